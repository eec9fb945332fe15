package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/track"
)

// Copier moves data between host memory and the device memory of one CUDA
// context, picking per transfer the fastest way to move each part of the
// host memory:
//
//   - Memory pinned for the Copier's context is copied directly, with one
//     driver copy per registration it spans (a driver copy must not span
//     two: see pinmem.Buffer.Segments). Pinned memory is recognised
//     wherever pinmem pinned it (pinmem.Alloc, pinmem.Register, pool
//     blocks, any registration cache: pinmem.Lookup), in buffers made
//     known with AddPinned, and in slices the registration cache holds.
//   - Pageable memory (ordinary Go memory) takes the fastest path
//     measured for its direction and size: one pinned stage of the
//     staging engine around one asynchronous copy (or a few, in pieces)
//     when a stage holds it and one is idle, else the Copier's ring of
//     pinned buffers, CPU goroutines filling one stage while the copy
//     engine drains another. Stats says which path a transfer took. The
//     driver's own pageable copy is never used (it cannot be interrupted
//     and would outlive a call whose context ended).
//
// Its methods are safe for concurrent use. Transfers that use the copy
// engines through the Copier (staged or direct) run on its lanes: a
// Copier with a stream of its own has two, each with a stream, so that
// two such transfers run at once (typically one each way, on the
// device's two copy engines) and the others wait for a lane in the order
// they ask (asynchronous transfers queue, two at a time); one given WithStream has one
// lane, that stream, so that its transfers run one at a time, in order
// on it.
//
// Every Copier of one context with the same stage size, stage flags and
// WithStats setting shares one staging engine: its pinned stages and its
// CPU copy goroutines. A staged transfer borrows up to Depth stages for
// its duration, waiting first come, first served when they are all in
// use; the engine holds one ring (Depth stages) for a single Copier
// running one transfer at a time, and two rings once two or more Copiers
// share it or a Copier runs two transfers at once (both lanes staging),
// never more, and copy goroutines for the largest parallelism asked for,
// capped by the number of CPUs. So N Copiers moving data at once neither
// multiply pinned memory nor oversubscribe the cores; pinmem's budget
// bounds the engine as any other pinned memory. A Copier with
// WithStageFlags pinmem options has an engine of its own. Goroutines that
// move data at the same time can share one Copier or have one each: a
// Copier costs two streams and a few events, not pinned memory or copy
// goroutines.
//
// A Copier dropped without Close is reported (track: "copier") and its
// stream, events, staging memory and goroutines are released by the
// garbage collector's cleanup; until then they stay allocated.
type Copier struct {
	*copier
	cleanup runtime.Cleanup
}

// copier is a Copier's state; it never refers back to the Copier, so that
// a dropped Copier becomes unreachable and its cleanup can release this.
type copier struct {
	cctx      *cuda.Context
	o         options
	ownStream bool
	eng       *engine // the staging engine shared with the context's other Copiers
	member    bool    // this Copier still counts in eng
	cache     *regCache
	lanes     []*lane    // every lane, idle or taken
	free      chan *lane // the idle lanes

	gate // transfers, pipeline runs and abandoned drains in progress
	rel  releaser
	// undestroyed holds events of single calls (RunMapped) whose
	// destruction failed: the driver still holds them; release retries.
	undestroyed []*cuda.Event

	pinned pinnedSet // AddPinned

	// fence orders every call's copies after those that earlier calls of
	// the Copier, its Pipelines and its Multi left queued (Fence).
	fence fence
}

// lane is what one transfer that uses the copy engines holds while it
// runs: a stream, the events that end and time the transfer, and the
// stages it borrowed from the engine (see Copier for why a Copier has one
// or two).
type lane struct {
	stream  *cuda.Stream
	w       *waiter     // the lane's own, so that a wait on one lane never queues behind another's
	stages  []*stage    // borrowed from the engine for the transfer in progress
	ops     []piece     // the schedule of the transfer in progress (kept to be reused)
	done    *cuda.Event // end of a transfer (blocking sync, no timing)
	near    *cuda.Event // all but the transfer's last piece (see waitLast)
	nearSet bool        // near is recorded for the transfer in progress
	t0, t1  *cuda.Event // timing of a transfer (WithStats only)
	// staging: the transfer holding the lane holds or waits for stages
	// (borrow); growForTwo grows the engine only for two of those.
	staging atomic.Bool
}

// lanesOwn is the number of lanes of a Copier with a stream of its own.
const lanesOwn = 2

