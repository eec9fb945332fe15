package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

var full = flag.Bool("full", false, "TestOnGPU: run the full sizes (64 MiB buffers, 4 MiB reads, 10 runs)")

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.size != 64<<20 || cfg.readSize != 4<<20 || cfg.reps != 10 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-size", "0"}, {"-size", "10", "-readsize", "11"}, {"-reps", "0"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunOnFakeDriver runs both kinds on the fake driver and checks that
// the second buffer really was write-combined.
func TestRunOnFakeDriver(t *testing.T) {
	d := cudatest.Install(t)
	var out strings.Builder
	res, err := run(context.Background(), config{size: 1 << 20, readSize: 64 << 10, reps: 2}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if res.Default.Flags != 0 || res.WC.Flags != pinmem.WriteCombined {
		t.Errorf("flags %v and %v, want 0 and WriteCombined", res.Default.Flags, res.WC.Flags)
	}
	for _, f := range []Figures{res.Default, res.WC} {
		if !(f.H2D > 0 && f.CPUWrite > 0 && f.CPURead > 0) {
			t.Errorf("figures %+v: not all positive", f)
		}
	}
	if n := d.Calls("cuMemHostAlloc"); n != 2 {
		t.Errorf("%d cuMemHostAlloc calls, want 2", n)
	}
	for _, want := range []string{"article:  write-combined memory gives about 35% more H2D bandwidth", "measured: H2D"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCopyFailureIsAnError checks that a failing copy ends the run with the
// driver's error.
func TestCopyFailureIsAnError(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemcpyHtoD_v2", cudatest.Once(), cuda.ResultUnknown); err != nil {
		t.Fatal(err)
	}
	_, err := run(context.Background(), config{size: 1 << 16, readSize: 1 << 10, reps: 1}, io.Discard)
	var cerr *cuda.Error
	if !errors.As(err, &cerr) || cerr.Code != cuda.ResultUnknown {
		t.Fatalf("run with a failing copy = %v", err)
	}
}

func TestFirstDiff(t *testing.T) {
	if i := firstDiff([]byte{1, 2, 3}, []byte{1, 2, 4}); i != 2 {
		t.Errorf("firstDiff = %d, want 2", i)
	}
	if i := firstDiff([]byte{1}, []byte{1}); i != -1 {
		t.Errorf("firstDiff of equal slices = %d", i)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "writecombined", "-size", "4096", "-readsize", "4096", "-reps", "1")
}

// TestOnGPU runs the example on the GPU (16 MiB buffers, 1 MiB reads, 3
// runs unless -full); every copy is checked in run.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	cfg := config{size: 16 << 20, readSize: 1 << 20, reps: 3}
	if testing.Short() { // the sanitizer tier
		cfg = config{size: 1 << 20, readSize: 64 << 10, reps: 1}
	}
	if *full {
		cfg = config{size: 64 << 20, readSize: 4 << 20, reps: 10}
	}
	var out strings.Builder
	res, err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !(res.WC.H2D > 0 && res.Default.H2D > 0) {
		t.Errorf("H2D figures %v and %v", res.Default.H2D, res.WC.H2D)
	}
}
