package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel/kerneltest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// full makes TestOnGPU run the example's default sizes and repetitions.
var full = flag.Bool("full", false, "TestOnGPU: run the full sizes (16 MiB and 256 MiB, 10 runs)")

// envCref names the C baseline binary (cref/bin/vectoradd) for TestOnGPU.
const envCref = "PINMEM_CREF_VECTORADD"

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || len(cfg.sizes) != 2 || cfg.sizes[0] != 16<<20 || cfg.sizes[1] != 256<<20 || cfg.reps != 10 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-sizes", "0"}, {"-sizes", "3"}, {"-sizes", "1MB"}, {"-reps", "0"}, {"extra"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunOnFakeDriver runs the example on the fake driver: every mode's
// copies and kernel run, every element is checked, and the report names
// the article's claim.
func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	res, err := run(context.Background(), config{sizes: []int{64 << 10, 1 << 20}, reps: 2}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 6 {
		t.Fatalf("%d rows, want 6 (2 sizes x 3 modes)", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Total <= 0 || r.Transfer() > r.Total {
			t.Errorf("row %+v: total %v, transfer %v", r, r.Total, r.Transfer())
		}
	}
	for _, want := range []string{"article:  pinned memory about halves the transfer: 15.000 ms -> 8.000 ms", "measured: 1 MiB: pageable"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestWrongResultIsAnError checks that a kernel computing one element wrong
// makes run fail, naming the element.
func TestWrongResultIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	_, err := run(context.Background(), config{sizes: []int{64 << 10}, reps: 1}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "c[5]") {
		t.Fatalf("run with a wrong kernel = %v, want an error naming c[5]", err)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "vectoradd", "-sizes", "1MiB", "-reps", "1")
}

// TestOnGPU runs the example on the GPU (small sizes unless -full). With
// PINMEM_CREF_VECTORADD naming the C baseline, it also runs that and fails
// when the Go pageable transfer is more than 15% slower than C's.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	cfg := config{sizes: []int{16 << 20}, reps: 3}
	if testing.Short() { // the sanitizer tier
		cfg = config{sizes: []int{1 << 20}, reps: 1}
	}
	if *full {
		cfg = config{sizes: []int{16 << 20, 256 << 20}, reps: 10}
	}
	cfg.cref = os.Getenv(envCref)
	var out strings.Builder
	res, err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3*len(cfg.sizes) {
		t.Fatalf("%d rows, want %d", len(res.Rows), 3*len(cfg.sizes))
	}
	if cfg.cref == "" {
		t.Logf("%s not set: the C baseline was not run", envCref)
		return
	}
	for _, c := range res.C {
		if c.Kind != "pageable" {
			continue
		}
		g := find(res.Rows, c.Size, "pageable")
		if r := float64(g.Transfer()) / (c.TransferMS * 1e6); r > 1.15 {
			t.Errorf("%s pageable: Go transfer %v is %.2fx C's %.3f ms (want within 15%%)", mib(c.Size), g.Transfer(), r, c.TransferMS)
		}
	}
	if len(res.C) == 0 {
		t.Error(errors.New("the C baseline gave no rows"))
	}
}

// TestCompareWithC runs a stand-in for the C baseline (a script printing
// its JSON lines) and checks that its rows are read and set beside Go's.
func TestCompareWithC(t *testing.T) {
	kerneltest.Install(t, false)
	script := filepath.Join(t.TempDir(), "vectoradd")
	lines := `{"bench":"vectoradd","kind":"info","device":"x"}
{"bench":"vectoradd","kind":"pageable","size":65536,"unit":"ms","median":2,"copy_in_ms":1,"kernel_ms":0.5,"copy_out_ms":0.5,"transfer_ms":1.5,"verified":true}
{"bench":"vectoradd","kind":"pinned","size":65536,"unit":"ms","median":1,"transfer_ms":0.75,"verified":true}`
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntest -s \"$1\" || exit 9\ncat <<'EOF'\n"+lines+"\nEOF\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := run(context.Background(), config{sizes: []int{64 << 10}, reps: 1, cref: script}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.C) != 2 || res.C[0].TransferMS != 1.5 || res.C[1].Kind != "pinned" {
		t.Fatalf("C rows = %+v", res.C)
	}
	if !strings.Contains(out.String(), "pageable  C transfer 1.500 ms, Go ") {
		t.Errorf("output lacks the C row:\n%s", out.String())
	}
	// A baseline that fails is an error that carries its stderr.
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'error: c[3] = 1, want 2' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), config{sizes: []int{64 << 10}, reps: 1, cref: script}, io.Discard); err == nil || !strings.Contains(err.Error(), "c[3] = 1, want 2") {
		t.Errorf("run with a failing baseline = %v", err)
	}
}
