package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/bench"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// execute runs the command tree in-process and returns stdout, stderr and
// the one line main would print for the error ("" on success).
func execute(t *testing.T, args ...string) (stdout, stderr, line string) {
	t.Helper()
	root := newRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		line = describe(err)
	}
	return out.String(), errb.String(), line
}

func TestBenchBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--sizes", "12Q"}, `--sizes: size "12Q": unknown unit "Q"`},
		{[]string{"bench", "--sizes", ""}, "--sizes: empty size list"},
		{[]string{"bench", "--kinds", "pinned,foo"}, `--kinds: unknown kind "foo"`},
		{[]string{"bench", "--dir", "sideways"}, `--dir: unknown direction "sideways"`},
		{[]string{"bench", "--samples", "0"}, "--samples 0: must be from 1 to 1000"},
		{[]string{"bench", "--samples", "x"}, `invalid argument "x" for "--samples"`},
		{[]string{"bench", "--format", "xml"}, `--format: unknown format "xml"`},
		{[]string{"bench", "--device", "-1"}, "--device -1: must be 0 or more"},
		{[]string{"bench", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"bench", "extra"}, `unknown command "extra"`},
		{[]string{"bench", "pin", "--methods", "magic"}, `--methods: unknown pinning method "magic"`},
		{[]string{"bench", "pin", "--sizes", "0"}, "--sizes: size \"0\" is zero"},
		{[]string{"bench", "overlap", "--chunks", "0"}, "--chunks 0: must be from 1 to 4096"},
		{[]string{"bench", "overlap", "--streams", "100"}, "--streams 100: must be from 1 to 64"},
		{[]string{"bench", "overlap", "--chunk-size", "big"}, "--chunk-size: size \"big\": no number"},
		{[]string{"bench", "overlap", "--vecadd-size", "-3"}, "--vecadd-size"},
		{[]string{"zerocopy", "--reuse", "1,0"}, `--reuse: reuse factor "0"`},
		{[]string{"zerocopy", "--size", "1001"}, "--size 1001: must be a multiple of 4 bytes"},
		{[]string{"zerocopy", "--size", "lots"}, "--size: size \"lots\""},
	}
	for _, c := range cases {
		_, _, line := execute(t, c.args...)
		if !strings.Contains(line, c.want) {
			t.Errorf("%v: error line %q, want it to contain %q", c.args, line, c.want)
		}
		if strings.Contains(line, "\n") {
			t.Errorf("%v: error is not one line: %q", c.args, line)
		}
		if code := run(c.args); code != 1 {
			t.Errorf("%v: exit status %d, want 1", c.args, code)
		}
	}
}