type stage struct {
	buf  *pinmem.Buffer
	mem  []byte
	cuts []int // registration boundaries in mem (segCuts)
	ev   *cuda.Event
	used bool // ev has been recorded
}

// New creates a Copier for the context c: its lanes' streams and events, and its
// membership of the context's staging engine, which New creates or grows
// (depth x stage size of pinned memory from pinmem.Alloc for the first
// Copier, twice that once two or more share it; copy goroutines up to
// the largest parallelism asked for). A refused option is a
// *pinmem.OptionError (matching cuda.ErrInvalidValue) naming it. The
// caller must Close the Copier.
func New(c *cuda.Context, opts ...Option) (*Copier, error) {
	retryOrphans()
	if c == nil {
		return nil, fmt.Errorf("transfer: nil context: %w", cuda.ErrInvalidValue)
	}
	o, err := buildOptions("transfer.New", opts)
	if err != nil {
		return nil, err
	}
	if o.stream != nil && (o.stream.Context() == nil || o.stream.Context().Handle() != c.Handle()) {
		return nil, fmt.Errorf("transfer: WithStream: the stream belongs to another context than the Copier's: %w", ErrWrongDevice)
	}
	s, err := newCopierState(c, o)
	if err != nil {
		return nil, err
	}
	cp := &Copier{copier: s}
	cp.cleanup = runtime.AddCleanup(cp, func(s *copier) { s.dropped() }, s)
	return cp, nil
}

func newCopierState(c *cuda.Context, o options) (cp *copier, err error) {
	cp = &copier{cctx: c, o: o, gate: newGate()}
	cp.rel.step = cp.releaseStep
	defer func() {
		if err != nil {
			cp.markClosed()
			err = errors.Join(err, cp.rel.release())
			orphan(&cp.rel)
			cp = nil
		}
	}()
	n := 1
	if o.stream == nil {
		n = lanesOwn
		cp.ownStream = true
	}
	cp.free = make(chan *lane, n)
	for range n {
		l := &lane{stream: o.stream, w: newWaiter()}
		cp.lanes = append(cp.lanes, l)
		if l.stream == nil {
			if l.stream, err = c.NewStream(cuda.StreamNonBlocking); err != nil {
				return cp, fmt.Errorf("transfer: creating the copy stream: %w", err)
			}
		}
		if l.done, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
			return cp, err
		}
		if l.near, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
			return cp, err
		}
		if o.stats {
			if l.t0, err = c.NewEvent(cuda.EventDefault); err != nil {
				return cp, err
			}
			if l.t1, err = c.NewEvent(cuda.EventDefault); err != nil {
				return cp, err
			}
		}
		cp.free <- l
	}
	if cp.eng, err = joinEngine(c, o, false); err != nil {
		return cp, err
	}
	cp.member = true
	if o.cacheOn {
		cp.cache = newRegCache(o.cacheLimit, o.cacheMin, pinmem.WithDevice(c.Device()))
	}
	return cp, nil
}

// ok reports whether c may be used: not nil.
func (c *Copier) ok() bool { return c != nil && c.copier != nil }

// Fence waits, bounded by ctx, until no copy left queued by a call of the
// Copier that returned before Fence was called (a transfer, a Pipeline
// Run or RunMapped of the Copier, a Broadcast of the Multi it belongs
// to) will touch memory again. A call that fails (a deadline, a
// cancellation, a panicking callback, a failed enqueue) returns without
// waiting for the copies it already queued; they are handed to the
// Copier's fence, and every later call's copies are queued on the device
// behind them. Pageable (Go) memory is never touched after a call
// returns; pinned memory copied directly (pinmem buffers, pool blocks,
// AddPinned, the registration cache) may be until those copies ran: call
// Fence after an error before reusing it. It returns nil at once when
// nothing is queued, and an error matching ctx.Err() when ctx ends first.
func (c *Copier) Fence(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return c.fence.wait(ctx, c.fence.last())
}

// AddPinned tells the Copier that b is pinned: copies from or to any part
// of b.Bytes() then go directly, without staging. Buffers pinmem pinned
// for the Copier's context (or Portable) are recognised without it; it
// makes a buffer pinned for another device's context count as pinned
// too. The returned function forgets b again; call it before freeing b. A
// nil Copier or buffer is ignored (the function does nothing).
func (c *Copier) AddPinned(b *pinmem.Buffer) (remove func()) {
	if !c.ok() || b == nil {
		return func() {}
	}
	return c.pinned.add(b)
}

