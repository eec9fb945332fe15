package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// Pipeline defaults.
const (
	// DefaultChunkSize is a Pipeline's default chunk: 32 MiB, large enough
	// for full-speed copies, small enough for several chunks in flight.
	DefaultChunkSize = 32 << 20
	// DefaultStreams is a Pipeline's default stream count: 4 streams let
	// one chunk's host-to-device copy, another's kernel and a third's
	// device-to-host copy overlap.
	DefaultStreams = 4
)

// Chunk is one piece of a Pipeline's input.
type Chunk struct {
	Index  int                // 0-based chunk number
	Offset int                // offset of the chunk in the input (and output)
	Len    int                // bytes in the chunk
	Dev    *cuda.DeviceBuffer // the chunk's device memory (Len bytes, borrowed view)
	In     []byte             // the chunk's input
	Out    []byte             // the chunk's output (nil when Run has no output); valid in Done
}

// PipelineOption configures a Pipeline. Options only record their value;
// NewPipeline validates them and names the option at fault.
type PipelineOption func(*pipelineConfig)

type pipelineConfig struct {
	chunkSize int
	streams   int
	inFlight  int // 0: 2*streams
	ordered   bool
	work      func(s *cuda.Stream, ch Chunk) error
	pinStages bool
	done      func(ch Chunk) error
}

// WithChunkSize sets the bytes per chunk (positive). Default
// DefaultChunkSize.
func WithChunkSize(n int) PipelineOption { return func(c *pipelineConfig) { c.chunkSize = n } }

// WithStreams sets the number of streams the chunks are spread over,
// round robin (positive). Default DefaultStreams.
func WithStreams(n int) PipelineOption { return func(c *pipelineConfig) { c.streams = n } }

// WithInFlight bounds the chunks issued and not yet completed (positive;
// default twice the stream count). Each holds a chunk of device memory
// and, when the input or output is not pinned, a chunk of pinned staging
// memory: this is the Pipeline's memory bound and its back-pressure.
func WithInFlight(n int) PipelineOption { return func(c *pipelineConfig) { c.inFlight = n } }

// WithOrdered delivers Done callbacks in chunk order (on) or each chunk
// as soon as it completes (off, the default).
func WithOrdered(on bool) PipelineOption { return func(c *pipelineConfig) { c.ordered = on } }

// WithWork sets the device work for one chunk, enqueued on s after the
// chunk's host-to-device copy and before its device-to-host copy:
// typically one kernel launch on ch.Dev (see LaunchWork). It must not wait
// for the work. Without it a Pipeline is a plain round trip.
func WithWork(f func(s *cuda.Stream, ch Chunk) error) PipelineOption {
	return func(c *pipelineConfig) { c.work = f }
}

// WithDone sets the function called, on Run's goroutine, when a chunk's
// output is in ch.Out (or its work finished, without output). An error
// stops the Pipeline.
func WithDone(f func(ch Chunk) error) PipelineOption {
	return func(c *pipelineConfig) { c.done = f }
}

// WithPinStages pins the staging buffers (one chunk per chunk in flight,
// shared as Pipeline says) in NewPipeline instead of in the first Run from
// Go memory, which then pays for it (PipelineStats.Setup). Default off.
func WithPinStages(on bool) PipelineOption { return func(c *pipelineConfig) { c.pinStages = on } }

// PipelineStats describe one Run.
type PipelineStats struct {
	Chunks     int           // chunks completed and delivered
	Bytes      int64         // input bytes of those chunks
	StagedIn   bool          // the input, or its parts not pinned, went through pinned stages
	StagedOut  bool          // the output, or its parts not pinned, went through pinned stages
	Wall       time.Duration // includes Setup
	Setup      time.Duration // time spent pinning the staging buffers (the first staged Run, without WithPinStages)
	CopyCPU    time.Duration // CPU time of the stage-in/stage-out copies (WithStats(true) on the Copier; zero otherwise)
	ProcessCPU time.Duration // process CPU time during the run (WithStats(true) on the Copier; zero otherwise)
}

// GBps returns input bytes per second of wall time, in GB/s.
func (s PipelineStats) GBps() float64 { return gbps(float64(s.Bytes), s.Wall) }

