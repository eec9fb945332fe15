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

// TestRunOnFakeDriver: under a budget of 10 MiB, three 3 MiB buffers are
// pinned and the fourth refused; the ledger checks in run hold.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	var out strings.Builder
	if err := run(10<<20, 3<<20, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"budget 10 MiB: 3 buffers of 3 MiB pinned, the next refused: ",
		"the ledger: 9 MiB more in 3 more buffers",
		"every buffer freed",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDriverRefusalIsAnError: a pin the driver refuses (pinmem.Alloc
// registers buffers of this size: mmap and cuMemHostRegister) is not the budget's
// refusal, and run returns it.
func TestDriverRefusalIsAnError(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemHostRegister_v2", cudatest.Nth(2), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if err := run(10<<20, 3<<20, &strings.Builder{}); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("run = %v, want cuda.ErrOutOfMemory", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "budget") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(256<<20, 48<<20, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
