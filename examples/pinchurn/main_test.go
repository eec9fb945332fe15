package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestRunOnFakeDriver runs the program on the fake driver, which places
// small pinned allocations side by side in shared pages as the driver
// does: 1,000 buffers, every way of pinning, every byte checked, the
// ledger back where it was.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	var out strings.Builder
	if err := run(context.Background(), &out, 1000, 1); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "pinchurn: 1000 buffers pinned in 21 ways") || strings.Contains(out.String(), "not supported") {
		t.Errorf("output: %s", out.String())
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "pinchurn") }

// TestGPUPinChurn runs the program on the GPU.
func TestGPUPinChurn(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	err := run(context.Background(), &out, 1000, 1)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
}
