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
func simulate(t *testing.T, file []byte, rs []Range, mem map[cuda.DevicePtr][]byte, stage int, align int64, split int) {
	t.Helper()
	reads := plan(rs, stage, align, split)
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
// of every range to its destination, for buffered and direct alignment,
// with the first range read alone and split among readers or not.
func TestPlanCoversRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	file := testutil.RandomBytes(3<<20+123, 7)
	for iter := range 300 {
		stage := Align * (1 + rng.IntN(64))
		if iter%3 == 0 { // stages over maxGap: the first range is split
			stage = Align * (1 + rng.IntN(768))
		}
		split := []int{0, 1, 2, 3, 16}[rng.IntN(5)]
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
			simulate(t, file, rs, mem, stage, align, split)
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
	if reads := plan(rs, 1<<20, 1, 0); len(reads) != 1 || len(reads[0].pieces) != 3 || reads[0].need != 5010 {
		t.Errorf("three small ranges: %+v, want one read of three pieces needing 5010 bytes", reads)
	}
	rs = []Range{{10, 3 << 20, d(1<<30, 3<<20)}}
	reads := plan(rs, 1<<20, Align, 0)
	if len(reads) != 4 || reads[0].off != 0 || reads[1].off != 1<<20 || reads[3].length != Align {
		t.Errorf("3 MiB at 10 in 1 MiB stages: %+v", reads)
	}
	rs = []Range{{0, 10, d(1<<30, 10)}, {10 + 2*maxGap, 10, d(2<<30, 10)}}
	if reads := plan(rs, 8*maxGap, 1, 0); len(reads) != 2 {
		t.Errorf("a hole of 2*maxGap was read through: %d reads", len(reads))
	}
}

// TestPlanFirstRangeAlone: split, the first range's reads hold nothing
// else and are shared among the readers, down to maxGap bytes each; the
// ranges after it share reads as before.
func TestPlanFirstRangeAlone(t *testing.T) {
	d := func(p cuda.DevicePtr, n int) *cuda.DeviceBuffer { return cuda.WrapDevicePtr(nil, p, n) }
	const stage = 8 << 20
	// 4 norms of 16 KiB, then a tensor of 64 MiB (the bench's shards).
	var rs []Range
	off := int64(1504)
	for k, n := range []int64{16 << 10, 16 << 10, 16 << 10, 16 << 10, 64 << 20} {
		rs = append(rs, Range{off, n, d(cuda.DevicePtr(k+1)<<32, int(n))})
		off += n
	}
	reads := plan(rs, stage, 1, 16)
	if r := reads[0]; r.off != 1504 || r.length != 16<<10 || len(r.pieces) != 1 {
		t.Errorf("read 0 = %+v, want the first norm alone", r)
	}
	if r := reads[1]; r.off != 1504+16<<10 || r.length != stage || len(r.pieces) != 4 {
		t.Errorf("read 1 = [%d, +%d) of %d pieces, want the other norms and the tensor's start in one stage", r.off, r.length, len(r.pieces))
	}
	if len(reads) != 10 {
		t.Errorf("%d reads, want 10", len(reads))
	}
	// The tensor first: 16 reads of 4 MiB, one for each reader; then the
	// norms after it in one read.
	rs = []Range{{0, 64 << 20, d(1<<32, 64<<20)}, {64 << 20, 16 << 10, d(2<<32, 16<<10)}, {64<<20 + 16<<10, 16 << 10, d(3<<32, 16<<10)}}
	reads = plan(rs, stage, Align, 16)
	for k, r := range reads[:16] {
		if r.off != int64(k)<<22 || r.length != 4<<20 || len(r.pieces) != 1 {
			t.Errorf("read %d = [%d, +%d), want [%d, +%d)", k, r.off, r.length, k<<22, 4<<20)
		}
	}
	if len(reads) != 17 || len(reads[16].pieces) != 2 {
		t.Errorf("%d reads, want 16 of the tensor and one of both norms", len(reads))
	}
	for _, c := range []struct {
		n           int64
		stage, p    int
		align, want int64
	}{
		{16 << 10, stage, 16, 1, maxGap}, // never under maxGap
		{64 << 20, stage, 16, 1, 4 << 20},
		{1 << 30, stage, 16, 1, stage},               // never over a stage
		{10<<20 + 1, stage, 4, Align, 5<<19 + Align}, // a quarter, rounded up to Align
		{3 << 20, 64 << 10, 16, Align, 64 << 10},
		{5 << 20, stage, 1, 1, 5 << 20},
	} {
		if got := headSize(c.n, c.stage, c.p, c.align); int64(got) != c.want {
			t.Errorf("headSize(%d, %d, %d, %d) = %d, want %d", c.n, c.stage, c.p, c.align, got, c.want)
		}
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