// Pipeline runs chunked host-to-device, device work, device-to-host
// sequences over several streams. Create it with Copier.NewPipeline; it
// uses the Copier's context, copy goroutines, fence and pinned-memory
// knowledge (AddPinned, registration cache). One Run at a time.
//
// The Pipelines of one context with the same chunk size share their pinned
// staging buffers as Copiers share their stages: a Run from Go memory
// borrows one per chunk in flight, first come first served, from a set of
// that many for one Pipeline and twice that for more. A Run that finds
// fewer free keeps fewer chunks in flight.
type Pipeline struct {
	*pipeline
	cleanup runtime.Cleanup
}

// pipeline is a Pipeline's state; it never refers back to the Pipeline.
type pipeline struct {
	c         *copier
	eng       *engine // the staging buffers shared with the context's Pipelines; nil until needed
	member    bool    // this Pipeline still counts in eng
	cfg       pipelineConfig
	streams   []*cuda.Stream
	waiters   []*waiter // the completers', one per stream; closed once no drain is left
	slots     []*slot
	run       chan struct{}   // one Run (or a Run's abandoned drain) at a time
	gate      *lifecycle.Gate // Runs and abandoned drains in progress
	rel       *lifecycle.Releaser
	panicked  any                // what a callback of the Run in progress panicked with
	cancelRun context.CancelFunc // ends the Run in progress
	dirty     bool               // a chunk's event was not recorded: its drain watches the streams
}

// slot is one chunk in flight: a stream, device memory, the event recorded
// behind the chunk's copies and work, and (staged) a stage. Slots are not
// a ring (ring.go): the completer of the slot's stream waits for its event
// and copies its staged output out on a goroutine of its own while Run's
// goroutine copies the next chunks in, and gives the slot back in the
// order its stream finishes, not in turn (a held stream stalls no other:
// TestFakePipelineHeldStreamOthersFlow).
type slot struct {
	stream    *cuda.Stream
	streamIdx int // the index of stream in the Pipeline's streams
	dev       *cuda.DeviceBuffer
	ev        *cuda.Event
	stage     *stage // borrowed for the Run in progress (nil: none)
}

// LaunchWork returns a Pipeline work function (WithWork) that launches f
// on each chunk with grid and block, and the arguments args returns for
// the chunk.
func LaunchWork(f *cuda.Function, grid, block cuda.Dim3, args func(ch Chunk) []any) func(*cuda.Stream, Chunk) error {
	return func(s *cuda.Stream, ch Chunk) error {
		if f == nil || args == nil {
			return fmt.Errorf("transfer: LaunchWork with a nil function or argument list: %w", cuda.ErrInvalidValue)
		}
		return f.Launch(s, grid, block, 0, args(ch)...)
	}
}

// NewPipeline creates a Pipeline: its streams, events and per-slot device
// memory. A refused option is a *pinmem.OptionError (matching
// cuda.ErrInvalidValue) naming it. The caller must Close it; once the
// Copier is closed, Run fails with ErrClosed.
func (c *Copier) NewPipeline(opts ...PipelineOption) (*Pipeline, error) {
	lifecycle.RetryOrphans()
	if !c.ok() {
		return nil, errNil("Copier")
	}
	if err := c.gate.Begin(); err != nil {
		return nil, err
	}
	defer c.gate.End()
	cfg := pipelineConfig{chunkSize: DefaultChunkSize, streams: DefaultStreams}
	if err := cfg.apply(opts); err != nil {
		return nil, err
	}
	s, err := newPipelineState(c.copier, cfg)
	if err != nil {
		return nil, err
	}
	p := &Pipeline{pipeline: s}
	p.cleanup = runtime.AddCleanup(p, func(s *pipeline) { s.dropped() }, s)
	return p, nil
}

