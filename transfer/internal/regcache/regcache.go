// Package regcache is a cache of pinmem registrations of Go memory, for
// a transfer.Copier's registration cache: a slice copied again and again
// is registered (pinned in place) once and copied directly afterwards.
//
// Registrations are keyed by page ranges: only the whole pages inside a
// slice are registered (the partial pages at its ends are the caller's to
// stage). A request shares the registered ranges it overlaps (reference
// counts) and fills the gaps with new registrations or, when every range
// it overlaps is idle, replaces them with one registration of the union
// (a merge). Idle registrations are evicted least recently used first,
// for the cache's limit and when pinmem's budget asks (Reclaim).
package regcache

import (
	"errors"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/reclaim"
)

// Cache is a registration cache. Its methods are safe for concurrent use;
// those that read it accept a nil Cache.
type Cache struct {
	mu      sync.Mutex
	entries []*entry // sorted by lo, disjoint; pending ones included
	limit   int64    // 0: no limit of its own
	min     int
	opts    []pinmem.Option
	tick    uint64
	closed  bool
	remove  func()
	stats   Stats
	unfreed []*pinmem.Buffer // releases the driver failed: the next free retries them
}

// Stats are a cache's counters.
type Stats struct {
	Entries       int   // live registrations
	Bytes         int64 // bytes registered
	Hits          int64 // requests fully served by existing registrations
	Misses        int64 // requests not fully served: a new registration needed, or one still being made
	Registrations int64 // pinmem.Register calls that succeeded
	Merges        int64 // registrations that replaced overlapping idle ones
	Evictions     int64 // registrations released to make room (limit or budget)
	Reclaimed     int64 // bytes released because pinmem's budget asked
	Failures      int64 // pinmem.Register calls that failed (the memory was staged)
}

type entry struct {
	lo, hi  uintptr
	buf     *pinmem.Buffer
	refs    int
	last    uint64 // tick of the last use
	pending bool   // being registered; not usable yet
	dead    bool   // forgotten while in use: released on the last release
}

func (e *entry) size() int64 { return int64(e.hi - e.lo) }

// Hold is one copy's hold on registrations, from Acquire to Release.
type Hold struct{ entries []*entry }

var pageSize = uintptr(os.Getpagesize())

// owned are the buffers caches registered (Owns).
var owned sync.Map // *pinmem.Buffer -> struct{}

// Owns reports whether b is a registration of a cache: a lookup of pinned
// memory must leave it to its cache, which holds it for a copy (another
// cache could evict it in the middle of one).
func Owns(b *pinmem.Buffer) bool {
	_, ok := owned.Load(b)
	return ok
}

// New makes a cache of at most limit registered bytes (0: bounded only by
// pinmem's budget, which it answers through Reclaim) that registers
// ranges of at least minSize bytes with opts.
func New(limit int64, minSize int, opts ...pinmem.Option) *Cache {
	c := &Cache{limit: limit, min: max(minSize, int(pageSize)), opts: opts}
	c.remove = reclaim.Add(reclaim.Func(c.Reclaim))
	return c
}

// Min returns the smallest range the cache registers.
func (c *Cache) Min() int { return c.min }

// overlapping returns the indexes [i, j) of entries overlapping [lo, hi). c.mu held.
func (c *Cache) overlapping(lo, hi uintptr) (int, int) {
	i := sort.Search(len(c.entries), func(k int) bool { return c.entries[k].hi > lo })
	return i, i + sort.Search(len(c.entries)-i, func(k int) bool { return c.entries[i+k].lo >= hi })
}

// unlink removes e from the entries. c.mu held.
func (c *Cache) unlink(e *entry) {
	if i := slices.Index(c.entries, e); i >= 0 {
		c.entries = slices.Delete(c.entries, i, i+1)
	}
}

