package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Pipeline defaults.
const (
	// DefaultChunkSize is a Pipeline's default chunk: 32 MiB, large enough
	// for full-speed copies, small enough for several chunks in flight.
	DefaultChunkSize = 32 << 20
	// DefaultStreams is a Pipeline's default stream count: 4 streams let
	// one chunk's host-to-device copy, another's kernel and a third's
	// device-to-host copy overlap (the C reference: 12.6 ms for 16 x 32 MiB
	// with 4 streams, 20.4 ms with one).
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

// PipelineConfig configures a Pipeline. Zero fields take the defaults.
type PipelineConfig struct {
	ChunkSize int // bytes per chunk; default DefaultChunkSize
	Streams   int // streams the chunks are spread over, round robin; default DefaultStreams
	// InFlight bounds the chunks issued and not yet completed (default
	// 2*Streams). Each holds ChunkSize bytes of device memory and, when the
	// input or output is not pinned, ChunkSize bytes of pinned staging
	// memory: this is the Pipeline's memory bound and its back-pressure.
	InFlight int
	// Ordered delivers Done callbacks in chunk order; otherwise each chunk
	// is delivered as soon as it completes.
	Ordered bool
	// Work enqueues the device work for one chunk on s, after its
	// host-to-device copy and before its device-to-host copy: typically one
	// kernel launch on ch.Dev (see LaunchWork). It must not wait for the
	// work. nil means no work (a plain round trip).
	Work func(s *cuda.Stream, ch Chunk) error
	// PinStages pins the staging buffers (ChunkSize bytes per chunk in
	// flight) in NewPipeline. Otherwise the first Run with Go memory pins
	// them, which costs that Run the time to pin InFlight*ChunkSize bytes
	// (PipelineStats.Setup: tens of milliseconds for 8 x 32 MiB), as long as the
	// transfer itself. Set it when the input or output will be Go memory.
	PinStages bool
	// Done is called, on Run's goroutine, when a chunk's output is in
	// ch.Out (or its work finished, without output). An error stops the
	// Pipeline.
	Done func(ch Chunk) error
}

// PipelineStats describe one Run.
type PipelineStats struct {
	Chunks     int           // chunks completed and delivered
	Bytes      int64         // input bytes of those chunks
	StagedIn   bool          // the input went through pinned stages
	StagedOut  bool          // the output went through pinned stages
	Wall       time.Duration // includes Setup
	Setup      time.Duration // time spent pinning the staging buffers (the first staged Run, without PinStages)
	CopyCPU    time.Duration // CPU time of the stage-in/stage-out copies
	ProcessCPU time.Duration // process CPU time during the run
}

// GBps returns input bytes per second of wall time, in GB/s.
func (s PipelineStats) GBps() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(s.Bytes) / s.Wall.Seconds() / 1e9
}

// Pipeline runs chunked host-to-device, device work, device-to-host
// sequences over several streams. Create it with Copier.NewPipeline; it
// uses the Copier's context, copy goroutines and pinned-memory knowledge
// (AddPinned, registration cache). One Run at a time.
type Pipeline struct {
	c       *Copier
	cfg     PipelineConfig
	streams []*cuda.Stream
	slots   []*slot
	w       *waiter
	run     sync.Mutex
	closed  bool
}

type slot struct {
	stream *cuda.Stream
	dev    *cuda.DeviceBuffer
	ev     *cuda.Event
	stage  *pinmem.Buffer // allocated on the first staged run
	mem    []byte
}

// LaunchWork returns a Pipeline Work function that launches f on each
// chunk with grid and block, and the arguments args returns for the chunk.
func LaunchWork(f *cuda.Function, grid, block cuda.Dim3, args func(ch Chunk) []any) func(*cuda.Stream, Chunk) error {
	return func(s *cuda.Stream, ch Chunk) error {
		return f.Launch(s, grid, block, 0, args(ch)...)
	}
}

