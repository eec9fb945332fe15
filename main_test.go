package pinmem

import (
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestMain checks, at the end of every test that installs a fake driver,
// that nothing is left pinned (checkNothingPinned) and puts back the
// budget the test found.
func TestMain(m *testing.M) {
	testutil.OnFake(func(t testing.TB, d *fakedrv.Driver) func() {
		base := Stats()
		budgetMu.Lock()
		prevBudget := budgetSet
		budgetMu.Unlock()
		return func() {
			budgetMu.Lock()
			budgetSet = prevBudget
			budgetMu.Unlock()
			checkNothingPinned(t, d, base)
		}
	})
	testutil.Main(m)
}