// Close stops the Copier: later calls return ErrClosed. It waits for the
// transfers and pipeline runs in progress (and for copies that a transfer
// left queued when its context ended), then releases the stream, the events,
// the staging ring, the registration cache and the copy goroutines. The wait
// is bounded by ctx: when ctx ends first, Close returns an error matching
// ctx.Err() and the Copier stays closed; its resources are then released in
// the background as soon as the copies in flight finish (never, if the
// device never finishes them). A release the driver fails keeps the object
// held (and counted by pinmem and cuda) and returns the error; a later Close
// waits again for what an earlier one left (bounded by its own ctx) and
// retries those releases. Once everything is released, a further Close
// returns ErrClosed.
func (c *Copier) Close(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	first := c.markClosed()
	return closeOwner(ctx, "Copier", first, &c.rel, &c.cleanup, c.idle)
}

// dropped is the cleanup of a Copier that became unreachable without
// Close: nothing can be in progress (every transfer and drain holds the
// Copier), so everything is released.
func (c *copier) dropped() {
	if !c.markClosed() {
		return
	}
	track.Dropped("copier", "stages", c.o.depth, "stage_size", c.o.stageSize)
	go func() { <-c.idle; _ = c.rel.release() }() // off the cleanup goroutine: release calls the driver
}

// destroyEvent destroys an event made for one call; when the driver fails
// to, the event is kept for release to retry.
func (c *copier) destroyEvent(ev *cuda.Event) error {
	left := 0
	err := destroyEvent(&ev, &left)
	if left > 0 {
		c.mu.Lock()
		c.undestroyed = append(c.undestroyed, ev)
		c.mu.Unlock()
	}
	return err
}

// releaseStep frees whatever newCopierState created (rel.step).
func (c *copier) releaseStep() (left int, err error) {
	var errs []error
	for _, l := range c.lanes {
		if l.w != nil {
			l.w.close()
		}
	}
	if c.cache != nil {
		n, err := c.cache.close()
		left += n
		errs = append(errs, err)
	}
	if c.eng != nil {
		n, err := c.eng.leave(&c.member)
		left += n
		errs = append(errs, err)
	}
	for _, l := range c.lanes {
		for _, e := range []**cuda.Event{&l.done, &l.near, &l.t0, &l.t1} {
			errs = append(errs, destroyEvent(e, &left))
		}
	}
	c.mu.Lock()
	for i := range c.undestroyed {
		errs = append(errs, destroyEvent(&c.undestroyed[i], &left))
	}
	c.undestroyed = slices.DeleteFunc(c.undestroyed, func(ev *cuda.Event) bool { return ev == nil })
	c.mu.Unlock()
	if c.ownStream {
		for _, l := range c.lanes {
			errs = append(errs, destroyStream(&l.stream, &left))
		}
	}
	return left, errors.Join(errs...)
}

// enter checks the receiver and the context of a blocking call and
// registers it; the caller must call c.end() when enter returned nil.
func (c *Copier) enter(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return c.begin()
}

