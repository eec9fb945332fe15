package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// small is what the tests on the fake driver move: a broadcast larger than
// one stage, shards that are not a whole number of MiB.
var small = sizes{weights: 24 << 20, shard: 3<<20 + 5}

func TestRunOnFakeDriver(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cudatest.Install(t, cudatest.WithDevices(n))
			var out strings.Builder
			if err := run(context.Background(), small, &out); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("%d devices: broadcast 24 MiB at ", n); !strings.HasPrefix(out.String(), want) {
				t.Errorf("output %q, want it to start with %q", out.String(), want)
			}
		})
	}
}

// TestCopyFailureIsAnError: a device-to-host copy that fails fails the run,
// and everything is still released (Install checks for leaks).
func TestCopyFailureIsAnError(t *testing.T) {
	d := cudatest.Install(t, cudatest.WithDevices(2))
	if err := d.FailOn("cuMemcpyDtoHAsync_v2", cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), small, &strings.Builder{}); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("run = %v, want cuda.ErrLaunchFailed", err)
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "multi") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), sizes{weights: 64 << 20, shard: 32 << 20}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
