package pool

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/internal/reclaim"
)

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
// Size classes waste less than 1/8 of a request (see Block.Cap); small
// blocks are carved from shared slabs; requests above HugeThreshold are
// pinned on their own. A pool respects pinmem's budget: when pinning fails
// on it, the pool releases its idle memory and retries once, then returns
// the budget error. pinmem's budget can also take its idle memory on behalf
// of other allocations.
//
// A Pool is safe for concurrent use. It publishes nothing by itself: read
// Stats, or export them with package prom.
//
// A Pool that becomes unreachable without Close is reported as dropped
// (counted in pinmem's dropped owners and logged through pinmem's logger)
// and the garbage collector's cleanup releases what nobody can still use:
// idle memory, spare events, and blocks whose stream work has finished.
// Blocks still out, whose memory a slice from Bytes may still reference,
// and blocks whose stream work has not been seen finished stay pinned for
// the life of the process. Close pools.
type Pool struct {
	s       *state
	cleanup runtime.Cleanup
}

var poolSeq atomic.Uint64

// New creates a pool. With no options it pins default (non-portable,
// unmapped) memory of device 0 with pinmem.MethodAuto, caches without a
// byte cap and releases idle memory on misses (see WithRetainOnMiss). It
// returns a *pinmem.OptionError (matching cuda.ErrInvalidValue) for an option it
// refuses, and the error of pinning for WithPrewarm.
//
// When prewarming fails, New unpins what it had pinned before returning
// the error. If the driver fails that too, the memory stays counted as
// pinned (pinmem.Stats) and every later New retries its release first, so
// that a caller retrying New once the driver works again leaves nothing
// behind.
func New(opts ...Option) (*Pool, error) {
	lifecycle.RetryOrphans()
	cfg := config{maxCached: -1}
	for i, o := range opts {
		if o == nil {
			return nil, &pinmem.OptionError{Func: "pool.New", Option: "Option", Value: "nil", Reason: fmt.Sprintf("option %d is nil", i)}
		}
		o(&cfg)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if !cfg.nameSet {
		cfg.name = fmt.Sprintf("pool%d", poolSeq.Add(1))
	}
	s := &state{
		name:         cfg.name,
		flags:        cfg.flags,
		pinOpts:      cfg.pinOpts,
		maxCached:    cfg.maxCached,
		retainOnMiss: cfg.retainOnMiss,
		stacks:       cfg.stacks,
		idle:         make([][]*chunk, numClasses),
		pending:      make([][]*pendingEntry, classesTotal),
		slabs:        map[*slab]struct{}{},
		evFree:       map[*cuda.Context][]*cuda.Event{},
	}
	s.st.Name = s.name
	s.out.next, s.out.prev = &s.out, &s.out
	s.removeReclaimer = reclaim.Add(s)
	if cfg.prewarmSet && cfg.prewarmBytes > 0 {
		if err := s.prewarm(cfg.prewarmSize, cfg.prewarmBytes); err != nil {
			if cerr := s.close(context.Background()); cerr != nil && !s.done() {
				lifecycle.Orphan(s.retry)
			}
			return nil, err
		}
	}
	p := &Pool{s: s}
	p.cleanup = runtime.AddCleanup(p, collect, s)
	return p, nil
}

// retry retries the release of a pool New failed to make (an orphan, see
// lifecycle.Orphan) and reports whether it released everything. An orphan
// has no stream work to wait for: close returns at once.
func (s *state) retry() bool {
	_ = s.close(context.Background())
	return s.done()
}

// collect runs when a Pool has become unreachable. Unless a Close released
// everything (which stops the cleanup), it reports a pool dropped without
// Close and releases, off the cleanup goroutine, what is safe to release.
func collect(s *state) { go s.collect() }

// Get returns a pinned block of at least size bytes (Len() == size). Its
// contents are whatever the block held before. It fails with an error
// matching cuda.ErrInvalidValue for a size outside [1, pinmem.MaxSize] or a
// nil ctx, ErrClosed after Close, pinmem.ErrBudget (a *pinmem.BudgetError)
// when the pinned budget does not allow the memory even after the pool
// released its idle blocks, or the driver's error. Get never waits for
// memory to come back: over the budget it fails at once.
//
// A hit makes no driver call other than cuEventQuery and does not wait. A
// miss pins memory (and may unpin idle memory first), which may wait for
// all work queued on the device (see the package documentation); that wait
// is bounded by ctx: when ctx is done first, Get returns an error matching
// ctx.Err(), and the pinning, which the driver cannot interrupt, goes on in
// the background and leaves its block idle in the pool (Close waits for
// it). A ctx that can never end (context.Background) pins on the calling
// goroutine.
func (p *Pool) Get(ctx context.Context, size int) (*Block, error) {
	if p == nil || p.s == nil {
		return nil, errNilPool("Get")
	}
	if ctx == nil {
		return nil, fmt.Errorf("pool %s: Get with a nil context: %w", p.s.name, cuda.ErrInvalidValue)
	}
	return p.s.get(ctx, size)
}

// Put gives b back to the pool. With no streams the block is idle at once
// and Put makes no driver call (idle memory over WithMaxCached is unpinned
// later, at the next miss, Trim, budget reclaim or Close: unpinning may
// synchronize the device). With streams, the block must be in use by
// asynchronous work queued on them (copies, kernels): Put records an event
// on each stream and does not wait; the block is reused only after those
// events have completed. Put never waits: on a stream where no event can
// be recorded (a driver failure, counted in Stats.EventErrors) the block
// waits instead until the stream itself is idle, polled as events are, so
// such a stream must not be destroyed before the block is reused.
//
// Putting a block twice fails with an error matching pinmem.ErrFreed; a
// nil block, a block of another pool or a nil stream with
// cuda.ErrInvalidValue. After Close, Put unpins the block, or, with
// streams, as soon as a later Put or Close sees their work finished: Put
// never waits.
func (p *Pool) Put(b *Block, streams ...*cuda.Stream) error {
	if p == nil || p.s == nil {
		return errNilPool("Put")
	}
	return p.s.put(b, streams...)
}

// Trim unpins every idle block (and slab whose blocks are all idle) now,
// after checking which stream-ordered blocks have become idle, and
// destroys the pool's spare events. It returns the bytes unpinned. It
// retries the releases that failed before (Stats.UnreleasedBytes,
// Stats.UndestroyedEvents); what the driver fails to release again stays
// counted, and the error is returned. It fails with an error matching
// ErrClosed after Close, and with cuda.ErrInvalidValue for a nil ctx.
//
// Unpinning may wait for all work queued on the device; that wait is
// bounded by ctx as Get's is: when ctx is done first, Trim returns an
// error matching ctx.Err() (and 0 bytes) while the unpinning finishes in
// the background; a ctx done already leaves the cache as it is.
func (p *Pool) Trim(ctx context.Context) (freed int64, err error) {
	if p == nil || p.s == nil {
		return 0, errNilPool("Trim")
	}
	if ctx == nil {
		return 0, fmt.Errorf("pool %s: Trim with a nil context: %w", p.s.name, cuda.ErrInvalidValue)
	}
	return p.s.trim(ctx)
}

// Close closes the pool: Get and Trim fail with ErrClosed from then on.
// It unpins all idle memory, destroys the pool's spare events, withdraws
// the pool from pinmem's reclaimers, and waits, by polling their events,
// for the stream work of blocks Put with streams, unpinning each block once
// its work has run, and for the pinning or unpinning that a Get or Trim
// whose ctx ended left running. Blocks still out stay valid and pinned
// until they are Put, which then unpins them; Close reports them in an
// *OutstandingError (matching ErrOutstanding).
//
// The wait is bounded by ctx, unpinning (which may wait for all work on
// the device) included: when ctx is done first, Close returns an error
// matching ctx.Err() (context.DeadlineExceeded for an expired deadline).
// The pool is closed all the same; unpinning the driver has begun
// finishes in the background, the blocks whose work has not run stay
// pinned, each unpinned when a later Put or Close sees its work
// finished, and a later Close waits for them again. An event whose
// query fails several times in a row (a broken context, whose work never
// runs) counts as finished and its error is returned; a single failed
// query does not. A release the driver fails (unpinning memory, destroying an
// event) keeps what the driver still holds counted (Stats.UnreleasedBytes,
// Stats.UndestroyedEvents) and returns the error; a later Close retries
// those releases (and waits again for blocks whose work had not run)
// rather than answering ErrClosed. Once Close has released everything, a
// further Close returns an error matching ErrClosed.
//
// Close returns an error matching cuda.ErrInvalidValue, and does nothing,
// for a nil ctx.
func (p *Pool) Close(ctx context.Context) error {
	if p == nil || p.s == nil {
		return errNilPool("Close")
	}
	if ctx == nil {
		return fmt.Errorf("pool %s: Close with a nil context: %w", p.s.name, cuda.ErrInvalidValue)
	}
	err := p.s.close(ctx)
	if p.s.done() {
		p.cleanup.Stop()
	}
	// The cleanup must not take p for dropped while Close runs.
	runtime.KeepAlive(p)
	return err
}

// Stats returns a snapshot of the pool's counters; zero for a nil Pool.
func (p *Pool) Stats() Stats {
	if p == nil || p.s == nil {
		return Stats{}
	}
	return p.s.stats()
}

// errNilPool is the error of a method called on a nil Pool or one not
// made by New.
func errNilPool(method string) error {
	return fmt.Errorf("pool: %s on a nil Pool (or one not made by New): %w", method, cuda.ErrInvalidValue)
}
