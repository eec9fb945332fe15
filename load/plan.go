package load

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/pinmem/pinmem/cuda"
)

// Range is one byte range of a file and where it goes: Length bytes at
// file offset Offset are copied to the start of Dst. Dst must hold at
// least Length bytes and belong to the Loader's context; use
// DeviceBuffer.Slice to place a range inside a larger allocation. A range
// of length 0 copies nothing (its Dst may then be nil).
type Range struct {
	Offset int64
	Length int64
	Dst    *cuda.DeviceBuffer
}

// piece is one host-to-device copy out of a stage: n bytes at stageOff go
// to dst.
type piece struct {
	stageOff int
	n        int
	dst      cuda.DevicePtr
	rng      int // the range it belongs to
}

// read is one pread into a stage: length bytes at file offset off, and the
// copies out of it. need is the end of the last byte a copy takes (the read
// may end early past it only at the end of the file).
type read struct {
	file   int // index of the file in the load
	off    int64
	length int
	need   int
	pieces []piece
}

// extent is a byte interval [lo, hi) of a file.
type extent struct{ lo, hi int64 }

// extents returns the bytes of the file that the ranges cover, as sorted,
// disjoint extents (ranges that overlap or touch are merged).
func extents(rs []Range) []extent {
	var ext []extent
	for _, r := range rs {
		if r.Length > 0 {
			ext = append(ext, extent{r.Offset, r.Offset + r.Length})
		}
	}
	slices.SortFunc(ext, func(a, b extent) int { return cmp.Compare(a.lo, b.lo) })
	out := ext[:0]
	for _, e := range ext {
		if n := len(out); n > 0 && e.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, e.hi)
			continue
		}
		out = append(out, e)
	}
	return out
}

// maxGap is the largest hole between two ranges that one read spans rather
// than issuing two: reading 1 MiB more costs less than another request.
const maxGap = 1 << 20

// checkRanges validates rs against the context handle ctx and returns the
// total length and the end of the furthest range.
func checkRanges(rs []Range, ctx uintptr) (total, end int64, err error) {
	type span struct {
		lo, hi cuda.DevicePtr
		i      int
	}
	spans := make([]span, 0, len(rs))
	for i, r := range rs {
		bad := func(format string, args ...any) error {
			return &RangeError{Index: i, Range: r, Reason: fmt.Sprintf(format, args...)}
		}
		switch {
		case r.Offset < 0:
			return 0, 0, bad("negative offset")
		case r.Length < 0:
			return 0, 0, bad("negative length")
		case r.Offset > 1<<62 || r.Length > 1<<62:
			return 0, 0, bad("offset or length beyond 2^62")
		case r.Length == 0:
			continue
		case r.Dst == nil:
			return 0, 0, bad("nil destination")
		}
		if derr := r.Dst.Err(); derr != nil {
			return 0, 0, bad("destination unusable: %v", derr)
		}
		if c := r.Dst.Context(); c == nil || c.Handle() != ctx {
			return 0, 0, bad("destination belongs to another context")
		}
		if int64(r.Dst.Size()) < r.Length {
			return 0, 0, bad("destination holds %d bytes, fewer than the length", r.Dst.Size())
		}
		total += r.Length
		end = max(end, r.Offset+r.Length)
		spans = append(spans, span{r.Dst.Ptr(), r.Dst.Ptr().Add(int(r.Length)), i})
	}
	// Destinations must not overlap: the copies run concurrently on
	// several streams, so overlapping ones would race.
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for k := 1; k < len(spans); k++ {
		if spans[k].lo < spans[k-1].hi {
			i := spans[k].i
			return 0, 0, &RangeError{Index: i, Range: rs[i], Reason: fmt.Sprintf("destination overlaps that of range %d", spans[k-1].i)}
		}
	}
	return total, end, nil
}

// plan splits the ranges into reads of at most stage bytes whose offsets
// and lengths are multiples of align (1 for buffered reads), in the order
// of the ranges' offsets (ranges that overlap in the file may make a read
// begin before the one issued just before it).
// Neighbouring ranges share reads: a read spans a hole of up to maxGap
// bytes to the next range when the read has room left.
//
// When split is not 0, the first range is read alone, in reads of
// headSize(its length, stage, split, align) bytes: they hold nothing of the
// other ranges, so that it lands once its own bytes are read, and split
// readers can read it at once (see run.plan).
func plan(rs []Range, stage int, align int64, split int) []read {
	idx := make([]int, 0, len(rs))
	for i, r := range rs {
		if r.Length > 0 {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case rs[a].Offset < rs[b].Offset:
			return -1
		case rs[a].Offset > rs[b].Offset:
			return 1
		}
		return 0
	})
	down := func(x int64) int64 { return x / align * align }
	up := func(x int64) int64 { return (x + align - 1) / align * align }
	var reads []read
	var cur *read
	size := int64(stage) // the most the current read may hold
	for k, i := range idx {
		r := rs[i]
		switch {
		case split > 0 && k == 0:
			size = int64(headSize(r.Length, stage, split, align))
		case split > 0 && k == 1:
			cur, size = nil, int64(stage) // the first range's reads end with it
		}
		pos, end := r.Offset, r.Offset+r.Length
		for pos < end {
			if cur == nil || pos < cur.off || pos >= cur.off+size || pos > cur.off+int64(cur.need)+maxGap {
				reads = append(reads, read{off: down(pos)})
				cur = &reads[len(reads)-1]
			}
			stop := min(end, cur.off+size)
			p := piece{stageOff: int(pos - cur.off), n: int(stop - pos), dst: r.Dst.Ptr().Add(int(pos - r.Offset)), rng: i}
			cur.pieces = append(cur.pieces, p)
			cur.need = max(cur.need, p.stageOff+p.n)
			cur.length = int(min(up(cur.off+int64(cur.need)), cur.off+size) - cur.off)
			pos = stop
		}
	}
	return reads
}

// headSize is the size of the reads of a first range of n bytes read
// alone (see plan): a part for each of the p readers, so that they all read
// it at once, but no part under maxGap (a request costs more than reading
// that much more) and none over a stage; a multiple of align.
func headSize(n int64, stage, p int, align int64) int {
	size := max(maxGap, (n+int64(p)-1)/int64(p))
	return int(min(int64(stage), (size+align-1)/align*align))
}