// apply applies opts to cfg and checks the result.
func (cfg *pipelineConfig) apply(opts []PipelineOption) error {
	refuse := func(opt string, v any, reason string) error {
		return &pinmem.OptionError{Func: "Copier.NewPipeline", Option: opt, Value: fmt.Sprint(v), Reason: reason}
	}
	for i, f := range opts {
		if f == nil {
			return refuse("PipelineOption", "nil", fmt.Sprintf("option %d is nil", i))
		}
		f(cfg)
	}
	if cfg.inFlight == 0 {
		cfg.inFlight = 2 * cfg.streams
	}
	switch {
	case cfg.chunkSize <= 0:
		return refuse("WithChunkSize", cfg.chunkSize, "the size must be positive")
	case cfg.streams <= 0 || cfg.streams > 1024:
		return refuse("WithStreams", cfg.streams, "must be 1 to 1024")
	case cfg.inFlight < 0 || cfg.inFlight > 4096:
		return refuse("WithInFlight", cfg.inFlight, "must be 1 to 4096")
	}
	return nil
}

func newPipelineState(c *copier, cfg pipelineConfig) (p *pipeline, err error) {
	p = &pipeline{c: c, cfg: cfg, run: make(chan struct{}, 1), gate: lifecycle.NewGate(ErrClosed)}
	p.rel = lifecycle.NewReleaser(p.releaseStep)
	defer func() {
		if err != nil {
			p.gate.MarkClosed()
			err = errors.Join(err, p.rel.Release())
			p.rel.Orphan()
			p = nil
		}
	}()
	for i := 0; i < cfg.streams; i++ {
		s, err := c.cctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return p, fmt.Errorf("transfer: pipeline stream %d: %w", i, err)
		}
		p.streams, p.waiters = append(p.streams, s), append(p.waiters, newWaiter())
	}
	for i := 0; i < cfg.inFlight; i++ {
		sl := &slot{stream: p.streams[i%cfg.streams], streamIdx: i % cfg.streams}
		p.slots = append(p.slots, sl)
		if sl.ev, err = c.cctx.NewEvent(syncEvent); err != nil {
			return p, err
		}
		if sl.dev, err = c.cctx.Alloc(cfg.chunkSize); err != nil {
			return p, fmt.Errorf("transfer: pipeline device memory for chunk slot %d: %w", i, err)
		}
	}
	if cfg.pinStages {
		if err := p.stages(context.Background()); err != nil {
			return p, err
		}
	}
	return p, nil
}

