package pool

import (
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

type evRec struct {
	ev  *cuda.Event
	ctx *cuda.Context
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

// Block is pinned memory taken from a Pool with Get. Give it back with Put;
// after Put, Bytes returns nil and the memory must no longer be touched
// (by the host, or by device work queued after the Put).
type Block struct {
	p          *Pool
	c          *chunk
	n          int
	id         uint64
	state      atomic.Uint32
	prev, next *Block
	stack      string
}

// Bytes returns the block's memory: Len() bytes, with capacity Cap(). It
// returns nil once the block has been Put.
func (b *Block) Bytes() []byte {
	if b.state.Load() != stateOut {
		return nil
	}
	return b.c.mem[:b.n]
}

// Len returns the size requested from Get.
func (b *Block) Len() int { return b.n }

// Cap returns the block's capacity: its size class, at least Len().
func (b *Block) Cap() int { return b.c.size }

// ID returns the block's sequence number in its pool, as Close's
// OutstandingError reports it.
func (b *Block) ID() uint64 { return b.id }

// DevicePtr returns the device address of the block's memory, for kernels
// that read or write it directly (zero-copy). The pool must have been
// created WithFlags(pinmem.Mapped) (or the platform must map all pinned
// memory); otherwise the error is pinmem's.
func (b *Block) DevicePtr() (cuda.DevicePtr, error) {
	if b.state.Load() != stateOut {
		return 0, fmt.Errorf("pool %s: block %d already returned: %w", b.p.name, b.id, pinmem.ErrFreed)
	}
	c := b.c
	if c.buf != nil {
		return c.buf.DevicePtr()
	}
	if c.slab.hasDptr {
		return c.slab.dptr.Add(c.off), nil
	}
	dp, err := c.slab.buf.DevicePtr()
	if err != nil {
		return 0, err
	}
	return dp.Add(c.off), nil
}

// Pool is a caching allocator of pinned host memory. Get returns a block
// of at least the size asked for, from the cache when one of its size
// class is idle (a hit: no driver call, no lock held across one) or newly
// pinned (a miss, which may synchronize the device: see the package
// documentation). Put returns a block; when asynchronous work on streams
// still uses it, Put records an event on each stream and the block is
// handed out again only once those events have completed, found by
// polling (cuEventQuery) on later Gets and Puts: no goroutine or thread
// ever waits for them.
//
// Size classes waste less than 1/8 of a request (see RoundedSize); small
// blocks are carved from shared slabs; requests above HugeThreshold are
// pinned on their own. A pool respects pinmem's budget: when pinning fails
// on it, the pool releases its idle memory and retries once, then returns
// the budget error. It also registers itself as a pinmem.Reclaimer, so
// the budget can ask it for idle memory on behalf of other allocations.
//
// A Pool is safe for concurrent use. Its Stats are published with expvar
// as "pinmem.pool.<name>" while it is open.
type Pool struct {
	name         string
	flags        pinmem.Flags
	device       *cuda.Device
	method       pinmem.Method
	maxCached    int64
	retainOnMiss bool
	stacks       bool

	// unordered makes Put ignore its streams (tests only: it shows that
	// stream-ordered reuse is what keeps queued copies correct).
	unordered bool

	removeReclaimer func()
	driverNS        atomic.Int64

	mu         sync.Mutex
	closed     bool
	idle       [][]*chunk // per class: LIFO stack of idle blocks (index 0 is the oldest)
	huge       []*chunk   // idle huge blocks, by size
	pending    [][]*pendingEntry
	slabs      map[*slab]struct{}
	quarantine []*chunk // blocks whose stream work could not be tracked; freed at Close
	// deferred holds idle memory evicted by the cap on the hit path (a
	// Put, or a Get or Put that found stream-ordered blocks finished):
	// unpinning may synchronize the device, so it waits for the next
	// call allowed to (a miss, Trim, Reclaim, Close). Still pinned.
	deferred []*pinmem.Buffer
	out      Block // sentinel of the list of blocks out
	nextID   uint64
	seq      uint64
	evFree   map[*cuda.Context][]*cuda.Event
	st       Stats
}

var poolSeq atomic.Uint64

// New creates a pool. With no options it pins default (non-portable,
// unmapped) memory with pinmem.MethodAuto, caches without a byte cap and
// releases idle memory on misses (see WithRetainOnMiss).
func New(opts ...Option) (*Pool, error) {
	cfg := config{method: pinmem.MethodAuto, maxCached: -1}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.name == "" {
		cfg.name = fmt.Sprintf("pool%d", poolSeq.Add(1))
	}
	if cfg.maxCached >= 0 && cfg.prewarmBytes > cfg.maxCached {
		return nil, fmt.Errorf("pool %s: prewarm of %d bytes exceeds the cache cap of %d: %w", cfg.name, cfg.prewarmBytes, cfg.maxCached, cuda.ErrInvalidValue)
	}
	p := &Pool{
		name:         cfg.name,
		flags:        cfg.flags,
		device:       cfg.device,
		method:       cfg.method,
		maxCached:    cfg.maxCached,
		retainOnMiss: cfg.retainOnMiss,
		stacks:       cfg.stacks,
		idle:         make([][]*chunk, numClasses),
		pending:      make([][]*pendingEntry, classesTotal),
		slabs:        map[*slab]struct{}{},
		evFree:       map[*cuda.Context][]*cuda.Event{},
	}
	p.st.Name = p.name
	p.out.next, p.out.prev = &p.out, &p.out
	if err := register(p); err != nil {
		return nil, err
	}
	p.removeReclaimer = pinmem.AddReclaimer(p)
	if cfg.prewarmBytes > 0 {
		if err := p.prewarm(cfg.prewarmSize, cfg.prewarmBytes); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *Pool) prewarm(size int, total int64) error {
	var blocks []*Block
	var got int64
	var err error
	for got < total {
		var b *Block
		if b, err = p.Get(size); err != nil {
			break
		}
		blocks = append(blocks, b)
		got += int64(b.Cap())
	}
	for _, b := range blocks {
		if perr := p.Put(b); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return fmt.Errorf("pool %s: prewarming %d bytes: %w", p.name, total, err)
	}
	p.mu.Lock()
	p.st.Gets, p.st.Hits, p.st.Misses, p.st.Puts = 0, 0, 0, 0
	p.st.PeakRequestedBytes, p.st.PeakInUseBytes = 0, 0
	p.mu.Unlock()
	return nil
}

// Name returns the pool's name.
func (p *Pool) Name() string { return p.name }

// Flags returns the pinmem flags of the pool's memory.
func (p *Pool) Flags() pinmem.Flags { return p.flags }

// Get returns a pinned block of at least size bytes (Len() == size). Its
// contents are whatever the block held before. It fails with an error
// matching cuda.ErrInvalidValue for a size outside [1, MaxSize],
// ErrClosed after Close, pinmem.ErrBudget (a *pinmem.BudgetError) when the
// pinned budget does not allow the memory even after the pool released
// its idle blocks, or the driver's error. A hit makes no driver call
// other than cuEventQuery; a miss pins memory (and may unpin idle memory
// first), which may wait for all work queued on the device.
func (p *Pool) Get(size int) (*Block, error) {
	if size <= 0 || size > MaxSize {
		return nil, fmt.Errorf("pool %s: Get(%d): size outside [1, %d]: %w", p.name, size, MaxSize, cuda.ErrInvalidValue)
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
		havePending := len(p.pending[ci]) > 0
		p.mu.Unlock()
		if polled || !havePending {
			break
		}
		p.poll(ci, maxPollPerGet, false)
	}
	if err := p.pin(b, ci, size, csize); err != nil {
		return nil, err
	}
	return b, nil
}

// takeIdleLocked removes and returns an idle block fit for a request of n bytes of class ci.
func (p *Pool) takeIdleLocked(ci, n int) *chunk {
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
		for j := ci; j < numClasses && (j == ci || classSize(j)-n <= n/8); j++ {
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

func (p *Pool) checkoutLocked(b *Block, c *chunk, hit bool) {
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

func (p *Pool) unlinkLocked(b *Block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	p.st.Puts++
	p.st.InUseBlocks--
	p.st.InUseBytes -= int64(b.c.size)
	p.st.RequestedBytes -= int64(b.n)
}

// releaseLocked makes c idle.
func (p *Pool) releaseLocked(c *chunk) {
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

// evictLocked removes idle memory, least recently released first, until at
// least want bytes are unpinned (all of it when want < 0), and returns the
// buffers to free once the lock is dropped.
func (p *Pool) evictLocked(want int64) (bufs []*pinmem.Buffer, freed int64) {
	bufs, freed = p.evictIdleLocked(want)
	p.st.PinnedBytes -= freed
	p.st.Unpins += uint64(len(bufs))
	return bufs, freed
}

// evictIdleLocked takes idle memory out of the cache, least recently
// released first, until at least want bytes are taken (all of it when
// want < 0); the memory still counts as pinned.
func (p *Pool) evictIdleLocked(want int64) (bufs []*pinmem.Buffer, freed int64) {
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
func (p *Pool) capLocked() {
	if p.maxCached < 0 || p.st.CachedBytes <= p.maxCached {
		return
	}
	bufs, n := p.evictIdleLocked(p.st.CachedBytes - p.maxCached)
	p.deferred = append(p.deferred, bufs...)
	p.st.DeferredUnpins += int64(len(bufs))
	p.st.DeferredBytes += n
}

// takeDeferredLocked hands the buffers whose unpinning was deferred to the
// caller, which frees them once the lock is dropped, and returns their bytes.
func (p *Pool) takeDeferredLocked() ([]*pinmem.Buffer, int64) {
	bufs, n := p.deferred, p.st.DeferredBytes
	p.deferred = nil
	p.st.PinnedBytes -= n
	p.st.Unpins += uint64(len(bufs))
	p.st.DeferredUnpins, p.st.DeferredBytes = 0, 0
	return bufs, n
}

// freeBufs unpins buffers; the caller must not hold p.mu.
func (p *Pool) freeBufs(bufs []*pinmem.Buffer) error {
	var errs []error
	for _, b := range bufs {
		t := time.Now()
		err := b.Free()
		p.driverNS.Add(int64(time.Since(t)))
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *Pool) alloc(n int) (*pinmem.Buffer, error) {
	opts := []pinmem.Option{pinmem.WithMethod(p.method)}
	if p.device != nil {
		opts = append(opts, pinmem.WithDevice(p.device))
	}
	t := time.Now()
	buf, err := pinmem.Alloc(n, p.flags, opts...)
	p.driverNS.Add(int64(time.Since(t)))
	if err == nil && len(buf.Bytes()) < n {
		_ = p.freeBufs([]*pinmem.Buffer{buf})
		return nil, fmt.Errorf("pool %s: pinmem.Alloc(%d) returned %d bytes: %w", p.name, n, len(buf.Bytes()), cuda.ErrInvalidValue)
	}
	return buf, err
}

// pin serves a miss: it pins a new block (or slab) of class ci and checks
// one block of it out to b.
func (p *Pool) pin(b *Block, ci, size, csize int) error {
	isSlab := ci <= lastSlabCls
	nblocks, nbytes := 1, csize
	if isSlab {
		nblocks, nbytes = slabLayout(ci)
	}
	// A miss may synchronize the device anyway (pinning can), so this is
	// where the unpinning deferred by the hit path happens.
	p.mu.Lock()
	victims, _ := p.takeDeferredLocked()
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
	_ = p.freeBufs(victims)
	buf, err := p.alloc(nbytes)
	if err != nil && errors.Is(err, pinmem.ErrBudget) {
		// Over budget: give back everything idle here, then try once more.
		p.pollAll()
		p.mu.Lock()
		p.st.BudgetRetries++
		victims, _ := p.takeDeferredLocked()
		more, _ := p.evictLocked(-1)
		victims = append(victims, more...)
		p.mu.Unlock()
		_ = p.freeBufs(victims)
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
				return errors.Join(fmt.Errorf("pool %s: device pointer of a new %d-byte slab: %w", p.name, nbytes, err), p.freeBufs([]*pinmem.Buffer{buf}))
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
		return errors.Join(fmt.Errorf("pool %s: Get(%d): %w", p.name, size, ErrClosed), p.freeBufs([]*pinmem.Buffer{buf}))
	}
	p.st.Pins++
	p.st.PinnedBytes += int64(nbytes)
	p.st.PeakPinnedBytes = max(p.st.PeakPinnedBytes, p.st.PinnedBytes)
	if s != nil {
		p.slabs[s] = struct{}{}
		p.st.Slabs++
		for i := len(s.chunks) - 1; i > 0; i-- {
			p.releaseLocked(s.chunks[i]) // the next Get takes the block at the lowest address
		}
	}
	p.checkoutLocked(b, c, false)
	p.mu.Unlock()
	return nil
}

// Put gives b back to the pool. With no streams the block is idle at once
// and Put makes no driver call (idle memory over WithMaxCached is unpinned
// later, at the next miss, Trim, Reclaim or Close: unpinning may
// synchronize the device). With streams, the block must be in use by
// asynchronous work queued on them (copies, kernels): Put records an event
// on each stream and does not wait; the block is reused only after those
// events have completed. A stream whose event cannot be recorded is
// synchronized instead; if that fails too, the block is kept out of use
// until Close and the error is returned.
//
// Putting a block twice fails with an error matching pinmem.ErrFreed; a
// block of another pool or a nil stream with cuda.ErrInvalidValue.
// After Close, Put unpins the block (waiting for its streams first).
func (p *Pool) Put(b *Block, streams ...*cuda.Stream) error {
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
	var recErr error
	if len(streams) > 0 && !p.unordered {
		evs, recErr = p.record(streams)
	}
	p.mu.Lock()
	p.unlinkLocked(b)
	if recErr != nil {
		var bufs []*pinmem.Buffer
		if p.closed {
			bufs = p.dropAfterCloseLocked(c)
		} else {
			p.quarantine = append(p.quarantine, c)
		}
		p.mu.Unlock()
		p.retireEvents(evs)
		return errors.Join(fmt.Errorf("pool %s: Put of block %d: %w", p.name, b.id, recErr), p.freeBufs(bufs))
	}
	if p.closed {
		p.mu.Unlock()
		return p.returnAfterClose(c, evs)
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

// record records one event per distinct stream.
func (p *Pool) record(streams []*cuda.Stream) ([]evRec, error) {
	evs := make([]evRec, 0, len(streams))
	for i, s := range streams {
		if slices.ContainsFunc(streams[:i], func(t *cuda.Stream) bool {
			return t == s || (t.Handle() == s.Handle() && t.Context() == s.Context())
		}) {
			continue
		}
		ctx := s.Context()
		ev, err := p.event(ctx)
		if err == nil {
			t := time.Now()
			err = ev.Record(s)
			p.driverNS.Add(int64(time.Since(t)))
			if err != nil {
				p.retireEvents([]evRec{{ev, ctx}})
			}
		}
		if err != nil {
			p.mu.Lock()
			p.st.EventErrors++
			p.mu.Unlock()
			t := time.Now()
			serr := s.Synchronize()
			p.driverNS.Add(int64(time.Since(t)))
			if serr != nil {
				return evs, fmt.Errorf("cannot record an event on stream %#x (%w) nor synchronize it: %w", s.Handle(), err, serr)
			}
			continue
		}
		evs = append(evs, evRec{ev, ctx})
	}
	return evs, nil
}

// event returns an idle event of ctx, creating one when none is free.
func (p *Pool) event(ctx *cuda.Context) (*cuda.Event, error) {
	p.mu.Lock()
	if l := p.evFree[ctx]; len(l) > 0 {
		ev := l[len(l)-1]
		p.evFree[ctx] = l[:len(l)-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	t := time.Now()
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
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
func (p *Pool) retireEvents(evs []evRec) {
	p.mu.Lock()
	if !p.closed {
		for _, r := range evs {
			p.evFree[r.ctx] = append(p.evFree[r.ctx], r.ev)
		}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.destroyEvents(evs)
}

func (p *Pool) destroyEvents(evs []evRec) error {
	var errs []error
	for _, r := range evs {
		t := time.Now()
		err := r.ev.Destroy()
		p.driverNS.Add(int64(time.Since(t)))
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// poll checks up to limit (0: all) of the oldest pending blocks of class
// ci, skipping the newest when skipNewest, and makes those whose events
// have all completed idle. It makes its driver calls without the lock.
func (p *Pool) poll(ci, limit int, skipNewest bool) {
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
	p.mu.Unlock()

	var queryErrs uint64
	for _, e := range batch {
		for e.next < len(e.evs) {
			t := time.Now()
			done, err := e.evs[e.next].ev.Query()
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
	p.st.EventErrors += queryErrs
	if p.closed {
		p.mu.Unlock()
		for _, e := range batch {
			_ = p.finishAfterClose(e)
		}
		return
	}
	var keep []*pendingEntry
	for _, e := range batch {
		for _, r := range e.evs[e.retired:e.next] {
			p.evFree[r.ctx] = append(p.evFree[r.ctx], r.ev)
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
func (p *Pool) pollAll() {
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

// finishAfterClose waits for a pending block's remaining events, destroys
// them and unpins the block.
func (p *Pool) finishAfterClose(e *pendingEntry) error {
	rest := e.evs[e.retired:]
	p.mu.Lock()
	p.st.EventsOutstanding -= int64(len(rest))
	p.st.PendingBlocks--
	p.st.PendingBytes -= int64(e.c.size)
	p.mu.Unlock()
	e.retired = len(e.evs)
	return p.returnAfterClose(e.c, rest)
}

// returnAfterClose waits for evs, destroys them, and unpins c (a slab once all its blocks are back).
func (p *Pool) returnAfterClose(c *chunk, evs []evRec) error {
	var errs []error
	for _, r := range evs {
		t := time.Now()
		err := r.ev.Synchronize()
		p.driverNS.Add(int64(time.Since(t)))
		if err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, p.destroyEvents(evs))
	p.mu.Lock()
	bufs := p.dropAfterCloseLocked(c)
	p.mu.Unlock()
	errs = append(errs, p.freeBufs(bufs))
	return errors.Join(errs...)
}

func (p *Pool) dropAfterCloseLocked(c *chunk) []*pinmem.Buffer {
	if c.buf != nil {
		p.st.PinnedBytes -= int64(c.size)
		p.st.Unpins++
		return []*pinmem.Buffer{c.buf}
	}
	s := c.slab
	s.idle++
	if s.idle < len(s.chunks) {
		return nil
	}
	delete(p.slabs, s)
	p.st.Slabs--
	p.st.PinnedBytes -= int64(s.bytes)
	p.st.Unpins++
	return []*pinmem.Buffer{s.buf}
}

// Trim unpins every idle block (and slab whose blocks are all idle) now,
// after checking which stream-ordered blocks have become idle, and
// destroys the pool's spare events. It returns the bytes unpinned.
func (p *Pool) Trim() (freed int64, err error) {
	p.pollAll()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, fmt.Errorf("pool %s: Trim: %w", p.name, ErrClosed)
	}
	bufs, freed := p.takeDeferredLocked()
	more, n := p.evictLocked(-1)
	bufs, freed = append(bufs, more...), freed+n
	var evs []evRec
	for ctx, l := range p.evFree {
		for _, ev := range l {
			evs = append(evs, evRec{ev, ctx})
		}
	}
	clear(p.evFree)
	p.mu.Unlock()
	return freed, errors.Join(p.freeBufs(bufs), p.destroyEvents(evs))
}

// Reclaim unpins idle memory, least recently used first, until at least
// want bytes are freed or nothing idle is left, and returns the bytes
// freed. It implements pinmem.Reclaimer: pinmem's budget calls it when an
// allocation anywhere in the process would exceed the budget.
func (p *Pool) Reclaim(want int64) (freed int64) {
	if want <= 0 {
		return 0
	}
	p.pollAll()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0
	}
	bufs, freed := p.takeDeferredLocked()
	if freed < want {
		more, n := p.evictLocked(want - freed)
		bufs, freed = append(bufs, more...), freed+n
	}
	p.st.Reclaimed += freed
	p.mu.Unlock()
	_ = p.freeBufs(bufs)
	return freed
}

// Close unpins all idle memory, waits for the stream work of blocks Put
// with streams and unpins them, destroys the pool's events, and withdraws
// the pool from pinmem's reclaimers and from expvar. Blocks still out stay
// valid and pinned until they are Put, which then unpins them; Close
// reports them in an *OutstandingError (matching ErrOutstanding). A second
// Close returns an error matching ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("pool %s: Close: %w", p.name, ErrClosed)
	}
	p.closed = true
	var entries []*pendingEntry
	for ci, l := range p.pending {
		entries = append(entries, l...)
		p.pending[ci] = nil
	}
	var bufs []*pinmem.Buffer
	for _, c := range p.quarantine {
		bufs = append(bufs, p.dropAfterCloseLocked(c)...)
	}
	p.quarantine = nil
	deferred, _ := p.takeDeferredLocked()
	bufs = append(bufs, deferred...)
	evicted, _ := p.evictLocked(-1)
	bufs = append(bufs, evicted...)
	// What is left idle lives in slabs with blocks still out: those
	// blocks count as returned already.
	for ci := range p.idle {
		p.idle[ci] = nil
	}
	p.st.CachedBlocks, p.st.CachedBytes = 0, 0
	var evs []evRec
	for ctx, l := range p.evFree {
		for _, ev := range l {
			evs = append(evs, evRec{ev, ctx})
		}
	}
	p.evFree = map[*cuda.Context][]*cuda.Event{}
	var outErr error
	if p.out.next != &p.out {
		oe := &OutstandingError{Pool: p.name}
		for b := p.out.next; b != &p.out; b = b.next {
			oe.Blocks = append(oe.Blocks, Outstanding{ID: b.id, Size: b.n, Cap: b.c.size, Stack: b.stack})
		}
		outErr = oe
	}
	p.mu.Unlock()

	unregister(p)
	p.removeReclaimer()
	errs := []error{p.freeBufs(bufs), p.destroyEvents(evs)}
	for _, e := range entries {
		errs = append(errs, p.finishAfterClose(e))
	}
	errs = append(errs, outErr)
	return errors.Join(errs...)
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	s := p.st
	p.mu.Unlock()
	s.WastedBytes = s.InUseBytes - s.RequestedBytes
	s.DriverTime = time.Duration(p.driverNS.Load())
	return s
}
