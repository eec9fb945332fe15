package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// cli runs the command tree in-process as main does (without signal
// handling) and returns stdout, stderr and the exit status.
func cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = execute(t.Context(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// writeFile writes a file under dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fixture returns the path of a saved report of internal/tools/bench's testdata.
func fixture(name string) string {
	return filepath.Join("..", "..", "internal", "tools", "bench", "testdata", name)
}

// TestBadCommandLines: each bad command line is refused before any GPU
// work with exactly one line on stderr that says what is wrong and points
// at --help, nothing on stdout, and exit status 2.
func TestBadCommandLines(t *testing.T) {
	dir := t.TempDir()
	good := fixture("bw.json")
	notJSON := writeFile(t, dir, "notjson.json", "hello\n")
	truncated := writeFile(t, dir, "trunc.json", `{"meta": {"schema_version": 1}, "results": [{"bench": "bw"`)
	empty := writeFile(t, dir, "empty.json", "")
	noMeta := writeFile(t, dir, "nometa.json", `{"results": []}`)
	future := writeFile(t, dir, "future.json", `{"meta": {"schema_version": 99}, "results": []}`)
	noSchema := writeFile(t, dir, "noschema.json", `{"meta": {}, "results": []}`)
	badUnit := writeFile(t, dir, "unit.json", `{"meta": {"schema_version": 1}, "results": [{"bench":"bw","kind":"pinned","dir":"h2d","size":1,"unit":"furlongs","median":1,"min":1,"max":1}]}`)
	unordered := writeFile(t, dir, "order.json", `{"meta": {"schema_version": 1}, "results": [{"bench":"bw","kind":"pinned","dir":"h2d","size":1,"unit":"GB/s","median":1,"min":2,"max":3}]}`)
	extra := writeFile(t, dir, "extra.json", `{"meta": {"schema_version": 1}, "results": []} {}`)
	unknownField := writeFile(t, dir, "field.json", `{"meta": {"schema_version": 1}, "results": [], "bogus": 1}`)
	wrongType := writeFile(t, dir, "type.json", `{"meta": {"schema_version": "one"}, "results": []}`)
	negSize := writeFile(t, dir, "neg.json", `{"meta": {"schema_version": 1}, "results": [{"bench":"bw","kind":"pinned","dir":"h2d","size":-5,"unit":"GB/s"}]}`)
	pinFix, err := os.ReadFile(fixture("pin.json"))
	if err != nil {
		t.Fatal(err)
	}
	otherGPU := writeFile(t, dir, "a100.json", strings.Replace(string(pinFix), "NVIDIA H200", "NVIDIA A100", 1))
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(filepath.Join(dir, "target.json"), link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		env  string // PINMEM_BUDGET, when not empty
		want string
	}{
		{[]string{"frobnicate"}, "", `unknown command "frobnicate"`},
		{[]string{"bench", "extra"}, "", `unknown command "extra" for "pinmem bench"`},
		{[]string{"bench", "--bogus"}, "", "unknown flag: --bogus"},
		{[]string{"bench", "-z"}, "", "unknown shorthand flag: 'z'"},
		{[]string{"bench", "--samples", "x"}, "", `--samples "x": want a whole number`},
		{[]string{"bench", "--samples", "0"}, "", "--samples 0: must be from 1 to 1000"},
		{[]string{"bench", "--samples", "1001"}, "", "--samples 1001"},
		{[]string{"bench", "--device", "-1"}, "", "--device -1: must be 0 or more"},
		{[]string{"bench", "--format", "xml"}, "", `--format "xml": want one of table, json, csv`},
		{[]string{"bench", "--kinds", "pinned,foo"}, "", `--kinds: unknown kind "foo"`},
		{[]string{"bench", "--kinds", ""}, "", "--kinds: empty kind list"},
		{[]string{"bench", "--dirs", "sideways"}, "", `--dirs: unknown direction "sideways"`},
		{[]string{"bench", "--dir", "up"}, "", `--dirs: unknown direction "up"`},
		{[]string{"bench", "--sizes", "12Q"}, "", `size "12Q" has an unknown suffix "Q" (want B, K/Ki/KiB`},
		{[]string{"bench", "--sizes", "-1"}, "", `size "-1" is negative`},
		{[]string{"bench", "--sizes", "99999999999999999999"}, "", `is too large (at most 1TiB)`},
		{[]string{"bench", "--sizes", "1EiB"}, "", `size "1EiB" is too large (at most 1TiB)`},
		{[]string{"bench", "--sizes", "0"}, "", `size "0" is zero`},
		{[]string{"bench", "--sizes", "1.5"}, "", "not a whole number of bytes"},
		{[]string{"bench", "--sizes", ""}, "", "--sizes: empty size list"},
		{[]string{"bench", "--size", "GiB"}, "", "has no number"},
		{[]string{"bench", "--baseline", "pinnned"}, "", `--baseline: unknown kind "pinnned"`},
		{[]string{"bench", "--out", filepath.Join(dir, "missing", "bw.json")}, "", "does not exist"},
		{[]string{"bench", "--out", dir}, "", "is a directory"},
		{[]string{"bench", "-o", link}, "", "is a symbolic link"},
		{[]string{"bench", "--out", "/dev/zero"}, "", "is not a regular file"},
		{[]string{"bench", "--plot", filepath.Join(dir, "bw.gif")}, "", "want a name ending in .svg or .png"},
		{[]string{"bench", "--plot", filepath.Join(dir, "nodir", "bw.png")}, "", "does not exist"},
		{[]string{"bench", "--out", filepath.Join(dir, "same.svg"), "--plot", filepath.Join(dir, "same.svg")}, "", "does not write svg"},
		{[]string{"bench", "--out", filepath.Join(dir, "same.svg"), "--plot", filepath.Join(dir, "same.svg")}, "", "this command does not write svg"},
		// -o takes its format from the extension, and refuses a mismatch.
		{[]string{"bench", "--format", "csv", "-o", filepath.Join(dir, "bw.json")}, "", "names json but --format is csv"},
		{[]string{"doctor", "-o", "json"}, "", "a file named after a format; for that format use --format json"},
		{[]string{"report", good, "-o", filepath.Join(dir, "r.jpeg.png.txt"), "--format", "png"}, "", "names table but --format is png"},
		{[]string{"report", "-", "-"}, "", "standard input can be read once"},
		{[]string{"report", "--format", "markdown", good, otherGPU}, "", "different devices or drivers"},
		{[]string{"bench"}, "foo", `PINMEM_BUDGET="foo": size "foo" has no number`},
		{[]string{"bench", "pin"}, "-1G", `PINMEM_BUDGET="-1G": size "-1G" is negative`},
		{[]string{"bench", "pin", "--methods", "magic"}, "", `--methods: unknown pinning method "magic"`},
		{[]string{"bench", "pin", "--sizes", "4KB,2TiB"}, "", "too large"},
		{[]string{"bench", "pin", "--baseline", "mmap-registered-x"}, "", "--baseline: unknown pinning method"},
		{[]string{"bench", "overlap", "--chunks", "0"}, "", "--chunks 0: must be from 1 to 4096"},
		{[]string{"bench", "overlap", "--streams", "100"}, "", "--streams 100: must be from 1 to 64"},
		{[]string{"bench", "overlap", "--chunk-size", "big"}, "", `--chunk-size: size "big" has no number`},
		{[]string{"bench", "overlap", "--vecadd-size", "-3"}, "", `--vecadd-size: size "-3" is negative`},
		{[]string{"bench", "overlap", "--baseline", "pinned-0streams"}, "", "--baseline: unknown variant"},
		{[]string{"zerocopy", "--reuse", "1,0"}, "", `--reuse: reuse factor "0"`},
		{[]string{"zerocopy", "--sizes", "1001"}, "", "must be a multiple of 4 bytes"},
		{[]string{"zerocopy", "--size", "lots"}, "", `size "lots" has no number`},
		{[]string{"zerocopy", "--baseline", "implicit"}, "", `--baseline: unknown variant "implicit"`},
		{[]string{"bench", "matrix", "--devices", "0,x"}, "", `--devices: device "x"`},
		{[]string{"bench", "matrix", "--sizes", "big"}, "", "--sizes"},
		{[]string{"bench", "matrix", "--dir", "up"}, "", "--dirs"},
		{[]string{"bench", "matrix", "--samples", "0"}, "", "--samples 0"},
		{[]string{"bench", "matrix", "--format", "png"}, "", "--format"},
		{[]string{"doctor", "--format", "csv"}, "", `--format "csv": want one of table, json`},
		{[]string{"doctor", "--json"}, "", "unknown flag: --json"},
		{[]string{"doctor", "extra"}, "", "takes no arguments"},
		{[]string{"version", "--format", "xml"}, "", "--format"},
		{[]string{"report"}, "", "name a result file written with --format json"},
		{[]string{"report", filepath.Join(dir, "nope.json")}, "", "no such file or directory"},
		{[]string{"report", dir}, "", "is a directory"},
		{[]string{"report", notJSON}, "", "not a pinmem report: line 1, column 1"},
		{[]string{"report", truncated}, "", "not a pinmem report: truncated JSON"},
		{[]string{"report", empty}, "", "not a pinmem report: empty input"},
		{[]string{"report", noMeta}, "", `no "meta" object`},
		{[]string{"report", future}, "", "schema version 99 is newer"},
		{[]string{"report", noSchema}, "", "schema_version missing"},
		{[]string{"report", badUnit}, "", `unknown unit "furlongs"`},
		{[]string{"report", unordered}, "", "are not in order"},
		{[]string{"report", extra}, "", "data after the JSON object"},
		{[]string{"report", unknownField}, "", `unknown field "bogus"`},
		{[]string{"report", wrongType}, "", `a JSON string where "meta.schema_version" wants a whole number`},
		{[]string{"report", negSize}, "", "negative size"},
		{[]string{"report", good, "--format", "gif"}, "", `--format "gif"`},
		{[]string{"report", good, "--format", "png"}, "", "name a file with --out"},
		{[]string{"report", good, "--out", dir}, "", "is a directory"},
		{[]string{"report", good, "--baseline", "pinnned"}, "", `--baseline "pinnned": no result of that kind`},
		{[]string{"compare", good}, "", "needs exactly 2 result files"},
		{[]string{"compare", good, good, good}, "", "needs exactly 2 result files"},
		{[]string{"compare", good, notJSON}, "", "not a pinmem report"},
		{[]string{"compare", good, good, "--threshold", "x"}, "", "--threshold"},
		{[]string{"compare", good, good, "--threshold", "150%"}, "", "below 100%"},
		{[]string{"compare", good, good, "--threshold", "-0.1"}, "", "at least 0%"},
		{[]string{"compare", good, good, "--format", "svg"}, "", "--format"},
	}
	if len(cases) < 40 {
		t.Fatalf("%d cases, want at least 40", len(cases))
	}
	for _, c := range cases {
		name := strings.Join(c.args, " ")
		if c.env != "" {
			name = "PINMEM_BUDGET=" + c.env + " " + name
		}
		t.Run(name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv(pinmem.EnvBudget, c.env)
			}
			stdout, stderr, code := cli(t, c.args...)
			if code != exitUsage {
				t.Errorf("exit status %d, want %d (stderr %q)", code, exitUsage, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "pinmem: ") {
				t.Errorf("stderr is not one line: %q", stderr)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q, want it to say %q", stderr, c.want)
			}
			if !strings.Contains(stderr, "--help')") {
				t.Errorf("stderr %q does not point at --help", stderr)
			}
		})
	}
}

// TestBadOutFailsBeforeMeasuring: with a GPU (the fake driver) present, a
// bad --out or --plot path is found before the device is opened: no
// driver call touches memory, and no file appears.
func TestBadOutFailsBeforeMeasuring(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	for _, args := range [][]string{
		{"bench", "--kinds", "pinned", "--sizes", "64KiB", "--out", filepath.Join(dir, "no", "bw.json")},
		{"bench", "--kinds", "pinned", "--sizes", "64KiB", "--plot", filepath.Join(dir, "no", "bw.png")},
		{"bench", "pin", "--sizes", "1MiB", "--out", dir},
		{"bench", "matrix", "--sizes", "64KiB", "--out", filepath.Join(dir, "no", "m.json")},
		{"zerocopy", "--sizes", "64KiB", "--plot", filepath.Join(dir, "z.jpeg")},
		{"bench", "blocks", "--sizes", "16KiB", "--out", filepath.Join(dir, "no", "b.json")},
	} {
		before := d.CallCounts()
		_, stderr, code := cli(t, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, stderr)
		}
		after := d.CallCounts()
		for _, op := range []string{"cuMemAlloc_v2", "cuMemHostAlloc", "cuDevicePrimaryCtxRetain", "cuMemHostRegister_v2"} {
			if after[op] != before[op] {
				t.Errorf("%v: %s called %d times before the path was refused", args, op, after[op]-before[op])
			}
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left behind: %v", ents)
	}
}

// TestFakeRunProvenance: a bench on the fake driver writes its JSON report
// atomically to --out and its plot to --plot; the report carries the
// schema version, the tool, argv, host facts, the device and the
// resolved configuration; exit status 0.
func TestFakeRunProvenance(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	out, plot := filepath.Join(dir, "bw.json"), filepath.Join(dir, "bw.png")
	writeFile(t, dir, "bw.json", "old contents")
	stdout, stderr, code := cli(t, "bench", "--kinds", "pinned,pageable", "--sizes", "64KiB,1MiB", "--dir", "h2d", "--samples", "2",
		"--format", "json", "-o", out, "--plot", plot)
	if code != exitOK || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	rep := readReport(t, out)
	m := rep.Meta
	if m.Schema != bench.SchemaVersion || m.Tool.Name != "pinmem" || m.Tool.GoVersion == "" || m.Partial ||
		!slices.Contains(m.Argv, "--plot") || m.Argv[0] != "pinmem" || m.Host.Cores < 1 || m.Host.OS == "" ||
		len(m.Devices) != 1 || m.Devices[0].Name == "" || m.Devices[0].DriverVersion == 0 {
		t.Errorf("meta %+v", m)
	}
	cfg, _ := m.Config.(map[string]any)
	if cfg == nil || cfg["samples"] != 2.0 || cfg["min_bytes"] == nil || fmt.Sprint(cfg["dirs"]) != "[h2d]" {
		t.Errorf("config %v", m.Config)
	}
	if len(rep.Results) != 4 {
		t.Errorf("%d results, want 4", len(rep.Results))
	}
	checkPNG(t, plot)
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("directory holds %v, want the report and the plot only (no temporary files)", ents)
	}
}