// Close stops the Pipeline (later Runs return ErrClosed), waits for the Run
// in progress and the chunks it left in flight, and releases its streams,
// events and memory, as the package documentation's Close contract says.
func (p *Pipeline) Close(ctx context.Context) error {
	if p == nil || p.pipeline == nil {
		return errNil("Pipeline")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return lifecycle.Close(ctx, "transfer: closing the Pipeline", p.gate, p.rel, &p.cleanup)
}

// dropped is the cleanup of a Pipeline dropped without Close; a drain a
// Run left may still be in progress, and release waits for it.
func (p *pipeline) dropped() {
	lifecycle.Dropped(p.gate, p.rel, "pipeline", "slots", len(p.slots), "chunk_size", p.cfg.chunkSize)
}

// releaseStep frees whatever newPipelineState created (rel.step).
func (p *pipeline) releaseStep() (left int, err error) {
	var errs []error
	for _, w := range p.waiters {
		w.close()
	}
	for _, sl := range p.slots {
		errs = append(errs, destroyEvent(&sl.ev, &left), freeDev(&sl.dev, &left))
	}
	if p.eng != nil {
		n, err := p.eng.leave(&p.member)
		left += n
		errs = append(errs, err)
	}
	for i := range p.streams {
		errs = append(errs, destroyStream(&p.streams[i], &left))
	}
	return left, errors.Join(errs...)
}

// stages joins, once, the engine of the context's Pipeline staging
// buffers and pins them (fill), bounded by ctx.
func (p *pipeline) stages(ctx context.Context) error {
	if p.eng != nil {
		return nil
	}
	o := options{stageSize: p.cfg.chunkSize, depth: p.cfg.inFlight, parallelism: 1}
	eng := joinEngine(p.c.cctx, o, true)
	member := true
	if err := eng.fill(ctx, o.depth); err != nil {
		left, lerr := eng.leave(&member)
		if left > 0 {
			eng.rel.Orphan() // what the driver failed to release, retried later
		}
		return fmt.Errorf("transfer: pipeline staging buffers: %w", errors.Join(err, lerr))
	}
	p.eng, p.member = eng, member
	return nil
}

// borrowStages lends up to a stage per slot to the Run, bounded by ctx,
// and returns how many slots got one and the function that gives them back.
func (p *pipeline) borrowStages(ctx context.Context) (int, func(), error) {
	got, err := p.eng.take(ctx, len(p.slots))
	if err != nil {
		return 0, nil, err
	}
	for i, s := range got {
		p.slots[i].stage = s
	}
	return len(got), func() {
		for _, sl := range p.slots[:len(got)] {
			sl.stage = nil
		}
		p.eng.give(got)
	}, nil
}

type flight struct {
	ch   Chunk
	sl   *slot
	last bool // the Run's last chunk
}

// Run processes in, chunk by chunk: host-to-device, the work (WithWork),
// and, when out is not nil, device-to-host into out (at least as long as
// in; it may be in itself). Pinned input or output is copied directly; Go
// memory goes through one pinned stage per chunk in flight, copied in on
// Run's goroutine and out on goroutines of their own, so that both CPU
// copies run at once. At most WithInFlight chunks are in flight; Done is
// called for each completed chunk, in order with WithOrdered(true).
//
// The first error (an enqueue, the work, an asynchronous fault, Done) or
// the end of ctx stops the issue of chunks; those in flight are waited for
// without further callbacks, bounded by ctx, and Run returns the error (a
// *ChunkError naming the chunk to blame, or one matching ctx.Err()). Run
// never reports success for work that did not complete. Chunks whose wait
// ended with ctx or failed go to the Copier's fence, as the package
// documentation says: the next Run waits for them, and pinned in or out
// may be touched until Fence returns. A panicking callback is raised again
// on Run's caller once its chunks are handed off.
func (p *Pipeline) Run(ctx context.Context, in, out []byte) (PipelineStats, error) {
	var st PipelineStats
	if p == nil || p.pipeline == nil {
		return st, errNil("Pipeline")
	}
	if err := checkCtx(ctx); err != nil {
		return st, err
	}
	if out != nil && len(out) < len(in) {
		return st, &SizeError{Op: "pipeline output", Need: len(in), Have: len(out)}
	}
	if err := p.gate.Begin(); err != nil {
		return st, err
	}
	defer p.gate.End()
	if err := p.c.gate.Begin(); err != nil {
		return st, err
	}
	defer p.c.gate.End()
	select {
	case p.run <- struct{}{}:
	case <-ctx.Done():
		return st, ctx.Err()
	}
	return p.runHeld(ctx, in, out)
}

// runHeld is Run with the run token held; the token goes back at once or,
// with chunks in flight, through the fence once they ran.
func (p *pipeline) runHeld(ctx context.Context, in, out []byte) (st PipelineStats, err error) {
	handedOff := false
	var holds []func()
	defer func() {
		if !handedOff {
			for _, h := range holds {
				h()
			}
			<-p.run
		}
	}()
	if p.gate.IsClosed() { // closed while this Run waited for the token
		return st, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m := startMeter(p.c.o.stats)
	inSpans, outSpans, slots, err := p.prepare(ctx, in, out, &st, &holds)
	if err != nil {
		return st, err
	}
	// A panicking callback ends rctx: the Run stops waiting and hands its
	// chunks in flight off at once.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.panicked, p.dirty, p.cancelRun = nil, false, cancel
	pending, err := p.loop(rctx, in, out, inSpans, outSpans, slots, &st)
	if len(pending) == 0 && !p.dirty && p.panicked == nil {
		// Report asynchronous errors of the streams; all their work is
		// done. Bounded by the caller's ctx (rctx ends with the Run).
		for _, s := range p.streams {
			if serr := streamErr(ctx, s); serr != nil && err == nil {
				err = fmt.Errorf("transfer: pipeline stream: %w", serr)
			}
		}
	}
	st.Wall, st.ProcessCPU = m.elapsed()
	if len(pending) > 0 || p.dirty {
		handedOff = true
		p.handOff(pending, holds)
	}
	if pv := p.panicked; pv != nil {
		// A callback panicked: every chunk in flight is handed off (or
		// drained), so the panic goes on, on the caller's goroutine.
		panic(pv)
	}
	return st, err
}

// prepare finds the pinned parts of in and out, borrows the stages a
// staged Run needs (holds gives them back) and orders the streams after
// the copies earlier calls left queued.
func (p *pipeline) prepare(ctx context.Context, in, out []byte, st *PipelineStats, holds *[]func()) (inSpans, outSpans []span, slots int, err error) {
	inSpans, relIn := p.c.pinnedSpans(in)
	*holds = append(*holds, relIn)
	st.StagedIn = len(in) > 0 && !hostspan.Covers(inSpans, len(in))
	if out != nil {
		var relOut func()
		outSpans, relOut = p.c.pinnedSpans(out[:len(in)])
		*holds = append(*holds, relOut)
		st.StagedOut = len(in) > 0 && !hostspan.Covers(outSpans, len(in))
	}
	if (st.StagedIn || st.StagedOut) && p.eng == nil {
		t0 := time.Now()
		if err := p.stages(ctx); err != nil {
			return nil, nil, 0, err
		}
		st.Setup = time.Since(t0)
	}
	slots = len(p.slots)
	if st.StagedIn || st.StagedOut {
		n, give, err := p.borrowStages(ctx)
		if err != nil {
			return nil, nil, 0, err
		}
		*holds = append(*holds, give)
		slots = n
	}
	for _, s := range p.streams {
		if err := p.c.fence.order(ctx, s); err != nil {
			return nil, nil, 0, fmt.Errorf("transfer: ordering after an abandoned transfer: %w", err)
		}
	}
	return inSpans, outSpans, slots, nil
}

// handOff gives the chunks that may be in flight to the fence, with the
// stages and the run token until they ran.
func (p *pipeline) handOff(pending []*flight, holds []func()) {
	d := drain{}
	for _, f := range pending {
		d.evs = append(d.evs, f.sl.ev)
	}
	if p.dirty {
		d.streams = p.streams
	}
	p.c.fence.handOff(func() { p.c.gate.Hold(); p.gate.Hold() }, func() { p.gate.End(); p.c.gate.End() }, d, func() {
		for _, h := range holds {
			h()
		}
		<-p.run
	})
}

// callback runs a user callback (Done, work), turning a panic into
// errPanicked and keeping its value for Run to raise again.
func (p *pipeline) callback(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			p.panicked = r
			p.cancelRun()
			err = errPanicked
		}
	}()
	return f()
}