// evict unlinks idle entries, least recently used first, until enough
// (given the bytes freed so far) or none is idle, and returns their
// buffers, to free outside the lock. c.mu held.
func (c *Cache) evict(enough func(freed int64) bool) (bufs []*pinmem.Buffer, freed int64) {
	for !enough(freed) {
		var v *entry
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
func (c *Cache) addPending(lo, hi uintptr) (*entry, []*pinmem.Buffer) {
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
	e := &entry{lo: lo, hi: hi, pending: true, refs: 1, last: c.tick}
	i, _ := c.overlapping(lo, hi)
	c.entries = slices.Insert(c.entries, i, e)
	return e, free
}

// free frees bufs and retries the registrations whose release failed
// before; one that fails again (not freed already) stays in unfreed.
func (c *Cache) free(bufs []*pinmem.Buffer) error {
	c.mu.Lock()
	bufs = append(bufs, c.unfreed...)
	c.unfreed = nil
	c.mu.Unlock()
	var errs []error
	var kept []*pinmem.Buffer
	for _, b := range bufs {
		err := b.Free()
		if err != nil && !errors.Is(err, pinmem.ErrFreed) {
			kept = append(kept, b)
		} else {
			owned.Delete(b)
		}
		errs = append(errs, err)
	}
	if len(kept) > 0 {
		c.mu.Lock()
		c.unfreed = append(c.unfreed, kept...)
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// locked runs f under c.mu and then frees the buffers it returns.
func (c *Cache) locked(f func() []*pinmem.Buffer) {
	c.mu.Lock()
	bufs := f()
	c.mu.Unlock()
	_ = c.free(bufs)
}

// sliceAt returns the n bytes at address lo inside base, a slice starting
// at baseLo.
func sliceAt(base []byte, baseLo, lo uintptr, n int) []byte {
	return hostptr.BytesAt(hostptr.Offset(hostptr.PtrOf(base), lo-baseLo), uintptr(n))
}

// Acquire returns the parts of p the cache has (or now gets) registered,
// as offsets into p in no particular order, and a hold to Release once
// the copy is done; no spans when p is too small or registration fails.
func (c *Cache) Acquire(p []byte) ([]hostspan.Span, *Hold) {
	pl := hostptr.AddrOf(p)
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
	h := &Hold{}
	over, idle, gaps := c.scan(a, b, h)
	if len(gaps) == 0 {
		// A hit when every registration over p was usable (held), not
		// one still being made.
		if len(h.entries) == len(over) {
			c.stats.Hits++
		} else {
			c.stats.Misses++
		}
		c.mu.Unlock()
		return h.spans(pl, ph), h
	}
	c.stats.Misses++
	var jobs []job
	var toFree []*pinmem.Buffer
	if idle {
		jobs, toFree = c.planMerge(p, a, b, over, h)
	} else {
		jobs, toFree = c.planGaps(p, gaps)
	}
	c.mu.Unlock()
	_ = c.free(toFree)
	c.register(jobs, h)
	return h.spans(pl, ph), h
}

// job is a registration Acquire makes outside the lock.
type job struct {
	e   *entry
	mem []byte
}

// scan returns the entries overlapping the pages [a, b), whether they
// are all idle, and the gaps between them (as addresses); it holds the
// usable ones in h. c.mu held.
func (c *Cache) scan(a, b uintptr, h *Hold) (over []*entry, idle bool, gaps [][2]uintptr) {
	i, j := c.overlapping(a, b)
	over = c.entries[i:j:j]
	idle = len(over) > 0
	cur := a
	for _, e := range over {
		if e.pending || e.dead || e.refs > 0 {
			idle = false
		}
		if e.lo > cur {
			gaps = append(gaps, [2]uintptr{cur, e.lo})
		}
		cur = max(cur, e.hi)
		if !e.pending && !e.dead {
			e.refs++
			e.last = c.tick
			h.entries = append(h.entries, e)
		}
	}
	if cur < b {
		gaps = append(gaps, [2]uintptr{cur, b})
	}
	return over, idle, gaps
}

// planMerge replaces the idle entries over, which overlap the pages
// [a, b) of p, with one pending registration of the union. c.mu held.
func (c *Cache) planMerge(p []byte, a, b uintptr, over []*entry, h *Hold) ([]job, []*pinmem.Buffer) {
	lo, hi := min(a, over[0].lo), max(b, over[len(over)-1].hi)
	base, baseLo := p, hostptr.AddrOf(p) // the union starts in p or in the first entry
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
	return []job{{e, mem}}, toFree
}

// planGaps adds a pending registration for each gap of p (addresses,
// whole pages) that fits under the limit. c.mu held.
func (c *Cache) planGaps(p []byte, gaps [][2]uintptr) (jobs []job, toFree []*pinmem.Buffer) {
	for _, g := range gaps {
		e, ev := c.addPending(g[0], g[1])
		toFree = append(toFree, ev...)
		if e != nil {
			jobs = append(jobs, job{e, sliceAt(p, hostptr.AddrOf(p), g[0], int(g[1]-g[0]))})
		}
	}
	return jobs, toFree
}

// register makes the registrations of jobs without the lock and holds in
// h those that succeeded.
func (c *Cache) register(jobs []job, h *Hold) {
	for _, jb := range jobs {
		buf, err := pinmem.Register(jb.mem, pinmem.Portable, c.opts...)
		c.mu.Lock()
		if err != nil {
			c.unlink(jb.e)
			c.stats.Failures++
		} else if c.closed { // the entry is gone: so is its registration
			c.mu.Unlock()
			_ = c.free([]*pinmem.Buffer{buf})
			continue
		} else {
			jb.e.buf = buf
			owned.Store(buf, struct{}{})
			jb.e.pending = false
			c.stats.Registrations++
			h.entries = append(h.entries, jb.e)
		}
		c.mu.Unlock()
	}
}

// spans returns the held entries clipped to [pl, ph), as offsets from pl.
func (h *Hold) spans(pl, ph uintptr) []hostspan.Span {
	var out []hostspan.Span
	for _, e := range h.entries {
		lo, hi := max(e.lo, pl), min(e.hi, ph)
		if lo < hi {
			out = append(out, hostspan.Span{Lo: int(lo - pl), Hi: int(hi - pl)})
		}
	}
	return out
}

// Cuts appends the boundaries of the held registrations' segments (a
// driver copy must not span two), as offsets from base.
func (h *Hold) Cuts(base uintptr, cuts []int) []int {
	for _, e := range h.entries {
		if e.buf == nil {
			continue
		}
		for _, seg := range e.buf.Segments() {
			a := int(hostptr.AddrOf(seg)) - int(base)
			cuts = append(cuts, a, a+len(seg))
		}
	}
	return cuts
}

// Release ends a hold (nil is ignored).
func (c *Cache) Release(h *Hold) {
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

// Reclaim releases idle registrations, least recently used first, until
// at least want bytes were freed or none is idle, and returns the bytes
// freed. pinmem calls it when its budget is short.
func (c *Cache) Reclaim(want int64) (freed int64) {
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

// Forget releases the registrations overlapping p: idle ones at once, busy
// ones on their last Release. It returns the bytes released now.
func (c *Cache) Forget(p []byte) (freed int64) {
	if c == nil || len(p) == 0 {
		return 0
	}
	pl := hostptr.AddrOf(p) &^ (pageSize - 1)
	ph := (hostptr.AddrOf(p) + uintptr(len(p)) + pageSize - 1) &^ (pageSize - 1)
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

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	if c == nil {
		return Stats{}
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

// Close releases every registration and stops answering pinmem's budget;
// left counts the registrations the driver failed to release, which the
// next Close retries.
func (c *Cache) Close() (left int, err error) {
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
	err = c.free(toFree)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unfreed), err
}