func readReport(t *testing.T, path string) bench.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := bench.ReadReport(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rep
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 400 {
		t.Errorf("%s: %dx%d pixels", path, b.Dx(), b.Dy())
	}
}

// TestSIGINTWritesPartialResults: a SIGINT in the middle of a run stops it
// after the current sample; run writes the results so far to --out as a
// valid report marked partial and exits 130.
func TestSIGINTWritesPartialResults(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	canceled := make(chan struct{})
	canceledBySignal = func() { close(canceled) }
	t.Cleanup(func() { canceledBySignal = nil })
	syncs := 0
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuEventSynchronize" {
			if syncs++; syncs == 3 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGINT)
				// Wait until the handler has canceled the run.
				select {
				case <-canceled:
				case <-time.After(10 * time.Second):
				}
			}
		}
		return cudadrv.Success
	})
	out := filepath.Join(t.TempDir(), "bw.json")
	code := run([]string{"bench", "--kinds", "pinned", "--sizes", "64KiB,1MiB", "--samples", "5", "--quiet", "--format", "json", "--out", out})
	if code != 130 {
		t.Fatalf("exit status %d, want 130", code)
	}
	rep := readReport(t, out)
	if !rep.Meta.Partial || len(rep.Results) != 1 || rep.Results[0].Samples == 0 || rep.Results[0].Samples >= 5 ||
		!strings.Contains(rep.Results[0].Note, "stopped after") {
		t.Fatalf("partial report: partial %v, %+v", rep.Meta.Partial, rep.Results)
	}
}

