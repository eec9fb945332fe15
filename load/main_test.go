package load

import (
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// TestMain checks, beside testutil.UseFake's own leak check, that every
// test that installs a fake driver ends with pinmem's ledger as it found it.
func TestMain(m *testing.M) {
	testutil.OnFake(func(t testing.TB, _ *fakedrv.Driver) func() {
		pinned0 := pinmem.Stats().Pinned
		return func() {
			if p := pinmem.Stats().Pinned; p != pinned0 {
				t.Errorf("pinmem ledger: %+v pinned at the end, %+v at the start", p, pinned0)
			}
		}
	})
	testutil.Main(m)
}