// acquire takes an idle lane for one transfer, waiting for one bounded by
// ctx, and orders its stream after the copies that earlier calls left
// queued (fence.order): a transfer retried after a timeout is never
// overwritten by the copies of the attempt that timed out.
func (c *copier) acquire(ctx context.Context) (*lane, error) {
	var l *lane
	select {
	case l = <-c.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := c.fence.order(l.stream); err != nil {
		c.free <- l
		return nil, fmt.Errorf("transfer: ordering after an abandoned transfer: %w", err)
	}
	return l, nil
}

// releaseLane gives the stages l borrowed back to the engine (everything
// queued on them has run) and l back to the idle lanes.
func (c *copier) releaseLane(l *lane) {
	if len(l.stages) > 0 {
		c.eng.give(l.stages)
		// give copied them: the slice is kept for the lane's next
		// transfer through one stage, which then allocates nothing.
		clear(l.stages)
		l.stages = l.stages[:0]
	}
	clear(l.ops) // no reference to the caller's memory stays
	l.ops = l.ops[:0]
	l.staging.Store(false)
	c.free <- l
}

// borrow takes up to want stages from the engine for the transfer holding
// l (at least one), waiting for them bounded by ctx. When another lane's
// transfer stages too, the engine first grows to two rings if it holds
// one (engine.growForTwo), so that the two transfers overlap.
func (c *copier) borrow(ctx context.Context, l *lane, want int) error {
	l.staging.Store(true)
	for _, o := range c.lanes {
		if o != l && o.staging.Load() {
			c.eng.growForTwo()
			break
		}
	}
	ss, err := c.eng.take(ctx, min(want, c.o.depth))
	if err != nil {
		return err
	}
	l.stages = ss
	return nil
}

// abandon hands the copies a transfer left queued on l, when it returns
// early, to the fence (handOff): l.done is recorded behind them (else
// the drain watches the whole stream), and once they ran, release runs
// (the registration cache's holds) and l and its stages go back.
func (c *copier) abandon(l *lane, release func()) {
	d := drain{evs: []*cuda.Event{l.done}}
	if l.done.Record(l.stream) != nil {
		d = drain{streams: []*cuda.Stream{l.stream}}
	}
	l.nearSet = false
	c.fence.handOff(c.hold, c.end, d, func() {
		release()
		c.releaseLane(l)
	})
}

// ---- the public transfers ----

// HtoD copies src into the device buffer dst (from offset 0; use
// dst.Slice for another offset) and returns when the data is there. dst
// must hold at least len(src) bytes, else a *SizeError; it must be alive
// (an error matching cuda.ErrInvalidHandle otherwise) and on the Copier's
// device (else ErrWrongDevice).
//
// ctx bounds the whole call. When it ends, HtoD stops issuing copies and
// returns an error matching ctx.Err() without waiting for the copies
// already queued (on a hung device they may never finish): they are
// handed to the Copier's fence, the Copier stays usable, and every later
// call's copies are queued on the device behind them, so a retry is never
// overwritten by the attempt that timed out. A pageable (Go) src is never
// read after HtoD returns, success or error: it is only read by the CPU
// copy into the pinned stages. A pinned src copied directly may still be
// read by the queued copies: call Fence before reusing it.
func (c *Copier) HtoD(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) (Stats, error) {
	if err := c.enter(ctx); err != nil {
		return Stats{Direction: HostToDevice}, err
	}
	defer c.end()
	return c.htod(ctx, dst, src, byRoute)
}

// DtoH copies len(dst) bytes from the start of the device buffer src into
// dst and returns when they are there. src must hold at least len(dst)
// bytes, else a *SizeError; it is checked as HtoD checks its destination.
// ctx bounds the call as it bounds HtoD. A pageable dst is never written
// after DtoH returns; after an error, a pinned destination copied directly
// may still be written by the copies already queued: Fence waits for
// them, bounded by its context, and must be called before the memory is
// reused (freed, put back to a pool, handed to another call).
func (c *Copier) DtoH(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) (Stats, error) {
	if err := c.enter(ctx); err != nil {
		return Stats{Direction: DeviceToHost}, err
	}
	defer c.end()
	return c.dtoh(ctx, dst, src, byRoute)
}

// HtoDAsync starts HtoD and returns at once; the Op reports its result.
// src must not be modified, nor dst used, until the Op is done; the Op is
// done only once no copy of it will read src again (after a cancellation
// or an error, once the copies it left queued ran: on a hung device,
// never; Wait is bounded by its own context). Errors,
// including a nil context or Copier, are reported by the Op. Ops started
// one after the other are not ordered with each other (two may run at
// once on the Copier's two lanes): wait for an Op before starting one
// that touches the same memory.
func (c *Copier) HtoDAsync(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) *Op {
	return c.async(ctx, HostToDevice, func(ctx context.Context) (Stats, error) { return c.htod(ctx, dst, src, byRoute) })
}

// DtoHAsync starts DtoH and returns at once; the Op reports its result.
// dst must not be used until the Op is done.
func (c *Copier) DtoHAsync(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) *Op {
	return c.async(ctx, DeviceToHost, func(ctx context.Context) (Stats, error) { return c.dtoh(ctx, dst, src, byRoute) })
}

func (c *Copier) async(ctx context.Context, d Direction, fn func(context.Context) (Stats, error)) *Op {
	t := &Op{cancel: func() {}, done: make(chan struct{}), returned: make(chan struct{})}
	if err := c.enter(ctx); err != nil {
		close(t.returned)
		t.finish(Stats{Direction: d}, err)
		return t
	}
	tctx, cancel := context.WithCancel(ctx)
	t.cancel = cancel
	go func() {
		defer c.end()
		st, err := fn(tctx)
		close(t.returned)
		if err != nil {
			// Done only once nothing the transfer queued touches its
			// memory: wait for the drains handed off so far.
			_ = c.fence.wait(context.Background(), c.fence.last())
		}
		t.finish(st, err)
	}()
	return t
}

// Op is an asynchronous transfer in progress.
type Op struct {
	cancel context.CancelFunc
	done   chan struct{}
	// returned is closed once the transfer's own call has returned: no
	// CPU copy of it reads or writes the caller's memory any more (copies
	// it left queued on the device are the fence's).
	returned chan struct{}
	stats    Stats
	err      error
}

func (t *Op) finish(s Stats, err error) {
	t.stats, t.err = s, err
	t.cancel()
	close(t.done)
}

// closedChan is returned by a nil Op's Done.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed when the transfer has finished (the data
// is in place, or it failed or was cancelled). A nil Op is done.
func (t *Op) Done() <-chan struct{} {
	if t == nil {
		return closedChan
	}
	return t.done
}

// Wait waits until the transfer has finished and returns its result. When
// ctx is done first, Wait returns ctx.Err() and the transfer goes on
// (cancel the context given to HtoDAsync or DtoHAsync to stop it).
func (t *Op) Wait(ctx context.Context) (Stats, error) {
	if t == nil {
		return Stats{}, errNil("Op")
	}
	if err := checkCtx(ctx); err != nil {
		return Stats{}, err
	}
	select {
	case <-t.done:
		return t.stats, t.err
	case <-ctx.Done():
		return Stats{}, ctx.Err()
	}
}

// ---- planning ----

// piece is one copy of a transfer: direct (host memory pinned) or
// through stage s at [lo, lo+len(host)) of the stage; dev at off is where
// host goes or comes from.
type piece struct {
	host   []byte
	dev    *cuda.DeviceBuffer
	off    int
	direct bool
	s      *stage
	lo     int
}

// span is a pinned sub-range [lo, hi) of a host slice, as offsets.
type span struct{ lo, hi int }

func addr(b []byte) uintptr { return hostptr.AddrOf(b) }

// pinnedSpans returns the parts of host known to be pinned, sorted and
// split at registration boundaries (one driver copy must not span two
// registrations), and a function that releases the registration cache's
// hold on them. Pinned memory is what AddPinned made known, what pinmem
// pinned (pinmem.Lookup: Alloc, Register, pool blocks) and what the
// registration cache holds or now registers.
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
	var holds []*regHold
	var out []span
	prev := 0
	gap := func(a, b int) {
		if b-a < c.cache.min {
			return
		}
		got, h := c.cache.acquire(host[a:b])
		if h != nil {
			holds = append(holds, h)
			cuts = h.cuts(addr(host), cuts)
		}
		for _, s := range got {
			out = append(out, span{s.lo + a, s.hi + a})
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
			c.cache.release(h)
		}
	}
}

