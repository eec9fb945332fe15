package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// TestRunOnFakeDriver runs the example on the fake driver: every batch goes
// through a pooled block and is checked, and the pool reuses blocks.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	var out strings.Builder
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "32 batches of 4 MiB through ") || !strings.Contains(out.String(), "every byte checked") {
		t.Errorf("output %q", out.String())
	}
}

// TestCopyFailureIsAnError: a failed copy fails the run, and the pool and
// the device memory are still released (Install checks for leaks).
func TestCopyFailureIsAnError(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemcpyHtoDAsync_v2", cudatest.Nth(5), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), &strings.Builder{}); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("run = %v, want cuda.ErrLaunchFailed", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "poolstream") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
