package transfer_test

import (
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUServiceUse runs the service program of TestServiceUse on the
// GPU: 16 goroutines moving random sizes from 1 B to 64 MiB both ways
// through one Copier with deadlines of 1-30 ms, retrying until they
// succeed, a Pipeline whose callback panics once and a Multi, every byte
// checked and pinmem's ledger at 0 at the end. The device is not stalled
// on purpose: 18 goroutines sharing one Copier's two lanes miss their
// deadlines often enough.
func TestGPUServiceUse(t *testing.T) {
	cctx := testutil.GPUContext(t)
	serviceUse(t, cctx, 40, nil)
}
