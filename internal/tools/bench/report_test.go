package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// sample returns fixed results like a small run's.
func sampleResults() []Result {
	return []Result{
		{Bench: "bw", Kind: KindPageable, Dir: DirH2D, Size: 1 << 20, Unit: GBps, Median: 15.8, Min: 15.1, Max: 16.2, Samples: 5, Verified: true, Timing: TimingEvents, Note: "driver's pageable path blocks the host: not held by spin-wait"},
		{Bench: "bw", Kind: KindPinned, Dir: DirH2D, Size: 1 << 20, Unit: GBps, Median: 47.7, Min: 47.1, Max: 48, Samples: 5, Verified: true, Timing: TimingSpin},
		{Bench: "bw", Kind: KindPageable, Dir: DirH2D, Size: 256 << 20, Unit: GBps, Median: 6.6, Min: 6.5, Max: 6.9, Samples: 5, Verified: true, Timing: TimingEvents},
		{Bench: "bw", Kind: KindPinned, Dir: DirH2D, Size: 256 << 20, Unit: GBps, Median: 55.3, Min: 55.2, Max: 55.4, Samples: 5, Verified: true, Timing: TimingSpin},
		{Bench: "bw", Kind: KindPinned, Dir: DirD2H, Size: 256 << 20, Unit: GBps, Median: 55.25, Min: 55, Max: 55.3, Samples: 5, Verified: true, Timing: TimingSpin},
		skipped("bw", KindMapped, DirH2D, 1<<20, GBps, "kernels unavailable: placeholder"),
	}
}

func TestWriteTableGolden(t *testing.T) {
	var b bytes.Buffer
	m := Meta{Command: "pinmem bench", Device: "NVIDIA H200 (device 0)", Driver: "CUDA 13.0", Timing: "spin-wait"}
	if err := WriteTable(&b, m, sampleResults(), TableOptions{Baseline: KindPinned}); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if got != goldenTable {
		t.Errorf("table:\n%s\nwant:\n%s", got, goldenTable)
	}
	// Every row has the same column starts up to the note.
	lines := strings.Split(strings.TrimSpace(got), "\n")[2:]
	col := strings.Index(lines[0], "UNIT")
	for _, l := range lines[1:] {
		if l[col:col+4] != "GB/s" {
			t.Errorf("UNIT column not aligned in %q", l)
		}
	}
}

// goldenTable is WriteTable's exact output for sampleResults.
const goldenTable = "# pinmem bench on NVIDIA H200 (device 0), driver CUDA 13.0\n" +
	"# timing: spin-wait\n" +
	"BENCH  KIND      DIR    SIZE  MEDIAN    MIN    MAX  UNIT  N  VERIFIED  VS PINNED  NOTE\n" +
	"bw     pageable  h2d    1MiB   15.80  15.10  16.20  GB/s  5  yes           0.33x  [events] driver's pageable path blocks the host: not held by spin-wait\n" +
	"bw     pinned    h2d    1MiB   47.70  47.10  48.00  GB/s  5  yes           1.00x\n" +
	"bw     pageable  h2d  256MiB    6.60   6.50   6.90  GB/s  5  yes           0.12x  [events]\n" +
	"bw     pinned    h2d  256MiB   55.30  55.20  55.40  GB/s  5  yes           1.00x\n" +
	"bw     pinned    d2h  256MiB   55.25  55.00  55.30  GB/s  5  yes           1.00x\n" +
	"bw     mapped    h2d    1MiB       -      -      -  GB/s  0  skipped              kernels unavailable: placeholder\n"