// TestCanceledRunWritesPartialResults: a canceled context (what the first
// signal does) stops the run; the table on stdout is written and the
// error line says it was interrupted.
func TestCanceledRunWritesPartialResults(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	syncs := 0
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuEventSynchronize" {
			if syncs++; syncs == 3 {
				cancel()
			}
		}
		return cudadrv.Success
	})
	var out, errb bytes.Buffer
	code := execute(ctx, []string{"bench", "--kinds", "pinned", "--sizes", "64KiB", "--samples", "5", "--format", "csv"}, &out, &errb)
	if code != exitInterrupted || !strings.Contains(errb.String(), "interrupted: stopped after the current sample") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil || len(recs) != 2 {
		t.Fatalf("partial CSV %q: %v", out.String(), err)
	}
}

// TestVerificationFailureExits1: when the device round trip of pinned
// memory fails, the result says VERIFY FAILED, the JSON sets
// verify_failed, the report is still written and the exit status is 1.
func TestVerificationFailureExits1(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	if err := d.FailOn("cuMemcpyDtoH_v2", 0, cudadrv.ErrorInvalidValue); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pin.json")
	_, stderr, code := cli(t, "bench", "pin", "--methods", "hostalloc", "--sizes", "1MiB", "--samples", "1", "--quiet", "--format", "json", "-o", out)
	if code != exitProblem || !strings.Contains(stderr, "verification failed in 2 result(s)") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	rep := readReport(t, out)
	for _, r := range rep.Results {
		if !r.VerifyFailed || !strings.Contains(r.Note, "VERIFY FAILED") {
			t.Errorf("result %+v", r)
		}
	}
}