// TestBenchNoGPU: every measuring command, on a machine without a driver,
// prints one line saying a GPU is needed and exits 1, writing no report.
func TestBenchNoGPU(t *testing.T) {
	if _, err := cudadrv.Get(); err == nil {
		t.Skip("a driver is present")
	}
	out := filepath.Join(t.TempDir(), "report.txt")
	for _, args := range [][]string{
		{"bench"}, {"bench", "--quiet", "--out", out, "--plot", out + ".svg"}, {"bench", "pin"},
		{"bench", "overlap"}, {"zerocopy", "--format", "json"},
	} {
		stdout, stderr, line := execute(t, args...)
		if !strings.HasPrefix(line, "no NVIDIA driver found: this command needs a GPU") {
			t.Errorf("%v: line %q", args, line)
		}
		if stdout != "" || strings.Contains(stderr, "panic") {
			t.Errorf("%v: stdout %q stderr %q", args, stdout, stderr)
		}
		if code := run(args); code != 1 {
			t.Errorf("%v: exit status %d, want 1", args, code)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a report file was written without a GPU")
	}
}

func TestBenchHelp(t *testing.T) {
	for _, args := range [][]string{{"bench", "--help"}, {"bench", "pin", "--help"}, {"bench", "overlap", "--help"}, {"zerocopy", "--help"}} {
		stdout, _, line := execute(t, args...)
		if line != "" || !strings.Contains(stdout, "--samples") || !strings.Contains(stdout, "--format") {
			t.Errorf("%v: error %q, help:\n%s", args, line, stdout)
		}
	}
	stdout, _, _ := execute(t, "bench", "--help")
	for _, s := range []string{"--kinds", "--sizes", "--dir", "--plot", "--out", "--quiet", "--device", "64KiB,1MiB,16MiB,256MiB"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("bench --help lacks %q", s)
		}
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

// TestGPUBenchCommands runs tiny versions of every command on a GPU and
// checks the reports.
func TestGPUBenchCommands(t *testing.T) {
	testutil.RequireGPU(t)
	dir := t.TempDir()
	jsonOut, svg := filepath.Join(dir, "bw.json"), filepath.Join(dir, "bw.svg")
	_, _, line := execute(t, "bench", "--quiet", "--sizes", "64KiB,1MiB", "--samples", "2", "--format", "json", "--out", jsonOut, "--plot", svg)
	if line != "" {
		t.Fatal(line)
	}
	data, err := os.ReadFile(jsonOut)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(bench.AllKinds())*2*3 || rep.Meta.Device == "" {
		t.Errorf("report: %d results, meta %+v", len(rep.Results), rep.Meta)
	}
	for _, r := range rep.Results {
		if r.Skipped || !r.Verified || r.Median <= 0 {
			t.Errorf("result %+v", r)
		}
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}
	for _, args := range [][]string{
		{"bench", "pin", "--quiet", "--sizes", "1MiB", "--samples", "2"},
		{"bench", "overlap", "--quiet", "--chunks", "4", "--chunk-size", "4MiB", "--vecadd-size", "4MiB", "--samples", "2"},
		{"zerocopy", "--quiet", "--size", "4MiB", "--reuse", "1,2", "--samples", "2", "--format", "csv"},
	} {
		stdout, _, line := execute(t, args...)
		bad := line != "" || stdout == "" || strings.Contains(stdout, "VERIFY FAILED")
		if args[len(args)-1] == "csv" {
			// The CSV header has a "skipped" column: check the cells.
			if err := checkCSV(stdout, 4); err != nil {
				t.Errorf("%v: %v", args, err)
			}
		} else if strings.Contains(stdout, "skipped") {
			bad = true
		}
		if bad {
			t.Errorf("%v: error %q, output:\n%s", args, line, stdout)
		}
		t.Logf("%v:\n%s", args, stdout)
	}
}

// checkCSV parses a CSV report: the header, then rows results each with
// every column, none skipped, all verified, with a positive median.
func checkCSV(out string, rows int) error {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return fmt.Errorf("malformed CSV: %v", err)
	}
	if len(recs) == 0 || !slices.Equal(recs[0], bench.CSVHeader) {
		return fmt.Errorf("header %q, want %q", recs, bench.CSVHeader)
	}
	if len(recs)-1 != rows {
		return fmt.Errorf("%d rows, want %d", len(recs)-1, rows)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for _, r := range recs[1:] {
		if r[col["skipped"]] != "false" || r[col["verified"]] != "true" {
			return fmt.Errorf("row %q: skipped or not verified", r)
		}
		if v, err := strconv.ParseFloat(r[col["median"]], 64); err != nil || v <= 0 {
			return fmt.Errorf("row %q: median %q", r, r[col["median"]])
		}
	}
	return nil
}

func TestMain(m *testing.M) { testutil.Main(m) }

// TestCheckCSV: a zerocopy report from a GPU run is well-formed and
// complete; a skipped, unverified, short or ragged report is not.
func TestCheckCSV(t *testing.T) {
	const h200 = `bench,kind,dir,size_bytes,size,unit,median,min,max,samples,verified,timing,skipped,note
zerocopy,zero-copy,reuse=1,4194304,4MiB,ms,0.086671,0.086655,0.086687,2,true,spin-wait+events,false,1 passes of read_sum_u32 over mapped host memory
zerocopy,explicit,reuse=1,4194304,4MiB,ms,0.0939515,0.093631,0.094272,2,true,spin-wait+events,false,"one H2D copy from pinned memory, 1 passes over device memory"
zerocopy,zero-copy,reuse=2,4194304,4MiB,ms,0.1719835,0.171936,0.172031,2,true,spin-wait+events,false,2 passes of read_sum_u32 over mapped host memory
zerocopy,explicit,reuse=2,4194304,4MiB,ms,0.097104,0.096992,0.097216,2,true,spin-wait+events,false,"one H2D copy from pinned memory, 2 passes over device memory"
`
	if err := checkCSV(h200, 4); err != nil {
		t.Errorf("H200 report: %v", err)
	}
	for name, out := range map[string]string{
		"short":      strings.Join(strings.SplitAfter(h200, "\n")[:3], ""),
		"skipped":    strings.Replace(h200, "events,false,2 passes", "events,true,2 passes", 1),
		"unverified": strings.Replace(h200, "2,true,spin", "2,false,spin", 1),
		"ragged":     strings.Replace(h200, ",false,1 passes", ",1 passes", 1),
		"no header":  strings.SplitN(h200, "\n", 2)[1],
	} {
		if err := checkCSV(out, 4); err == nil {
			t.Errorf("%s report accepted", name)
		}
	}
}

// TestInterruptedRunWritesPartialResults: a canceled context (what SIGINT
// does) stops the run after the current sample; the results so far are
// written to --out and the error line says so.
func TestInterruptedRunWritesPartialResults(t *testing.T) {
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
	out := filepath.Join(t.TempDir(), "bw.json")
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"bench", "--kinds", "pinned", "--sizes", "64KiB", "--samples", "5", "--format", "json", "--out", out})
	err := root.ExecuteContext(ctx)
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(describe(err), "interrupted") {
		t.Fatalf("error %v (%q), want context.Canceled", err, describe(err))
	}
	b, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatal(rerr)
	}
	var rep bench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Samples == 0 || rep.Results[0].Samples >= 5 || !strings.Contains(rep.Results[0].Note, "stopped after") {
		t.Fatalf("partial report %+v", rep.Results)
	}
}
