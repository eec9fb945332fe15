package load

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// stage is one pinned buffer with the stream its copies run on and the
// event recorded after them. A stage is in the Loader's free channel only
// when no copy out of it can still run.
type stage struct {
	buf    *pinmem.Buffer
	mem    []byte
	stream *cuda.Stream
	ev     *cuda.Event
}

// Loader reads files into device memory through pinned stages. Create one
// with New and Close it when done: it holds its streams and events from
// New to Close, and each stage's pinned memory (the stage size, charged
// to pinmem's budget; at most the depth times it) from the first read
// that takes the stage to Close. Its methods are safe for concurrent use;
// loads run one at a time, each using every stage, and a Load waiting for
// its turn gives up when its context ends.
type Loader struct {
	cctx    *cuda.Context
	cfg     config
	streams []*cuda.Stream
	stages  []*stage
	free    chan *stage // stages whose copies have finished

	// turn holds a token while a load, Wait or Close runs: one at a time.
	// It is a channel rather than a mutex so that a Load can stop waiting
	// for its turn when its context ends.
	turn   chan struct{}
	closed bool // guarded by turn
	// drained is closed once every stage is back after Close (guarded by
	// turn; nil before Close).
	drained chan struct{}

	rel *lifecycle.Releaser // frees the stages, events and streams (releaseStep)
	// released is closed once rel has released everything.
	released chan struct{}
}

// Stats describes one load.
type Stats struct {
	// Bytes is what was delivered to device memory: the sum of the ranges'
	// lengths on success.
	Bytes int64
	// ReadBytes is what was read from the files: Bytes plus alignment and
	// the holes between ranges that a read spanned.
	ReadBytes int64
	// Reads is the number of read requests.
	Reads int
	// Wall is the time from the start of the load to the last byte on the
	// device (opening the files and sampling the page cache included).
	Wall time.Duration
	// Mode is how the files were read: ModeDirect or ModeBuffered (never
	// ModeAuto; ModeMapped reads buffered); a file that fell back counts
	// as ModeBuffered. Where files were read differently, it is the mode
	// that read the most bytes.
	Mode Mode
	// Resident is the share of sampled pages that were in the page cache
	// when the load started (over all files, weighted by the bytes read
	// from each), or -1 when it was not sampled (the mode was chosen by
	// option) or could not be.
	Resident float64
	// Fallback says why direct I/O or ModeMapped was asked for (or
	// chosen) but a file was read buffered, naming the file when the load
	// had several; empty when no file fell back.
	Fallback string
}

// GBps returns the load's rate in GB/s (10^9 bytes per second): Bytes
// over Wall.
func (s Stats) GBps() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(s.Bytes) / s.Wall.Seconds() / 1e9
}

// New returns a Loader for device memory of ctx. It checks the options
// first (a *pinmem.OptionError for the first it refuses, matching
// cuda.ErrInvalidValue; a nil option too), before it looks at ctx, so
// that New(nil, opts...) checks a command line's options without a GPU:
// it returns the *pinmem.OptionError, or for valid options an error
// matching cuda.ErrInvalidValue for the nil context. It then creates the
// streams and events; it pins no memory: a load's reads pin the stages
// they take (see Loader). On any error whatever it had created is
// released again.
func New(c *cuda.Context, opts ...Option) (_ *Loader, err error) {
	lifecycle.RetryOrphans()
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("load: nil context: %w", cuda.ErrInvalidValue)
	}
	l := &Loader{cctx: c, cfg: cfg, free: make(chan *stage, cfg.depth), turn: make(chan struct{}, 1), released: make(chan struct{})}
	l.rel = lifecycle.NewReleaser(l.releaseStep)
	defer func() {
		if err != nil {
			err = errors.Join(err, l.rel.Release())
			l.rel.Orphan()
		}
	}()
	for range cfg.streams {
		s, err := c.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return nil, fmt.Errorf("load: creating a stream: %w", err)
		}
		l.streams = append(l.streams, s)
	}
	for i := range cfg.depth {
		st := &stage{stream: l.streams[i%len(l.streams)]}
		if st.ev, err = c.NewEvent(cuda.EventDisableTiming | cuda.EventBlockingSync); err != nil {
			return nil, fmt.Errorf("load: creating an event: %w", err)
		}
		l.stages = append(l.stages, st)
		l.free <- st
	}
	return l, nil
}