// NewPipeline creates a Pipeline: its streams, events and per-slot device
// memory. The caller must Close it (before closing the Copier).
func (c *Copier) NewPipeline(cfg PipelineConfig) (p *Pipeline, err error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.active.Done()
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.Streams == 0 {
		cfg.Streams = DefaultStreams
	}
	if cfg.InFlight == 0 {
		cfg.InFlight = 2 * cfg.Streams
	}
	if cfg.ChunkSize < 0 || cfg.Streams < 0 || cfg.InFlight < 0 {
		return nil, fmt.Errorf("transfer: pipeline chunk %d, streams %d, in flight %d: %w", cfg.ChunkSize, cfg.Streams, cfg.InFlight, cuda.ErrInvalidValue)
	}
	p = &Pipeline{c: c, cfg: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.release())
			p = nil
		}
	}()
	for i := 0; i < cfg.Streams; i++ {
		s, err := c.cctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return p, fmt.Errorf("transfer: pipeline stream %d: %w", i, err)
		}
		p.streams = append(p.streams, s)
	}
	for i := 0; i < cfg.InFlight; i++ {
		sl := &slot{stream: p.streams[i%cfg.Streams]}
		p.slots = append(p.slots, sl)
		if sl.ev, err = c.cctx.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
			return p, err
		}
		if sl.dev, err = c.cctx.Alloc(cfg.ChunkSize); err != nil {
			return p, fmt.Errorf("transfer: pipeline device memory for chunk slot %d: %w", i, err)
		}
	}
	if cfg.PinStages {
		if err := p.stages(); err != nil {
			return p, err
		}
	}
	p.w = newWaiter()
	return p, nil
}

// Close releases the Pipeline's streams, events and memory. A second
// Close returns ErrClosed.
func (p *Pipeline) Close() error {
	p.run.Lock()
	defer p.run.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.closed = true
	return p.release()
}

func (p *Pipeline) release() error {
	var errs []error
	if p.w != nil {
		p.w.close()
	}
	for _, s := range p.streams {
		errs = append(errs, s.Synchronize())
	}
	for _, sl := range p.slots {
		if sl.ev != nil {
			errs = append(errs, sl.ev.Destroy())
		}
		if sl.dev != nil {
			errs = append(errs, sl.dev.Free())
		}
		if sl.stage != nil {
			errs = append(errs, sl.stage.Free())
		}
	}
	for _, s := range p.streams {
		errs = append(errs, s.Destroy())
	}
	return errors.Join(errs...)
}

// staged reports whether every slot has its staging buffer.
func (p *Pipeline) staged() bool {
	for _, sl := range p.slots {
		if sl.stage == nil {
			return false
		}
	}
	return true
}

// stages allocates each slot's pinned staging buffer, once.
func (p *Pipeline) stages() error {
	for i, sl := range p.slots {
		if sl.stage != nil {
			continue
		}
		b, err := pinmem.Alloc(p.cfg.ChunkSize, pinmem.Portable, pinmem.WithDevice(p.c.cctx.Device()))
		if err != nil {
			return fmt.Errorf("transfer: pipeline staging buffer for slot %d: %w", i, err)
		}
		sl.stage, sl.mem = b, b.Bytes()
	}
	return nil
}

type flight struct {
	ch   Chunk
	sl   *slot
	done bool
}

