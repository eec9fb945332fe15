package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/transfer/internal/regcache"
)

// Copier moves data between host memory and the device memory of one CUDA
// context, each part of the host memory the fastest way (see the package
// documentation): pinned memory directly, one driver copy per
// registration it spans (pinmem.Buffer.Segments); pageable memory through
// one pinned stage or the ring of stages, as measured for its direction
// and size. Stats says which path a transfer took.
//
// Its methods are safe for concurrent use. A Copier with a stream of its
// own has two lanes, each with a stream, so that two transfers run at once
// (typically one each way, on the device's two copy engines) and the
// others wait for a lane in the order they ask; one given WithStream has
// one lane, that stream, and runs its transfers in order on it.
//
// The Copiers of one context with the same stage size, stage flags and
// WithStats setting share one staging engine: pinned stages, borrowed
// first come, first served (one ring, two once two transfers stage at
// once, never more), and copy goroutines for the largest parallelism asked
// for, capped by the CPUs. N Copiers neither multiply pinned memory nor
// oversubscribe the cores. WithStageFlags pinmem options make an engine of
// the Copier's own.
//
// The stages are pinned when a transfer first needs them, not in New, and
// stay pinned until the engine's last Copier closes (pinmem.Stats counts
// them): a pageable transfer of up to 1 MiB, with larger stages, goes
// through a small stage of 1 MiB, one per transfer in flight (a Copier
// that only moves small transfers holds 1 MiB, 2 MiB with both lanes
// busy); a larger one pins the stages of the stage size it takes, up to
// one ring (depth stages: 96 MiB by default), two once two transfers stage
// at once. A transfer whose stages cannot be pinned when none is there
// returns that error (a *pinmem.BudgetError over the budget); with stages
// there it runs on those, and the engine pins no more until a Copier joins.
type Copier struct {
	*copier
	cleanup runtime.Cleanup
}

// copier is a Copier's state; it never refers back to the Copier, so that
// a dropped Copier's cleanup can release it.
type copier struct {
	cctx      *cuda.Context
	o         options
	ownStream bool
	eng       *engine // the staging engine shared with the context's other Copiers
	member    bool    // this Copier still counts in eng
	cache     *regcache.Cache
	lanes     []*lane    // every lane, idle or taken
	free      chan *lane // the idle lanes

	gate        *lifecycle.Gate // transfers, pipeline runs and abandoned drains in progress
	rel         *lifecycle.Releaser
	mu          sync.Mutex
	undestroyed []*cuda.Event // RunMapped events the driver failed to destroy; release retries (mu)
	pinned      pinnedSet     // AddPinned
	fence       fence         // orders every call after the copies earlier calls left queued
}

// lane is what one transfer holds while it runs: a stream, its events and
// the stages it borrowed.
type lane struct {
	stream  *cuda.Stream
	w       *waiter     // the lane's own: a wait never queues behind another lane's
	stages  []*stage    // borrowed for the transfer in progress
	ring    ring        // the ring over the stages, for a ring transfer
	ops     []piece     // the transfer's schedule (kept to be reused)
	done    *cuda.Event // the transfer's end
	near    *cuda.Event // all but the transfer's last piece (waitLast)
	nearSet bool        // near is recorded for the transfer in progress
	t0, t1  *cuda.Event // timing (WithStats only)
	staging atomic.Bool // the transfer holds or waits for stages (allowTwo)
}

const lanesOwn = 2 // the lanes of a Copier with a stream of its own

