package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMatrixOnFourFakeDevices(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{DeviceCount: 4})
	rs, m, err := Matrix(t.Context(), MatrixConfig{Size: 256 << 10, Samples: 2, Reps: 1, Session: SessionConfig{NoSpin: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4*3+3 {
		t.Fatalf("%d results, want 15", len(rs))
	}
	for i, r := range rs {
		want := DeviceKind(i / 3)
		if i >= 12 {
			want = KindAll
		}
		if r.Kind != want || r.Dir != AllDirs()[i%3] || r.Bench != "matrix" || r.Skipped || !r.Verified || r.Samples != 2 || r.Median <= 0 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if !strings.Contains(rs[12].Note, "sum of per-device figures") || !strings.Contains(rs[12].Note, "gpu3") {
		t.Errorf("aggregate note %q", rs[12].Note)
	}
	if !strings.Contains(m.Device, "4 devices") {
		t.Errorf("meta device %q", m.Device)
	}
	var b bytes.Buffer
	if err := WriteMatrix(&b, m, rs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"DEVICE", "H2D", "BIDIR", "gpu3", "all at once", "sum of rows", "# all h2d: sum of per-device"} {
		if !strings.Contains(out, want) {
			t.Errorf("matrix table lacks %q:\n%s", want, out)
		}
	}
	if c := d.Live(); c.HostAllocs != 0 || c.Registrations != 0 || c.DeviceAllocs != 0 || c.Streams != 0 || c.Events != 0 {
		t.Errorf("left behind: %+v", c)
	}
}

func TestMatrixOneFakeDevice(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	rs, _, err := Matrix(t.Context(), MatrixConfig{Size: 64 << 10, Samples: 1, Dirs: []string{DirH2D}, Session: SessionConfig{NoSpin: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Kind != "gpu0" || rs[1].Kind != KindAll || !rs[1].Verified {
		t.Fatalf("results %+v", rs)
	}
}

// TestMatrixAggregateMath: the aggregate is the median of per-sample sums
// over devices, compared with the sum of the per-device medians.
func TestMatrixAggregateMath(t *testing.T) {
	per := []Result{{Kind: "gpu0", Median: 50}, {Kind: "gpu1", Median: 40}, {Kind: "gpu2", Skipped: true}}
	conc := [][]float64{{45, 44, 46}, {35, 30, 36, 99}, {10, 11, 12}}
	r := aggregate(DirH2D, 1<<20, per, conc)
	// Sums of the first 3 samples: 90, 85, 94 -> median 90, min 85, max 94.
	if r.Median != 90 || r.Min != 85 || r.Max != 94 || r.Samples != 3 || r.Kind != KindAll {
		t.Fatalf("aggregate %+v", r)
	}
	if !strings.Contains(r.Note, "sum of per-device figures 90.00 GB/s") || !strings.Contains(r.Note, "at once / sum = 1.00") ||
		!strings.Contains(r.Note, "gpu1 35.50") || !strings.Contains(r.Note, "gpu2 11.00") {
		t.Fatalf("note %q", r.Note)
	}
	r = aggregate(DirD2H, 1, []Result{{Median: 10}}, [][]float64{{5}})
	if math.Abs(r.Median-5) > 1e-12 || !strings.Contains(r.Note, "= 0.50") {
		t.Fatalf("one device: %+v", r)
	}
}

// TestWriteMatrixCells: a missing cell is "-", a skipped one "skipped", an
// unverified median is marked "!"; the sum row adds the devices' own
// measured cells only; the notes follow the table.
func TestWriteMatrixCells(t *testing.T) {
	rs := []Result{
		{Bench: "matrix", Kind: "gpu0", Dir: DirH2D, Size: 1 << 20, Median: 10, Verified: true, Note: "host memory: node 0"},
		{Bench: "matrix", Kind: "gpu0", Dir: DirD2H, Size: 1 << 20, Median: 12},
		{Bench: "matrix", Kind: "gpu1", Dir: DirH2D, Size: 1 << 20, Skipped: true},
		{Bench: "matrix", Kind: KindAll, Dir: DirH2D, Size: 1 << 20, Median: 9, Verified: true, Note: "sum of per-device figures 10"},
		{Bench: "bw", Kind: KindPinned, Dir: DirH2D, Size: 1 << 20, Median: 99},
	}
	var b bytes.Buffer
	if err := WriteMatrix(&b, Meta{Command: "pinmem bench matrix", Device: "Fake", Driver: "13.0"}, rs); err != nil {
		t.Fatal(err)
	}
	want := `# pinmem bench matrix on Fake, driver 13.0
# host<->GPU bandwidth, GB/s (median), 1MiB per copy
DEVICE           H2D     D2H
gpu0           10.00  12.00!
gpu1         skipped       -
all at once     9.00       -
sum of rows    10.00   12.00
# all h2d: sum of per-device figures 10
# gpu0: host memory: node 0
`
	if got := b.String(); got != want {
		t.Errorf("WriteMatrix:\n%s\nwant:\n%s", got, want)
	}
}
