package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/track"
)

// Polling limits: how many pending blocks one Get or Put checks.
const (
	maxPollPerGet = 16
	maxPollPerPut = 4
)

// chunk is one block's memory: a whole buffer of its own, or a piece of a slab.
type chunk struct {
	mem   []byte         // the memory, len == cap == size
	size  int            // capacity
	class int            // size class, or hugeClass
	buf   *pinmem.Buffer // own buffer; nil for a slab piece
	slab  *slab
	off   int    // offset in the slab
	seq   uint64 // release sequence number when it last became idle (for LRU)
}

// slab is one pinned buffer carved into equal blocks of one class.
type slab struct {
	buf     *pinmem.Buffer
	class   int
	bytes   int
	chunks  []*chunk
	idle    int // chunks that are idle (cached)
	seq     uint64
	dptr    cuda.DevicePtr
	hasDptr bool
}

// evRec is one wait of a block Put with streams: an event recorded on a
// stream, or, when no event could be recorded there, the stream itself
// (ev nil), whose Query reports all its work finished.
type evRec struct {
	ev   *cuda.Event
	cctx *cuda.Context
	s    *cuda.Stream
}

// query reports whether the work r waits for has finished.
func (r evRec) query() (bool, error) {
	if r.ev == nil {
		return r.s.Query()
	}
	return r.ev.Query()
}

// eventsOf returns the events among rs, for the free list or destruction.
func eventsOf(rs []evRec) []evRec {
	var evs []evRec
	for _, r := range rs {
		if r.ev != nil {
			evs = append(evs, r)
		}
	}
	return evs
}

// pendingEntry is a block Put with stream work: it becomes idle when every
// event has completed. Events before next have been seen complete; those
// before retired are back on the free list.
type pendingEntry struct {
	c             *chunk
	evs           []evRec
	next, retired int
}

const (
	stateOut uint32 = iota
	stateReturned
)

// state is a pool: everything but the handle users hold, so that a
// cleanup attached to the handle can release what a dropped pool cached.
type state struct {
	name         string
	flags        pinmem.Flags
	pinOpts      []pinmem.Option // pinmem.Alloc options (WithFlags)
	maxCached    int64
	retainOnMiss bool
	stacks       bool

	// unordered makes Put ignore its streams (tests only: it shows that
	// stream-ordered reuse is what keeps queued copies correct).
	unordered bool

	removeReclaimer func()
	driverNS        atomic.Int64

	mu      sync.Mutex
	closed  bool
	idle    [][]*chunk // per class: LIFO stack of idle blocks (index 0 is the oldest)
	huge    []*chunk   // idle huge blocks, by size
	pending [][]*pendingEntry
	slabs   map[*slab]struct{}
	// deferred holds idle memory evicted by the cap on the hit path (a
	// Put, or a Get or Put that found stream-ordered blocks finished):
	// unpinning may synchronize the device, so it waits for the next
	// call allowed to (a miss, Trim, Reclaim, Close). Still pinned.
	deferred []*pinmem.Buffer
	// closePending holds the blocks a closed pool waits for: Put with
	// stream work not yet seen finished. polling counts the polls of the
	// open pool still holding blocks taken from pending.
	closePending []*pendingEntry
	polling      int
	// busy counts pinning and unpinning left running by a Get or Trim
	// whose ctx ended (see bounded); Close waits for it.
	busy int
	// unreleased holds buffers whose release failed while the driver kept
	// their memory: still in PinnedBytes, retried with the deferred ones.
	unreleased []*pinmem.Buffer
	// undestroyed holds events whose destruction failed: the driver still
	// holds them, so Trim and Close destroy them again.
	undestroyed []evRec
	out         Block // sentinel of the list of blocks out
	nextID      uint64
	seq         uint64
	evFree      map[*cuda.Context][]*cuda.Event
	st          Stats
}

func (p *state) prewarm(size int, total int64) error {
	var blocks []*Block
	var got int64
	var err error
	// A block that would take the idle bytes above the cap would leave the
	// cache at once, still pinned (capLocked): stop before it.
	for got < total && (p.maxCached < 0 || got+int64(roundedSize(size)) <= p.maxCached) {
		var b *Block
		if b, err = p.get(context.Background(), size); err != nil {
			break
		}
		blocks = append(blocks, b)
		got += int64(b.Cap())
	}
	for _, b := range blocks {
		if perr := p.put(b); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return fmt.Errorf("pool %s: prewarming %d bytes: %w", p.name, total, err)
	}
	p.mu.Lock()
	p.st.Gets, p.st.Hits, p.st.Misses, p.st.Puts = 0, 0, 0, 0
	// PeakInUseBytes stays: it is the footprint a miss keeps within (see
	// pin), and the prewarmed blocks are part of it. Reset, the first miss
	// of another size would unpin them all.
	p.st.PeakRequestedBytes = 0
	p.mu.Unlock()
	return nil
}