// TestWriteTableComputedUnverifiedPartial: a computed row shows only its
// median, an unverified one says NO, a partial run says so in the header.
func TestWriteTableComputedUnverifiedPartial(t *testing.T) {
	rs := []Result{
		{Bench: "overlap", Kind: VariantBound, Dir: "pipeline", Size: 1 << 20, Unit: Ms, Median: 1.5, Min: 1.5, Max: 1.5, Timing: TimingComputed, Note: "computed"},
		{Bench: "overlap", Kind: VariantPinned1, Dir: "pipeline", Size: 1 << 20, Unit: Ms, Median: 2, Min: 1, Max: 3, Samples: 2, Timing: TimingWall},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, Meta{Device: "Fake", Partial: true}, rs, TableOptions{}); err != nil {
		t.Fatal(err)
	}
	want := "#  on Fake\n" +
		"# PARTIAL: the run was interrupted or ended early; not every configured measurement is present\n" +
		"BENCH    KIND            DIR       SIZE  MEDIAN   MIN   MAX  UNIT  N  VERIFIED  NOTE\n" +
		"overlap  bound           pipeline  1MiB    1.50     -     -  ms    -  computed  [computed] computed\n" +
		"overlap  pinned-1stream  pipeline  1MiB    2.00  1.00  3.00  ms    2  NO        [wall]\n"
	if got := b.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteTableNoBaseline(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, Meta{}, sampleResults()[:1], TableOptions{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "VS ") || strings.HasPrefix(b.String(), "#") {
		t.Errorf("table without baseline or meta:\n%s", b.String())
	}
	if !strings.HasPrefix(b.String(), "BENCH") {
		t.Errorf("table starts with %q", b.String())
	}
}

func TestWriteTableTimeRatio(t *testing.T) {
	rs := []Result{
		{Bench: "pin", Kind: PinHostAlloc, Dir: OpPin, Size: 1 << 30, Unit: Ms, Median: 628, Min: 600, Max: 650, Samples: 3, Verified: true, Timing: TimingWall},
		{Bench: "pin", Kind: PinMmapRegister, Dir: OpPin, Size: 1 << 30, Unit: Ms, Median: 157, Min: 150, Max: 160, Samples: 3, Verified: true, Timing: TimingWall},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, Meta{}, rs, TableOptions{Baseline: PinHostAlloc}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "4.00x") || !strings.Contains(b.String(), "628.0") || !strings.Contains(b.String(), "VS HOSTALLOC") {
		t.Errorf("pin table (a 4x shorter time is 4.00x):\n%s", b.String())
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	m := Meta{Schema: SchemaVersion, Command: "pinmem bench", Device: "GPU", Timing: "t"}
	if err := WriteJSON(&b, m, sampleResults()); err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if !reflect.DeepEqual(rep.Meta, m) || len(rep.Results) != 6 || rep.Results[1] != sampleResults()[1] {
		t.Errorf("round trip: %+v", rep)
	}
	var raw map[string]any
	_ = json.Unmarshal(b.Bytes(), &raw)
	first := raw["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"bench", "kind", "dir", "size", "unit", "median", "min", "max", "samples", "verified", "timing", "skipped", "note"} {
		if _, ok := first[k]; !ok {
			t.Errorf("JSON result lacks %q: %v", k, first)
		}
	}
	b.Reset()
	_ = WriteJSON(&b, Meta{}, nil)
	if !strings.Contains(b.String(), `"results": []`) {
		t.Errorf("empty results are not []: %s", b.String())
	}
}

func TestWriteCSV(t *testing.T) {
	var b bytes.Buffer
	if err := WriteCSV(&b, CSVSource{File: "a.json", Meta: Meta{Device: "GPU X"}, Results: sampleResults()}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 || strings.Join(rows[0], ",") != strings.Join(CSVHeader, ",") {
		t.Fatalf("rows: %q", rows)
	}
	want := []string{"a.json", "GPU X", "bw", "pinned", "d2h", "268435456", "256MiB", "GB/s", "55.25", "55", "55.3", "5", "true", TimingSpin, "false", "", "", "", ""}
	if strings.Join(rows[5], "|") != strings.Join(want, "|") {
		t.Errorf("row = %q, want %q", rows[5], want)
	}
	if rows[6][14] != "true" || rows[6][18] == "" {
		t.Errorf("skipped row = %q", rows[6])
	}
}

func TestResultString(t *testing.T) {
	r := sampleResults()[1]
	if got := r.String(); got != "bw pinned h2d 1MiB: 47.70 GB/s (min 47.10, max 48.00, 5 samples, verified)" {
		t.Errorf("String = %q", got)
	}
	if got := sampleResults()[5].String(); !strings.Contains(got, "skipped: kernels unavailable") {
		t.Errorf("String = %q", got)
	}
}

func TestFpsOf(t *testing.T) {
	r := Result{Bench: "overlap", Size: 512 << 20, Unit: Ms, Median: 20, Min: 10, Max: 40}
	f := fpsOf(r, 16)
	if f.Unit != FPS || f.Median != 800 || f.Min != 400 || f.Max != 1600 || !strings.Contains(f.Note, "16 chunks of 32MiB") {
		t.Errorf("fpsOf = %+v", f)
	}
}

// TestTimingHeaderFollowsRows: a report whose every row was timed by the
// wall clock (bench pin) does not claim the session's spin-wait timing in
// its header; a command's own timing statement is kept.
func TestTimingHeaderFollowsRows(t *testing.T) {
	pin := []Result{{Bench: "pin", Kind: PinHostAlloc, Dir: OpPin, Size: 1 << 20, Unit: Ms, Median: 1, Min: 1, Max: 1, Samples: 1, Verified: true, Timing: TimingWall}}
	var b bytes.Buffer
	if err := WriteTable(&b, Meta{Command: "pinmem bench pin", Timing: sessionSpinTiming}, pin, TableOptions{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "spin-wait") || !strings.Contains(b.String(), "# timing: host wall clock") {
		t.Errorf("pin table header:\n%s", b.String())
	}
	if got := TimingOf(Meta{Timing: "the host clock around each list"}, pin); got != "the host clock around each list" {
		t.Errorf("a command's own timing replaced by %q", got)
	}
	mixed := append(pin, Result{Bench: "bw", Kind: KindPinned, Dir: DirH2D, Size: 1, Unit: GBps, Median: 1, Min: 1, Max: 1, Samples: 1, Timing: TimingSpin})
	if got := TimingOf(Meta{Timing: sessionSpinTiming}, mixed); got != sessionSpinTiming {
		t.Errorf("rows timed by spin-wait: %q", got)
	}
}
