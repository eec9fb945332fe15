package transfer

import (
	"errors"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/reclaim"
)

// regCache is a Copier's registration cache (WithRegistrationCache),
// keyed by page ranges: only the whole pages inside a slice are
// registered (the partial pages at its ends are staged). A request shares
// the registered ranges it overlaps (reference counts) and fills the gaps
// with new registrations or, when every range it overlaps is idle,
// replaces them with one registration of the union (a merge). Idle
// registrations are evicted least recently used first, for the cache's
// limit and when pinmem's budget asks (reclaim).
type regCache struct {
	mu      sync.Mutex
	entries []*regEntry // sorted by lo, disjoint; pending ones included
	limit   int64       // 0: no limit of its own
	min     int
	opts    []pinmem.Option
	tick    uint64
	closed  bool
	remove  func()
	stats   CacheStats
	unfreed []*pinmem.Buffer // releases the driver failed: the next freeAll retries them
}

// CacheStats are a registration cache's counters.
type CacheStats struct {
	Entries       int   // live registrations
	Bytes         int64 // bytes registered
	Hits          int64 // requests fully served by existing registrations
	Misses        int64 // requests that needed a new registration
	Registrations int64 // pinmem.Register calls that succeeded
	Merges        int64 // registrations that replaced overlapping idle ones
	Evictions     int64 // registrations released to make room (limit or budget)
	Reclaimed     int64 // bytes released because pinmem's budget asked
	Failures      int64 // pinmem.Register calls that failed (the memory was staged)
}

type regEntry struct {
	lo, hi  uintptr
	buf     *pinmem.Buffer
	refs    int
	last    uint64 // tick of the last use
	pending bool   // being registered; not usable yet
	dead    bool   // forgotten while in use: released on the last release
}

func (e *regEntry) size() int64 { return int64(e.hi - e.lo) }

// regHold is one transfer's hold on cache entries.
type regHold struct{ entries []*regEntry }

var pageSize = uintptr(os.Getpagesize())

// newRegCache makes a cache that also answers pinmem's budget (reclaim).
func newRegCache(limit int64, minSize int, opts ...pinmem.Option) *regCache {
	c := &regCache{limit: limit, min: max(minSize, int(pageSize)), opts: opts}
	c.remove = reclaim.Add(reclaim.Func(c.reclaim))
	return c
}

// overlapping returns the indexes [i, j) of entries overlapping [lo, hi). c.mu held.
func (c *regCache) overlapping(lo, hi uintptr) (int, int) {
	i := sort.Search(len(c.entries), func(k int) bool { return c.entries[k].hi > lo })
	return i, i + sort.Search(len(c.entries)-i, func(k int) bool { return c.entries[i+k].lo >= hi })
}

// unlink removes e from the entries. c.mu held.
func (c *regCache) unlink(e *regEntry) {
	if i := slices.Index(c.entries, e); i >= 0 {
		c.entries = slices.Delete(c.entries, i, i+1)
	}
}

// evict unlinks idle entries, least recently used first, until enough
// (given the bytes freed so far) or none is idle, and returns their
// buffers, to free outside the lock. c.mu held.
func (c *regCache) evict(enough func(freed int64) bool) (bufs []*pinmem.Buffer, freed int64) {
	for !enough(freed) {
		var v *regEntry
		for _, e := range c.entries {
			if e.refs == 0 && !e.pending && (v == nil || e.last < v.last) {
				v = e
			}
		}
		if v == nil {
			break
		}
		c.unlink(v)
		c.stats.Evictions++
		bufs = append(bufs, v.buf)
		freed += v.size()
	}
	return bufs, freed
}

// addPending adds a pending registration of [lo, hi), held once, when it
// fits under the limit after evictions (nil when not), and returns the
// buffers evicted. c.mu held.
func (c *regCache) addPending(lo, hi uintptr) (*regEntry, []*pinmem.Buffer) {
	need := int64(hi - lo)
	var used int64 // registered and pending
	for _, e := range c.entries {
		used += e.size()
	}
	fits := func(freed int64) bool { return c.limit == 0 || used-freed+need <= c.limit }
	if c.limit > 0 && need > c.limit {
		return nil, nil
	}
	free, freed := c.evict(fits)
	if !fits(freed) {
		return nil, free
	}
	e := &regEntry{lo: lo, hi: hi, pending: true, refs: 1, last: c.tick}
	i, _ := c.overlapping(lo, hi)
	c.entries = slices.Insert(c.entries, i, e)
	return e, free
}

