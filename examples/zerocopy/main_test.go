package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel/kerneltest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestKernelPTX checks that kernel.ptx was made from kernel.cu as it is now.
func TestKernelPTX(t *testing.T) {
	extest.Check(t, kernel.Source, kernel.PTX, kernel.Name)
}

// TestRunOnFakeDriver runs the example with the kernel's Go body on the
// fake driver, which reads the mapped buffer through its device pointer.
func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	if err := run(context.Background(), 3*1000+3, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "3003 float32 values ") {
		t.Errorf("output %q", out.String())
	}
}

// TestWrongResultIsAnError: a kernel that leaves the last value unwritten
// fails run.
func TestWrongResultIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	err := run(context.Background(), 300, &strings.Builder{})
	if err == nil || !strings.HasPrefix(err.Error(), "value 299 = ") {
		t.Fatalf("run = %v, want value 299 to differ", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "zerocopy") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), 32*224*224*kernel.Channels, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
