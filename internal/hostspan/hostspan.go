// Package hostspan finds the pinned parts of host memory and cuts them at
// registration boundaries: the spans of a slice that lie in pinmem
// buffers (a driver copy of pinned memory goes directly) and the offsets
// a driver copy must not cross (pinmem.Buffer.Segments).
package hostspan

import (
	"slices"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// Span is a sub-range [Lo, Hi) of a host slice, as offsets into it.
type Span struct{ Lo, Hi int }

// Set collects the pinned spans of one slice and the offsets of the
// registration boundaries around them.
type Set struct {
	Spans []Span
	Cuts  []int
}

// AddBuffer adds the parts of host that lie in b, and the boundaries of
// b's registrations there.
func (s *Set) AddBuffer(host []byte, b *pinmem.Buffer) {
	lo := hostptr.AddrOf(host)
	hi := lo + uintptr(len(host))
	for _, seg := range b.Segments() {
		sl := hostptr.AddrOf(seg)
		sh := sl + uintptr(len(seg))
		if len(seg) == 0 || sl >= hi || sh <= lo {
			continue
		}
		a, z := int(max(sl, lo)-lo), int(min(sh, hi)-lo)
		s.Spans = append(s.Spans, Span{a, z})
		s.Cuts = append(s.Cuts, a, z)
	}
}

// AddLookup adds the parts of host in buffers pinmem pinned
// (pinmem.Lookup) that ok accepts.
func (s *Set) AddLookup(host []byte, ok func(*pinmem.Buffer) bool) {
	for off := 0; off < len(host); {
		b, found := pinmem.Lookup(host[off:])
		if !found {
			return
		}
		mem := b.Bytes()
		end := int(hostptr.AddrOf(mem) + uintptr(len(mem)) - hostptr.AddrOf(host))
		if end <= off { // freed meanwhile
			return
		}
		if ok(b) {
			s.AddBuffer(host, b)
		}
		off = end
	}
}

// Split returns the set's spans sorted, merged and split at its cuts.
func (s *Set) Split() []Span { return SplitAt(Normalize(s.Spans), s.Cuts) }

// Normalize sorts s and merges overlapping or touching spans, in place.
func Normalize(s []Span) []Span {
	if len(s) < 2 {
		return s
	}
	slices.SortFunc(s, func(a, b Span) int { return a.Lo - b.Lo })
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if x.Lo <= last.Hi {
			last.Hi = max(last.Hi, x.Hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// SplitAt splits sorted, disjoint spans at the cut offsets inside them, so
// that no span crosses a registration boundary.
func SplitAt(spans []Span, cuts []int) []Span {
	if len(cuts) == 0 || len(spans) == 0 {
		return spans
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []Span
	k := 0
	for _, s := range spans {
		for k < len(cuts) && cuts[k] <= s.Lo {
			k++
		}
		lo := s.Lo
		for j := k; j < len(cuts) && cuts[j] < s.Hi; j++ {
			out = append(out, Span{lo, cuts[j]})
			lo = cuts[j]
		}
		out = append(out, Span{lo, s.Hi})
	}
	return out
}

// Cuts returns the offsets in b.Bytes() where one registration of b ends
// and the next begins (none for a buffer of one registration).
func Cuts(b *pinmem.Buffer) []int {
	segs := b.Segments()
	var cuts []int
	off := 0
	for _, s := range segs[:max(len(segs)-1, 0)] {
		off += len(s)
		cuts = append(cuts, off)
	}
	return cuts
}

// EachPiece calls f for the parts of [lo, hi) between the sorted cut
// offsets, in order, until f fails.
func EachPiece(cuts []int, lo, hi int, f func(lo, hi int) error) error {
	for _, c := range cuts {
		if c <= lo {
			continue
		}
		if c >= hi {
			break
		}
		if err := f(lo, c); err != nil {
			return err
		}
		lo = c
	}
	return f(lo, hi)
}

// Covers reports whether the sorted, disjoint spans s cover [0, n).
func Covers(s []Span, n int) bool {
	at := 0
	for _, x := range s {
		if x.Lo != at {
			return false
		}
		at = x.Hi
	}
	return at == n
}

// Parts calls f for every part of [off, off+n), as offsets from off, in
// order, until f fails: pinned, a part in the sorted, disjoint spans s;
// else a gap between them. It is pinmem's one policy for partly pinned
// memory: the pinned parts are copied directly, the gaps staged.
func Parts(s []Span, off, n int, f func(lo, hi int, pinned bool) error) error {
	at := 0
	err := Within(s, off, n, func(lo, hi int) error {
		if at < lo {
			if err := f(at, lo, false); err != nil {
				return err
			}
		}
		at = hi
		return f(lo, hi, true)
	})
	if err == nil && at < n {
		err = f(at, n, false)
	}
	return err
}

// Within calls f for the parts of [off, off+n) in the sorted, disjoint
// spans s, as offsets from off, in order, until f fails.
func Within(s []Span, off, n int, f func(lo, hi int) error) error {
	i, _ := slices.BinarySearchFunc(s, off, func(x Span, t int) int {
		if x.Hi <= t {
			return -1
		}
		if x.Lo > t {
			return 1
		}
		return 0
	})
	for ; i < len(s) && s[i].Lo < off+n; i++ {
		lo, hi := max(s[i].Lo, off), min(s[i].Hi, off+n)
		if lo < hi {
			if err := f(lo-off, hi-off); err != nil {
				return err
			}
		}
	}
	return nil
}