// pinnedHere reports whether b is pinned for the Copier's context:
// Portable, or pinned by that context (pinmem pins in its device's
// primary context). Other memory is pageable for this context: the driver
// would copy it as such, and a queued copy of pageable memory waits for
// the device inside the driver call, beyond the reach of ctx.
func (c *copier) pinnedHere(b *pinmem.Buffer) bool {
	if b.Flags()&pinmem.Portable != 0 {
		return true
	}
	d := b.Device()
	if d == nil || d.Ordinal() != c.cctx.Device().Ordinal() {
		return false
	}
	// The buffer's device has its primary context retained already (pinmem
	// pinned in it): this reads it, it retains nothing.
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

// chunkSize is the staged piece size for n staged bytes: a stage, or less
// when the transfer is small, so that at least tune.chunkPieces pieces
// overlap.
func (c *copier) chunkSize(n int) int {
	ch := (n/c.o.tune.chunkPieces + 65535) &^ 65535
	return max(min(ch, c.o.stageSize), min(minChunk, c.o.stageSize))
}

// plan splits a copy between host and dev into pieces: one direct copy per
// pinned span and the pageable rest staged, in chunks of at most a stage.
// The pageable rest of a partly pinned transfer is staged whatever its
// size: queued on the stream, the driver's copy of pageable memory would
// wait for the device inside the driver call, beyond the reach of ctx.
func (c *copier) plan(host []byte, dev *cuda.DeviceBuffer, spans []span, st *Stats) []piece {
	var ops []piece
	staged := len(host)
	for _, s := range spans {
		staged -= s.hi - s.lo
	}
	chunk := c.chunkSize(staged)
	stage := func(a, b int) {
		for off := a; off < b; off += chunk {
			end := min(off+chunk, b)
			ops = append(ops, piece{host: host[off:end], dev: dev, off: off})
			st.StagedBytes += int64(end - off)
			st.Stages++
		}
	}
	prev := 0
	for _, s := range spans {
		stage(prev, s.lo)
		ops = append(ops, piece{host: host[s.lo:s.hi], dev: dev, off: s.lo, direct: true})
		st.DirectBytes += int64(s.hi - s.lo)
		prev = s.hi
	}
	stage(prev, len(host))
	// A long direct copy at the end goes in two pieces, so that waitLast
	// sleeps through the first and polls only the last tailBytes.
	if n := len(ops); c.o.wait == WaitHybrid && n > 0 && ops[n-1].direct && len(ops[n-1].host) >= 2*tailBytes {
		last := ops[n-1]
		cut := len(last.host) - tailBytes
		ops[n-1] = piece{host: last.host[:cut], dev: last.dev, off: last.off, direct: true}
		ops = append(ops, piece{host: last.host[cut:], dev: last.dev, off: last.off + cut, direct: true})
	}
	return ops
}

// markNear records l.near before the last of n ops (index i) is queued,
// when there is work before it: waitLast then sleeps until the rest has run
// and polls only the last piece.
func (c *copier) markNear(l *lane, i, n int) {
	if i == n-1 && n > 1 && c.o.wait == WaitHybrid {
		l.nearSet = l.near.Record(l.stream) == nil
	}
}

// waitLast waits for ev, the end of the transfer in progress: asleep in
// the driver until l.near (when recorded) and then polling for at most the
// tail spin, so that the driver's wake-up latency does not land on the
// transfer's end.
func (c *copier) waitLast(ctx context.Context, l *lane, ev *cuda.Event) error {
	if l.nearSet {
		l.nearSet = false
		if err := l.w.wait(ctx, l.near); err != nil {
			return err
		}
	}
	return l.w.waitEnd(ctx, ev, c.o.wait)
}

// ---- execution ----

func (c *copier) htod(ctx context.Context, dst *cuda.DeviceBuffer, src []byte, how strategy) (Stats, error) {
	st := Stats{Direction: HostToDevice, Bytes: int64(len(src))}
	if err := checkBuf(dst, c.cctx.Device(), "destination device buffer"); err != nil {
		return st, err
	}
	if len(src) > dst.Size() {
		return st, &SizeError{Op: HostToDevice.String(), Need: len(src), Have: dst.Size()}
	}
	return c.move(ctx, &st, src, dst, how)
}

func (c *copier) dtoh(ctx context.Context, dst []byte, src *cuda.DeviceBuffer, how strategy) (Stats, error) {
	st := Stats{Direction: DeviceToHost, Bytes: int64(len(dst))}
	if err := checkBuf(src, c.cctx.Device(), "source device buffer"); err != nil {
		return st, err
	}
	if len(dst) > src.Size() {
		return st, &SizeError{Op: DeviceToHost.String(), Need: len(dst), Have: src.Size()}
	}
	return c.move(ctx, &st, dst, src, how)
}

// move moves host to or from dev in st.Direction through the staged
// executor, in the shape schedule chooses.
func (c *copier) move(ctx context.Context, st *Stats, host []byte, dev *cuda.DeviceBuffer, how strategy) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return *st, err
	}
	if len(host) == 0 {
		return *st, nil
	}
	m := startMeter(c.o.stats)
	l, ring, release, err := c.schedule(ctx, st, host, dev, how)
	if err != nil {
		return *st, err
	}
	err = c.exec(ctx, l, l.ops, ring, st, release)
	m.stop(st)
	if err != nil {
		return *st, fmt.Errorf("transfer: %s copy of %d bytes: %w", st.Direction, len(host), err)
	}
	if !ring {
		st.StagedBytes = int64(len(host))
		st.Stages = 1
	}
	return *st, nil
}