// TestAllSkippedExits1: a run in which every result was skipped (a budget
// of one byte refuses every pinned buffer; the fake has no kernels for
// zerocopy) writes its report and exits 1.
func TestAllSkippedExits1(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	prev := pinmem.SetBudget(1)
	defer pinmem.SetBudget(prev)
	for _, args := range [][]string{
		{"bench", "--kinds", "pinned,portable", "--sizes", "64KiB", "--samples", "1", "--quiet"},
		{"zerocopy", "--sizes", "64KiB", "--samples", "1", "--quiet"},
	} {
		stdout, stderr, code := cli(t, args...)
		if code != exitProblem || !strings.Contains(stderr, "every result was skipped") || !strings.Contains(stdout, "skipped") {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s", args, code, stderr, stdout)
		}
	}
}

// TestNoGPU: every measuring command, on a machine without a driver,
// prints one line saying a GPU is needed and exits 3, writing no report;
// doctor still reports and exits 0, and doctor --strict exits 3 as the
// others do.
func TestNoGPU(t *testing.T) {
	if _, err := cudadrv.Get(); err == nil {
		t.Skip("a driver is present")
	}
	out := filepath.Join(t.TempDir(), "report.txt")
	for _, args := range [][]string{
		{"bench"}, {"bench", "--quiet", "--out", out, "--plot", out + ".svg"}, {"bench", "pin"},
		{"bench", "overlap"}, {"zerocopy", "--format", "json"}, {"bench", "matrix"}, {"bench", "blocks"},
		{"bench", "all", "--quiet", "--out", filepath.Join(t.TempDir(), "all")},
	} {
		stdout, stderr, code := cli(t, args...)
		if code != exitNoGPU || !strings.HasPrefix(stderr, "pinmem: no NVIDIA driver found: this command needs a GPU") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
		if stdout != "" {
			t.Errorf("%v: stdout %q", args, stdout)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a report file was written without a GPU")
	}
	stdout, _, code := cli(t, "doctor")
	if code != exitOK || !strings.Contains(stdout, "problem  driver: no NVIDIA driver found") || !strings.Contains(stdout, "bench          will not work") {
		t.Errorf("doctor: exit %d\n%s", code, stdout)
	}
	if _, stderr, code := cli(t, "doctor", "--strict"); code != exitNoGPU || !strings.Contains(stderr, "no NVIDIA driver found") {
		t.Errorf("doctor --strict: exit %d, %q", code, stderr)
	}
}

// TestDoctorFake: on the fake driver doctor reports verdicts, the budget
// and its source (PINMEM_BUDGET), the commands, as text and JSON; a bad
// PINMEM_BUDGET is a problem that --strict turns into exit status 1.
func TestDoctorFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	t.Setenv(pinmem.EnvBudget, "8GiB")
	stdout, _, code := cli(t, "doctor", "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	var r struct {
		Checks []struct{ Name, Level, Detail, Advice string }
		Budget struct {
			Bytes  int64
			Source string
		}
		Commands []struct {
			Name  string
			Works bool
		}
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if r.Budget.Source != "PINMEM_BUDGET=8GiB" || len(r.Checks) < 4 || len(r.Commands) < 8 {
		t.Errorf("doctor JSON: %+v", r)
	}
	for _, c := range r.Checks {
		if c.Level != "ok" && c.Level != "warning" && c.Level != "problem" || c.Level != "ok" && c.Advice == "" && c.Name != "huge pages" {
			t.Errorf("check %+v", c)
		}
	}
	t.Setenv(pinmem.EnvBudget, "lots")
	stdout, _, code = cli(t, "doctor")
	if code != exitOK || !strings.Contains(stdout, "problem  budget:") || !strings.Contains(stdout, `PINMEM_BUDGET="lots" does not parse`) {
		t.Errorf("doctor with a bad budget: exit %d\n%s", code, stdout)
	}
	if _, _, code := cli(t, "doctor", "--strict"); code != exitProblem {
		t.Errorf("doctor --strict with a bad budget: exit %d", code)
	}
}

// TestReportFixtures renders every saved report of internal/tools/bench's
// testdata in every format.
func TestReportFixtures(t *testing.T) {
	files, _ := filepath.Glob(fixture("*.json"))
	if len(files) < 5 {
		t.Fatalf("fixtures: %v", files)
	}
	for _, f := range files {
		renderAll(t, f)
	}
}

// TestReportDocsResults renders every result file committed under
// docs/results in every format, as CI does to keep the README's figures
// reproducible from the saved data.
func TestReportDocsResults(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "results", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Log("docs/results holds no result files yet: nothing to render")
		return
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".schema.json") || filepath.Base(f) == "doctor.json" {
			continue
		}
		renderAll(t, f)
		// A committed plot of the file must be what report draws from it.
		committed := strings.TrimSuffix(f, ".json") + ".png"
		old, err := os.ReadFile(committed)
		if err != nil {
			continue
		}
		fresh := filepath.Join(t.TempDir(), "fresh.png")
		if _, stderr, code := cli(t, "report", f, "--format", "png", "-o", fresh); code != exitOK {
			t.Fatalf("report %s: %s", f, stderr)
		}
		a, errA := png.DecodeConfig(bytes.NewReader(old))
		nb, _ := os.ReadFile(fresh)
		b, errB := png.DecodeConfig(bytes.NewReader(nb))
		switch {
		case errA != nil || errB != nil:
			t.Errorf("%s: %v, %v", committed, errA, errB)
		case a.Width != b.Width || a.Height != b.Height:
			t.Errorf("%s is %dx%d; pinmem report draws %dx%d from %s: re-render it", committed, a.Width, a.Height, b.Width, b.Height, f)
		case !bytes.Equal(old, nb):
			t.Logf("%s differs in its pixels from a fresh rendering (same size): fonts or rasterization differ here", committed)
		}
	}
	t.Logf("rendered %d result file(s) from docs/results", len(files))
}

