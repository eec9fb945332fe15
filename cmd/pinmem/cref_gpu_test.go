package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/bench"
	"github.com/pinmem/pinmem/internal/testutil"
)

// EnvCRefBW names the C reference bandwidth program (cref/bin/bw, built by
// cref/build) that TestGPUMatchesCReference runs.
const EnvCRefBW = "PINMEM_CREF_BW"

// TestGPUMatchesCReference runs the C reference (cref/bw.c: driver API,
// events around a batch of at least 20 ms) and `pinmem bench` on the same
// GPU at 256 MiB, five samples each, and checks pinned H2D and D2H agree
// within 1% and pageable within 5%: both through the driver's staging
// path from page-aligned memory that is not pinned (the Go heap here,
// cref/bw's page-aligned allocation in C), compared like with like. It needs a GPU
// and PINMEM_CREF_BW; it is skipped otherwise.
func TestGPUMatchesCReference(t *testing.T) {
	testutil.RequireGPU(t)
	bw := os.Getenv(EnvCRefBW)
	if bw == "" {
		t.Skipf("%s is not set (cref/build -o DIR; %s=DIR/bw)", EnvCRefBW, EnvCRefBW)
	}
	const size = 256 << 20
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), bw, "--samples", "5", "--kinds", "pinned,pageable", "--dirs", "h2d,d2h", "268435456")
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
	dir := t.TempDir()
	jsonOut := filepath.Join(dir, "bw.json")
	if _, stderr, code := cli(t, "bench", "--quiet", "--kinds", "pinned,pageable", "--sizes", "256MiB", "--dirs", "h2d,d2h", "--samples", "5", "--format", "json", "-o", jsonOut); code != exitOK {
		t.Fatalf("pinmem bench: exit %d: %s", code, stderr)
	}
	rep := readReport(t, jsonOut)
	tol := map[string]float64{bench.KindPinned: 0.01, bench.KindPageable: 0.05}
	checked := 0
	for _, r := range rep.Results {
		c, ok := cref[[2]string{r.Kind, r.Dir}]
		if !ok {
			t.Errorf("no C reference figure for %s %s", r.Kind, r.Dir)
			continue
		}
		dev := r.Median/c - 1
		t.Logf("%-8s %s 256MiB: pinmem %.2f GB/s, C reference %.2f GB/s (%+.2f%%; allowed %.0f%%)", r.Kind, r.Dir, r.Median, c, 100*dev, 100*tol[r.Kind])
		if !r.Verified || math.Abs(dev) > tol[r.Kind] {
			t.Errorf("%s %s: pinmem %.3f GB/s vs C %.3f GB/s: %+.2f%%, verified %v", r.Kind, r.Dir, r.Median, c, 100*dev, r.Verified)
		}
		checked++
	}
	if checked != 4 {
		t.Errorf("%d figures compared, want 4", checked)
	}
	t.Logf("wall time: %v", time.Since(start).Round(time.Millisecond))
}
