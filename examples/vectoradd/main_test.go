package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel/kerneltest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestKernelPTX checks that kernel.ptx was made from kernel.cu as it is now.
func TestKernelPTX(t *testing.T) {
	extest.Check(t, kernel.Source, kernel.PTX, kernel.Name)
}

// TestRunOnFakeDriver runs the example with the kernel's Go body on the
// fake driver: the copies and the launch are made and c is checked.
func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	if err := run(context.Background(), 1<<16+3, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "c = a + b for 65539 float32 elements on ") {
		t.Errorf("output %q", out.String())
	}
}

// TestWrongResultIsAnError: a kernel that gets element 5 wrong fails run.
func TestWrongResultIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	err := run(context.Background(), 1<<10, &strings.Builder{})
	if err == nil || !strings.HasPrefix(err.Error(), "c[5] = ") {
		t.Fatalf("run = %v, want an error naming c[5]", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "vectoradd") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), 16<<20, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