// renderAll runs `pinmem report` on file in every format and checks each.
func renderAll(t *testing.T, file string) {
	t.Helper()
	dir := t.TempDir()
	rep := readReport(t, file)
	for _, format := range []string{"table", "csv", "json", "svg", "png"} {
		out := filepath.Join(dir, strings.TrimSuffix(filepath.Base(file), ".json")+"."+format)
		if _, stderr, code := cli(t, "report", file, "--format", format, "-o", out); code != exitOK {
			t.Errorf("report %s --format %s: exit %d, %s", file, format, code, stderr)
			continue
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		switch format {
		case "table":
			if !strings.Contains(string(data), "# "+file) || strings.Count(string(data), "\n") < 3 {
				t.Errorf("%s table:\n%s", file, data)
			}
		case "csv":
			recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
			if err != nil || len(recs) != len(rep.Results)+1 {
				t.Errorf("%s csv: %d records, %v", file, len(recs), err)
			}
		case "json":
			back, err := bench.ReadReport(bytes.NewReader(data))
			if err != nil || len(back.Results) != len(rep.Results) || back.Meta.Command != rep.Meta.Command {
				t.Errorf("%s json round trip: %v", file, err)
			}
		case "svg":
			if !bytes.Contains(data, []byte("<svg")) || len(data) < 2000 {
				t.Errorf("%s svg: %d bytes", file, len(data))
			}
		case "png":
			checkPNG(t, out)
		}
	}
}

// TestCompare: compare pairs the results of two runs as ratios; with
// --threshold a drop beyond it is a regression: listed, exit status 1.
func TestCompare(t *testing.T) {
	dir := t.TempDir()
	a := readReport(t, fixture("bw.json"))
	b := a
	b.Results = slices.Clone(a.Results)
	for i, r := range b.Results {
		if r.Kind == bench.KindPinned && r.Dir == bench.DirH2D && r.Size == 256<<20 {
			b.Results[i].Median, b.Results[i].Min, b.Results[i].Max = r.Median*0.9, r.Min*0.9, r.Max*0.9
		}
	}
	b.Results = b.Results[:len(b.Results)-1] // one result only in A
	var buf bytes.Buffer
	if err := bench.WriteJSON(&buf, b.Meta, b.Results); err != nil {
		t.Fatal(err)
	}
	pa, pb := fixture("bw.json"), writeFile(t, dir, "b.json", buf.String())
	stdout, stderr, code := cli(t, "compare", pa, pb)
	if code != exitOK || !strings.Contains(stdout, "0.900x") || !strings.Contains(stdout, "1.000x") ||
		!strings.Contains(stdout, "1 result(s) only in A, 0 only in B") || strings.Contains(stdout, "REGRESSION") {
		t.Errorf("compare: exit %d, %s\n%s", code, stderr, stdout)
	}
	stdout, stderr, code = cli(t, "compare", pa, pb, "--threshold", "5%")
	if code != exitProblem || strings.Count(stdout, "REGRESSION") != 1 || !strings.Contains(stderr, "1 regression(s) beyond 5%: bw pinned h2d 256MiB 0.900x") {
		t.Errorf("compare --threshold 5%%: exit %d, %q\n%s", code, stderr, stdout)
	}
	if _, _, code := cli(t, "compare", pa, pb, "--threshold", "0.2"); code != exitOK {
		t.Errorf("compare --threshold 0.2: exit %d", code)
	}
	stdout, _, code = cli(t, "compare", pa, pb, "--threshold", "5%", "--format", "csv")
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if code != exitProblem || err != nil || len(recs) != len(b.Results)+1 {
		t.Errorf("compare csv: exit %d, %d records, %v", code, len(recs), err)
	}
	regressions := 0
	for _, r := range recs[1:] {
		if r[9] == "true" {
			regressions++
		}
	}
	if regressions != 1 {
		t.Errorf("csv lists %d regressions, want 1", regressions)
	}
	stdout, _, _ = cli(t, "compare", pa, pb, "--format", "json")
	var j struct{ Results []comparisonRow }
	if err := json.Unmarshal([]byte(stdout), &j); err != nil || len(j.Results) != len(b.Results) {
		t.Errorf("compare json: %v, %d rows", err, len(j.Results))
	}
	// A slower median whose samples overlap A's is noise, not a regression.
	c := a
	c.Results = slices.Clone(a.Results)
	for i, r := range c.Results {
		if r.Kind == bench.KindPinned && r.Dir == bench.DirH2D && r.Size == 256<<20 {
			c.Results[i].Median, c.Results[i].Min = r.Median*0.9, r.Min*0.85
			c.Results[i].Max = r.Max
		}
	}
	buf.Reset()
	if err := bench.WriteJSON(&buf, c.Meta, c.Results); err != nil {
		t.Fatal(err)
	}
	pc := writeFile(t, dir, "c.json", buf.String())
	if stdout, stderr, code := cli(t, "compare", pa, pc, "--threshold", "5%"); code != exitOK || !strings.Contains(stdout, "0.900x (noise)") {
		t.Errorf("compare within the spread: exit %d, %s\n%s", code, stderr, stdout)
	}
	// Different devices are refused, or compared with a warning.
	d := a
	d.Meta.Device = "NVIDIA A100 (device 0)"
	buf.Reset()
	if err := bench.WriteJSON(&buf, d.Meta, d.Results); err != nil {
		t.Fatal(err)
	}
	pd := writeFile(t, dir, "a100.json", buf.String())
	if _, stderr, code := cli(t, "compare", pa, pd); code != exitUsage || !strings.Contains(stderr, "devices differ") {
		t.Errorf("compare across devices: exit %d, %q", code, stderr)
	}
	if _, stderr, code := cli(t, "compare", pa, pd, "--across-devices"); code != exitOK || !strings.Contains(stderr, "WARNING: devices differ") {
		t.Errorf("compare --across-devices: exit %d, %q", code, stderr)
	}
	// Nothing in common is a problem too.
	pz := fixture("zerocopy.json")
	if _, stderr, code := cli(t, "compare", pa, pz); code != exitProblem || !strings.Contains(stderr, "no result in common") {
		t.Errorf("compare of unrelated runs: exit %d, %q", code, stderr)
	}
}

// TestVersion: --version and `version` say the module version, VCS
// revision, dirty flag and Go version from the build info.
func TestVersion(t *testing.T) {
	stdout, _, code := cli(t, "--version")
	if code != exitOK || !strings.HasPrefix(stdout, "pinmem ") || !strings.Contains(stdout, "go1.") {
		t.Errorf("--version: %d %q", code, stdout)
	}
	old := readBuildInfo
	defer func() { readBuildInfo = old }()
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/pinmem/pinmem", Version: "v0.1.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	stdout, _, _ = cli(t, "version")
	if !strings.HasPrefix(stdout, "pinmem v0.1.0 (revision abc123, modified), go1.26.0 ") {
		t.Errorf("version: %q", stdout)
	}
	stdout, _, _ = cli(t, "version", "--format", "json")
	var tool bench.Tool
	if err := json.Unmarshal([]byte(stdout), &tool); err != nil || tool.Modified == nil || !*tool.Modified ||
		(bench.Tool{Name: tool.Name, Version: tool.Version, Revision: tool.Revision, GoVersion: tool.GoVersion, Platform: tool.Platform, Changelog: tool.Changelog}) != (bench.Tool{Name: "pinmem", Version: "v0.1.0", Revision: "abc123", GoVersion: "go1.26.0", Platform: runtime.GOOS + "/" + runtime.GOARCH, Changelog: changelogVersion}) {
		t.Errorf("version json: %+v, %v", tool, err)
	}
	// A build without VCS information (a git worktree, GOFLAGS=-buildvcs=false)
	// takes the revision the build scripts stamp at link time.
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/pinmem/pinmem", Version: "(devel)"}}, true
	}
	stdout, _, _ = cli(t, "version")
	if !strings.Contains(stdout, "revision unknown") {
		t.Errorf("version without a revision: %q", stdout)
	}
	oldRev := stampedRevision
	defer func() { stampedRevision = oldRev }()
	stampedRevision = "f7fe20b"
	stdout, _, _ = cli(t, "version")
	if !strings.HasPrefix(stdout, "pinmem (devel) (revision f7fe20b), go1.26.0 "+runtime.GOOS+"/"+runtime.GOARCH) {
		t.Errorf("version with a stamped revision: %q", stdout)
	}
}

