package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
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
	// The tests measured outside internal/tools/bench are skipped without their
	// inputs, with a line each.
	for _, want := range []string{"load: skipped (no --weights FILE)", "imagepipeline: skipped (no --imagepipeline BIN)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("no line %q in:\n%s", want, stderr)
		}
	}
	if !strings.Contains(stderr, "render it with: pinmem report --format markdown "+filepath.Join(dir, "*.json")) {
		t.Errorf("the last line does not say how to render the run:\n%s", stderr)
	}
	// Each finished measurement is a line under its test's.
	if !strings.Contains(stderr, "bw: every kind of host memory") || !strings.Contains(stderr, "\n  bw pinned h2d 64KiB: ") {
		t.Errorf("no indented measurement lines under the tests' in:\n%s", stderr)
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
	// A test named without its input, or an input that is not a program,
	// is a usage error before any GPU work (there is no driver yet).
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-t", "load"}, "needs --weights FILE"},
		{[]string{"-t", "pin,imagepipeline"}, "needs --imagepipeline BIN"},
		{[]string{"--imagepipeline", filepath.Join(t.TempDir(), "none")}, "not an executable file"},
		{[]string{"--plot-format", "gif"}, "want png or svg"},
		{[]string{"--samples", "-1"}, "--samples -1: must be from 0"},
		{[]string{"--device", "-1"}, "--device -1: must be 0 or more"},
		{[]string{"--cref", filepath.Join(t.TempDir(), "none")}, "not a directory"},
		{[]string{"--out", ""}, "--out DIR: name the directory"},
	} {
		_, stderr, code := cli(t, append([]string{"bench", "all", "--out", t.TempDir()}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %s; want usage error %q", c.args, code, stderr, c.want)
		}
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

// TestBenchAllImagePipeline: bench all runs the image pipeline program
// with -json on the run's device, and its rows (here a stand-in's, in the
// form examples/imagepipeline/measure -json prints) become
// imagepipeline.json, valid and with each row's same-run reference, its
// plot and a section of the rendered docs; its table is kept as text. A
// program that fails keeps the rows it printed, marked partial, and the
// run exits 1.
func TestBenchAllImagePipeline(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	result, _ := schemas(t)
	dir := t.TempDir()
	rows := `{"bench":"imagepipeline","kind":"naive","dir":"320x240","size":307200,"unit":"FPS","median":100,"min":90,"max":110,"samples":2,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"pinned-1stream","dir":"320x240","size":307200,"unit":"FPS","median":300,"min":290,"max":310,"samples":2,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"pinned-4streams","dir":"320x240","size":307200,"unit":"FPS","median":380,"min":370,"max":390,"samples":2,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"pipeline","dir":"320x240","size":307200,"unit":"FPS","median":200,"min":190,"max":210,"samples":2,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"bound","dir":"320x240","size":307200,"unit":"FPS","median":400,"min":400,"max":400,"samples":0,"verified":false,"timing":"computed","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"staged-bound","dir":"320x240","size":307200,"unit":"FPS","median":250,"min":250,"max":250,"samples":0,"verified":false,"timing":"computed","skipped":false,"verify_failed":false}
{"bench":"imagepipeline","kind":"c:naive","dir":"320x240","size":307200,"unit":"FPS","median":125,"min":120,"max":130,"samples":2,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}`
	prog := filepath.Join(dir, "imagepipeline")
	script := "#!/bin/sh\necho \"$@\" > " + filepath.Join(dir, "args") + "\necho 'imagepipeline: the table' >&2\ncat <<'EOF'\n" + rows + "\nEOF\n"
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, stderr, code := cli(t, "bench", "all", "--quick", "--quiet", "-t", "imagepipeline", "--imagepipeline", prog, "--out", out); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if args, _ := os.ReadFile(filepath.Join(dir, "args")); !strings.Contains(string(args), "-json -device 0 -res 320x240") {
		t.Errorf("the program ran with %q, want -json on device 0 at quick sizes", args)
	}
	if text, _ := os.ReadFile(filepath.Join(out, "imagepipeline.txt")); string(text) != "imagepipeline: the table\n" {
		t.Errorf("imagepipeline.txt = %q, want the program's table", text)
	}
	path := filepath.Join(out, "imagepipeline.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(t, result, path, data); err != nil {
		t.Errorf("imagepipeline.json: %v", err)
	}
	rep := readReport(t, path)
	refs := map[string]string{}
	for _, r := range rep.Results {
		refs[r.Kind] = fmt.Sprintf("%s %.2f", r.Ref, r.Ratio)
	}
	want := map[string]string{"naive": "c:naive 0.80", "pinned-1stream": "bound 0.75", "pinned-4streams": "bound 0.95", "pipeline": "staged-bound 0.80", "bound": " 0.00", "c:naive": " 0.00"}
	for k, w := range want {
		if refs[k] != w {
			t.Errorf("%s: reference %q, want %q", k, refs[k], w)
		}
	}
	if m := rep.Meta; m.Part != "imagepipeline" || m.Partial || m.Timing != imagePipelineTiming || !strings.Contains(m.Note, "quick run") || !strings.HasPrefix(m.Device, "Fake ") {
		t.Errorf("meta %+v", m)
	}
	if _, err := os.Stat(filepath.Join(out, "imagepipeline.png")); err != nil {
		t.Errorf("no plot: %v", err)
	}
	md, stderr, code := cli(t, "report", "--format", "markdown", path)
	if code != exitOK || !strings.Contains(md, "## The image pipeline") || !strings.Contains(md, "| imagepipeline | pipeline | 320x240 |") {
		t.Errorf("markdown: exit %d %s\n%s", code, stderr, md)
	}

	// A program that fails after some rows: they are kept, the report is
	// partial, and the run says so with the program's last line.
	script = "#!/bin/sh\nhead -n 2 <<'EOF'\n" + rows + "\nEOF\necho 'imagepipeline: 4K: output frame 3 wrong' >&2\nexit 1\n"
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = cli(t, "bench", "all", "--quiet", "-t", "imagepipeline", "--imagepipeline", prog, "--out", out)
	if code != exitProblem || !strings.Contains(stderr, "output frame 3 wrong") {
		t.Errorf("failing program: exit %d, %s", code, stderr)
	}
	if rep := readReport(t, path); !rep.Meta.Partial || len(rep.Results) != 2 {
		t.Errorf("after a failure: partial %v, %d rows", rep.Meta.Partial, len(rep.Results))
	}
}

// TestBenchAllImagePipelineInterrupted: an interrupt while the image
// pipeline program runs stops it, keeps the rows it printed in a partial
// report and exits with the interrupted status.
func TestBenchAllImagePipelineInterrupted(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	if err := syscall.Mkfifo(ready, 0o600); err != nil {
		t.Skip("no named pipes here:", err)
	}
	row := `{"bench":"imagepipeline","kind":"naive","dir":"4K","size":33177600,"unit":"FPS","median":10,"min":9,"max":11,"samples":3,"verified":true,"timing":"wall","skipped":false,"verify_failed":false}`
	prog := filepath.Join(dir, "imagepipeline")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\necho '"+row+"'\necho > "+ready+"\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// Opening the pipe waits for the program to have printed its row.
		if f, err := os.Open(ready); err == nil {
			f.Close()
		}
		cancel()
	}()
	out := filepath.Join(dir, "out")
	var stdout, stderr strings.Builder
	code := execute(ctx, []string{"bench", "all", "--quiet", "-t", "imagepipeline", "--imagepipeline", prog, "--out", out}, &stdout, &stderr)
	if code != exitInterrupted {
		t.Fatalf("exit %d, want %d: %s", code, exitInterrupted, stderr.String())
	}
	if rep := readReport(t, filepath.Join(out, "imagepipeline.json")); !rep.Meta.Partial || len(rep.Results) != 1 {
		t.Errorf("partial %v, %d rows: want the one row printed, marked partial", rep.Meta.Partial, len(rep.Results))
	}
}