func (p *state) get(ctx context.Context, size int) (*Block, error) {
	if size <= 0 || size > maxSize {
		return nil, fmt.Errorf("pool %s: Get(%d): size outside [1, %d]: %w", p.name, size, maxSize, cuda.ErrInvalidValue)
	}
	ci, csize := hugeClass, roundUp(size, pageSize)
	if size <= HugeThreshold {
		ci = classOf(size)
		csize = classSize(ci)
	}
	b := &Block{p: p, n: size}
	if p.stacks {
		b.stack = track.Stack(3)
	}
	for polled := false; ; polled = true {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("pool %s: Get(%d): %w", p.name, size, ErrClosed)
		}
		if c := p.takeIdleLocked(ci, size); c != nil {
			p.checkoutLocked(b, c, true)
			p.mu.Unlock()
			return b, nil
		}
		// Stream-ordered blocks of every class that may serve the request.
		pend := make([]int, 0, 4) // on the stack: one or two classes fit
		for j := ci; j <= lastFit(ci, size); j++ {
			if len(p.pending[j]) > 0 {
				pend = append(pend, j)
			}
		}
		p.mu.Unlock()
		if polled || len(pend) == 0 {
			break
		}
		for _, j := range pend {
			p.poll(j, maxPollPerGet, false)
		}
	}
	if err := p.bounded(ctx, fmt.Sprintf("Get(%d)", size), func(h *handoff) error { return p.pin(h, b, ci, size, csize) }); err != nil {
		return nil, err
	}
	return b, nil
}

// handoff is what a Get or Trim whose ctx ended and the pinning or
// unpinning it left running share, under p.mu: the work sets done when it
// hands its result to the caller, the caller sets left when it returns
// without one, and work that finds left set keeps its result in the pool.
type handoff struct{ done, left bool }

// bounded runs f, pinning or unpinning, which the driver cannot interrupt
// and which may wait for all work on the device, bounded by ctx. With a
// ctx that can never end, f runs on the calling goroutine. Otherwise f
// runs on a goroutine of its own, counted in busy (Close waits for it);
// when ctx is done before f has handed over its result, bounded returns an
// error matching ctx.Err() and f, finding its handoff left, keeps the
// result in the pool.
func (p *state) bounded(ctx context.Context, what string, f func(h *handoff) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pool %s: %s: %w", p.name, what, err)
	}
	return p.await(ctx, what, f)
}

