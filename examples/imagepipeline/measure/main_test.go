package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/imagepipeline/kernel"
	"github.com/pinmem/pinmem/examples/imagepipeline/kernel/kerneltest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

var full = flag.Bool("full", false, "TestOnGPU: run the full sizes (1080p and 4K, 240 frames, 3 runs)")

// envCref names the C baseline binary (cref/bin/imagepipeline) for TestOnGPU.
const envCref = "PINMEM_CREF_IMAGEPIPELINE"

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || len(cfg.res) != 2 || cfg.res[1].Width != 3840 || cfg.frames != 240 || cfg.ring != 8 || cfg.streams != 4 {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	if cfg, err := parseFlags([]string{"-res", "64x32", "-ring", "6", "-streams", "3", "-frames", "12"}, io.Discard); err != nil || cfg.res[0] != (Resolution{"64x32", 64, 32}) {
		t.Errorf("custom = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-res", "8k"}, {"-res", "0x5"}, {"-ring", "6"}, {"-frames", "4"}, {"-streams", "0"}, {"-reps", "0"}, {"-device", "-1"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestBlur pins the CPU blur to values worked out by hand: the rounded
// mean of a clamped 3x3 neighbourhood, per channel.
func TestBlur(t *testing.T) {
	// A 3x2 frame; channel 0 holds 0..5 row by row, the others 9, 0, 255.
	src := make([]byte, 3*2*4)
	for i := range 6 {
		copy(src[4*i:], []byte{byte(i), 9, 0, 255})
	}
	dst := make([]byte, len(src))
	kernel.Blur(dst, src, 3, 2)
	// Pixel (0,0): rows 0,0,1 and columns 0,0,1 -> 0+0+1 +0+0+1 +3+3+4 = 12 -> (12+4)/9 = 1.
	// Pixel (2,1): rows 0,1,1, columns 1,2,2 -> 1+2+2 +4+5+5 +4+5+5 = 33 -> 37/9 = 4.
	if dst[0] != 1 || dst[4*5] != 4 {
		t.Errorf("blur of channel 0 at (0,0) and (2,1) = %d, %d; want 1, 4", dst[0], dst[4*5])
	}
	for i := range 6 {
		if got := dst[4*i+1 : 4*i+4]; got[0] != 9 || got[1] != 0 || got[2] != 255 {
			t.Errorf("pixel %d: flat channels blurred to %v, want [9 0 255]", i, got)
		}
	}
}

func fakeConfig() config {
	return config{res: []Resolution{{"16x8", 16, 8}, {"5x3", 5, 3}}, frames: 10, ring: 4, streams: 2, reps: 2}
}

// TestRunOnFakeDriver runs every mode on the fake driver: the frames go
// through each loop and the Pipeline and are checked.
func TestRunOnFakeDriver(t *testing.T) {
	kerneltest.Install(t, false)
	var out strings.Builder
	res, err := run(context.Background(), fakeConfig(), &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 8 || len(res.Bounds) != 2 {
		t.Fatalf("%d rows and %d bounds, want 8 and 2", len(res.Rows), len(res.Bounds))
	}
	for _, r := range res.Rows {
		if !(r.FPS > 0) {
			t.Errorf("row %+v: FPS not positive", r)
		}
		// Only the Pipeline from Go memory is compared with the staged
		// bound measured beside each of its runs.
		if (r.Mode == ModePipeline) != (r.StagedShare > 0) {
			t.Errorf("row %+v: staged share", r)
		}
	}
	for _, want := range []string{"article:  pinned memory and streams took a pipeline from 120 to 210 FPS", "measured: 16x8: naive", "Go frames, transfer.Pipeline, 2 streams", "of it measured beside each run)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestJSONRows: with jsonOut, every mode and both bounds of each
// resolution come out as result rows, in order, the measured ones with
// their runs' spread and the bounds marked computed.
func TestJSONRows(t *testing.T) {
	kerneltest.Install(t, false)
	cfg := fakeConfig()
	var js bytes.Buffer
	cfg.jsonOut = &js
	if _, err := run(context.Background(), cfg, io.Discard); err != nil {
		t.Fatal(err)
	}
	// pinmem bench all reads them as result rows, each with its reference.
	rs, err := bench.ParseResultLines(js.Bytes())
	if err != nil || len(rs) != 12 {
		t.Fatalf("bench.ParseResultLines: %d rows, %v", len(rs), err)
	}
	bench.AddReferences(rs)
	for _, r := range rs {
		if want := map[string]string{"pinned-1stream": "bound", "pinned-2streams": "bound", "pipeline": "staged-bound"}[r.Kind]; r.Ref != want {
			t.Errorf("%s %s: reference %q, want %q", r.Kind, r.Dir, r.Ref, want)
		}
	}
	dec := json.NewDecoder(&js)
	dec.DisallowUnknownFields()
	var got []string
	for dec.More() {
		var r resultRow
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Kind+" "+r.Dir)
		computed := r.Kind == KindBound || r.Kind == KindStagedBound
		switch {
		case r.Bench != "imagepipeline" || r.Unit != "FPS" || !(r.Median > 0) || r.Min > r.Median || r.Median > r.Max:
			t.Errorf("row %+v", r)
		case computed && (r.Timing != "computed" || r.Samples != 0 || r.Verified):
			t.Errorf("bound row %+v: want computed, no samples, not verified", r)
		case !computed && (r.Timing != "wall" || r.Samples != cfg.reps || !r.Verified):
			t.Errorf("measured row %+v: want wall, %d samples, verified", r, cfg.reps)
		}
		if want := int64(cfg.res[0].Bytes()); r.Dir == "16x8" && r.Size != want {
			t.Errorf("row %+v: size, want %d", r, want)
		}
	}
	want := "naive 16x8,pinned-1stream 16x8,pinned-2streams 16x8,pipeline 16x8,bound 16x8,staged-bound 16x8," +
		"naive 5x3,pinned-1stream 5x3,pinned-2streams 5x3,pipeline 5x3,bound 5x3,staged-bound 5x3"
	if strings.Join(got, ",") != want {
		t.Errorf("rows %s\nwant %s", strings.Join(got, ","), want)
	}
}

// TestWrongFrameIsAnError checks that one wrong byte in a frame fails run.
func TestWrongFrameIsAnError(t *testing.T) {
	kerneltest.Install(t, true)
	_, err := run(context.Background(), fakeConfig(), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "naive: output frame 0, pixel (15, 7), channel 3") {
		t.Fatalf("run with a wrong kernel = %v, want the naive mode's first frame's last byte", err)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "imagepipeline", "-res", "720p", "-frames", "8")
}

// TestOnGPU runs the example on the GPU: 1080p and 4K with few frames
// unless -full. With PINMEM_CREF_IMAGEPIPELINE naming the C baseline it also
// runs that and fails when Go's naive frame rate is more than 15% below C's;
// with -full it fails when the 4K N-stream rate is below 90% of the bound.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	cfg := config{res: []Resolution{resolutions["1080p"], resolutions["4k"]}, frames: 32, ring: 8, streams: 4, reps: 1}
	if testing.Short() { // the sanitizer tier
		cfg = config{res: []Resolution{{"320x240", 320, 240}}, frames: 8, ring: 4, streams: 2, reps: 1}
	}
	if *full {
		cfg.frames, cfg.reps = 240, 3
	}
	cfg.cref = os.Getenv(envCref)
	var out strings.Builder
	res, err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 4*len(cfg.res) {
		t.Fatalf("%d rows, want %d", len(res.Rows), 4*len(cfg.res))
	}
	if *full && !testing.Short() {
		k4 := resolutions["4k"]
		if pn, b := res.row(k4, ModePinnedN), res.Bounds[1]; pn.FPS < 0.9*b.FPS {
			t.Errorf("4K pinned, %d streams: %.1f FPS is %.1f%% of the copy bound %.1f FPS (want at least 90%%)", cfg.streams, pn.FPS, 100*pn.FPS/b.FPS, b.FPS)
		}
	}
	if cfg.cref == "" {
		t.Logf("%s not set: the C baseline was not run", envCref)
		return
	}
	for _, r := range cfg.res {
		c, g := findC(res.C, r, "naive", 1), res.row(r, ModeNaive)
		if c.Median <= 0 {
			t.Errorf("%s: no naive row from the C baseline", r.Name)
			continue
		}
		if g.FPS < c.Median/1.15 {
			t.Errorf("%s naive: Go %.1f FPS, C %.1f FPS: Go is more than 15%% slower", r.Name, g.FPS, c.Median)
		}
	}
}

// TestCompareWithC runs a stand-in for the C baseline (a script printing
// its JSON lines) and checks that its rows are read and set beside Go's.
func TestCompareWithC(t *testing.T) {
	kerneltest.Install(t, false)
	script := filepath.Join(t.TempDir(), "imagepipeline")
	lines := `{"bench":"imagepipeline","kind":"bidir","width":16,"height":8,"streams":2,"median":100}
{"bench":"imagepipeline","kind":"naive","width":16,"height":8,"streams":1,"median":1000,"verified":true}
{"bench":"imagepipeline","kind":"pinned","width":16,"height":8,"streams":2,"median":3000,"verified":true}`
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntest -s \"$1\" || exit 9\ncat <<'EOF'\n"+lines+"\nEOF\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fakeConfig()
	cfg.res, cfg.cref = cfg.res[:1], script
	var out strings.Builder
	res, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if c := findC(res.C, cfg.res[0], "pinned", 2); c.Median != 3000 {
		t.Fatalf("C rows = %+v", res.C)
	}
	rows := cRows(cfg, res.C)
	if len(rows) != 2 || rows[0].Kind != "c:naive" || rows[1].Kind != "c:pinned-2streams" || rows[1].Median != 3000 || rows[1].Min != 3000 || rows[1].Dir != "16x8" || !rows[1].Verified {
		t.Errorf("C result rows %+v", rows)
	}
	for _, want := range []string{"16x8   naive: C 1000.0 FPS, Go ", "16x8   pinned, 2 streams: C 3000.0 FPS", "both directions at once: C 100.0 GB/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'error: naive: output frame 0 byte 3 is 1, want 2' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "output frame 0 byte 3") {
		t.Errorf("run with a failing baseline = %v", err)
	}
}
