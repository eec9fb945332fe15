package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/bench"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// TestBenchAllOnFake runs the whole suite end to end on the fake driver:
// every test writes a valid report and a plot, each report names its
// test, the tool and the fake driver (its figures are the fake's), and
// the copier rows carry their same-run reference.
func TestBenchAllOnFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := filepath.Join(t.TempDir(), "out")
	_, stderr, code := cli(t, "bench", "all", "--quick", "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, p := range bench.SuiteParts() {
		path := filepath.Join(dir, p.Name+".json")
		rep := readReport(t, path)
		m := rep.Meta
		if m.Part != p.Name || m.Schema != bench.SchemaVersion || m.Tool.Name != "pinmem" || m.Partial ||
			!strings.Contains(m.Note, "fake driver") || !strings.Contains(m.Note, "quick run") || !strings.HasPrefix(m.Device, "Fake ") {
			t.Errorf("%s: meta %+v", p.Name, m)
		}
		if len(rep.Results) == 0 {
			t.Errorf("%s: no results", p.Name)
		}
		if !strings.Contains(stderr, "] "+p.Name+": ") {
			t.Errorf("no progress line for %s in %q", p.Name, stderr)
		}
		if p.Name == "copier" || p.Name == "concurrency" {
			for _, r := range rep.Results {
				if r.Kind == bench.KindCopier && (r.Ref != bench.KindPageableSync || r.Ratio <= 0) {
					t.Errorf("%s: copier row %s %d without its reference: %+v", p.Name, r.Dir, r.Size, r)
				}
			}
		}
		if _, err := os.Stat(filepath.Join(dir, p.Name+".png")); err != nil && hasFigures(rep.Results) {
			t.Errorf("%s: no plot: %v", p.Name, err)
		}
	}
	// The run renders as the docs do, labelled as the fake's.
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	md, stderr, code := cli(t, append([]string{"report", "--format", "markdown"}, files...)...)
	if code != exitOK {
		t.Fatalf("report --format markdown: exit %d, %s", code, stderr)
	}
	for _, want := range []string{bench.FakeNote, "## The Copier against the driver, every size", "## Many goroutines at once", "## Scattered block copies", "x pageable-sync"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown of the run lacks %q", want)
		}
	}
	if testing.Verbose() {
		t.Log(md)
	}
}

func hasFigures(rs []bench.Result) bool {
	for _, r := range rs {
		if !r.Skipped && r.Median > 0 {
			return true
		}
	}
	return false
}

// TestBenchAllListAndSelect: -l lists every test with what it measures;
// -t runs only the named tests; an unknown name is a usage error before
// any GPU work.
func TestBenchAllListAndSelect(t *testing.T) {
	stdout, _, code := cli(t, "bench", "all", "-l")
	if code != exitOK {
		t.Fatalf("-l: exit %d", code)
	}
	for _, p := range allPartsList() {
		if !strings.Contains(stdout, p[0]+"  ") {
			t.Errorf("-l does not list %s:\n%s", p[0], stdout)
		}
	}
	_, stderr, code := cli(t, "bench", "all", "-t", "bogus", "--out", t.TempDir())
	if code != exitUsage || !strings.Contains(stderr, `unknown test "bogus"`) {
		t.Errorf("-t bogus: exit %d, %s", code, stderr)
	}
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	if _, stderr, code := cli(t, "bench", "all", "--quick", "--quiet", "-t", "pin", "--out", dir); code != exitOK {
		t.Fatalf("-t pin: exit %d: %s", code, stderr)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "pin.json pin.png" {
		t.Errorf("-t pin wrote %v", names)
	}
}

// TestBenchAllInterrupted: a run canceled in its second test keeps the
// first test's report whole, writes the second's rows so far marked
// partial, runs no later test and exits with the interrupted status.
func TestBenchAllInterrupted(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Cancel as the second test starts: once the first test's report is
	// in place, at the next driver call.
	d.SetHook(func(string) cudadrv.Result {
		if _, err := os.Stat(filepath.Join(dir, "bw.json")); err == nil {
			cancel()
		}
		return cudadrv.Success
	})
	var out, errb strings.Builder
	code := execute(ctx, []string{"bench", "all", "--quick", "--quiet", "-t", "bw,pin,overlap", "--out", dir}, &out, &errb)
	if code != exitInterrupted {
		t.Fatalf("exit %d, want %d: %s", code, exitInterrupted, errb.String())
	}
	ents, _ := os.ReadDir(dir)
	var partial, whole []string
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		if readReport(t, filepath.Join(dir, e.Name())).Meta.Partial {
			partial = append(partial, e.Name())
		} else {
			whole = append(whole, e.Name())
		}
	}
	if len(partial) != 1 || len(partial)+len(whole) > 2 {
		t.Errorf("whole %v, partial %v: want one partial report and no test after it", whole, partial)
	}
}

// TestBenchAllLoad: the load test runs bench load on the weights file and
// adds PyTorch's row beside the loader's; where --python cannot run the
// script, that row is skipped with the reason and the run still succeeds.
func TestBenchAllLoad(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	weights := filepath.Join(dir, "model.bin")
	if err := os.WriteFile(weights, testutil.RandomBytes(1<<20, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, stderr, code := cli(t, "bench", "all", "--quick", "--quiet", "-t", "load", "--weights", weights, "--python", "/nonexistent/python", "--out", out); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rep := readReport(t, filepath.Join(out, "load.json"))
	var loader, torch bool
	for _, r := range rep.Results {
		switch {
		case r.Kind == "loader" && r.Dir == "warm" && !r.Skipped:
			loader = true
		case r.Kind == "torch":
			torch = r.Skipped && strings.Contains(r.Note, "PyTorch reference not run") && r.Size == 1<<20
		}
	}
	if !loader || !torch || rep.Meta.Part != "load" {
		t.Errorf("load report: loader %v, torch %v, part %q: %+v", loader, torch, rep.Meta.Part, rep.Results)
	}
}
