package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/imagepipeline/kernel"
	"github.com/pinmem/pinmem/examples/imagepipeline/kernel/kerneltest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestKernelPTX checks that kernel.ptx was made from kernel.cu as it is now.
func TestKernelPTX(t *testing.T) {
	extest.Check(t, kernel.Source, kernel.PTX, kernel.Name)
}

// TestRunOnFakeDriver runs the example with the kernel's Go body on the
// fake driver: every frame goes through the Pipeline and is checked.
func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	if err := run(context.Background(), video{64, 36, 9}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "9 frames of 64x36 blurred through a 4-stream Pipeline at ") {
		t.Errorf("output %q", out.String())
	}
}

// TestWrongFrameIsAnError: a kernel that gets one byte of a frame wrong
// fails run.
func TestWrongFrameIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	err := run(context.Background(), video{16, 8, 3}, &strings.Builder{})
	if err == nil || !strings.HasPrefix(err.Error(), "frame 0: ") {
		t.Fatalf("run = %v, want frame 0 to differ", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "imagepipeline") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), video{1920, 1080, 16}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
