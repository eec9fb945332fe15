package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/safetensors"
)

// TestBenchLoadFake runs the command on the fake driver (structure and
// verification only: the fake's figures mean nothing).
func TestBenchLoadFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, testutil.RandomBytes(3<<20+5, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	plot := filepath.Join(t.TempDir(), "load.svg")
	out, line, code := cli(t, "bench", "load", path, "--samples", "2", "--quiet", "--stage-size", "256KiB", "--readers", "3", "--format", "json", "--plot", plot)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, line)
	}
	if svg, err := os.ReadFile(plot); err != nil || !strings.Contains(string(svg), "<svg") {
		t.Errorf("--plot %s: %v, %d bytes", plot, err, len(svg))
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]bench.Result{}
	for _, r := range rep.Results {
		got[r.Kind+"/"+r.Dir+"/"+string(r.Unit)] = r
	}
	for _, k := range []string{"read-parallel/warm", "loader/warm"} {
		for _, u := range []bench.Unit{bench.GBps, bench.CPUsPerGB} {
			r, ok := got[k+"/"+string(u)]
			if !ok || r.Skipped || r.Samples != 2 || r.Median <= 0 && u == bench.GBps || r.Size != 3<<20+5 {
				t.Errorf("%s %s: %+v", k, u, r)
			}
		}
	}
	if r := got["loader/warm/GB/s"]; !r.Verified || !strings.Contains(r.Note, "mode") || !strings.Contains(r.Note, "of pinned-h2d in this run") {
		t.Errorf("warm loader not verified, or without its ratio to the pinned reference: %+v", r)
	}
	if r := got["pinned-h2d/warm/GB/s"]; !r.Verified || r.Samples != 2 || r.Median <= 0 {
		t.Errorf("pinned reference: %+v", r)
	}
	if r := got["loader/warm/GB/s"]; !strings.Contains(r.Note, "3 readers, 6 stages of 256KiB, 2 streams") || strings.Contains(r.Note, "defaults") {
		t.Errorf("the loader's note does not give the sizes set by flags: %q", r.Note)
	}
	if rep.Meta.Config.(map[string]any)["loader_defaults"] != false {
		t.Errorf("config %v: loader_defaults should be false with --readers", rep.Meta.Config)
	}
	for _, k := range []string{"loader/cold", "read-direct/cold", "read-buffered/cold"} {
		if r, ok := got[k+"/GB/s"]; !ok || !r.Skipped || !strings.Contains(r.Note, "--drop-caches") {
			t.Errorf("%s without --drop-caches: %+v", k, r)
		}
	}
	// The report reads back (the CPU-s/GB unit is known to the reader).
	rp := filepath.Join(t.TempDir(), "load.json")
	if err := os.WriteFile(rp, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, line, code := cli(t, "report", rp); code != exitOK {
		t.Errorf("pinmem report of the load bench: exit %d: %s", code, line)
	}
	table, line, code := cli(t, "bench", "load", path, "--samples", "1", "--quiet", "--stage-size", "64KiB")
	if code != exitOK || !strings.Contains(table, "read-parallel") || !strings.Contains(table, "CPU-s/GB") {
		t.Errorf("table (exit %d, %s):\n%s", code, line, table)
	}
	// With no size flag the loader runs with its own defaults, and the
	// table says which.
	d := load.DefaultSettings()
	table, line, code = cli(t, "bench", "load", path, "--samples", "1", "--quiet")
	want := fmt.Sprintf("%d readers, %d stages of %s, %d streams (the loader's defaults on %d cores)", d.Parallelism, d.Depth, bench.FormatSize(int64(d.StageSize)), d.Streams, runtime.NumCPU())
	if code != exitOK || !strings.Contains(table, want) {
		t.Errorf("table (exit %d, %s) does not say %q:\n%s", code, line, want, table)
	}
	csv, _, code := cli(t, "bench", "load", path, "--samples", "1", "--quiet", "--stage-size", "64KiB", "--format", "csv")
	if code != exitOK || !strings.Contains(csv, "loader") {
		t.Errorf("csv (exit %d):\n%s", code, csv)
	}
}

// TestBenchLoadBadCommandLines: each is refused before any GPU work with
// exit status 2.
func TestBenchLoadBadCommandLines(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "f.bin", "hello")
	empty := writeFile(t, dir, "empty.bin", "")
	for _, args := range [][]string{
		{"bench", "load"},
		{"bench", "load", file, file},
		{"bench", "load", filepath.Join(dir, "missing")},
		{"bench", "load", dir},
		{"bench", "load", empty},
		{"bench", "load", file, "--samples", "0"},
		{"bench", "load", file, "--mode", "fast"},
		{"bench", "load", file, "--stage-size", "5000"},
		{"bench", "load", file, "--stage-size", "2GiB"},
		{"bench", "load", file, "--readers", "0"},
		{"bench", "load", file, "--depth", "0"},
		{"bench", "load", file, "--stages", "-1"},
		{"bench", "load", file, "--format", "xml"},
		{"bench", "load", file, "--baseline", "nope"},
	} {
		out, errb, code := cli(t, args...)
		if code != exitUsage || out != "" || strings.Count(errb, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line", args, code, out, errb)
		}
	}
	if os.Geteuid() != 0 {
		if _, errb, code := cli(t, "bench", "load", file, "--drop-caches"); code != exitUsage || !strings.Contains(errb, "root") {
			t.Errorf("--drop-caches as a user: exit %d, %q", code, errb)
		}
	}
}