// New creates a Copier for the context c: its lanes' streams and events,
// and its membership of the context's staging engine. It pins no memory:
// the transfers pin the stages they need (see Copier). A refused option is
// a *pinmem.OptionError (matching cuda.ErrInvalidValue) naming it. The
// caller must Close it.
func New(c *cuda.Context, opts ...Option) (*Copier, error) {
	lifecycle.RetryOrphans()
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
	cp = &copier{cctx: c, o: o, gate: lifecycle.NewGate(ErrClosed)}
	cp.rel = lifecycle.NewReleaser(cp.releaseStep)
	defer func() {
		if err != nil {
			cp.gate.MarkClosed()
			err = errors.Join(err, cp.rel.Release())
			cp.rel.Orphan()
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
		l.ring = ring{lanes: []*lane{l}, wait: cp.ringWait}
		cp.lanes = append(cp.lanes, l)
		if l.stream == nil {
			if l.stream, err = c.NewStream(cuda.StreamNonBlocking); err != nil {
				return cp, fmt.Errorf("transfer: creating the copy stream: %w", err)
			}
		}
		if err = newEvents(c, syncEvent, &l.done, &l.near); err == nil && o.stats {
			err = newEvents(c, cuda.EventDefault, &l.t0, &l.t1)
		}
		if err != nil {
			return cp, err
		}
		cp.free <- l
	}
	cp.eng, cp.member = joinEngine(c, o, false), true
	if o.cacheOn {
		cp.cache = regcache.New(o.cacheLimit, o.cacheMin, pinmem.WithDevice(c.Device()))
	}
	return cp, nil
}

// syncEvent are the flags of the events a wait sleeps on.
const syncEvent = cuda.EventBlockingSync | cuda.EventDisableTiming

// newEvents creates an event with flags for each of evs.
func newEvents(c *cuda.Context, flags cuda.EventFlags, evs ...**cuda.Event) (err error) {
	for _, ev := range evs {
		if *ev, err = c.NewEvent(flags); err != nil {
			return err
		}
	}
	return nil
}

// ok reports whether c may be used: not nil.
func (c *Copier) ok() bool { return c != nil && c.copier != nil }

// Fence waits, bounded by ctx, until no copy left queued by a call that
// returned before Fence was called (a transfer, Pipeline Run or RunMapped
// of the Copier, a Broadcast of its Multi) will touch memory again. Call
// it after an error before reusing pinned memory the call copied directly
// (see the package documentation). It returns nil at once when nothing is
// queued, and an error matching ctx.Err() when ctx ends first.
func (c *Copier) Fence(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return c.fence.wait(ctx, c.fence.last())
}

// AddPinned tells the Copier that b is pinned, so that copies from or to
// b.Bytes() go directly: needed only for a buffer pinned for another
// context (pinmem's own buffers for this context, or Portable, are
// recognised). The returned function forgets b; call it before freeing b.
// A nil Copier or buffer is ignored.
func (c *Copier) AddPinned(b *pinmem.Buffer) (remove func()) {
	if !c.ok() || b == nil {
		return func() {}
	}
	return c.pinned.add(b)
}

// Forget releases the registration cache's registrations overlapping p
// (see WithRegistrationCache): idle ones at once, busy ones after the copy
// using them. Call it before p's memory is reused for something else or
// unmapped. It returns the bytes released now (0 when the cache is off,
// and for a nil Copier).
func (c *Copier) Forget(p []byte) int64 {
	if !c.ok() {
		return 0
	}
	return c.cache.Forget(p)
}

// CacheStats returns the registration cache's counters (zero when the
// cache is off, and for a nil Copier).
func (c *Copier) CacheStats() CacheStats {
	if !c.ok() {
		return CacheStats{}
	}
	return c.cache.Stats()
}

// Close stops the Copier (later calls return ErrClosed), waits for the
// calls in progress and the copies they left queued, and releases its
// streams, events, its share of the staging engine and the registration
// cache, as the package documentation's Close contract says.
func (c *Copier) Close(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return lifecycle.Close(ctx, "transfer: closing the Copier", c.gate, c.rel, &c.cleanup)
}

// dropped is the cleanup of a Copier dropped without Close.
func (c *copier) dropped() {
	lifecycle.Dropped(c.gate, c.rel, "copier", "stages", c.o.depth, "stage_size", c.o.stageSize)
}

// destroyEvent destroys an event made for one call, keeping it for
// release to retry when the driver fails.
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
		n, err := c.cache.Close()
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

// enter checks the receiver and ctx of a call and registers it; the
// caller calls c.gate.End() when enter returned nil.
func (c *Copier) enter(ctx context.Context) error {
	if !c.ok() {
		return errNil("Copier")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return c.gate.Begin()
}

// acquire takes an idle lane, bounded by ctx, and orders its stream after
// the copies earlier calls left queued (fence.order).
func (c *copier) acquire(ctx context.Context) (*lane, error) {
	var l *lane
	select {
	case l = <-c.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := c.fence.order(ctx, l.stream); err != nil {
		c.free <- l
		return nil, fmt.Errorf("transfer: ordering after an abandoned transfer: %w", err)
	}
	return l, nil
}

// releaseLane gives l's stages back to the engine (everything queued on
// them ran) and l back to the idle lanes.
func (c *copier) releaseLane(l *lane) {
	if len(l.stages) > 0 {
		c.eng.give(l.stages)
		// Kept for the next one-stage transfer, which allocates nothing.
		clear(l.stages)
		l.stages = l.stages[:0]
		l.ring.stages = nil
	}
	clear(l.ops) // no reference to the caller's memory stays
	l.ops = l.ops[:0]
	l.staging.Store(false)
	c.free <- l
}

// borrow takes 1 to want stages for the transfer holding l, bounded by
// ctx, first letting the engine grow to two rings when another lane
// stages too, so that the two transfers overlap.
func (c *copier) borrow(ctx context.Context, l *lane, want int) error {
	l.staging.Store(true)
	for _, o := range c.lanes {
		if o != l && o.staging.Load() {
			c.eng.allowTwo()
			break
		}
	}
	ss, err := c.eng.take(ctx, min(want, c.o.depth))
	if err != nil {
		return err
	}
	l.stages = ss
	l.ring.reset(ss)
	return nil
}

// abandon hands the copies an early exit left queued on l to the fence,
// with l.done recorded behind them (else the drain watches the stream);
// once they ran, release runs and l and its stages go back. It returns
// the channel closed once they ran when the schedule copies host memory
// directly (the caller's pinned memory, or a slice the registration cache
// pinned), which those copies may still touch; nil when they touch only
// the stages, which the drain keeps.
func (c *copier) abandon(l *lane, release func()) (touching <-chan struct{}) {
	direct := slices.ContainsFunc(l.ops, func(p piece) bool { return p.direct })
	d := drain{evs: []*cuda.Event{l.done}}
	if l.done.Record(l.stream) != nil {
		d = drain{streams: []*cuda.Stream{l.stream}}
	}
	l.nearSet = false
	ran := c.fence.handOff(c.gate.Hold, c.gate.End, d, func() {
		release()
		c.releaseLane(l)
	})
	if !direct {
		return nil
	}
	return ran
}

// abandonOnPanic runs f, which calls the caller's code (a reader, a
// writer) on lane l; when that panics (or exits the goroutine), the
// copies l queued go to the fence (abandon) before the panic goes on, so
// that the Copier keeps its lane and stages.
func (c *copier) abandonOnPanic(l *lane, f func() error) error {
	returned := false
	defer func() {
		if !returned {
			c.abandon(l, func() {})
		}
	}()
	err := f()
	returned = true
	return err
}

// HtoD copies src into the device buffer dst (from offset 0; use
// dst.Slice for another offset) and returns when the data is there. dst
// must hold len(src) bytes (else a *SizeError), be alive (else an error
// matching cuda.ErrInvalidHandle) and be on the Copier's device (else
// ErrWrongDevice). ctx bounds the call; an early exit follows the package
// documentation's rules: src is never read after HtoD returns if pageable,
// and after an error a pinned src may be until Fence returns.
func (c *Copier) HtoD(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) (Stats, error) {
	if err := c.enter(ctx); err != nil {
		return Stats{Direction: HostToDevice}, err
	}
	defer c.gate.End()
	st, _, err := c.move(ctx, HostToDevice, src, dst, byRoute)
	return st, err
}

// DtoH copies len(dst) bytes from the start of the device buffer src into
// dst and returns when they are there. src is checked as HtoD checks dst,
// and ctx bounds the call as it bounds HtoD: a pageable dst is never
// written after DtoH returns, and after an error a pinned dst may be until
// Fence returns.
func (c *Copier) DtoH(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) (Stats, error) {
	if err := c.enter(ctx); err != nil {
		return Stats{Direction: DeviceToHost}, err
	}
	defer c.gate.End()
	st, _, err := c.move(ctx, DeviceToHost, dst, src, byRoute)
	return st, err
}

// piece is one copy of a transfer, between host and dev at off: direct
// (host pinned) or through stage s at [lo, lo+len(host)).
type piece struct {
	host   []byte
	dev    *cuda.DeviceBuffer
	off    int
	direct bool
	s      *stage
	lo     int
}

// chunkSize is the piece size for n staged bytes: a stage, or less so
// that at least tune.chunkPieces pieces overlap.
func (c *copier) chunkSize(n int) int {
	ch := (n/c.o.tune.chunkPieces + 65535) &^ 65535
	return max(min(ch, c.o.stageSize), min(minChunk, c.o.stageSize))
}

// plan splits a copy between host and dev into pieces: one direct copy per
// pinned span, the pageable rest staged in chunks of at most a stage.
func (c *copier) plan(host []byte, dev *cuda.DeviceBuffer, spans []span, st *Stats) []piece {
	var ops []piece
	staged := len(host)
	for _, s := range spans {
		staged -= s.Hi - s.Lo
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
	_ = hostspan.Parts(spans, 0, len(host), func(a, b int, pinned bool) error {
		if !pinned {
			stage(a, b)
			return nil
		}
		ops = append(ops, piece{host: host[a:b], dev: dev, off: a, direct: true})
		st.DirectBytes += int64(b - a)
		return nil
	})
	// A long direct copy at the end goes in two: waitLast polls only the
	// last tailBytes.
	if n := len(ops); c.o.wait == WaitHybrid && n > 0 && ops[n-1].direct && len(ops[n-1].host) >= 2*tailBytes {
		last := ops[n-1]
		cut := len(last.host) - tailBytes
		ops[n-1] = piece{host: last.host[:cut], dev: last.dev, off: last.off, direct: true}
		ops = append(ops, piece{host: last.host[cut:], dev: last.dev, off: last.off + cut, direct: true})
	}
	return ops
}

// markNear records l.near before the last of n ops (index i) when work
// precedes it, so that waitLast polls only the last piece.
func (c *copier) markNear(l *lane, i, n int) {
	if i == n-1 && n > 1 && c.o.wait == WaitHybrid {
		l.nearSet = l.near.Record(l.stream) == nil
	}
}

// waitLast waits for ev, the transfer's end: asleep until l.near (when
// recorded), then as the WaitMode says.
func (c *copier) waitLast(ctx context.Context, l *lane, ev *cuda.Event) error {
	if l.nearSet {
		l.nearSet = false
		if err := l.w.wait(ctx, l.near); err != nil {
			return err
		}
	}
	return l.w.waitAs(ctx, ev, c.o.wait, tailSpin)
}

// move checks dev and moves host to or from it in direction d through the
// executor; how forces a path (tests). After an early exit, touching is
// closed once the copies left queued no longer touch host (see abandon);
// nil when none does, as the stages they use are the drain's.
func (c *copier) move(ctx context.Context, d Direction, host []byte, dev *cuda.DeviceBuffer, how strategy) (_ Stats, touching <-chan struct{}, _ error) {
	st := &Stats{Direction: d, Bytes: int64(len(host))}
	what := "destination device buffer"
	if d == DeviceToHost {
		what = "source device buffer"
	}
	if err := checkBuf(dev, c.cctx.Device(), what); err != nil {
		return *st, nil, err
	}
	if len(host) > dev.Size() {
		return *st, nil, &SizeError{Op: d.String(), Need: len(host), Have: dev.Size()}
	}
	if err := ctx.Err(); err != nil {
		return *st, nil, err
	}
	if len(host) == 0 {
		return *st, nil, nil
	}
	m := startMeter(c.o.stats)
	l, ring, release, err := c.schedule(ctx, st, host, dev, how)
	if err != nil {
		return *st, nil, err
	}
	touching, err = c.exec(ctx, l, l.ops, ring, st, release)
	m.stop(st)
	if err != nil {
		return *st, touching, fmt.Errorf("transfer: %s copy of %d bytes: %w", st.Direction, len(host), err)
	}
	if !ring {
		st.StagedBytes = int64(len(host))
		st.Stages = 1
	}
	return *st, nil, nil
}

// schedule takes a lane, bounded by ctx, and stages and lays the
// transfer out in l.ops: through one stage (ring false) when route says
// so, no part of host may be pinned and a stage is idle or may be pinned
// (oneStage); else through the ring, bounded by ctx, pinned spans copied
// directly (release ends the registration cache's holds). A transfer
// finding every lane busy waits for one and keeps route's path, so that
// transfers a small stage holds never pin ring stages.
func (c *copier) schedule(ctx context.Context, st *Stats, host []byte, dev *cuda.DeviceBuffer, how strategy) (l *lane, ring bool, release func(), err error) {
	if l, err = c.acquire(ctx); err != nil {
		return nil, true, nil, err
	}
	if p := route(len(host), c.o.stageSize, how); p != pathRing && !c.mayBePinned(host) && c.oneStage(ctx, l, st.Direction, host, dev, p == pathSmall) {
		return l, false, func() {}, nil
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
	return l, true, release, nil
}

// ringWait is the wait of a lane's ring: for the transfer's end when
// last (waitLast), else for a stage (waitStage).
func (c *copier) ringWait(ctx context.Context, l *lane, ev *cuda.Event, last bool) error {
	if last {
		return c.waitLast(ctx, l, ev)
	}
	return c.waitStage(ctx, l, ev)
}

// htod queues the copy of the stage's bytes [lo, hi) to dev at off on
// st, one copy per registration of the stage.
func (s *stage) htod(st *cuda.Stream, dev *cuda.DeviceBuffer, off, lo, hi int) error {
	return hostspan.EachPiece(s.cuts, lo, hi, func(a, b int) error { return st.CopyHtoD(dev, off+a-lo, s.mem[a:b]) })
}

// dtoh queues the copy of hi-lo bytes of dev at off into the stage's
// bytes [lo, hi) on st, one copy per registration of the stage.
func (s *stage) dtoh(st *cuda.Stream, dev *cuda.DeviceBuffer, off, lo, hi int) error {
	return hostspan.EachPiece(s.cuts, lo, hi, func(a, b int) error { return st.CopyDtoH(s.mem[a:b], dev, off+a-lo) })
}

// waitStage waits for stage event ev inside a transfer holding l.
func (c *copier) waitStage(ctx context.Context, l *lane, ev *cuda.Event) error {
	return l.w.waitAs(ctx, ev, c.o.wait, c.o.tune.stageSpin)
}

// startTimer records the transfer's first timing event (WithStats).
func (l *lane) startTimer() error {
	if l.t0 == nil {
		return nil
	}
	return l.t0.Record(l.stream)
}

// The executor runs a schedule of pieces on a lane in one of two shapes.
// In a ring the staged pieces take the borrowed stages in turn from the
// lane's ring, which refills a stage or hands it out to be copied out only
// once its copy ran, and the end is the lane's done event. Through
// one stage the pieces are parts of one stage, so no stage event is
// recorded: device to host, the near event between the two halves says
// when the first can be copied out, and the end is singleWait.

// exec runs ops on lane l and ends the transfer (finish).
func (c *copier) exec(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats, release func()) (touching <-chan struct{}, _ error) {
	var first error
	if st.Direction == HostToDevice {
		first = c.execHtoD(ctx, l, ops, ring, st)
	} else {
		first = c.execDtoH(ctx, l, ops, ring, st)
	}
	return c.finish(ctx, l, ops, ring, first, st, release)
}

// execHtoD fills each staged piece's part of its stage and queues its copy
// at once, so that its DMA overlaps the CPU's copy of the next.
func (c *copier) execHtoD(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats) error {
	for i, o := range ops {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ring {
			c.markNear(l, i, len(ops))
		}
		s := o.s
		if !o.direct {
			if ring {
				var err error
				if s, err = l.ring.next(ctx); err != nil {
					return err
				}
			}
			st.CopyCPU += c.copyStage(s.mem[o.lo:o.lo+len(o.host)], o.host)
		}
		if i == 0 {
			if err := l.startTimer(); err != nil {
				return err
			}
		}
		var err error
		if o.direct {
			err = l.stream.CopyHtoD(o.dev, o.off, o.host)
		} else if err = s.htod(l.stream, o.dev, o.off, o.lo, o.lo+len(o.host)); ring {
			err = l.ring.queued(0, false, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// execDtoH queues the copies, as many staged ones at once as there are
// stages (the ring's window), and copies each staged piece out once its
// copy ran while later ones fly (through one stage, finish copies the
// last piece out).
func (c *copier) execDtoH(ctx context.Context, l *lane, ops []piece, ring bool, st *Stats) error {
	head, next, inFlight := 0, 0, 0
	for {
		for next < len(ops) && (ops[next].direct || (ring && !l.ring.full()) || (!ring && inFlight < len(ops))) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := c.queueOut(ctx, l, ops, next, ring); err != nil {
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
		s := o.s
		var err error
		switch {
		case !ring && last:
			return nil
		case !ring:
			err = l.w.wait(ctx, l.near)
		default:
			s, err = l.ring.oldest(ctx, last)
		}
		if err != nil {
			return err
		}
		st.CopyCPU += c.copyStage(o.host, s.mem[o.lo:o.lo+len(o.host)])
		head++
		inFlight--
	}
}

// queueOut queues the copy of ops[i] to the host or into its stage, with
// the events its shape records around it.
func (c *copier) queueOut(ctx context.Context, l *lane, ops []piece, i int, ring bool) error {
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
	if !ring {
		return o.s.dtoh(l.stream, o.dev, o.off, o.lo, o.lo+len(o.host))
	}
	s, err := l.ring.next(ctx) // free: the window holds fewer pending stages than there are
	if err != nil {
		return err
	}
	return l.ring.queued(0, true, s.dtoh(l.stream, o.dev, o.off, o.lo, o.lo+len(o.host)))
}

// finish waits, bounded by ctx, for everything the transfer on l queued
// (through one stage, then copies the last piece out), then runs release
// and gives l back. When the transfer stopped early (first) or ctx ends,
// l and release go to the fence (abandon) and finish returns at once,
// with abandon's channel. It reports the first error.
func (c *copier) finish(ctx context.Context, l *lane, ops []piece, ring bool, first error, st *Stats, release func()) (touching <-chan struct{}, _ error) {
	if first != nil {
		return c.abandon(l, release), first
	}
	timed := l.t1 != nil && l.t1.Record(l.stream) == nil
	var err error
	if ring {
		if err = l.done.Record(l.stream); err == nil {
			err = c.waitLast(ctx, l, l.done)
		}
		// Collect the copies' asynchronous errors on a stream of our own;
		// a caller's stream may hold later work, its errors are the caller's.
		if err == nil && c.ownStream {
			err = streamErr(ctx, l.stream)
		}
	} else {
		err = c.singleWait(ctx, l)
	}
	if err != nil {
		return c.abandon(l, release), err
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
	return nil, nil
}
