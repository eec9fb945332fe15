package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestBenchBlocksFake runs `bench blocks` end to end on the fake driver
// (structure and verification only: the fake's figures mean nothing):
// the JSON report with its provenance, the plot, the table with the ratio
// against the contiguous copy, CSV, and `pinmem report` of the saved file
// as a table and as a plot.
func TestBenchBlocksFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	out, plot := filepath.Join(dir, "blocks.json"), filepath.Join(dir, "blocks.svg")
	stdout, stderr, code := cli(t, "bench", "blocks", "--sizes", "4KiB,16KiB", "--blocks", "64", "--samples", "2", "--quiet",
		"--format", "json", "-o", out, "--plot", plot)
	if code != exitOK || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	rep := readReport(t, out)
	m := rep.Meta
	if m.Schema != bench.SchemaVersion || m.Command != "pinmem bench blocks" || m.Tool.Name != "pinmem" || m.Tool.GoVersion == "" ||
		m.Partial || !slices.Contains(m.Argv, "--blocks") || m.Argv[0] != "pinmem" || m.Host.Cores < 1 || m.Host.OS == "" ||
		len(m.Devices) != 1 || m.Devices[0].Name == "" || m.Timing != bench.BlocksTiming || m.Device == "" || m.Driver == "" {
		t.Errorf("meta %+v", m)
	}
	cfg, _ := m.Config.(map[string]any)
	if cfg == nil || cfg["blocks"] != 64.0 || cfg["samples"] != 2.0 || cfg["gap_bytes"] != float64(bench.DefaultBlockGap) ||
		fmt.Sprint(cfg["sizes_bytes"]) != "[4096 16384]" || fmt.Sprint(cfg["dirs"]) != "[h2d d2h bidir]" || fmt.Sprint(cfg["kinds"]) != fmt.Sprint(bench.AllBlockKinds()) {
		t.Errorf("config %v", m.Config)
	}
	if want := 2 * 3 * len(bench.AllBlockKinds()); len(rep.Results) != want {
		t.Fatalf("%d results, want %d", len(rep.Results), want)
	}
	for _, r := range rep.Results {
		if r.Bench != "blocks" || r.Skipped || !r.Verified || r.VerifyFailed || r.Samples != 2 || r.Median <= 0 || r.Timing != bench.TimingWall {
			t.Errorf("result %+v", r)
		}
		if r.Kind == bench.BlockKindAuto && (!strings.Contains(r.Note, "chose kernel") || !strings.Contains(r.Note, "of the best strategy in this run")) {
			t.Errorf("auto's note: %q", r.Note)
		}
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.Contains(svg, []byte("scattered block copies")) || !bytes.Contains(svg, []byte("block size")) {
		t.Errorf("plot: %v", err)
	}

	// The table: the ratio column against the contiguous copy.
	table, line, code := cli(t, "bench", "blocks", "--sizes", "4KiB", "--blocks", "16", "--samples", "1", "--quiet", "--dir", "d2h")
	if code != exitOK || !strings.Contains(table, "VS CONTIGUOUS") || !strings.Contains(table, "per-copy") || strings.Contains(table, "h2d") {
		t.Errorf("table (exit %d, %s):\n%s", code, line, table)
	}
	csvOut, _, code := cli(t, "bench", "blocks", "--sizes", "4KiB", "--blocks", "16", "--samples", "1", "--quiet", "--format", "csv")
	if code != exitOK {
		t.Errorf("csv: exit %d", code)
	}
	if err := checkCSV(csvOut, len(bench.AllBlockDirs())*len(bench.AllBlockKinds())); err != nil {
		t.Errorf("csv: %v\n%s", err, csvOut)
	}

	// pinmem report renders the saved result as a table and as a plot.
	rt, line, code := cli(t, "report", out, "--baseline", bench.BlockKindContiguous)
	if code != exitOK || !strings.Contains(rt, "pinmem bench blocks") || !strings.Contains(rt, "VS CONTIGUOUS") || !strings.Contains(rt, "driver-batch") {
		t.Errorf("report table (exit %d, %s):\n%s", code, line, rt)
	}
	png := filepath.Join(dir, "report.png")
	if _, line, code := cli(t, "report", out, "--format", "png", "-o", png); code != exitOK {
		t.Fatalf("report png: exit %d, %s", code, line)
	}
	checkPNG(t, png)
}

// TestBenchBlocksOldDriver: on a driver without the batch copy the
// driver's batch is skipped with the reason, the rest is measured (auto
// takes the kernel at 4 KiB), and the run succeeds.
func TestBenchBlocksOldDriver(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DriverVersion: 12040})
	out, line, code := cli(t, "bench", "blocks", "--sizes", "4KiB", "--blocks", "16", "--samples", "1", "--quiet", "--dirs", "h2d")
	if code != exitOK || !strings.Contains(out, "not supported by this driver") || !strings.Contains(out, "chose kernel") {
		t.Errorf("exit %d (%s):\n%s", code, line, out)
	}
}