// freeAll frees bufs and retries the registrations whose release failed
// before; one that fails again stays in unfreed.
func (c *regCache) freeAll(bufs []*pinmem.Buffer) error {
	c.mu.Lock()
	bufs = append(bufs, c.unfreed...)
	c.unfreed = nil
	c.mu.Unlock()
	var errs []error
	var kept []*pinmem.Buffer
	for _, b := range bufs {
		n, kb := 0, b
		errs = append(errs, freeBuf(&b, &n))
		if n > 0 {
			kept = append(kept, b)
		} else {
			cacheBufs.Delete(kb)
		}
	}
	if len(kept) > 0 {
		c.mu.Lock()
		c.unfreed = append(c.unfreed, kept...)
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// locked runs f under c.mu and then frees the buffers it returns.
func (c *regCache) locked(f func() []*pinmem.Buffer) {
	c.mu.Lock()
	bufs := f()
	c.mu.Unlock()
	_ = c.freeAll(bufs)
}

// sliceAt returns the n bytes at address lo inside base, a slice starting
// at baseLo.
func sliceAt(base []byte, baseLo, lo uintptr, n int) []byte {
	return hostptr.BytesAt(hostptr.Offset(hostptr.PtrOf(base), lo-baseLo), uintptr(n))
}

// acquire returns the parts of p the cache has (or now gets) registered,
// as offsets into p, and a hold to release when the copy is done; no
// spans when p is too small or registration fails.
func (c *regCache) acquire(p []byte) ([]span, *regHold) {
	pl := addr(p)
	ph := pl + uintptr(len(p))
	a := (pl + pageSize - 1) &^ (pageSize - 1)
	b := ph &^ (pageSize - 1)
	if b <= a || int(b-a) < c.min {
		return nil, nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, nil
	}
	c.tick++
	h := &regHold{}
	over, idle, gaps := c.scan(a, b, h)
	if len(gaps) == 0 {
		c.stats.Hits++
		c.mu.Unlock()
		return h.spans(pl, ph), h
	}
	c.stats.Misses++
	var jobs []regJob
	var toFree []*pinmem.Buffer
	if idle {
		jobs, toFree = c.planMerge(p, a, b, over, h)
	} else {
		jobs, toFree = c.planGaps(p, gaps)
	}
	c.mu.Unlock()
	_ = c.freeAll(toFree)
	c.register(jobs, h)
	return h.spans(pl, ph), h
}

// regJob is a registration acquire makes outside the lock.
type regJob struct {
	e   *regEntry
	mem []byte
}

// scan returns the entries overlapping the pages [a, b), whether they
// are all idle, and the gaps between them (as addresses); it holds the
// usable ones in h. c.mu held.
func (c *regCache) scan(a, b uintptr, h *regHold) (over []*regEntry, idle bool, gaps []span) {
	i, j := c.overlapping(a, b)
	over = c.entries[i:j:j]
	idle = len(over) > 0
	cur := a
	for _, e := range over {
		if e.pending || e.dead || e.refs > 0 {
			idle = false
		}
		if e.lo > cur {
			gaps = append(gaps, span{int(cur), int(e.lo)})
		}
		cur = max(cur, e.hi)
		if !e.pending && !e.dead {
			e.refs++
			e.last = c.tick
			h.entries = append(h.entries, e)
		}
	}
	if cur < b {
		gaps = append(gaps, span{int(cur), int(b)})
	}
	return over, idle, gaps
}

// planMerge replaces the idle entries over, which overlap the pages
// [a, b) of p, with one pending registration of the union. c.mu held.
func (c *regCache) planMerge(p []byte, a, b uintptr, over []*regEntry, h *regHold) ([]regJob, []*pinmem.Buffer) {
	lo, hi := min(a, over[0].lo), max(b, over[len(over)-1].hi)
	base, baseLo := p, addr(p) // the union starts in p or in the first entry
	if lo != a {
		base, baseLo = over[0].buf.Bytes(), over[0].lo
	}
	mem := sliceAt(base, baseLo, lo, int(hi-lo))
	var toFree []*pinmem.Buffer
	for _, e := range slices.Clone(over) {
		e.refs--
		c.unlink(e)
		toFree = append(toFree, e.buf)
	}
	h.entries = nil
	e, ev := c.addPending(lo, hi)
	toFree = append(toFree, ev...)
	if e == nil {
		return nil, toFree
	}
	c.stats.Merges++
	return []regJob{{e, mem}}, toFree
}

// planGaps adds a pending registration for each gap of p (addresses,
// whole pages) that fits under the limit. c.mu held.
func (c *regCache) planGaps(p []byte, gaps []span) (jobs []regJob, toFree []*pinmem.Buffer) {
	for _, g := range gaps {
		lo, hi := uintptr(g.lo), uintptr(g.hi)
		e, ev := c.addPending(lo, hi)
		toFree = append(toFree, ev...)
		if e != nil {
			jobs = append(jobs, regJob{e, sliceAt(p, addr(p), lo, int(hi-lo))})
		}
	}
	return jobs, toFree
}

// register makes the registrations of jobs without the lock and holds in
// h those that succeeded.
func (c *regCache) register(jobs []regJob, h *regHold) {
	for _, jb := range jobs {
		buf, err := pinmem.Register(jb.mem, pinmem.Portable, c.opts...)
		c.mu.Lock()
		if err != nil {
			c.unlink(jb.e)
			c.stats.Failures++
		} else if c.closed { // the entry is gone: so is its registration
			c.mu.Unlock()
			_ = c.freeAll([]*pinmem.Buffer{buf})
			continue
		} else {
			jb.e.buf = buf
			cacheBufs.Store(buf, struct{}{})
			jb.e.pending = false
			c.stats.Registrations++
			h.entries = append(h.entries, jb.e)
		}
		c.mu.Unlock()
	}
}

// spans returns the held entries clipped to [pl, ph), as offsets from pl.
func (h *regHold) spans(pl, ph uintptr) []span {
	var out []span
	for _, e := range h.entries {
		lo, hi := max(e.lo, pl), min(e.hi, ph)
		if lo < hi {
			out = append(out, span{int(lo - pl), int(hi - pl)})
		}
	}
	return normalize(out)
}

// cuts appends the boundaries of the held registrations' segments, as
// offsets from base.
func (h *regHold) cuts(base uintptr, cuts []int) []int {
	for _, e := range h.entries {
		if e.buf == nil {
			continue
		}
		for _, seg := range e.buf.Segments() {
			a := int(addr(seg)) - int(base)
			cuts = append(cuts, a, a+len(seg))
		}
	}
	return cuts
}

// release ends a transfer's hold.
func (c *regCache) release(h *regHold) {
	if h == nil {
		return
	}
	c.locked(func() (toFree []*pinmem.Buffer) {
		for _, e := range h.entries {
			if e.refs--; e.refs == 0 && e.dead {
				toFree = append(toFree, e.buf)
			}
		}
		return toFree
	})
}

// reclaim, which pinmem calls when its budget is short, releases idle
// registrations, least recently used first, until at least want bytes
// were freed or none is idle, and returns the bytes freed.
func (c *regCache) reclaim(want int64) (freed int64) {
	if c == nil {
		return 0
	}
	c.locked(func() (toFree []*pinmem.Buffer) {
		toFree, freed = c.evict(func(f int64) bool { return f >= want })
		c.stats.Reclaimed += freed
		return toFree
	})
	return freed
}

// Forget releases the registration cache's registrations overlapping p
// (see WithRegistrationCache): idle ones at once, busy ones after the
// copy using them. Call it before p's memory is reused for something else
// or unmapped. It returns the bytes released now (0 when the cache is
// off, and for a nil Copier).
func (c *Copier) Forget(p []byte) int64 {
	if !c.ok() {
		return 0
	}
	return c.cache.forget(p)
}

// forget is Copier.Forget; 0 for a nil cache.
func (c *regCache) forget(p []byte) (freed int64) {
	if c == nil || len(p) == 0 {
		return 0
	}
	pl := addr(p) &^ (pageSize - 1)
	ph := (addr(p) + uintptr(len(p)) + pageSize - 1) &^ (pageSize - 1)
	c.locked(func() (toFree []*pinmem.Buffer) {
		i, j := c.overlapping(pl, ph)
		for _, e := range slices.Clone(c.entries[i:j]) {
			if e.pending {
				continue
			}
			c.unlink(e)
			if e.refs == 0 {
				toFree = append(toFree, e.buf)
				freed += e.size()
			} else {
				e.dead = true
			}
		}
		return toFree
	})
	return freed
}

// CacheStats returns the registration cache's counters (zero when the
// cache is off, and for a nil Copier).
func (c *Copier) CacheStats() CacheStats {
	if !c.ok() {
		return CacheStats{}
	}
	return c.cache.snapshot()
}

// snapshot returns the cache's counters (zero for a nil cache).
func (c *regCache) snapshot() CacheStats {
	if c == nil {
		return CacheStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	for _, e := range c.entries {
		if !e.pending {
			s.Entries++
			s.Bytes += e.size()
		}
	}
	return s
}

// close releases every registration and stops answering pinmem's budget;
// left counts the registrations the driver failed to release, which the
// next close retries.
func (c *regCache) close() (left int, err error) {
	c.remove()
	c.mu.Lock()
	c.closed = true
	var toFree []*pinmem.Buffer
	for _, e := range c.entries {
		if !e.pending {
			toFree = append(toFree, e.buf)
		}
	}
	c.entries = nil
	c.mu.Unlock()
	err = c.freeAll(toFree)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unfreed), err
}
