package transfer

import (
	"slices"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/regcache"
)

// pinnedSet is the buffers made known with AddPinned.
type pinnedSet struct {
	mu   sync.RWMutex
	bufs map[*pinmem.Buffer]struct{}
}

// add makes b known until remove is called (once or more).
func (p *pinnedSet) add(b *pinmem.Buffer) (remove func()) {
	p.mu.Lock()
	if p.bufs == nil {
		p.bufs = map[*pinmem.Buffer]struct{}{}
	}
	p.bufs[b] = struct{}{}
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			delete(p.bufs, b)
			p.mu.Unlock()
		})
	}
}

// spans appends the parts of host in known buffers and their cuts (regSpans).
func (p *pinnedSet) spans(host []byte, spans []span, cuts []int) ([]span, []int) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for b := range p.bufs {
		spans, cuts = regSpans(host, b, spans, cuts)
	}
	return spans, cuts
}

// empty reports whether no buffer is known.
func (p *pinnedSet) empty() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.bufs) == 0
}

// regSpans appends to spans the parts of host that lie in b, and to cuts
// the offsets in host of the boundaries of b's registrations.
func regSpans(host []byte, b *pinmem.Buffer, spans []span, cuts []int) ([]span, []int) {
	lo := addr(host)
	hi := lo + uintptr(len(host))
	for _, seg := range b.Segments() {
		if len(seg) == 0 {
			continue
		}
		sl := addr(seg)
		sh := sl + uintptr(len(seg))
		if sl >= hi || sh <= lo {
			continue
		}
		a, z := int(max(sl, lo)-lo), int(min(sh, hi)-lo)
		spans = append(spans, span{a, z})
		cuts = append(cuts, a, z)
	}
	return spans, cuts
}

// lookupSpansIf appends the parts of host in buffers pinmem pinned that ok
// accepts, registration caches' excepted, and their registrations' cuts.
func lookupSpansIf(host []byte, spans []span, cuts []int, ok func(*pinmem.Buffer) bool) ([]span, []int) {
	off := 0
	for off < len(host) {
		b, found := pinmem.Lookup(host[off:])
		if !found {
			break
		}
		mem := b.Bytes()
		end := int(addr(mem) + uintptr(len(mem)) - addr(host))
		if end <= off { // freed meanwhile
			break
		}
		if !regcache.Owns(b) && ok(b) {
			spans, cuts = regSpans(host, b, spans, cuts)
		}
		off = end
	}
	return spans, cuts
}

// segCuts returns the offsets in b.Bytes() where one registration of b ends
// and the next begins: a stage over 4 GiB is copied piece by piece there.
func segCuts(b *pinmem.Buffer) []int {
	segs := b.Segments()
	var cuts []int
	off := 0
	for _, s := range segs[:max(len(segs)-1, 0)] {
		off += len(s)
		cuts = append(cuts, off)
	}
	return cuts
}

// eachPiece calls f for the parts of [lo, hi) between the sorted cut
// offsets, in order, until f fails.
func eachPiece(cuts []int, lo, hi int, f func(lo, hi int) error) error {
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

// splitAtCuts splits sorted, disjoint spans at the cut offsets inside them,
// so that no span crosses a registration boundary.
func splitAtCuts(spans []span, cuts []int) []span {
	if len(cuts) == 0 || len(spans) == 0 {
		return spans
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []span
	k := 0
	for _, s := range spans {
		for k < len(cuts) && cuts[k] <= s.lo {
			k++
		}
		lo := s.lo
		for j := k; j < len(cuts) && cuts[j] < s.hi; j++ {
			out = append(out, span{lo, cuts[j]})
			lo = cuts[j]
		}
		out = append(out, span{lo, s.hi})
	}
	return out
}

// mayBePinned reports cheaply whether part of host could be copied directly.
func (c *copier) mayBePinned(host []byte) bool {
	if c.cache != nil && len(host) >= c.cache.Min() {
		return true
	}
	if !c.pinned.empty() {
		return true
	}
	b, ok := pinmem.Lookup(host)
	return ok && c.pinnedHere(b)
}

// strategy forces a transfer's handling of pageable memory (tests).
type strategy uint8

const (
	byRoute     strategy = iota // as route's size bands say
	forceStaged                 // the ring at every size
	forceShort                  // one stage when one is idle and holds the transfer, else the ring
)

// span is a pinned sub-range [lo, hi) of a host slice, as offsets.
type span struct{ lo, hi int }

func addr(b []byte) uintptr { return hostptr.AddrOf(b) }

// pinnedSpans returns the parts of host known to be pinned (AddPinned,
// pinmem.Lookup, the registration cache), sorted and split at
// registration boundaries, and the function that ends the cache's holds.
func (c *copier) pinnedSpans(host []byte) ([]span, func()) {
	if len(host) == 0 {
		return nil, func() {}
	}
	spans, cuts := c.pinned.spans(host, nil, nil)
	spans, cuts = lookupSpansIf(host, spans, cuts, c.pinnedHere)
	spans = normalize(spans)
	if c.cache == nil {
		return splitAtCuts(spans, cuts), func() {}
	}
	// Ask the cache about the gaps.
	var holds []*regcache.Hold
	var out []span
	prev := 0
	gap := func(a, b int) {
		if b-a < c.cache.Min() {
			return
		}
		got, h := c.cache.Acquire(host[a:b])
		if h != nil {
			holds = append(holds, h)
			cuts = h.Cuts(addr(host), cuts)
		}
		for _, s := range got {
			out = append(out, span{s.Lo + a, s.Hi + a})
		}
	}
	for _, s := range spans {
		gap(prev, s.lo)
		prev = s.hi
	}
	gap(prev, len(host))
	spans = splitAtCuts(normalize(append(out, spans...)), cuts)
	return spans, func() {
		for _, h := range holds {
			c.cache.Release(h)
		}
	}
}

// pinnedHere reports whether b is pinned for the Copier's context:
// Portable, or pinned in it (pinmem pins in the primary context). Other
// memory would be copied as pageable, which waits inside the driver call,
// beyond ctx.
func (c *copier) pinnedHere(b *pinmem.Buffer) bool {
	if b.Flags()&pinmem.Portable != 0 {
		return true
	}
	d := b.Device()
	if d == nil || d.Ordinal() != c.cctx.Device().Ordinal() {
		return false
	}
	// Retained already by pinmem: this only reads it.
	pc, err := d.PrimaryContext()
	return err == nil && pc.Handle() == c.cctx.Handle()
}

// normalize sorts spans and merges overlapping or touching ones.
func normalize(s []span) []span {
	if len(s) < 2 {
		return s
	}
	slices.SortFunc(s, func(a, b span) int { return a.lo - b.lo })
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if x.lo <= last.hi {
			last.hi = max(last.hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}
