package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/bench"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// TestBenchLoadFake runs the command on the fake driver (structure and
// verification only: the fake's figures mean nothing).
func TestBenchLoadFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, testutil.RandomBytes(3<<20+5, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	out, line, code := cli(t, "bench", "load", path, "--samples", "2", "--quiet", "--stage-size", "256KiB", "--readers", "3", "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, line)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]bench.Result{}
	for _, r := range rep.Results {
		got[r.Kind+"/"+r.Dir+"/"+string(r.Unit)] = r
	}
	for _, k := range []string{"read-parallel/warm", "loader/warm", "loader-mapped/warm"} {
		for _, u := range []bench.Unit{bench.GBps, bench.CPUsPerGB} {
			r, ok := got[k+"/"+string(u)]
			if !ok || r.Skipped || r.Samples != 2 || r.Median <= 0 && u == bench.GBps || r.Size != 3<<20+5 {
				t.Errorf("%s %s: %+v", k, u, r)
			}
		}
	}
	if r := got["loader/warm/GB/s"]; !r.Verified || !strings.Contains(r.Note, "mode") {
		t.Errorf("warm loader not verified: %+v", r)
	}
	if r := got["loader-mapped/warm/GB/s"]; !r.Verified || !strings.Contains(r.Note, "mode mapped") {
		t.Errorf("mapped loader not verified, or not mapped: %+v", r)
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
		{"bench", "load", file, "--format", "xml"},
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