// schedule takes a lane and stages for a transfer of host to or from dev
// and lays the transfer out in l.ops: through one stage (ring false) when
// route gives it to one stage, no part of host may be pinned and a lane
// and a stage are idle at once (oneStage); else through the ring, on a
// lane waited for bounded by ctx, the parts of host known to be pinned
// copied directly and the rest staged in the stages borrowed (release
// ends the registration cache's holds).
func (c *copier) schedule(ctx context.Context, st *Stats, host []byte, dev *cuda.DeviceBuffer, how strategy) (l *lane, ring bool, release func(), err error) {
	if route(len(host), c.o.stageSize, how) == pathStage && !c.mayBePinned(host) {
		if l, err = c.oneStage(st.Direction, host, dev); l != nil || err != nil {
			return l, false, func() {}, err
		}
	}
	if l, err = c.acquire(ctx); err != nil {
		return nil, true, nil, err
	}
	spans, release := c.pinnedSpans(host)
	l.ops = c.plan(host, dev, spans, st)
	if st.Stages > 0 {
		if err := c.borrow(ctx, l, st.Stages); err != nil {
			release()
			c.releaseLane(l)
			return nil, true, nil, err
		}
	}
	for i, k := 0, 0; i < len(l.ops); i++ {
		if !l.ops[i].direct {
			l.ops[i].s = l.stageAt(k)
			k++
		}
	}
	return l, true, release, nil
}