// pin pins s's memory with pinmem.Alloc on the context's device (a
// request over pinmem's budget is a *pinmem.BudgetError) unless an earlier
// read did: a stage is pinned by the first read that takes it, once, and
// stays pinned until Close. So a load pins only the stages its reads take
// (a load of one read, one stage), the readers pin theirs in parallel,
// and a load's first range waits for its own stage's pinning, not the
// whole ring's. The reader that took s from the free channel owns it.
// When ctx has ended it pins nothing.
func (l *Loader) pin(ctx context.Context, s *stage) error {
	if s.mem != nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := pinmem.Alloc(l.cfg.stageSize, 0, pinmem.WithDevice(l.cctx.Device()))
	if err != nil {
		return fmt.Errorf("load: pinning a stage of %d bytes: %w", l.cfg.stageSize, err)
	}
	s.buf, s.mem = b, b.Bytes()
	return nil
}

// Context returns the context whose device memory the Loader fills.
func (l *Loader) Context() *cuda.Context {
	if l == nil {
		return nil
	}
	return l.cctx
}

// buildConfig applies opts to the defaults and checks the result.
func buildConfig(opts []Option) (config, error) {
	cfg := defaults()
	for i, o := range opts {
		if o == nil {
			return cfg, optionError(fmt.Sprintf("option %d", i), "nil", "the option is nil")
		}
		o(&cfg)
	}
	return cfg, cfg.check()
}

// Close stops the Loader: later loads return ErrClosed. It waits for a
// load in progress to end and for the copies that an ended load left
// queued, then releases the stages, events and streams. The wait is
// bounded by ctx: when ctx ends first, Close returns an error matching
// ctx.Err() and the Loader stays closed; its resources are then released
// in the background as soon as the copies in flight finish (never, if the
// device never finishes them). A second Close returns ErrClosed.
func (l *Loader) Close(ctx context.Context) error {
	if l == nil || ctx == nil {
		return fmt.Errorf("load: Close of a nil Loader or with a nil context: %w", cuda.ErrInvalidValue)
	}
	if l.turn == nil {
		return fmt.Errorf("load: Close of a Loader not made by New: %w", cuda.ErrInvalidValue)
	}
	if err := l.take(ctx); err != nil {
		return fmt.Errorf("load: Close waiting for a load to end: %w", err)
	}
	defer func() { <-l.turn }()
	if l.closed {
		return ErrClosed
	}
	l.closed = true
	l.drained = make(chan struct{})
	go func() { // the one background wait: every stage is back
		_, _ = l.idle(context.Background())
		close(l.drained)
	}()
	return lifecycle.ReleaseWhenIdle(ctx, "load: Close waiting for the copies in flight", l.drained, l.rel)
}

// Wait returns once no copy that a load on l queued can still run, or an
// error matching ctx.Err() when ctx ends first. A load that returned
// early (its context ended) may have left copies queued that still write
// its destinations: once Wait has returned nil they have all run, and
// the destinations may be freed. Wait first waits for a load in progress
// to end; on a closed Loader it waits for the copies Close waits for.
func (l *Loader) Wait(ctx context.Context) error {
	if l == nil || l.turn == nil || ctx == nil {
		return fmt.Errorf("load: Wait on a nil Loader, one not made by New, or with a nil context: %w", cuda.ErrInvalidValue)
	}
	if err := l.take(ctx); err != nil {
		return fmt.Errorf("load: Wait for a load to end: %w", err)
	}
	defer func() { <-l.turn }()
	if l.closed {
		select {
		case <-l.drained:
			return nil
		default:
		}
		select {
		case <-l.drained:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("load: Wait for the copies in flight of a closed Loader: %w", ctx.Err())
		}
	}
	if busy, err := l.idle(ctx); err != nil {
		return fmt.Errorf("load: Wait for %d stages still copying: %w", busy, err)
	}
	return nil
}