// loop issues the chunks on Run's goroutine and delivers them as the
// completers give them back. It returns the chunks that may still be in
// flight (their waits ended with ctx, or followed a failed wait) and the
// first error.
func (p *pipeline) loop(ctx context.Context, in, out []byte, inSpans, outSpans []span, slots int, st *PipelineStats) ([]*flight, error) {
	cs := p.cfg.chunkSize
	r := &runLoop{p: p, ctx: ctx, in: in, out: out, inSpans: inSpans, outSpans: outSpans, st: st,
		n: (len(in) + cs - 1) / cs, free: append([]*slot(nil), p.slots[:slots]...)}
	queues := len(p.streams)
	if p.cfg.ordered {
		queues = 1
	}
	r.cm = p.startCompleters(ctx, queues, slots, st.StagedOut && out != nil, outSpans)
	defer func() {
		// Reached with chunks out only when a function of pinmem's
		// panicked: no callback runs any more and the completers stop
		// waiting, so that the panic goes on once no copy out runs.
		if r.busy > 0 {
			r.fail(errPanicked)
			r.cm.cancel()
			for r.busy > 0 {
				r.take(<-r.cm.done)
			}
		}
		st.CopyCPU += r.cm.stop()
	}()
	for {
		r.issueReady()
		if r.busy == 0 {
			break
		}
		r.take(<-r.cm.done)
	}
	if err := ctx.Err(); err != nil {
		r.fail(err) // ctx ended during the Run, if only in the last callback
	}
	return r.pending, r.stop
}