// TestGPUBenchLoad runs the command on the GPU with a 256 MiB file: every
// warm result measured, the loader's data verified.
func TestGPUBenchLoad(t *testing.T) {
	testutil.RequireGPU(t)
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, testutil.RandomBytes(256<<20, 10), 0o644); err != nil {
		t.Fatal(err)
	}
	out, line, code := cli(t, "bench", "load", path, "--samples", "3", "--quiet", "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, line)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		t.Log(r.String())
		if r.Dir == "warm" && (r.Skipped || r.Median <= 0 || r.Failed()) {
			t.Errorf("warm result %s", r)
		}
		if r.Kind == loadKindLoader && r.Dir == "warm" && !r.Verified {
			t.Errorf("loader not verified: %s", r)
		}
	}
}

// TestBenchLoadCheckpointFake runs the command on a sharded checkpoint on
// the fake driver: its rows are there, and the loads verified.
func TestBenchLoadCheckpointFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	weights := map[string]string{}
	for k, n := range []int{3, 2} {
		name := fmt.Sprintf("model-%d.safetensors", k)
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var specs []safetensors.Spec
		for i := range n {
			tn := fmt.Sprintf("w%d.%d", k, i)
			data := testutil.RandomBytes(100000+i*4, uint64(10*k+i))
			specs = append(specs, safetensors.Spec{Name: tn, DType: safetensors.F32, Shape: []int64{int64(len(data) / 4)},
				Data: func(w io.Writer) error { _, err := w.Write(data); return err }})
			weights[tn] = name
		}
		if _, err := safetensors.Write(f, specs, nil); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(map[string]any{"weight_map": weights})
	if err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(dir, "model.safetensors.index.json")
	if err := os.WriteFile(index, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{index, dir} {
		out, line, code := cli(t, "bench", "load", path, "--samples", "2", "--quiet", "--stage-size", "64KiB", "--format", "json")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, line)
		}
		var rep bench.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		got := map[string]bench.Result{}
		for _, r := range rep.Results {
			got[r.Kind+"/"+string(r.Unit)] = r
		}
		for _, k := range []string{"checkpoint/GB/s"} {
			if r := got[k]; !r.Verified || r.Size != 5*100000+(4+8)+4 || !strings.Contains(r.Note, "5 tensors, 2 shards") {
				t.Errorf("%s: %+v", k, r)
			}
		}
		if r := got["checkpoint/GB/s"]; !strings.Contains(r.Note, "of pinned-h2d in this run") {
			t.Errorf("checkpoint without its ratio to the pinned reference: %q", r.Note)
		}
		if r := got["checkpoint-first/ms"]; r.Samples != 2 || r.Median <= 0 || !strings.Contains(r.Note, "% of it") {
			t.Errorf("checkpoint-first: %+v", r)
		}
		if r := got["read-parallel/GB/s"]; r.Skipped || r.Samples != 2 {
			t.Errorf("read-parallel: %+v", r)
		}
	}

	// --drop-caches takes a checkpoint: the disk's parallel reads of every
	// shard and the cold load, which says its ratio to the better read.
	if os.Geteuid() != 0 {
		t.Skip("--drop-caches needs root")
	}
	drops := 0
	old := dropCaches
	dropCaches = func() error { drops++; return nil } // the fake's figures mean nothing: no need to drop anything
	t.Cleanup(func() { dropCaches = old })
	out, line, code := cli(t, "bench", "load", dir, "--samples", "2", "--quiet", "--stage-size", "64KiB", "--drop-caches", "--format", "json")
	if code != exitOK {
		t.Fatalf("--drop-caches on a checkpoint: exit %d: %s", code, line)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	cold := map[string]bench.Result{}
	for _, r := range rep.Results {
		if r.Dir == "cold" && r.Unit == bench.GBps {
			cold[r.Kind] = r
		}
	}
	for _, k := range []string{"read-direct", "read-parallel"} {
		if r := cold[k]; r.Samples != 2 && !(r.Skipped && strings.Contains(r.Note, "O_DIRECT")) {
			t.Errorf("cold %s: %+v", k, r)
		}
	}
	if r := cold["checkpoint"]; !r.Verified || r.Samples != 2 || !strings.Contains(r.Note, "of the disk's best parallel read in this run") {
		t.Errorf("cold checkpoint: %+v", r)
	}
	if drops != 3*2 {
		t.Errorf("%d drops of the page cache, want one before each of 2 samples of 3 rows", drops)
	}
}