// TestOutputConventions: -o takes its format from the extension, -o -
// and /dev/stdout write standard output, and report - reads standard
// input.
func TestOutputConventions(t *testing.T) {
	dir := t.TempDir()
	csvOut := filepath.Join(dir, "bw.csv")
	if _, stderr, code := cli(t, "report", fixture("bw.json"), "-o", csvOut); code != exitOK {
		t.Fatalf("report -o bw.csv: exit %d, %s", code, stderr)
	}
	data, _ := os.ReadFile(csvOut)
	if !strings.HasPrefix(string(data), strings.Join(bench.CSVHeader, ",")+"\n") {
		t.Errorf("-o bw.csv did not write CSV: %.80q", data)
	}
	mdOut := filepath.Join(dir, "perf.md")
	if _, stderr, code := cli(t, "report", fixture("bw.json"), fixture("pin.json"), "-o", mdOut); code != exitOK {
		t.Fatalf("report -o perf.md: exit %d, %s", code, stderr)
	}
	if data, _ := os.ReadFile(mdOut); !strings.HasPrefix(string(data), "# Performance\n") {
		t.Errorf("-o perf.md did not write markdown: %.80q", data)
	}
	for _, o := range []string{"-", "/dev/stdout"} {
		stdout, stderr, code := cli(t, "report", fixture("bw.json"), "--format", "json", "-o", o)
		if code != exitOK || !strings.HasPrefix(stdout, "{") {
			t.Errorf("-o %s: exit %d, %s, stdout %.40q", o, code, stderr, stdout)
		}
	}
	in, _ := os.ReadFile(fixture("pin.json"))
	var out, errb bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"report", "-", "--format", "csv"})
	root.SetIn(bytes.NewReader(in))
	root.SetOut(&out)
	root.SetErr(&errb)
	if err := root.ExecuteContext(t.Context()); err != nil || !strings.Contains(out.String(), "\n-,") || !strings.Contains(out.String(), ",pin,hostalloc,") {
		t.Errorf("report - from stdin: %v, %s, %.200q", err, errb.String(), out.String())
	}
}