// runLoop is the state of one Run's loop, on Run's goroutine.
type runLoop struct {
	p                 *pipeline
	ctx               context.Context
	in, out           []byte
	inSpans, outSpans []span
	st                *PipelineStats
	n, next           int       // chunks, and the next to issue
	free              []*slot   // slots free to issue into
	pending           []*flight // given back without a completed wait: maybe in flight
	stop              error     // first error; set: issue nothing more, deliver nothing more
	cm                *completers
	busy              int // chunks given to the completers and not yet back
}

func (r *runLoop) fail(err error) {
	if r.stop == nil {
		r.stop = err
		r.cm.stopped.Store(true) // copy nothing more out
	}
}

// issueReady issues chunks while there are chunks, free slots and no
// error, and gives each to the completers.
func (r *runLoop) issueReady() {
	cs := r.p.cfg.chunkSize
	for r.stop == nil && r.next < r.n && len(r.free) > 0 {
		if err := r.ctx.Err(); err != nil {
			r.fail(err)
			return
		}
		sl := r.free[0]
		r.free = r.free[1:]
		off := r.next * cs
		l := min(cs, len(r.in)-off)
		dev, _ := sl.dev.Slice(0, l)
		ch := Chunk{Index: r.next, Offset: off, Len: l, Dev: dev, In: r.in[off : off+l]}
		if r.out != nil {
			ch.Out = r.out[off : off+l]
		}
		r.next++
		if stage, err := r.p.issue(sl, ch, r.st, r.inSpans, r.outSpans); err != nil {
			r.fail(&ChunkError{Chunk: ch.Index, Offset: ch.Offset, Stage: stage, Err: err})
		}
		r.cm.queue(&flight{ch: ch, sl: sl, last: r.next == r.n})
		r.busy++
	}
}

// take handles a chunk the completers gave back: one whose copies ran is
// delivered (Done, the counts) and its slot freed; one whose wait failed
// or ended with ctx may still be in flight and is kept for the fence.
func (r *runLoop) take(o outResult) {
	r.busy--
	if !o.waited {
		switch ctxErr := r.ctx.Err(); {
		case o.err != nil && !(ctxErr != nil && errors.Is(o.err, ctxErr)):
			r.fail(&ChunkError{Chunk: o.f.ch.Index, Offset: o.f.ch.Offset, Stage: "complete", Err: o.err})
		case o.err != nil:
			r.fail(o.err)
		}
		r.pending = append(r.pending, o.f)
		return
	}
	if err := r.ctx.Err(); err != nil {
		r.fail(err) // ctx ended: no more callbacks
	}
	f := o.f
	if r.stop == nil && r.p.cfg.done != nil {
		if err := r.p.callback(func() error { return r.p.cfg.done(f.ch) }); err != nil {
			r.fail(&ChunkError{Chunk: f.ch.Index, Offset: f.ch.Offset, Stage: "callback", Err: err})
		}
	}
	if r.stop == nil {
		r.st.Chunks++
		r.st.Bytes += int64(f.ch.Len)
	}
	r.free = append(r.free, f.sl)
}

// completers wait for a Run's chunks, one goroutine per stream (the
// order its chunks complete in) or one for all with WithOrdered(true),
// copy a staged output out while Run's goroutine copies the next chunks
// in, and give each chunk back. The queues and done hold every chunk in
// flight, so no send blocks. After a failed wait a completer gives the
// rest of its queue back unwaited.
type completers struct {
	qs      []chan *flight
	done    chan outResult
	stopped atomic.Bool // the Run stopped: wait, but copy nothing more out
	cancel  context.CancelFunc
	cpu     atomic.Int64 // nanoseconds of CPU time of the copies out (WithStats)
	wg      sync.WaitGroup
}

// outResult is a chunk given back: waited is true once its copies ran
// (and its staged output, unless the Run stopped, was copied out).
type outResult struct {
	f      *flight
	waited bool
	err    error
}

// errPanicked stops a Run whose Done or work function panicked.
var errPanicked = errors.New("transfer: a pipeline callback panicked")