// await is bounded for work that must run even when ctx is done already
// (releasing what Trim or Close took out of the cache): f starts all the
// same, and await waits for it only as long as ctx allows.
func (p *state) await(ctx context.Context, what string, f func(h *handoff) error) error {
	h := &handoff{}
	if ctx.Done() == nil {
		return f(h)
	}
	p.mu.Lock()
	p.busy++
	p.mu.Unlock()
	done := make(chan error, 1) // buffered: work left behind never blocks
	go func() {
		err := f(h)
		p.mu.Lock()
		p.busy--
		p.mu.Unlock()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	p.mu.Lock()
	if h.done {
		p.mu.Unlock()
		return <-done
	}
	h.left = true
	p.mu.Unlock()
	return fmt.Errorf("pool %s: %s: the driver is still busy (it finishes in the background): %w", p.name, what, ctx.Err())
}

// lastFit returns the largest class whose blocks may serve a request of
// n bytes of class ci: ci, or a larger one whose blocks still waste at
// most 1/8 of n. Huge requests are served by huge blocks only.
func lastFit(ci, n int) int {
	if ci == hugeClass {
		return ci
	}
	j := ci
	for j+1 < numClasses && classSize(j+1)-n <= n/8 {
		j++
	}
	return j
}

// takeIdleLocked removes and returns an idle block fit for a request of n bytes of class ci.
func (p *state) takeIdleLocked(ci, n int) *chunk {
	var c *chunk
	if ci == hugeClass {
		i := sort.Search(len(p.huge), func(i int) bool { return p.huge[i].size >= n })
		if i == len(p.huge) || p.huge[i].size-n > n/8 {
			return nil
		}
		c = p.huge[i]
		p.huge = slices.Delete(p.huge, i, i+1)
	} else {
		// The request's class, else a larger one whose blocks still waste at most 1/8.
		found := -1
		for j := ci; j <= lastFit(ci, n); j++ {
			if len(p.idle[j]) > 0 {
				found = j
				break
			}
		}
		if found < 0 {
			return nil
		}
		ci = found
		l := p.idle[ci]
		c = l[len(l)-1]
		l[len(l)-1] = nil
		p.idle[ci] = l[:len(l)-1]
		if c.slab != nil {
			c.slab.idle--
		}
	}
	p.st.CachedBlocks--
	p.st.CachedBytes -= int64(c.size)
	return c
}

func (p *state) checkoutLocked(b *Block, c *chunk, hit bool) {
	b.c = c
	p.nextID++
	b.id = p.nextID
	b.prev, b.next = p.out.prev, &p.out
	p.out.prev.next = b
	p.out.prev = b
	p.st.Gets++
	if hit {
		p.st.Hits++
	} else {
		p.st.Misses++
	}
	p.st.InUseBlocks++
	p.st.InUseBytes += int64(c.size)
	p.st.PeakInUseBytes = max(p.st.PeakInUseBytes, p.st.InUseBytes)
	p.st.RequestedBytes += int64(b.n)
	p.st.PeakRequestedBytes = max(p.st.PeakRequestedBytes, p.st.RequestedBytes)
}

func (p *state) unlinkLocked(b *Block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	p.st.Puts++
	p.st.InUseBlocks--
	p.st.InUseBytes -= int64(b.c.size)
	p.st.RequestedBytes -= int64(b.n)
}

// releaseLocked makes c idle.
func (p *state) releaseLocked(c *chunk) {
	p.seq++
	c.seq = p.seq
	if c.class == hugeClass {
		i := sort.Search(len(p.huge), func(i int) bool { return p.huge[i].size >= c.size })
		p.huge = slices.Insert(p.huge, i, c)
	} else {
		p.idle[c.class] = append(p.idle[c.class], c)
	}
	if s := c.slab; s != nil {
		s.idle++
		if s.idle == len(s.chunks) {
			s.seq = p.seq
		}
	}
	p.st.CachedBlocks++
	p.st.CachedBytes += int64(c.size)
}

// evictLocked takes idle memory out of the cache, least recently released
// first, until at least want bytes are taken (all of it when want < 0),
// and returns the buffers for release to unpin once the lock is dropped.
// The memory counts as pinned until release has unpinned it.
func (p *state) evictLocked(want int64) (bufs []*pinmem.Buffer, freed int64) {
	for want < 0 || freed < want {
		const (
			none = iota
			large
			huge
			slabKind
		)
		kind, bestSeq, bestIdx := none, uint64(math.MaxUint64), 0
		var bestSlab *slab
		for ci := lastSlabCls + 1; ci < numClasses; ci++ {
			if l := p.idle[ci]; len(l) > 0 && l[0].seq < bestSeq {
				kind, bestSeq, bestIdx = large, l[0].seq, ci
			}
		}
		for i, c := range p.huge {
			if c.seq < bestSeq {
				kind, bestSeq, bestIdx = huge, c.seq, i
			}
		}
		for s := range p.slabs {
			if s.idle == len(s.chunks) && s.seq < bestSeq {
				kind, bestSeq, bestSlab = slabKind, s.seq, s
			}
		}
		var n int
		switch kind {
		case none:
			return bufs, freed
		case large:
			c := p.idle[bestIdx][0]
			p.idle[bestIdx] = slices.Delete(p.idle[bestIdx], 0, 1)
			bufs, n = append(bufs, c.buf), c.size
			p.st.CachedBlocks--
			p.st.CachedBytes -= int64(n)
		case huge:
			c := p.huge[bestIdx]
			p.huge = slices.Delete(p.huge, bestIdx, bestIdx+1)
			bufs, n = append(bufs, c.buf), c.size
			p.st.CachedBlocks--
			p.st.CachedBytes -= int64(n)
		case slabKind:
			s := bestSlab
			p.idle[s.class] = slices.DeleteFunc(p.idle[s.class], func(c *chunk) bool { return c.slab == s })
			delete(p.slabs, s)
			p.st.Slabs--
			p.st.CachedBlocks -= int64(len(s.chunks))
			p.st.CachedBytes -= int64(len(s.chunks) * classSize(s.class))
			bufs, n = append(bufs, s.buf), s.bytes
		}
		freed += int64(n)
		p.st.Evictions++
	}
	return bufs, freed
}

// capLocked enforces the cap on cached bytes on the hit path: the blocks
// over the cap leave the cache at once, but their unpinning, which may
// synchronize the device (cuMemFreeHost, cuMemHostUnregister), is
// deferred to the next call allowed to synchronize (see takeDeferredLocked).
func (p *state) capLocked() {
	if p.maxCached < 0 || p.st.CachedBytes <= p.maxCached {
		return
	}
	bufs, n := p.evictLocked(p.st.CachedBytes - p.maxCached)
	p.deferred = append(p.deferred, bufs...)
	p.st.DeferredUnpins += int64(len(bufs))
	p.st.DeferredBytes += n
}

// takeDeferredLocked hands the caller, which releases them once the lock
// is dropped, the buffers whose unpinning was deferred and those whose
// release failed before (retried here).
func (p *state) takeDeferredLocked() []*pinmem.Buffer {
	bufs := append(p.deferred, p.unreleased...)
	p.deferred, p.unreleased = nil, nil
	p.st.DeferredUnpins, p.st.DeferredBytes = 0, 0
	p.st.UnreleasedBytes = 0
	return bufs
}

// releaseErr is release for callers that need only its error.
func (p *state) releaseErr(bufs []*pinmem.Buffer, counted bool) error {
	_, err := p.release(bufs, counted)
	return err
}

// release unpins bufs; the caller must not hold p.mu. counted says whether
// the buffers are in PinnedBytes (they are unless a miss failed before
// handing out their memory). The books follow what the driver still
// holds: a buffer unpinned leaves PinnedBytes; one whose release failed
// and that still holds its memory stays in (or joins) PinnedBytes and is
// kept in unreleased, retried by the next miss, Trim, budget reclaim and
// Close. It returns the bytes unpinned.
func (p *state) release(bufs []*pinmem.Buffer, counted bool) (freed int64, err error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	var errs []error
	var kept []*pinmem.Buffer
	var keptBytes int64
	var unpins uint64
	for _, b := range bufs {
		// Pinned, not Len: after a failed Free, Len is 0 while the driver
		// still holds Pinned bytes.
		n := int64(b.Pinned())
		t := time.Now()
		ferr := b.Free()
		p.driverNS.Add(int64(time.Since(t)))
		if ferr != nil {
			errs = append(errs, ferr)
			if held := int64(b.Pinned()); held != 0 {
				kept = append(kept, b)
				keptBytes += held
				freed += n - held
				continue
			}
		}
		// Unpinned, or its release failed and pinmem let the memory go:
		// either way the pool holds it no longer.
		freed += n
		unpins++
	}
	p.mu.Lock()
	if counted {
		p.st.PinnedBytes -= freed
	} else {
		p.st.PinnedBytes += keptBytes
		p.st.PeakPinnedBytes = max(p.st.PeakPinnedBytes, p.st.PinnedBytes)
	}
	p.st.Unpins += unpins
	p.st.ReleaseErrors += uint64(len(errs))
	p.unreleased = append(p.unreleased, kept...)
	p.st.UnreleasedBytes += keptBytes
	p.mu.Unlock()
	return freed, errors.Join(errs...)
}

func (p *state) alloc(n int) (*pinmem.Buffer, error) {
	t := time.Now()
	buf, err := pinmem.Alloc(n, p.flags, p.pinOpts...)
	p.driverNS.Add(int64(time.Since(t)))
	if err == nil && len(buf.Bytes()) < n {
		_, _ = p.release([]*pinmem.Buffer{buf}, false)
		return nil, fmt.Errorf("pool %s: pinmem.Alloc(%d) returned %d bytes: %w", p.name, n, len(buf.Bytes()), cuda.ErrInvalidValue)
	}
	return buf, err
}

// pin serves a miss: it pins a new block (or slab) of class ci and checks
// one block of it out to b, or, when the caller has left h, makes it idle.
func (p *state) pin(h *handoff, b *Block, ci, size, csize int) error {
	isSlab := ci <= lastSlabCls
	nblocks, nbytes := 1, csize
	if isSlab {
		nblocks, nbytes = slabLayout(ci)
	}
	// A miss may synchronize the device anyway (pinning can), so this is
	// where the unpinning deferred by the hit path happens.
	p.mu.Lock()
	victims := p.takeDeferredLocked()
	if !p.retainOnMiss {
		// Keep the footprint within the peak of the bytes in use: pin more
		// than that only when no idle memory is left to release.
		limit := max(p.st.PeakInUseBytes, p.st.InUseBytes+int64(csize))
		if excess := p.st.PinnedBytes + int64(nbytes) - limit; excess > 0 && p.st.CachedBytes > 0 {
			more, _ := p.evictLocked(excess)
			victims = append(victims, more...)
		}
	}
	p.mu.Unlock()
	_, _ = p.release(victims, true)
	buf, err := p.alloc(nbytes)
	if err != nil && errors.Is(err, pinmem.ErrBudget) {
		// Over budget: give back everything idle here, then try once more.
		p.pollAll()
		p.mu.Lock()
		p.st.BudgetRetries++
		victims := p.takeDeferredLocked()
		more, _ := p.evictLocked(-1)
		victims = append(victims, more...)
		p.mu.Unlock()
		_, _ = p.release(victims, true)
		buf, err = p.alloc(nbytes)
		if err != nil && errors.Is(err, pinmem.ErrBudget) {
			p.mu.Lock()
			p.st.BudgetErrors++
			p.mu.Unlock()
		}
	}
	if err != nil {
		return fmt.Errorf("pool %s: pinning %d bytes for Get(%d): %w", p.name, nbytes, size, err)
	}
	var c *chunk
	var s *slab
	if isSlab {
		s = &slab{buf: buf, class: ci, bytes: nbytes}
		if p.flags&pinmem.Mapped != 0 {
			t := time.Now()
			dp, err := buf.DevicePtr()
			p.driverNS.Add(int64(time.Since(t)))
			if err != nil {
				return errors.Join(fmt.Errorf("pool %s: device pointer of a new %d-byte slab: %w", p.name, nbytes, err), p.releaseErr([]*pinmem.Buffer{buf}, false))
			}
			s.dptr, s.hasDptr = dp, true
		}
		mem := buf.Bytes()
		s.chunks = make([]*chunk, nblocks)
		for i := range s.chunks {
			off := i * csize
			s.chunks[i] = &chunk{mem: mem[off : off+csize : off+csize], size: csize, class: ci, slab: s, off: off}
		}
		c = s.chunks[0]
	} else {
		c = &chunk{mem: buf.Bytes()[:csize:csize], size: csize, class: ci, buf: buf}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.Join(fmt.Errorf("pool %s: Get(%d): %w", p.name, size, ErrClosed), p.releaseErr([]*pinmem.Buffer{buf}, false))
	}
	p.st.Pins++
	p.st.PinnedBytes += buf.Pinned() // what the ledger counts; release subtracts the same
	p.st.PeakPinnedBytes = max(p.st.PeakPinnedBytes, p.st.PinnedBytes)
	if s != nil {
		p.slabs[s] = struct{}{}
		p.st.Slabs++
		for i := len(s.chunks) - 1; i > 0; i-- {
			p.releaseLocked(s.chunks[i]) // the next Get takes the block at the lowest address
		}
	}
	if h.left {
		p.releaseLocked(c)
		p.capLocked()
	} else {
		p.checkoutLocked(b, c, false)
		h.done = true
	}
	p.mu.Unlock()
	return nil
}

func (p *state) put(b *Block, streams ...*cuda.Stream) error {
	if b == nil || b.p != p {
		return fmt.Errorf("pool %s: Put of a block from another pool (or nil): %w", p.name, cuda.ErrInvalidValue)
	}
	for i, s := range streams {
		if s == nil {
			return fmt.Errorf("pool %s: Put of block %d: stream %d is nil: %w", p.name, b.id, i, cuda.ErrInvalidValue)
		}
	}
	if !b.state.CompareAndSwap(stateOut, stateReturned) {
		return fmt.Errorf("pool %s: Put of block %d: already returned: %w", p.name, b.id, pinmem.ErrFreed)
	}
	c := b.c
	var evs []evRec
	if len(streams) > 0 && !p.unordered {
		evs = p.record(streams)
	}
	p.mu.Lock()
	p.unlinkLocked(b)
	if p.closed {
		// No wait after Close either: a block with stream work joins the
		// blocks Close waits for; it is unpinned as soon as a later Put or
		// Close sees its work finished.
		var bufs []*pinmem.Buffer
		if len(evs) > 0 {
			p.closePending = append(p.closePending, &pendingEntry{c: c, evs: evs})
			p.st.OrderedPuts++
			p.st.PendingBlocks++
			p.st.PendingBytes += int64(c.size)
			p.st.EventsOutstanding += int64(len(evs))
		} else {
			bufs = p.dropAfterCloseLocked(c)
		}
		p.mu.Unlock()
		err := p.releaseErr(bufs, true)
		_, _ = p.pollClosed(context.Background()) // Put has no ctx: as its own release, inline
		return err
	}
	if len(evs) > 0 {
		p.pending[c.class] = append(p.pending[c.class], &pendingEntry{c: c, evs: evs})
		p.st.OrderedPuts++
		p.st.PendingBlocks++
		p.st.PendingBytes += int64(c.size)
		p.st.EventsOutstanding += int64(len(evs))
		more := len(p.pending[c.class]) > 1
		p.mu.Unlock()
		if more {
			p.poll(c.class, maxPollPerPut, true)
		}
		return nil
	}
	p.releaseLocked(c)
	p.capLocked()
	p.mu.Unlock()
	return nil
}

// record records one event per distinct stream. Where no event can be
// recorded (the event cannot be created, or recording fails) the block
// waits for the stream itself to be idle: nothing waits here.
func (p *state) record(streams []*cuda.Stream) []evRec {
	evs := make([]evRec, 0, len(streams))
	for i, s := range streams {
		if slices.ContainsFunc(streams[:i], func(t *cuda.Stream) bool {
			return t == s || (t.Handle() == s.Handle() && t.Context() == s.Context())
		}) {
			continue
		}
		cctx := s.Context()
		ev, err := p.event(cctx)
		if err == nil {
			t := time.Now()
			err = ev.Record(s)
			p.driverNS.Add(int64(time.Since(t)))
			if err != nil {
				p.retireEvents([]evRec{{ev: ev, cctx: cctx}})
			}
		}
		if err != nil {
			p.mu.Lock()
			p.st.EventErrors++
			p.mu.Unlock()
			evs = append(evs, evRec{cctx: cctx, s: s})
			continue
		}
		evs = append(evs, evRec{ev: ev, cctx: cctx})
	}
	return evs
}

// event returns an idle event of cctx, creating one when none is free.
func (p *state) event(cctx *cuda.Context) (*cuda.Event, error) {
	p.mu.Lock()
	if l := p.evFree[cctx]; len(l) > 0 {
		ev := l[len(l)-1]
		p.evFree[cctx] = l[:len(l)-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	t := time.Now()
	ev, err := cctx.NewEvent(cuda.EventDisableTiming)
	p.driverNS.Add(int64(time.Since(t)))
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.st.EventsCreated++
	p.mu.Unlock()
	return ev, nil
}

// retireEvents puts events back on the free list, or destroys them when the pool is closed.
func (p *state) retireEvents(evs []evRec) {
	p.mu.Lock()
	if !p.closed {
		for _, r := range evs {
			p.evFree[r.cctx] = append(p.evFree[r.cctx], r.ev)
		}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.destroyEvents(evs)
}

// destroyEvents destroys evs. An event whose destruction fails is still
// held by the driver: it is kept in undestroyed and destroyed again by the
// next Trim or Close. An error matching cuda.ErrInvalidHandle says the
// event is gone already (released with its destroyed context, or by an
// earlier attempt): there is nothing left to retry.
func (p *state) destroyEvents(evs []evRec) error {
	var errs []error
	var kept []evRec
	for _, r := range evs {
		t := time.Now()
		err := r.ev.Destroy()
		p.driverNS.Add(int64(time.Since(t)))
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: destroying an event: %w", p.name, err))
			if !errors.Is(err, cuda.ErrInvalidHandle) {
				kept = append(kept, r)
			}
		}
	}
	if len(kept) > 0 {
		p.mu.Lock()
		p.undestroyed = append(p.undestroyed, kept...)
		p.st.UndestroyedEvents = int64(len(p.undestroyed))
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// takeUndestroyedLocked hands the caller the events whose destruction
// failed before, to pass to destroyEvents again.
func (p *state) takeUndestroyedLocked() []evRec {
	evs := p.undestroyed
	p.undestroyed = nil
	p.st.UndestroyedEvents = 0
	return evs
}

// poll checks up to limit (0: all) of the oldest pending blocks of class
// ci, skipping the newest when skipNewest, and makes those whose events
// have all completed idle. It makes its driver calls without the lock.
func (p *state) poll(ci, limit int, skipNewest bool) {
	p.mu.Lock()
	l := p.pending[ci]
	n := len(l)
	if skipNewest {
		n--
	}
	if limit > 0 && n > limit {
		n = limit
	}
	if n <= 0 || p.closed {
		p.mu.Unlock()
		return
	}
	batch := slices.Clone(l[:n])
	p.pending[ci] = slices.Delete(l, 0, n)
	p.polling++
	p.mu.Unlock()

	var queryErrs uint64
	for _, e := range batch {
		for e.next < len(e.evs) {
			t := time.Now()
			done, err := e.evs[e.next].query()
			p.driverNS.Add(int64(time.Since(t)))
			if err != nil {
				queryErrs++ // keep the block pending; Close synchronizes it
			}
			if !done || err != nil {
				break
			}
			e.next++
		}
	}

	p.mu.Lock()
	p.polling--
	p.st.EventErrors += queryErrs
	if p.closed {
		// Closed meanwhile: Close waits for these blocks with the others.
		p.closePending = append(p.closePending, batch...)
		p.mu.Unlock()
		return
	}
	var keep []*pendingEntry
	for _, e := range batch {
		for _, r := range eventsOf(e.evs[e.retired:e.next]) {
			p.evFree[r.cctx] = append(p.evFree[r.cctx], r.ev)
		}
		p.st.EventsOutstanding -= int64(e.next - e.retired)
		e.retired = e.next
		if e.next < len(e.evs) {
			keep = append(keep, e)
			continue
		}
		p.st.PendingBlocks--
		p.st.PendingBytes -= int64(e.c.size)
		p.releaseLocked(e.c)
	}
	p.pending[ci] = append(keep, p.pending[ci]...)
	p.capLocked()
	p.mu.Unlock()
}

// pollAll polls every pending block once.
func (p *state) pollAll() {
	p.mu.Lock()
	var classes []int
	for ci, l := range p.pending {
		if len(l) > 0 {
			classes = append(classes, ci)
		}
	}
	p.mu.Unlock()
	for _, ci := range classes {
		p.poll(ci, 0, false)
	}
}

// pollClosed checks the blocks of a closed pool that wait for stream
// work, without waiting, and unpins those whose work has finished. An
// event whose queries keep failing (a broken context, whose work will not
// run: see queryClosed) counts as finished, and its error is returned.
// left is the number of
// blocks still waiting, including those a poll of the open pool holds.
// Unpinning, which may wait for the device, is bounded by ctx (see await).
func (p *state) pollClosed(ctx context.Context) (left int, err error) {
	p.mu.Lock()
	batch := p.closePending
	p.closePending = nil
	p.polling++
	p.mu.Unlock()
	var errs []error
	var keep, done []*pendingEntry
	for _, e := range batch {
		failed := false
		for e.next < len(e.evs) {
			ok, qerr := p.queryClosed(e.evs[e.next])
			if qerr != nil {
				errs = append(errs, fmt.Errorf("pool %s: event of block on close: %w", p.name, qerr))
				failed = true
				break
			}
			if !ok {
				break
			}
			e.next++
		}
		if failed || e.next == len(e.evs) {
			done = append(done, e)
		} else {
			keep = append(keep, e)
		}
	}
	var evs []evRec
	var bufs []*pinmem.Buffer
	p.mu.Lock()
	p.polling--
	p.closePending = append(keep, p.closePending...)
	for _, e := range done {
		rest := e.evs[e.retired:]
		e.retired = len(e.evs)
		evs = append(evs, eventsOf(rest)...)
		p.st.EventsOutstanding -= int64(len(rest))
		p.st.PendingBlocks--
		p.st.PendingBytes -= int64(e.c.size)
		bufs = append(bufs, p.dropAfterCloseLocked(e.c)...)
	}
	left = len(p.closePending) + p.polling + p.busy
	p.mu.Unlock()
	if len(bufs) > 0 || len(evs) > 0 {
		errs = append(errs, p.await(ctx, "Close", p.releaser(bufs, evs)))
	}
	return left, errors.Join(errs...)
}

// releaser returns the work, for await, of unpinning bufs (counted in
// PinnedBytes) and destroying evs, whose result goes to the caller when it
// finishes before the caller's ctx ends.
func (p *state) releaser(bufs []*pinmem.Buffer, evs []evRec) func(h *handoff) error {
	return func(h *handoff) error {
		err := errors.Join(p.releaseErr(bufs, true), p.destroyEvents(evs))
		p.mu.Lock()
		h.done = !h.left
		p.mu.Unlock()
		return err
	}
}

// queryAttempts is how many times pollClosed queries an event before it
// takes a failure for a broken context.
const queryAttempts = 3

// queryClosed queries ev for pollClosed. A failure counts as finished
// there (a broken context's work never runs), so it must be one that
// lasts: the query is repeated, and only an event that fails every
// attempt is reported with the last error. A failure that does not last
// is counted in EventErrors and the event's answer stands.
func (p *state) queryClosed(r evRec) (done bool, err error) {
	for range queryAttempts {
		t := time.Now()
		done, err = r.query()
		p.driverNS.Add(int64(time.Since(t)))
		if err == nil {
			return done, nil
		}
		p.mu.Lock()
		p.st.EventErrors++
		p.mu.Unlock()
	}
	return false, err
}

// drainClosed polls the blocks a closed pool waits for until none is left
// or ctx is done; the wait between polls grows from microseconds to a few
// milliseconds, so a block is seen finished soon after its work ran.
func (p *state) drainClosed(ctx context.Context) error {
	var errs []error
	wait := 20 * time.Microsecond
	for {
		left, err := p.pollClosed(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		if left == 0 {
			return errors.Join(errs...)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(append(errs, fmt.Errorf("pool %s: Close: %d block(s) still used by stream work stay pinned (Close again to wait for them): %w", p.name, left, ctx.Err()))...)
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
}

// dropAfterCloseLocked takes back a block of a closed pool and returns the
// buffer to release: its own, or its slab's once every block of the slab
// is back.
func (p *state) dropAfterCloseLocked(c *chunk) []*pinmem.Buffer {
	if c.buf != nil {
		return []*pinmem.Buffer{c.buf}
	}
	s := c.slab
	s.idle++
	if s.idle < len(s.chunks) {
		return nil
	}
	delete(p.slabs, s)
	p.st.Slabs--
	return []*pinmem.Buffer{s.buf}
}

// spareEventsLocked takes the pool's idle events for destroyEvents.
func (p *state) spareEventsLocked() []evRec {
	var evs []evRec
	for cctx, l := range p.evFree {
		for _, ev := range l {
			evs = append(evs, evRec{ev: ev, cctx: cctx})
		}
	}
	clear(p.evFree)
	return evs
}

func (p *state) trim(ctx context.Context) (freed int64, err error) {
	p.pollAll()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, fmt.Errorf("pool %s: Trim: %w", p.name, ErrClosed)
	}
	// Checked before anything leaves the cache: once taken, the memory
	// must be released (await runs the release however ctx ends).
	if err := ctx.Err(); err != nil {
		p.mu.Unlock()
		return 0, fmt.Errorf("pool %s: Trim: %w", p.name, err)
	}
	bufs := p.takeDeferredLocked()
	more, _ := p.evictLocked(-1)
	bufs = append(bufs, more...)
	evs := append(p.takeUndestroyedLocked(), p.spareEventsLocked()...)
	p.mu.Unlock()
	err = p.await(ctx, "Trim", func(h *handoff) error {
		n, err := p.release(bufs, true)
		err = errors.Join(err, p.destroyEvents(evs))
		p.mu.Lock()
		if !h.left {
			freed, h.done = n, true
		}
		p.mu.Unlock()
		return err
	})
	return freed, err
}

// Reclaim unpins idle memory, least recently released first, until at
// least want bytes are freed or nothing idle is left, and returns the
// bytes freed. It makes the state a reclaim.Reclaimer: pinmem's budget
// calls it when an allocation anywhere in the process would exceed the
// budget.
func (p *state) Reclaim(want int64) (freed int64) {
	if want <= 0 {
		return 0
	}
	p.pollAll()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0
	}
	bufs := p.takeDeferredLocked()
	var taken int64
	for _, b := range bufs {
		// Pinned, not Len: a buffer whose release failed has Len 0 but
		// still holds its memory, which release counts when it frees it.
		taken += int64(b.Pinned())
	}
	if taken < want {
		more, _ := p.evictLocked(want - taken)
		bufs = append(bufs, more...)
	}
	p.mu.Unlock()
	freed, _ = p.release(bufs, true)
	p.mu.Lock()
	p.st.Reclaimed += freed
	p.mu.Unlock()
	return freed
}

// close closes the pool (the first call) and waits, bounded by ctx, for
// the blocks still used by stream work; a later call after one that
// expired waits again for what is left, and retries releases that
// failed. Once nothing is left it returns ErrClosed.
func (p *state) close(ctx context.Context) error {
	p.mu.Lock()
	first := !p.closed
	if !first && p.doneLocked() {
		p.mu.Unlock()
		return fmt.Errorf("pool %s: Close: %w", p.name, ErrClosed)
	}
	var bufs []*pinmem.Buffer
	var evs []evRec
	var outErr error
	if first {
		p.closed = true
		for ci, l := range p.pending {
			p.closePending = append(p.closePending, l...)
			p.pending[ci] = nil
		}
		bufs = append(bufs, p.takeDeferredLocked()...)
		evicted, _ := p.evictLocked(-1)
		bufs = append(bufs, evicted...)
		// What is left idle lives in slabs with blocks still out: those
		// blocks count as returned already.
		for ci := range p.idle {
			p.idle[ci] = nil
		}
		p.st.CachedBlocks, p.st.CachedBytes = 0, 0
		evs = append(p.takeUndestroyedLocked(), p.spareEventsLocked()...)
		if p.out.next != &p.out {
			oe := &OutstandingError{Pool: p.name}
			for b := p.out.next; b != &p.out; b = b.next {
				oe.Blocks = append(oe.Blocks, Outstanding{ID: b.id, Size: b.n, Cap: b.c.size, Stack: b.stack})
			}
			outErr = oe
		}
	} else {
		bufs = p.takeDeferredLocked()
		evs = p.takeUndestroyedLocked()
	}
	p.mu.Unlock()

	if first {
		p.removeReclaimer()
	}
	// Unpinning may wait for all work on the device: bounded by ctx, it
	// finishes in the background (counted in busy, which a later Close
	// waits for) when ctx ends first.
	var relErr error
	if len(bufs) > 0 || len(evs) > 0 {
		relErr = p.await(ctx, "Close", p.releaser(bufs, evs))
	}
	return errors.Join(relErr, p.drainClosed(ctx), outErr)
}

// done reports whether the pool is closed with nothing left to wait for
// or to retry (blocks still out are the user's).
func (p *state) done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed && p.doneLocked()
}

// doneLocked reports whether nothing is left to wait for or to retry.
func (p *state) doneLocked() bool {
	return len(p.closePending) == 0 && p.polling == 0 && p.busy == 0 && len(p.unreleased) == 0 && len(p.undestroyed) == 0
}

// collect releases what a pool dropped without Close holds and no one can
// use any more: idle memory, spare events, blocks whose stream work has
// finished. Blocks still out (their memory may still be referenced
// through Bytes) and blocks whose stream work has not been seen finished
// stay pinned. A pool that was closed is not reported.
func (p *state) collect() {
	p.mu.Lock()
	closed, out, pending := p.closed, p.st.InUseBlocks, p.st.PendingBlocks
	p.mu.Unlock()
	if !closed {
		track.Dropped("pool", "pool", p.name, "blocks_out", out, "blocks_pending", pending)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // poll once: no one waits for a dropped pool
	_ = p.close(ctx)
}

func (p *state) stats() Stats {
	p.mu.Lock()
	s := p.st
	p.mu.Unlock()
	s.WastedBytes = s.InUseBytes - s.RequestedBytes
	s.DriverTime = time.Duration(p.driverNS.Load())
	return s
}