// TestEveryHelpHasExitStatus: every command's help ends with the exit
// statuses.
func TestEveryHelpHasExitStatus(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Name() != "completion" && c.Name() != "help" && c.Parent() != nil && c.Parent().Name() != "completion" {
			stdout, _, code := cli(t, append(strings.Fields(strings.TrimPrefix(c.CommandPath(), "pinmem")), "--help")...)
			if code != exitOK || !strings.Contains(stdout, "Exit status:") || !strings.Contains(stdout, "3    no NVIDIA driver") {
				t.Errorf("%s --help: exit %d, no exit statuses", c.CommandPath(), code)
			}
			n++
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
	if n < 12 {
		t.Errorf("checked %d commands", n)
	}
}

// TestMatrixTakesDeviceAndBaseline: bench matrix takes the --device and
// --baseline every measuring command has (checked before any GPU work).
func TestMatrixTakesDeviceAndBaseline(t *testing.T) {
	if _, stderr, code := cli(t, "bench", "matrix", "--device", "x"); code != exitUsage || !strings.Contains(stderr, "--devices") {
		t.Errorf("--device x: exit %d, %s", code, stderr)
	}
	if _, stderr, code := cli(t, "bench", "matrix", "--baseline", "pinned"); code != exitUsage || !strings.Contains(stderr, "want gpuN or all") {
		t.Errorf("--baseline pinned: exit %d, %s", code, stderr)
	}
	testutil.UseFake(t, fakedrv.Options{DeviceCount: 2})
	stdout, stderr, code := cli(t, "bench", "matrix", "--device", "0,1", "--baseline", "gpu0", "--size", "64KiB", "--samples", "1", "--quiet")
	if code != exitOK || !strings.Contains(stdout, "VS GPU0") {
		t.Errorf("matrix --device 0,1 --baseline gpu0: exit %d, %s\n%s", code, stderr, stdout)
	}
}

// TestHelp: the help says the exit statuses and the shared flags.
func TestHelp(t *testing.T) {
	stdout, _, code := cli(t, "--help")
	if code != exitOK || !strings.Contains(stdout, "Exit status:") || !strings.Contains(stdout, "3    no NVIDIA driver") {
		t.Errorf("--help:\n%s", stdout)
	}
	for _, args := range [][]string{{"bench", "--help"}, {"bench", "pin", "--help"}, {"bench", "overlap", "--help"}, {"zerocopy", "--help"}, {"bench", "matrix", "--help"}, {"bench", "blocks", "--help"}} {
		stdout, _, code := cli(t, args...)
		for _, f := range []string{"--samples", "--format", "-o, --out", "--plot", "--quiet"} {
			if code != exitOK || !strings.Contains(stdout, f) {
				t.Errorf("%v lacks %q:\n%s", args, f, stdout)
			}
		}
	}
	stdout, _, _ = cli(t, "bench", "--help")
	for _, s := range []string{"--kinds", "--sizes", "--dirs", "--device", "64KiB,1MiB,16MiB,256MiB", "mmap-register"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("bench --help lacks %q", s)
		}
	}
}