// stageAt returns stage k (mod the stages) of the transfer holding l.
func (l *lane) stageAt(k int) *stage { return l.stages[k%len(l.stages)] }

// reuse waits until stage s's last queued copy has run, if it has one.
func (c *copier) reuse(ctx context.Context, l *lane, s *stage) error {
	if !s.used {
		return nil
	}
	return l.w.waitStage(ctx, s.ev, c.o.wait, c.o.tune.stageSpin)
}

// queued takes the result of queueing a copy into or out of stage s on
// l's stream and, if it was queued, records s's event behind it, so that s
// is reused only after that copy has run.
func (l *lane) queued(s *stage, err error) error {
	if err != nil {
		return err
	}
	if err := s.ev.Record(l.stream); err != nil {
		return err
	}
	s.used = true
	return nil
}

// htod queues the copy of the stage's bytes [lo, hi) to dev at off on
// st, one copy per registration of the stage.
func (s *stage) htod(st *cuda.Stream, dev *cuda.DeviceBuffer, off, lo, hi int) error {
	return eachPiece(s.cuts, lo, hi, func(a, b int) error { return st.CopyHtoD(dev, off+a-lo, s.mem[a:b]) })
}

// dtoh queues the copy of hi-lo bytes of dev at off into the stage's
// bytes [lo, hi) on st, one copy per registration of the stage.
func (s *stage) dtoh(st *cuda.Stream, dev *cuda.DeviceBuffer, off, lo, hi int) error {
	return eachPiece(s.cuts, lo, hi, func(a, b int) error { return st.CopyDtoH(s.mem[a:b], dev, off+a-lo) })
}

// waitStage waits for stage event ev inside a transfer holding l
// (waiter.waitStage).
func (c *copier) waitStage(ctx context.Context, l *lane, ev *cuda.Event) error {
	return l.w.waitStage(ctx, ev, c.o.wait, c.o.tune.stageSpin)
}

// startTimer records the transfer's first timing event (WithStats only).
func (l *lane) startTimer() error {
	if l.t0 == nil {
		return nil
	}
	return l.t0.Record(l.stream)
}

// The staged executor: one schedule of pieces on a lane, in one of two
// shapes that route's bands choose. In a ring (ring true) the staged
// pieces take the transfer's borrowed stages in turn, each recording its
// stage's event so that the stage is refilled (host to device) or copied
// out (device to host) only once its copy ran, up to a stage per piece in
// flight, and the end is the lane's done event. Through one stage (ring
// false) the pieces are parts of one stage, so nothing is reused within
// the transfer and no stage event is recorded: device to host, the lane's
// near event between the two halves says when the first can be copied
// out, and the end is a wait for the lane's stream (singleWait).

// exec runs ops, a schedule whose staged pieces have their stages, on
// lane l and ends the transfer (finish).
func (c *copier) exec(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats, release func()) error {
	var first error
	if st.Direction == HostToDevice {
		first = c.execHtoD(ctx, l, ops, ring, st)
	} else {
		first = c.execDtoH(ctx, l, ops, ring, st)
	}
	return c.finish(ctx, l, ops, ring, first, st, release)
}

