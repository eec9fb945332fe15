package transfer

import (
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/transfer/internal/regcache"
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

// addTo adds to set the parts of host in known buffers.
func (p *pinnedSet) addTo(set *hostspan.Set, host []byte) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for b := range p.bufs {
		set.AddBuffer(host, b)
	}
}

// holdsPart reports whether a known buffer holds part of host.
func (p *pinnedSet) holdsPart(host []byte) bool {
	var s hostspan.Set
	p.addTo(&s, host)
	return len(s.Spans) > 0
}

// mayBePinned reports cheaply whether part of host could be copied directly.
func (c *copier) mayBePinned(host []byte) bool {
	if c.cache != nil && len(host) >= c.cache.Min() {
		return true
	}
	if c.pinned.holdsPart(host) {
		return true
	}
	b, ok := pinmem.Lookup(host)
	return ok && c.pinnedHere(b)
}

// span is a pinned sub-range of a host slice.
type span = hostspan.Span

func addr(b []byte) uintptr { return hostptr.AddrOf(b) }

// pinnedSpans returns the parts of host known to be pinned (AddPinned,
// pinmem.Lookup, the registration cache), sorted and split at
// registration boundaries, and the function that ends the cache's holds.
func (c *copier) pinnedSpans(host []byte) ([]span, func()) {
	if len(host) == 0 {
		return nil, func() {}
	}
	var set hostspan.Set
	c.pinned.addTo(&set, host)
	set.AddLookup(host, func(b *pinmem.Buffer) bool { return !regcache.Owns(b) && c.pinnedHere(b) })
	if c.cache == nil {
		return set.Split(), func() {}
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
			set.Cuts = h.Cuts(addr(host), set.Cuts)
		}
		for _, s := range got {
			out = append(out, span{Lo: s.Lo + a, Hi: s.Hi + a})
		}
	}
	set.Spans = hostspan.Normalize(set.Spans)
	for _, s := range set.Spans {
		gap(prev, s.Lo)
		prev = s.Hi
	}
	gap(prev, len(host))
	set.Spans = append(set.Spans, out...)
	return set.Split(), func() {
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
