package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.budget != 1<<30 || cfg.chunk != 128<<20 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-chunk", "3MiB"}, {"-chunk", "0"}, {"-budget", "x"}, {"-budget", "64MiB", "-chunk", "128MiB"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunOnFakeDriver pins up to a 10 MiB budget in 4 MiB buffers with both
// methods: two fit, the third is refused with the budget's figures, and the
// budget in force before the run comes back.
func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	before := pinmem.Budget()
	var out strings.Builder
	rounds, err := run(context.Background(), config{budget: 10 << 20, chunk: 4 << 20}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(rounds))
	}
	for _, r := range rounds {
		if r.Buffers != 2 || r.Ledger != 8<<20 || r.Refusal == nil || r.Refusal.Limit != 10<<20 {
			t.Errorf("round %+v", r)
		}
	}
	if got := pinmem.Budget(); got != before {
		t.Errorf("budget after the run %d, want %d as before", got, before)
	}
	for _, want := range []string{"errors.Is(err, pinmem.ErrBudget) = true", "article:  keep pinned memory under half of physical memory", "after Free the ledger holds 0.0 MiB in 0 buffers"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDriverRefusalIsAnError checks that a pin the driver refuses (not the
// budget) ends the run with the driver's error.
func TestDriverRefusalIsAnError(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemHostAlloc", cudatest.Nth(2), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	_, err := run(context.Background(), config{budget: 10 << 20, chunk: 4 << 20}, io.Discard)
	if !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("run with the second cuMemHostAlloc failing = %v, want cuda.ErrOutOfMemory", err)
	}
}

func TestMeminfo(t *testing.T) {
	m, err := readMeminfo()
	if err != nil {
		t.Skip(err)
	}
	if m["MemTotal"] < 1<<20 || m["MemAvailable"] <= 0 {
		t.Errorf("MemTotal %d, MemAvailable %d", m["MemTotal"], m["MemAvailable"])
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "budget", "-budget", "64MiB", "-chunk", "32MiB")
}

// TestOnGPU pins up to a 512 MiB budget in 64 MiB buffers with both methods.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	rounds, err := run(context.Background(), config{budget: 512 << 20, chunk: 64 << 20}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rounds {
		if r.Buffers != 8 {
			t.Errorf("%v: %d buffers under a 512 MiB budget, want 8", r.Method, r.Buffers)
		}
	}
}
