package load

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// simulate runs the reads of plan over file as a Loader would, with host
// byte slices standing for device memory (keyed by fake addresses), and
// checks every promise of plan on the way.
func simulate(t *testing.T, file []byte, rs []Range, mem map[cuda.DevicePtr][]byte, stage int, align int64) {
	t.Helper()
	reads := plan(rs, stage, align)
	for k, rd := range reads {
		switch {
		case rd.off%align != 0 || int64(rd.length)%align != 0 && rd.off+int64(rd.length) < int64(len(file)):
			t.Fatalf("read %d [%d, +%d) is not aligned to %d", k, rd.off, rd.length, align)
		case rd.length > stage || rd.length <= 0:
			t.Fatalf("read %d has length %d, stage %d", k, rd.length, stage)
		case rd.need > rd.length:
			t.Fatalf("read %d needs %d of its %d bytes", k, rd.need, rd.length)
		}
		buf := make([]byte, rd.length)
		n := copy(buf, file[min(rd.off, int64(len(file))):])
		if n < rd.need {
			t.Fatalf("read %d needs %d bytes, the file has %d there", k, rd.need, n)
		}
		for _, p := range rd.pieces {
			if p.stageOff < 0 || p.stageOff+p.n > rd.need || p.n <= 0 {
				t.Fatalf("read %d: piece %+v outside [0, %d)", k, p, rd.need)
			}
			done := false
			for base, m := range mem {
				if p.dst >= base && p.dst.Add(p.n) <= base.Add(len(m)) {
					copy(m[p.dst-base:], buf[p.stageOff:p.stageOff+p.n])
					done = true
				}
			}
			if !done {
				t.Fatalf("read %d: piece %+v lands in no destination", k, p)
			}
		}
	}
	for i, r := range rs {
		if r.Length == 0 {
			continue
		}
		got := mem[r.Dst.Ptr()][:r.Length]
		if !bytes.Equal(got, file[r.Offset:r.Offset+r.Length]) {
			t.Fatalf("range %d (%d, %d): wrong bytes at %d", i, r.Offset, r.Length, testutil.FirstMismatch(got, file[r.Offset:r.Offset+r.Length]))
		}
	}
}

// TestPlanCoversRanges checks on random range sets (overlapping in the
// file, with holes, unaligned, empty) that the reads deliver every byte
// of every range to its destination, for buffered and direct alignment.
func TestPlanCoversRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	file := testutil.RandomBytes(3<<20+123, 7)
	for iter := range 300 {
		stage := Align * (1 + rng.IntN(64))
		n := 1 + rng.IntN(12)
		var rs []Range
		mem := map[cuda.DevicePtr][]byte{}
		base := cuda.DevicePtr(1 << 40)
		for range n {
			off := rng.Int64N(int64(len(file)))
			length := rng.Int64N(min(int64(len(file))-off, int64(1+rng.IntN(4*stage)))) + 0
			if rng.IntN(8) == 0 {
				length = 0
			}
			d := cuda.WrapDevicePtr(nil, base, int(length))
			mem[base] = make([]byte, length)
			base = base.Add(int(length) + 256)
			rs = append(rs, Range{Offset: off, Length: length, Dst: d})
		}
		for _, align := range []int64{1, Align} {
			for k := range mem {
				clear(mem[k])
			}
			simulate(t, file, rs, mem, stage, align)
		}
		if t.Failed() {
			t.Fatalf("iteration %d", iter)
		}
	}
}

// TestPlanSharesReads checks that neighbouring small ranges share one read
// and that a range larger than a stage is split at stage boundaries.
func TestPlanSharesReads(t *testing.T) {
	d := func(p cuda.DevicePtr, n int) *cuda.DeviceBuffer { return cuda.WrapDevicePtr(nil, p, n) }
	rs := []Range{{0, 100, d(1<<30, 100)}, {100, 200, d(2<<30, 200)}, {5000, 10, d(3<<30, 10)}}
	if reads := plan(rs, 1<<20, 1); len(reads) != 1 || len(reads[0].pieces) != 3 || reads[0].need != 5010 {
		t.Errorf("three small ranges: %+v, want one read of three pieces needing 5010 bytes", reads)
	}
	rs = []Range{{10, 3 << 20, d(1<<30, 3<<20)}}
	reads := plan(rs, 1<<20, Align)
	if len(reads) != 4 || reads[0].off != 0 || reads[1].off != 1<<20 || reads[3].length != Align {
		t.Errorf("3 MiB at 10 in 1 MiB stages: %+v", reads)
	}
	rs = []Range{{0, 10, d(1<<30, 10)}, {10 + 2*maxGap, 10, d(2<<30, 10)}}
	if reads := plan(rs, 8*maxGap, 1); len(reads) != 2 {
		t.Errorf("a hole of 2*maxGap was read through: %d reads", len(reads))
	}
}

// TestExtents: the bytes ranges cover, merged where ranges overlap or
// touch, without empty ranges.
func TestExtents(t *testing.T) {
	rs := []Range{
		{Offset: 500, Length: 100},
		{Offset: 0, Length: 10},
		{Offset: 5, Length: 0},
		{Offset: 550, Length: 10}, // inside the first
		{Offset: 10, Length: 5},   // touches the second
		{Offset: 600, Length: 1},  // touches the first
		{Offset: 1000, Length: 1},
	}
	want := []extent{{0, 15}, {500, 601}, {1000, 1001}}
	if got := extents(rs); !slices.Equal(got, want) {
		t.Errorf("extents = %v, want %v", got, want)
	}
	if got := extents([]Range{{Offset: 7, Length: 0}}); len(got) != 0 {
		t.Errorf("extents of an empty range = %v", got)
	}
}

// TestChoose is the table of how a load reads its files.
func TestChoose(t *testing.T) {
	for _, c := range []struct {
		mode     Mode
		resident float64
		sampled  bool
		want     Mode
	}{
		{ModeAuto, 1, true, ModeBuffered},
		{ModeAuto, 0.5, true, ModeBuffered},
		{ModeAuto, 0.49, true, ModeDirect},
		{ModeAuto, 0, true, ModeDirect},
		{ModeAuto, 0, false, ModeBuffered},
		{ModeDirect, 1, true, ModeDirect},
		{ModeBuffered, 0, true, ModeBuffered},
		{ModeMapped, 0, true, ModeMapped},
		{ModeMapped, 1, false, ModeMapped},
	} {
		if got := choose(c.mode, c.resident, c.sampled, DefaultWarmThreshold); got != c.want {
			t.Errorf("choose(%v, %v, %v) = %v, want %v", c.mode, c.resident, c.sampled, got, c.want)
		}
	}
}
