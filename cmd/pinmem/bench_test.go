package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUBenchCommands runs tiny versions of every command on a GPU and
// checks the reports.
func TestGPUBenchCommands(t *testing.T) {
	testutil.RequireGPU(t)
	dir := t.TempDir()
	jsonOut, svg := filepath.Join(dir, "bw.json"), filepath.Join(dir, "bw.svg")
	if _, stderr, code := cli(t, "bench", "--quiet", "--sizes", "64KiB,1MiB", "--samples", "2", "--format", "json", "--out", jsonOut, "--plot", svg); code != exitOK {
		t.Fatal(stderr)
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
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}
	for _, args := range [][]string{
		{"bench", "pin", "--quiet", "--sizes", "1MiB", "--samples", "2"},
		{"bench", "overlap", "--quiet", "--chunks", "4", "--chunk-size", "4MiB", "--vecadd-size", "4MiB", "--samples", "2"},
		{"zerocopy", "--quiet", "--sizes", "4MiB", "--reuse", "1,2", "--samples", "2", "--format", "csv"},
	} {
		stdout, line, code := cli(t, args...)
		bad := code != exitOK || stdout == "" || strings.Contains(stdout, "VERIFY FAILED")
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

// TestCheckCSV: a zerocopy report from a GPU run is well-formed and
// complete; a skipped, unverified, short or ragged report is not.
func TestCheckCSV(t *testing.T) {
	const h200 = `file,device,bench,kind,dir,size_bytes,size,unit,median,min,max,samples,verified,timing,skipped,path,ref,ratio,note
,NVIDIA H200 (device 0),zerocopy,zero-copy,reuse=1,4194304,4MiB,ms,0.086671,0.086655,0.086687,2,true,spin-wait+events,false,,explicit,1.084,1 passes of read_sum_u32 over mapped host memory
,NVIDIA H200 (device 0),zerocopy,explicit,reuse=1,4194304,4MiB,ms,0.0939515,0.093631,0.094272,2,true,spin-wait+events,false,,,,"one H2D copy from pinned memory, 1 passes over device memory"
,NVIDIA H200 (device 0),zerocopy,zero-copy,reuse=2,4194304,4MiB,ms,0.1719835,0.171936,0.172031,2,true,spin-wait+events,false,,explicit,0.565,2 passes of read_sum_u32 over mapped host memory
,NVIDIA H200 (device 0),zerocopy,explicit,reuse=2,4194304,4MiB,ms,0.097104,0.096992,0.097216,2,true,spin-wait+events,false,,,,"one H2D copy from pinned memory, 2 passes over device memory"
`
	if err := checkCSV(h200, 4); err != nil {
		t.Errorf("H200 report: %v", err)
	}
	for name, out := range map[string]string{
		"short":      strings.Join(strings.SplitAfter(h200, "\n")[:3], ""),
		"skipped":    strings.Replace(h200, "events,false,,explicit,0.565", "events,true,,explicit,0.565", 1),
		"unverified": strings.Replace(h200, "2,true,spin", "2,false,spin", 1),
		"ragged":     strings.Replace(h200, ",1.084,1 passes", ",1 passes", 1),
		"no header":  strings.SplitN(h200, "\n", 2)[1],
	} {
		if err := checkCSV(out, 4); err == nil {
			t.Errorf("%s report accepted", name)
		}
	}
}

// TestBenchMatrixFake runs the command on a fake driver with two devices
// (structure only: the fake's figures mean nothing).
func TestBenchMatrixFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DeviceCount: 2})
	out, line, code := cli(t, "bench", "matrix", "--size", "64KiB", "--samples", "1", "--quiet", "--format", "json")
	if code != exitOK {
		t.Fatal(line)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2*3+3 || rep.Results[8].Kind != bench.KindAll {
		t.Fatalf("%d results: %+v", len(rep.Results), rep.Results)
	}
	out, line, code = cli(t, "bench", "matrix", "--size", "64KiB", "--samples", "1", "--quiet", "--devices", "1", "--dir", "h2d")
	if code != exitOK || !strings.Contains(out, "gpu1") || strings.Contains(out, "gpu0") || !strings.Contains(out, "all at once") {
		t.Fatalf("table (%s):\n%s", line, out)
	}
}