// take takes the Loader's turn (see Loader.turn), waiting for it until
// ctx ends; a free turn is taken even when ctx has ended.
func (l *Loader) take(ctx context.Context) error {
	select {
	case l.turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case l.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseStep frees everything New created (rel's step), keeping what the
// driver fails to release for the next pass. It runs only when no copy
// out of a stage can still run: after New failed, or once every stage is
// back.
func (l *Loader) releaseStep() (left int, err error) {
	var errs []error
	for _, st := range l.stages {
		errs = append(errs,
			lifecycle.Drop(&st.buf, &left, (*pinmem.Buffer).Free, pinmem.ErrFreed),
			lifecycle.Drop(&st.ev, &left, (*cuda.Event).Destroy, cuda.ErrInvalidHandle))
	}
	for i := range l.streams {
		errs = append(errs, lifecycle.Drop(&l.streams[i], &left, (*cuda.Stream).Destroy, cuda.ErrInvalidHandle))
	}
	if left == 0 {
		l.stages, l.streams = nil, nil
		close(l.released)
	}
	return left, errors.Join(errs...)
}

// File is one file of a LoadFiles call: the file at Path and the ranges
// of it to load.
type File struct {
	Path   string
	Ranges []Range
}

// LoadFile reads the whole file at path into the start of dst, which must
// hold at least the file's size. A file larger than dst is an error
// matching ErrRange before anything is read.
func (l *Loader) LoadFile(ctx context.Context, path string, dst *cuda.DeviceBuffer) (Stats, error) {
	// The file's size is taken from the file the load opens, not from a
	// stat of the path before: by the open the path may name another
	// file, of which a stat-sized prefix would be loaded as if whole.
	return l.load(ctx, []File{{Path: path}}, dst, true, nil)
}

// Load reads the ranges of the file at path into their destinations and
// returns when every byte is in device memory (the copies have finished).
// It is LoadFiles of one file; see there.
func (l *Loader) Load(ctx context.Context, path string, ranges []Range) (Stats, error) {
	return l.load(ctx, []File{{Path: path, Ranges: ranges}}, nil, false, nil)
}

// LoadFiles reads the ranges of several files into their destinations,
// the files in parallel, and returns when every byte is in device memory.
// Only regular files are opened (anything else, a FIFO or a device, is an
// error matching fs.ErrInvalid, and opening never blocks).
//
// Goroutines (WithParallelism) read in parallel into free stages, taking
// the reads in the order of the files and of the ranges' offsets in each
// (all the readers on the first ranges first, a file's end followed by the
// next file's start), so that ranges land in about that order; the first
// range is read alone, shared among the readers, so that it lands soonest.
// Each stage is drained by an asynchronous copy on one of the Loader's
// streams and is refilled only once that copy has finished, so the pinned
// memory in use never exceeds the stages' (the depth times the stage
// size): reading waits for copying. A read that takes a stage no read
// took before pins it (the load's Wall includes that); later reads and
// loads reuse it. Neighbouring ranges share reads. How each file is read
// is decided for that file, from the Loader's mode and, for ModeAuto, the
// page-cache residency of its ranges: a warm shard is read buffered while
// a cold one beside it is read directly.
//
// ready, when not nil, is called with a file's and a range's index as soon
// as that range is entirely in device memory, in the order ranges land
// (once for each range that has a byte);
// its calls and the WithProgress calls never overlap. Both run on a loader
// goroutine and must return quickly. A panic in either stops the load:
// the copies in flight are left to finish in the background, and the
// panic is raised again by LoadFiles on the caller's goroutine. Neither
// is called after LoadFiles returns; a call that blocks does not hold
// LoadFiles past ctx's end (it returns ctx's error while that call runs
// on, and no other starts).
//
// Errors: an invalid range is a *RangeError (ErrRange) and a range past
// the end of its file a *ShortFileError (ErrShortFile), both before
// anything is read; a stage that cannot be pinned is pinmem's error (a
// *pinmem.BudgetError over the budget), which stops the load as a failed
// read does, the stages already pinned kept for later loads; a file that
// ends early while it is read is a *ShortFileError too, and one whose size
// or modification time changed by the end of the load an error matching
// ErrChanged; a closed Loader gives ErrClosed. When ctx ends, or a read or
// copy fails, no new read starts. Every wait is bounded by ctx: LoadFiles
// returns ctx's error once ctx ends even if the device never finishes the
// copies already queued. The destinations then hold a part of the data and
// may still be written by those copies: they have all finished once Wait
// or Close has returned nil, or a later load on the Loader has begun
// reading (a load begins only when no copy of an earlier one runs); free
// the destinations after that. A LoadFiles that waits for another load, or for
// those copies, returns ctx's error, having read nothing, if ctx ends
// first.
func (l *Loader) LoadFiles(ctx context.Context, files []File, ready func(file, rng int)) (Stats, error) {
	return l.load(ctx, files, nil, false, ready)
}