// TestBenchBlocksVerifyFailure: a strategy that copies the wrong bytes
// (here a block kernel that leaves the last block out) makes the run a
// measurement problem: the report is written with verify_failed set on
// that result, and the exit status is 1.
func TestBenchBlocksVerifyFailure(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	d.RegisterKernel(kernels.KernelBlockCopy, []int{8, 4}, func(k *fakedrv.KernelCall) error {
		count := int(k.Uint32(1)) - 1
		descs, err := k.Mem(k.Ptr(0), uint64(max(count, 1)*kernels.BlockDescSize))
		if err != nil {
			return err
		}
		return kernels.BlockCopyTwin(descs, count, func(a, n uint64) ([]byte, error) { return k.Mem(cudadrv.DevicePtr(a), n) })
	})
	out := filepath.Join(t.TempDir(), "blocks.json")
	_, stderr, code := cli(t, "bench", "blocks", "--sizes", "4KiB", "--blocks", "8", "--samples", "2", "--quiet", "--format", "json", "-o", out)
	if code != exitProblem || !strings.Contains(stderr, "verification failed in 6 result(s)") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, r := range readReport(t, out).Results {
		if failed := r.Kind == bench.BlockKindKernel || r.Kind == bench.BlockKindAuto; r.VerifyFailed != failed || r.Verified == failed {
			t.Errorf("result %+v", r)
		}
	}
}

// TestBenchBlocksInterrupted: a run canceled part way writes the results
// measured so far, marked partial, and exits as interrupted.
func TestBenchBlocksInterrupted(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	syncs := 0
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuStreamSynchronize" {
			if syncs++; syncs == 9 {
				cancel()
			}
		}
		return cudadrv.Success
	})
	out := filepath.Join(t.TempDir(), "blocks.json")
	var stdout, stderr bytes.Buffer
	code := execute(ctx, []string{"bench", "blocks", "--sizes", "4KiB", "--blocks", "8", "--samples", "5", "--quiet", "--format", "json", "-o", out}, &stdout, &stderr)
	d.SetHook(nil)
	if code != exitInterrupted {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	rep := readReport(t, out)
	if !rep.Meta.Partial || len(rep.Results) == 0 || len(rep.Results) >= 2*len(bench.AllBlockKinds()) ||
		!strings.Contains(rep.Results[len(rep.Results)-1].Note, "stopped after") {
		t.Fatalf("partial report: partial %v, %+v", rep.Meta.Partial, rep.Results)
	}
}

// TestBenchBlocksBadCommandLines: each bad command line is refused with
// exit status 2 and one line on stderr, before the device is touched.
func TestBenchBlocksBadCommandLines(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--blocks", "0"}, "--blocks 0: must be from 1 to 1048576"},
		{[]string{"--blocks", "-3"}, "--blocks -3"},
		{[]string{"--blocks", "1048577"}, "--blocks 1048577"},
		{[]string{"--blocks", "many"}, `--blocks "many": want a whole number`},
		{[]string{"--sizes", "0"}, `size "0" is zero`},
		{[]string{"--sizes", ""}, "--sizes: empty size list"},
		{[]string{"--sizes", "12Q"}, `unknown suffix "Q"`},
		{[]string{"--size", "2GiB"}, "--sizes 2GiB: a block is at most 1GiB"},
		{[]string{"--sizes", "1MiB", "--blocks", "1048576"}, "more than 1TiB"},
		{[]string{"--dirs", "sideways"}, `--dirs: unknown direction "sideways" (want one of h2d, d2h, bidir, or all)`},
		{[]string{"--dir", "up"}, `--dirs: unknown direction "up"`},
		{[]string{"--dirs", ","}, "--dirs: empty direction list"},
		{[]string{"--samples", "0"}, "--samples 0: must be from 1 to 1000"},
		{[]string{"--device", "-1"}, "--device -1: must be 0 or more"},
		{[]string{"--format", "xml"}, `--format "xml": want one of table, json, csv`},
		{[]string{"--baseline", "fastest"}, `--baseline: unknown block strategy "fastest"`},
		{[]string{"--out", dir}, "is a directory"},
		{[]string{"--out", filepath.Join(dir, "no", "b.json")}, "does not exist"},
		{[]string{"--plot", filepath.Join(dir, "b.gif")}, "want a name ending in .svg or .png"},
		{[]string{"--strategy", "kernel"}, "unknown flag: --strategy"},
		{[]string{"extra"}, `takes no arguments (got "extra")`},
	} {
		args := append([]string{"bench", "blocks"}, c.args...)
		before := d.CallCounts()
		stdout, stderr, code := cli(t, args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "--help')") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line saying %q", args, code, stdout, stderr, c.want)
		}
		after := d.CallCounts()
		for _, op := range []string{"cuDevicePrimaryCtxRetain", "cuMemAlloc_v2", "cuMemHostAlloc", "cuMemHostRegister_v2"} {
			if after[op] != before[op] {
				t.Errorf("%q: %s called before the command line was refused", args, op)
			}
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left behind: %v", ents)
	}
}