// Run processes in, chunk by chunk: host-to-device, Work, and, when out is
// not nil, device-to-host into out (which must be at least as long as in;
// it may be in itself). Pinned input or output (known to the Copier) is
// copied directly; Go memory goes through one pinned stage per chunk in
// flight. At most InFlight chunks are in flight; Done is called for each
// completed chunk, in order when Ordered.
//
// The first error (an enqueue, the Work function, a copy or kernel failing
// asynchronously, a Done callback) or ctx's cancellation stops the issue of
// new chunks; the chunks in flight are drained without further callbacks,
// and Run returns the error (a *ChunkError when a chunk is to blame; one
// matching ctx.Err() on cancellation). Run never reports success for work
// that did not complete.
func (p *Pipeline) Run(ctx context.Context, in, out []byte) (PipelineStats, error) {
	var st PipelineStats
	if ctx == nil {
		ctx = context.Background()
	}
	p.run.Lock()
	defer p.run.Unlock()
	if p.closed {
		return st, ErrClosed
	}
	if out != nil && len(out) < len(in) {
		return st, &SizeError{Op: "pipeline output", Need: len(in), Have: len(out)}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m := startMeter()
	inSpans, relIn := p.c.pinnedSpans(in)
	defer relIn()
	st.StagedIn = len(in) > 0 && !covers(inSpans, len(in))
	if out != nil {
		outSpans, relOut := p.c.pinnedSpans(out[:len(in)])
		defer relOut()
		st.StagedOut = len(in) > 0 && !covers(outSpans, len(in))
	}
	if (st.StagedIn || st.StagedOut) && !p.staged() {
		t0 := time.Now()
		if err := p.stages(); err != nil {
			return st, err
		}
		st.Setup = time.Since(t0)
	}
	err := p.loop(ctx, in, out, &st)
	st.Wall, st.ProcessCPU = m.elapsed()
	return st, err
}

func covers(s []span, n int) bool { return len(s) == 1 && s[0].lo == 0 && s[0].hi == n }

func (p *Pipeline) loop(ctx context.Context, in, out []byte, st *PipelineStats) error {
	cs := p.cfg.ChunkSize
	n := (len(in) + cs - 1) / cs
	free := append([]*slot(nil), p.slots...)
	var pending []*flight
	var stop error // first error; set: issue nothing more, deliver nothing more
	next := 0
	fail := func(err error) {
		if stop == nil {
			stop = err
		}
	}
	complete := func(f *flight) {
		if stop == nil {
			if st.StagedOut && f.ch.Out != nil {
				st.CopyCPU += p.c.pool.copy(f.ch.Out, f.sl.mem[:f.ch.Len])
			}
			if p.cfg.Done != nil {
				if err := p.cfg.Done(f.ch); err != nil {
					fail(&ChunkError{Chunk: f.ch.Index, Offset: f.ch.Offset, Stage: "callback", Err: err})
				}
			}
			if stop == nil {
				st.Chunks++
				st.Bytes += int64(f.ch.Len)
			}
		}
		free = append(free, f.sl)
	}
	// collect delivers completed chunks and reports whether any was.
	collect := func() bool {
		progress := false
		for i := 0; i < len(pending); {
			f := pending[i]
			done, err := f.sl.ev.Query()
			if err != nil {
				fail(&ChunkError{Chunk: f.ch.Index, Offset: f.ch.Offset, Stage: "complete", Err: err})
				done = true
			}
			if !done {
				if p.cfg.Ordered || stop != nil {
					break
				}
				i++
				continue
			}
			complete(f)
			pending = append(pending[:i], pending[i+1:]...)
			progress = true
		}
		return progress
	}
	for {
		for stop == nil && next < n && len(free) > 0 {
			if err := ctx.Err(); err != nil {
				fail(err)
				break
			}
			sl := free[0]
			free = free[1:]
			off := next * cs
			l := min(cs, len(in)-off)
			dev, _ := sl.dev.Slice(0, l)
			ch := Chunk{Index: next, Offset: off, Len: l, Dev: dev, In: in[off : off+l]}
			if out != nil {
				ch.Out = out[off : off+l]
			}
			next++
			stage, err := p.issue(sl, ch, st)
			pending = append(pending, &flight{ch: ch, sl: sl})
			if err != nil {
				fail(&ChunkError{Chunk: ch.Index, Offset: ch.Offset, Stage: stage, Err: err})
			}
		}
		if len(pending) == 0 {
			break
		}
		if collect() {
			continue
		}
		wctx := ctx
		if stop != nil {
			wctx = context.Background() // draining: wait for the DMA whatever happens
		}
		var err error
		if next == n && len(pending) == 1 {
			// The run's last chunk: wait as the Copier's WaitMode says
			// (poll rather than wait for the driver to wake a sleeper).
			err = p.w.waitEnd(wctx, pending[0].sl.ev, p.c.o.wait)
		} else {
			err = p.w.wait(wctx, pending[0].sl.ev)
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				fail(err)
				continue
			}
			f := pending[0]
			fail(&ChunkError{Chunk: f.ch.Index, Offset: f.ch.Offset, Stage: "complete", Err: err})
			pending = pending[1:]
			free = append(free, f.sl)
		}
	}
	// Report asynchronous errors of the streams; all their work is done.
	for _, s := range p.streams {
		if err := s.Synchronize(); err != nil {
			fail(fmt.Errorf("transfer: pipeline stream: %w", err))
		}
	}
	return stop
}

// issue queues one chunk on its slot's stream; it returns which step failed.
func (p *Pipeline) issue(sl *slot, ch Chunk, st *PipelineStats) (string, error) {
	s := sl.stream
	src := ch.In
	if st.StagedIn {
		st.CopyCPU += p.c.pool.copy(sl.mem[:ch.Len], ch.In)
		src = sl.mem[:ch.Len]
	}
	if err := s.CopyHtoD(ch.Dev.Ptr(), src); err != nil {
		return "host-to-device", err
	}
	if p.cfg.Work != nil {
		if err := p.cfg.Work(s, ch); err != nil {
			// Record anyway so that the drain waits for the copy already queued.
			_ = sl.ev.Record(s)
			return "work", err
		}
	}
	if ch.Out != nil {
		dst := ch.Out
		if st.StagedOut {
			dst = sl.mem[:ch.Len]
		}
		if err := s.CopyDtoH(dst, ch.Dev.Ptr()); err != nil {
			_ = sl.ev.Record(s)
			return "device-to-host", err
		}
	}
	if err := sl.ev.Record(s); err != nil {
		// Without the event the drain cannot see this chunk: wait for it here.
		return "record", errors.Join(err, s.Synchronize())
	}
	return "", nil
}
