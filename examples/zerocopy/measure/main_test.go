package main

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel/kerneltest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

var full = flag.Bool("full", false, "TestOnGPU: run the full sizes (batch 32, 20 runs per cell)")

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.batch != 32 || len(cfg.passes) != 4 || cfg.passes[3] != 8 || cfg.reps != 20 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-passes", "0"}, {"-passes", "1,x"}, {"-batch", "0"}, {"-reps", "0"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	rows, err := run(context.Background(), config{batch: 1, passes: []int{1, 4}, reps: 2}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Passes != 1 || rows[1].Passes != 4 {
		t.Fatalf("rows = %+v", rows)
	}
	for _, want := range []string{"article:  zero-copy speeds up a batch-32 ResNet-50", "measured: read once, zero-copy"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestWrongResultIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	_, err := run(context.Background(), config{batch: 1, passes: []int{1}, reps: 1}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "output 150527 (image 0, channel 2)") {
		t.Fatalf("run with a kernel that skips the last value = %v", err)
	}
}

func TestSummary(t *testing.T) {
	rows := []Row{{1, 2, 3}, {2, 4, 4}, {4, 8, 5}}
	if got := summary(rows); !strings.Contains(got, "zero-copy wins by 1.50x") || !strings.Contains(got, "the copy wins from 2 reads on") {
		t.Errorf("summary = %q", got)
	}
	if got := summary(rows[:1]); !strings.Contains(got, "zero-copy wins at every number of reads measured") {
		t.Errorf("summary = %q", got)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "zerocopy", "-batch", "1", "-reps", "1")
}

// TestOnGPU runs the example on the GPU (batch 32, 3 runs per cell unless
// -full): every output is checked in run.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	cfg := config{batch: 32, passes: []int{1, 2, 4, 8}, reps: 3}
	if testing.Short() { // the sanitizer tier
		cfg = config{batch: 1, passes: []int{1, 2}, reps: 1}
	}
	if *full {
		cfg.reps = 20
	}
	var out strings.Builder
	rows, err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.ZeroCopy <= 0 || r.Explicit <= 0 {
			t.Errorf("row %+v: a latency is not positive", r)
		}
	}
}
