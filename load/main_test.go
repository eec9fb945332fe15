package load

import (
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestMain checks, beside testutil.UseFake's own leak check, that every
// test that installs a fake driver ends with pinmem's ledger as it found it.
func TestMain(m *testing.M) {
	testutil.CheckPinned(func() pinmem.Usage { return pinmem.Stats().Pinned })
	testutil.Main(m)
}
