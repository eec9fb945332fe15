package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	var out strings.Builder
	if err := run(3<<20, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "3 MiB written into write-combined pinned memory") {
		t.Errorf("output %q", out.String())
	}
}

// TestCopyFailureIsAnError: a copy to the device that fails fails run, and
// the buffers are still freed (Install checks for leaks).
func TestCopyFailureIsAnError(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemcpyHtoD_v2", cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := run(1<<20, &strings.Builder{}); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("run = %v, want cuda.ErrLaunchFailed", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "writecombined") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(64<<20, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
