package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// EnvCRefBW names the C reference bandwidth program (cref/bin/bw, built by
// cref/build) that TestGPUMatchesCReference runs.
const EnvCRefBW = "PINMEM_CREF_BW"

// TestGPUMatchesCReference runs the C reference (cref/bw.c: driver API,
// events around a batch of at least 20 ms) and `pinmem bench` on the same
// GPU at 256 MiB, five samples each, alternately for crefRounds() rounds
// (C, pinmem, pinmem, C, C, pinmem, ...), and checks that pinmem's figure
// over C's, taken round by round and then the median of those ratios,
// is within 1% of 1 for pinned H2D and D2H and within 5% for pageable:
// both through the driver's staging path from page-aligned memory that is
// not pinned and has no huge pages advised (the Go heap here, cref/bw's
// page-aligned allocation in C: both follow the system's transparent huge
// page default), compared like with like. The driver's pageable path
// varies by 10-20% from one process to the next, so one run of each would
// compare that variation, not the programs: the ratio of two runs side by
// side cancels what drifts between rounds, and the median over many rounds
// what varies per process. It needs a GPU and PINMEM_CREF_BW; it is
// skipped otherwise.
func TestGPUMatchesCReference(t *testing.T) {
	testutil.RequireGPU(t)
	bw := os.Getenv(EnvCRefBW)
	if bw == "" {
		t.Skipf("%s is not set (cref/build -o DIR; %s=DIR/bw)", EnvCRefBW, EnvCRefBW)
	}
	const size = 256 << 20
	start := time.Now()
	cRounds := map[[2]string][]float64{}
	goRounds := map[[2]string][]float64{}
	verified := map[[2]string]bool{}
	dir := t.TempDir()
	runC := func() {
		for k, v := range crefRun(t, bw, size) {
			cRounds[k] = append(cRounds[k], v)
		}
	}
	rounds := crefRounds()
	for round := range rounds {
		if round%2 == 0 { // who goes first alternates
			runC()
		}
		jsonOut := filepath.Join(dir, fmt.Sprintf("bw%d.json", round))
		if _, stderr, code := cli(t, "bench", "--quiet", "--kinds", "pinned,pageable", "--sizes", "256MiB", "--dirs", "h2d,d2h", "--samples", "5", "--format", "json", "-o", jsonOut); code != exitOK {
			t.Fatalf("pinmem bench: exit %d: %s", code, stderr)
		}
		for _, r := range readReport(t, jsonOut).Results {
			k := [2]string{r.Kind, r.Dir}
			goRounds[k] = append(goRounds[k], r.Median)
			verified[k] = r.Verified && (round == 0 || verified[k])
		}
		if round%2 == 1 {
			runC()
		}
	}
	tol := map[string]float64{bench.KindPinned: 0.01, bench.KindPageable: 0.05}
	checked := 0
	for _, kind := range []string{bench.KindPinned, bench.KindPageable} {
		for _, d := range []string{"h2d", "d2h"} {
			k := [2]string{kind, d}
			cs, gs := cRounds[k], goRounds[k]
			if len(cs) != rounds || len(gs) != rounds {
				t.Errorf("%s %s: %d C and %d pinmem figures, want %d each", kind, d, len(cs), len(gs), rounds)
				continue
			}
			ratios := make([]float64, rounds)
			for i := range ratios {
				ratios[i] = gs[i] / cs[i]
			}
			c, g, r := medianOf(cs), medianOf(gs), medianOf(ratios)
			dev := r - 1
			t.Logf("%-8s %s 256MiB: pinmem %.2f GB/s %v, C reference %.2f GB/s %v (medians of %d rounds); pinmem/C by round %v, median %.4f (%+.2f%%; allowed %.0f%%)",
				kind, d, g, roundTo(gs), c, roundTo(cs), rounds, roundTo(ratios), r, 100*dev, 100*tol[kind])
			if !verified[k] || math.Abs(dev) > tol[kind] {
				t.Errorf("%s %s: pinmem/C %.4f by round (medians: pinmem %.3f GB/s, C %.3f GB/s): %+.2f%%, verified %v", kind, d, r, g, c, 100*dev, verified[k])
			}
			checked++
		}
	}
	if checked != 4 {
		t.Errorf("%d figures compared, want 4", checked)
	}
	t.Logf("wall time: %v", time.Since(start).Round(time.Millisecond))
}

// EnvCRefRounds sets how many rounds TestGPUMatchesCReference runs
// (default 21): the driver's pageable path varies by 10-20% from round to
// round on the H200 machine (device to host 13.8-18.1 GB/s in one run),
// and two sides agree to a few per cent only over many rounds.
const EnvCRefRounds = "PINMEM_CREF_ROUNDS"

// crefRounds is how many times TestGPUMatchesCReference runs each side.
func crefRounds() int {
	if n, err := strconv.Atoi(os.Getenv(EnvCRefRounds)); err == nil && n > 0 {
		return n
	}
	return 21
}

// crefRun runs the C reference once and returns its medians by (kind, dir).
func crefRun(t *testing.T, bw string, size int64) map[[2]string]float64 {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bw, "--samples", "5", "--kinds", "pinned,pageable", "--dirs", "h2d,d2h", strconv.FormatInt(size, 10))
	var cerr bytes.Buffer
	cmd.Stderr = &cerr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bw, err, cerr.String())
	}
	cref := map[[2]string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l struct {
			Bench, Kind, Dir string
			Size             int64
			Median           float64
			Verified         bool
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Bench != "bw" || l.Size != size {
			continue
		}
		if !l.Verified {
			t.Errorf("C reference %s %s not verified", l.Kind, l.Dir)
		}
		cref[[2]string{l.Kind, l.Dir}] = l.Median
	}
	return cref
}

// medianOf returns the median of xs (not empty).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// roundTo returns xs rounded to two decimals, for the log.
func roundTo(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.Round(x*100) / 100
	}
	return out
}