// execHtoD fills each staged piece's part of its stage and queues each
// piece's copy as soon as it is in place, so that its DMA overlaps the
// CPU's copy of the next.
func (c *copier) execHtoD(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats) error {
	for i, o := range ops {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ring {
			c.markNear(l, i, len(ops))
		}
		if !o.direct {
			if ring {
				if err := c.reuse(ctx, l, o.s); err != nil {
					return err
				}
			}
			st.CopyCPU += c.copyStage(o.s.mem[o.lo:o.lo+len(o.host)], o.host)
		}
		if i == 0 {
			if err := l.startTimer(); err != nil {
				return err
			}
		}
		var err error
		if o.direct {
			err = l.stream.CopyHtoD(o.dev, o.off, o.host)
		} else if err = o.s.htod(l.stream, o.dev, o.off, o.lo, o.lo+len(o.host)); ring {
			err = l.queued(o.s, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// execDtoH queues the pieces' copies, as many staged ones at once as the
// transfer has stages (through one stage: all), and copies each staged
// piece out once its copy ran, while the later ones are in flight. The
// last staged piece is copied out here in a ring and by finish through
// one stage.
func (c *copier) execDtoH(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats) error {
	window := len(ops)
	if ring {
		window = len(l.stages)
	}
	head, next, inFlight := 0, 0, 0
	for {
		for next < len(ops) && (ops[next].direct || inFlight < window) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := c.queueOut(l, ops, next, ring); err != nil {
				return err
			}
			if !ops[next].direct {
				inFlight++
			}
			next++
		}
		for head < next && ops[head].direct {
			head++
		}
		if head == next {
			return nil
		}
		o := ops[head]
		last := next == len(ops) && inFlight == 1
		var err error
		switch {
		case !ring && last:
			return nil
		case !ring:
			err = l.w.wait(ctx, l.near)
		case last:
			err = c.waitLast(ctx, l, o.s.ev)
		default:
			err = c.waitStage(ctx, l, o.s.ev)
		}
		if err != nil {
			return err
		}
		st.CopyCPU += c.copyStage(o.host, o.s.mem[o.lo:o.lo+len(o.host)])
		head++
		inFlight--
	}
}

// queueOut queues the copy of ops[i] to the host or into its stage,
// with the events its shape records before it (the timer's start, near)
// and, in a ring, its stage's event behind it.
func (c *copier) queueOut(l *lane, ops []piece, i int, ring bool) error {
	o := ops[i]
	if i == 0 {
		if err := l.startTimer(); err != nil {
			return err
		}
	}
	if ring {
		c.markNear(l, i, len(ops))
	} else if i > 0 && i == len(ops)-1 {
		if err := l.near.Record(l.stream); err != nil {
			return err
		}
	}
	if o.direct {
		return l.stream.CopyDtoH(o.host, o.dev, o.off)
	}
	err := o.s.dtoh(l.stream, o.dev, o.off, o.lo, o.lo+len(o.host))
	if ring {
		return l.queued(o.s, err)
	}
	return err
}

// finish ends a transfer that holds lane l: it waits, bounded by ctx,
// for everything the transfer queued (through one stage, then copies the
// last piece out), so that no stage or destination is still in use by the
// copy engine when the transfer returns, then releases l and runs
// release. When the transfer stopped early (first) or ctx ends first, the
// copies queued go to the fence with l and release (abandon) and the
// transfer returns at once. It reports the first error: the one that
// stopped the transfer, else an asynchronous one, else ctx's.
func (c *copier) finish(ctx context.Context, l *lane, ops []piece, ring bool, first error, st *Stats, release func()) error {
	if first != nil {
		c.abandon(l, release)
		return first
	}
	timed := l.t1 != nil && l.t1.Record(l.stream) == nil
	var err error
	if ring {
		if err = l.done.Record(l.stream); err == nil {
			err = c.waitLast(ctx, l, l.done)
		}
		// Everything on a stream of the Copier's own has run: collect the
		// copies' asynchronous errors. A caller's stream (WithStream) may
		// hold the caller's later work, which the transfer does not wait
		// for; its errors are the caller's to collect.
		if err == nil && c.ownStream {
			err = streamErr(ctx, l.stream)
		}
	} else {
		err = c.singleWait(ctx, l)
	}
	if err != nil {
		c.abandon(l, release)
		return err
	}
	if timed {
		if d, err := l.t1.Elapsed(l.t0); err == nil {
			st.Device = d
		}
	}
	if !ring && st.Direction == DeviceToHost {
		o := ops[len(ops)-1]
		st.CopyCPU += c.copyStage(o.host, o.s.mem[o.lo:o.lo+len(o.host)])
	}
	release()
	c.releaseLane(l)
	return nil
}