// TestCompletion: flag values complete from the known names.
func TestCompletion(t *testing.T) {
	stdout, _, _ := cli(t, "__complete", "bench", "--kinds", "pinned,")
	if !strings.Contains(stdout, "pinned,mmap-register") || !strings.Contains(stdout, "pinned,write-combined") {
		t.Errorf("--kinds completion:\n%s", stdout)
	}
	stdout, _, _ = cli(t, "__complete", "bench", "pin", "--methods", "")
	if !strings.Contains(stdout, "malloc+register") {
		t.Errorf("--methods completion:\n%s", stdout)
	}
	stdout, _, _ = cli(t, "__complete", "report", "x.json", "--format", "")
	for _, f := range []string{"table", "csv", "json", "svg", "png"} {
		if !strings.Contains(stdout, f+"\n") {
			t.Errorf("report --format completion lacks %s:\n%s", f, stdout)
		}
	}
}

// TestProgress: no progress on a stderr that is not a terminal; on a
// terminal, a bar with the count of finished measurements.
func TestProgress(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	args := []string{"bench", "--kinds", "pinned", "--sizes", "64KiB,1MiB", "--dirs", "h2d,d2h", "--samples", "1"}
	_, stderr, code := cli(t, args...)
	if code != exitOK || strings.Contains(stderr, "4/4") || strings.Contains(stderr, "GB/s") {
		t.Errorf("progress on a non-terminal: %q", stderr)
	}
	old := isTerminal
	defer func() { isTerminal = old }()
	isTerminal = func(io.Writer) bool { return true }
	_, stderr, _ = cli(t, args...)
	if !strings.Contains(stderr, "4/4") {
		t.Errorf("progress on a terminal: %q", stderr)
	}
	_, stderr, _ = cli(t, append(args, "--quiet")...)
	if stderr != "" {
		t.Errorf("progress with --quiet: %q", stderr)
	}
}

// TestAtomicWriteRefusesSymlink: writeAtomic replaces a file whole and
// never writes through a symbolic link.
func TestAtomicWriteRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := writeFile(t, dir, "target", "keep")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := writeAtomic(link, []byte("new")); err == nil {
		t.Error("writeAtomic wrote through a symbolic link")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("link target changed to %q", b)
	}
	p := filepath.Join(dir, "f")
	for _, s := range []string{"one", "two"} {
		if err := writeAtomic(p, []byte(s)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != s {
			t.Errorf("contents %q, want %q", b, s)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("directory holds %v", ents)
	}
}

func TestParseReuse(t *testing.T) {
	got, err := parseReuse(" 1,2, 4,8 ")
	if err != nil || len(got) != 4 || got[3] != 8 {
		t.Errorf("parseReuse = %v, %v", got, err)
	}
	for _, s := range []string{"", "a", "0", "2000", "1,,x"} {
		if _, err := parseReuse(s); err == nil {
			t.Errorf("parseReuse(%q) succeeded", s)
		}
	}
}

func TestParseThreshold(t *testing.T) {
	for in, want := range map[string]float64{"": -1, "5%": 0.05, "0.05": 0.05, "0": 0, "99.5%": 0.995} {
		if got, err := parseThreshold(in); err != nil || got != want {
			t.Errorf("parseThreshold(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "100%", "1", "-1%", "NaN", "Inf"} {
		if _, err := parseThreshold(in); err == nil {
			t.Errorf("parseThreshold(%q) succeeded", in)
		}
	}
}

// TestErroredRunExits1: a run that fails part-way (device memory refused)
// writes what it has, marked partial, and exits 1 with the reason.
func TestErroredRunExits1(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	if err := d.FailOn("cuMemAlloc_v2", 0, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "bw.json")
	_, stderr, code := cli(t, "bench", "--kinds", "pinned", "--sizes", "64KiB", "--quiet", "--format", "json", "-o", out)
	if code != exitProblem || !strings.Contains(stderr, "device buffer of 64KiB") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if rep := readReport(t, out); !rep.Meta.Partial {
		t.Errorf("report not marked partial: %+v", rep.Meta)
	}
}