// startCompleters starts the completers of a Run with up to slots chunks
// in flight; copyOut: the output is staged where outSpans, its pinned
// parts, leave gaps.
func (p *pipeline) startCompleters(ctx context.Context, queues, slots int, copyOut bool, outSpans []span) *completers {
	wctx, cancel := context.WithCancel(ctx)
	cm := &completers{done: make(chan outResult, slots), cancel: cancel}
	for i := range queues {
		q, w := make(chan *flight, slots), p.waiters[i] // its own waiter: a sleep never holds up another queue
		cm.qs = append(cm.qs, q)
		cm.wg.Go(func() {
			var failed error
			for f := range q {
				if failed == nil {
					failed = p.waitChunk(wctx, w, f, copyOut)
				}
				if failed != nil {
					cm.done <- outResult{f: f, err: failed}
					continue
				}
				if copyOut && !cm.stopped.Load() {
					_ = hostspan.Parts(outSpans, f.ch.Offset, f.ch.Len, func(lo, hi int, pinned bool) error {
						if !pinned {
							cm.cpu.Add(int64(p.c.copyStage(f.ch.Out[lo:hi], f.sl.stage.mem[lo:hi])))
						}
						return nil
					})
				}
				cm.done <- outResult{f: f, waited: true}
			}
		})
	}
	return cm
}

// waitChunk waits for f's chunk as the WaitMode says: the last like a
// transfer's end; with a staged output, whose copy out is on the critical
// path, the others polled for up to tune.outSpin under WaitHybrid; else
// asleep.
func (p *pipeline) waitChunk(ctx context.Context, w *waiter, f *flight, copyOut bool) error {
	mode := p.c.o.wait
	if f.last || (copyOut && mode != WaitHybrid) {
		return w.waitAs(ctx, f.sl.ev, mode, tailSpin)
	}
	if copyOut {
		return w.waitTail(ctx, f.sl.ev, p.c.o.tune.outSpin)
	}
	return w.wait(ctx, f.sl.ev)
}

// queue gives f to the completer of its stream (or the only one).
func (cm *completers) queue(f *flight) { cm.qs[f.sl.streamIdx%len(cm.qs)] <- f }

// stop ends the completers, once every chunk queued came back, and
// returns the CPU time of their copies.
func (cm *completers) stop() time.Duration {
	for _, q := range cm.qs {
		close(q)
	}
	cm.wg.Wait()
	cm.cancel()
	return time.Duration(cm.cpu.Load())
}

// issue queues one chunk on its slot's stream (pinned input or output
// directly) and returns which step failed. The slot's event is recorded
// behind whatever was queued, so that a drain waits for it; without it
// the drain watches the streams (dirty).
func (p *pipeline) issue(sl *slot, ch Chunk, st *PipelineStats, inSpans, outSpans []span) (step string, err error) {
	s := sl.stream
	defer func() {
		if rerr := sl.ev.Record(s); rerr != nil {
			p.dirty = true
			if err == nil {
				step, err = "record", rerr
			}
		}
	}()
	// The chunk's pinned parts directly, the rest through the slot's stage
	// at the same offsets (hostspan.Parts).
	err = hostspan.Parts(inSpans, ch.Offset, ch.Len, func(lo, hi int, pinned bool) error {
		if pinned {
			return s.CopyHtoD(ch.Dev, lo, ch.In[lo:hi])
		}
		st.CopyCPU += p.c.copyStage(sl.stage.mem[lo:hi], ch.In[lo:hi])
		return sl.stage.htod(s, ch.Dev, lo, lo, hi)
	})
	if err != nil {
		return "host-to-device", err
	}
	if p.cfg.work != nil {
		if err := p.callback(func() error { return p.cfg.work(s, ch) }); err != nil {
			return "work", err
		}
	}
	if ch.Out != nil {
		err = hostspan.Parts(outSpans, ch.Offset, ch.Len, func(lo, hi int, pinned bool) error {
			if pinned {
				return s.CopyDtoH(ch.Out[lo:hi], ch.Dev, lo)
			}
			return sl.stage.dtoh(s, ch.Dev, lo, lo, hi) // copied out by the completer
		})
	}
	if err != nil {
		return "device-to-host", err
	}
	return "", nil
}
