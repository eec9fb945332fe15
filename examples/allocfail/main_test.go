package main

import (
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestRunOnFakeDriver runs the cases on the fake driver (16 GiB of device
// memory by default): each fails the way it should, and the budget in force
// before comes back.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	before := pinmem.Budget()
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1. pinmem: ", "   handled: ", "2. ", "   handled: errors.Is(err, cuda.ErrOutOfMemory)", "3. "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if got := pinmem.Budget(); got != before {
		t.Errorf("budget after the run %d, want %d", got, before)
	}
}

// TestNoFailureIsAnError: a case that does not fail is an error of the
// program. The fake device reports 1 MiB of memory but lets 1 GiB be
// allocated, so the request for twice its memory succeeds (and is freed:
// the fake checks for leaks).
func TestNoFailureIsAnError(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{{TotalMem: 1 << 20}}, DeviceMemLimit: 1 << 30})
	err := run(&strings.Builder{})
	if err == nil || !strings.HasPrefix(err.Error(), "twice the GPU's memory: got <nil>") {
		t.Fatalf("run = %v", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "allocfail") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	err := run(&out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
}
