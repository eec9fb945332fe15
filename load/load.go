package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// stage is one pinned buffer with the stream its copies run on and the
// event recorded after them.
type stage struct {
	buf     *pinmem.Buffer
	mem     []byte
	stream  *cuda.Stream
	ev      *cuda.Event
	pending int64 // bytes whose copies were queued and not yet waited for
}

// Loader reads files into device memory through pinned stages. Create one
// with New and Close it when done: it holds its stages' pinned memory,
// streams and events from New to Close. Its methods are safe for
// concurrent use; loads run one at a time, each using every stage, and a
// Load waiting for its turn gives up when its context ends.
type Loader struct {
	ctx     *cuda.Context
	cfg     config
	streams []*cuda.Stream
	free    chan *stage // stages not being filled; their last copies may still run
	stages  []*stage
	aligned bool // every stage's address is a multiple of Align (direct I/O possible)

	// turn holds a token while a load or Close runs: one at a time. It is a
	// channel rather than a mutex so that a Load can stop waiting for its
	// turn when its context ends.
	turn   chan struct{}
	closed bool // guarded by turn
}

// Stats describes one load.
type Stats struct {
	// Bytes is what was delivered to device memory: the sum of the ranges'
	// lengths on success.
	Bytes int64
	// ReadBytes is what was read from the file: Bytes plus alignment and
	// the holes between ranges that a read spanned.
	ReadBytes int64
	// Reads is the number of read requests.
	Reads int
	// Wall is the time from the start of the load to the last byte on the
	// device (opening the file and sampling the page cache included).
	Wall time.Duration
	// Mode is how the file was read: ModeDirect or ModeBuffered (never
	// ModeAuto). After a fallback it is ModeBuffered.
	Mode Mode
	// Resident is the share of sampled pages that were in the page cache
	// when the load started, or -1 when it was not sampled (the mode was
	// chosen by option) or could not be.
	Resident float64
	// Fallback says why direct I/O was asked for (or chosen) but the load
	// read buffered; empty when it did not fall back.
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
// (an *OptionError for the first it refuses, matching
// cuda.ErrInvalidValue; a nil option too), then pins the stages with
// pinmem.Alloc on ctx's device (a request over pinmem's budget is a
// *pinmem.BudgetError) and creates the streams and events. On any error
// whatever it had created is released again.
func New(ctx *cuda.Context, opts ...Option) (_ *Loader, err error) {
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, fmt.Errorf("load: nil context: %w", cuda.ErrInvalidValue)
	}
	l := &Loader{ctx: ctx, cfg: cfg, free: make(chan *stage, cfg.stages), aligned: true, turn: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.release())
		}
	}()
	for range cfg.streams {
		s, err := ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return nil, fmt.Errorf("load: creating a stream: %w", err)
		}
		l.streams = append(l.streams, s)
	}
	for i := range cfg.stages {
		st := &stage{stream: l.streams[i%len(l.streams)]}
		if st.ev, err = ctx.NewEvent(cuda.EventDisableTiming | cuda.EventBlockingSync); err != nil {
			return nil, fmt.Errorf("load: creating an event: %w", err)
		}
		l.stages = append(l.stages, st)
		if st.buf, err = pinmem.Alloc(cfg.stageSize, 0, pinmem.WithDevice(ctx.Device())); err != nil {
			return nil, fmt.Errorf("load: pinning stage %d of %d (%d bytes each): %w", i+1, cfg.stages, cfg.stageSize, err)
		}
		st.mem = st.buf.Bytes()
		if hostptr.AddrOf(st.mem)%Align != 0 {
			l.aligned = false
		}
		l.free <- st
	}
	return l, nil
}

// Context returns the context whose device memory the Loader fills.
func (l *Loader) Context() *cuda.Context {
	if l == nil {
		return nil
	}
	return l.ctx
}

// CheckOptions returns the *OptionError New would return for opts, or nil,
// without creating anything: a command line can check its flags before it
// opens a GPU.
func CheckOptions(opts ...Option) error {
	_, err := buildConfig(opts)
	return err
}

// buildConfig applies opts to the defaults and checks the result.
func buildConfig(opts []Option) (config, error) {
	cfg := defaults()
	for i, o := range opts {
		if o == nil {
			return cfg, &OptionError{Option: fmt.Sprintf("option %d", i), Value: "nil", Reason: "the option is nil"}
		}
		o(&cfg)
	}
	return cfg, cfg.check()
}

// PinnedBytes returns the bytes of pinned memory the Loader's stages hold.
func (l *Loader) PinnedBytes() int64 {
	if l == nil {
		return 0
	}
	return int64(l.cfg.stages) * int64(l.cfg.stageSize)
}

// Close waits for the copies still queued, then releases the stages,
// events and streams. A second Close returns an error matching ErrClosed.
// It waits for a load in progress to end first.
func (l *Loader) Close() error {
	if l == nil {
		return fmt.Errorf("load: Close of a nil Loader: %w", cuda.ErrInvalidValue)
	}
	if l.turn == nil {
		return fmt.Errorf("load: Close of a Loader not made by New: %w", cuda.ErrInvalidValue)
	}
	l.turn <- struct{}{}
	defer func() { <-l.turn }()
	if l.closed {
		return ErrClosed
	}
	l.closed = true
	return l.release()
}

// release synchronizes and frees everything New created. A stage whose
// last copy failed to finish is still freed: the error is reported, and
// the stream's work has ended either way once Synchronize returned.
func (l *Loader) release() error {
	var errs []error
	for _, s := range l.streams {
		if err := s.Synchronize(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, st := range l.stages {
		if st.buf != nil {
			if err := st.buf.Free(); err != nil {
				errs = append(errs, err)
			}
		}
		if st.ev != nil {
			if err := st.ev.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, s := range l.streams {
		if err := s.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	l.stages, l.streams = nil, nil
	return errors.Join(errs...)
}

// LoadFile reads the whole file at path into the start of dst, which must
// hold at least the file's size. A file larger than dst is an error
// matching ErrRange before anything is read.
func (l *Loader) LoadFile(ctx context.Context, path string, dst *cuda.DeviceBuffer) (Stats, error) {
	// The file's size is taken from the file the load opens, not from a
	// stat of the path before: by the open the path may name another
	// file, of which a stat-sized prefix would be loaded as if whole.
	return l.load(ctx, path, nil, dst, true)
}

// Load reads the ranges of the file at path into their destinations and
// returns when every byte is in device memory (the copies have finished).
//
// Readers pread in parallel into free stages, in file order; each stage is
// drained by an asynchronous copy on one of the Loader's streams, and a
// stage is refilled only after the event recorded behind its copies has
// completed. Neighbouring ranges share reads.
//
// Errors: an invalid range is a *RangeError (ErrRange) and a range past
// the end of the file a *ShortFileError (ErrShortFile), both before
// anything is read; a file that ends early while it is read is a
// *ShortFileError too; a closed Loader gives ErrClosed. When ctx is
// canceled, or a read or copy fails, no new read starts, and Load returns
// once the copies already queued (at most the stages' memory) have
// finished, so that no stage is reused or freed under a running copy: the
// wait after cancellation is bounded by draining at most PinnedBytes
// bytes. The returned error is then ctx's error or the first failure, and
// the destinations hold a part of the data. A Load that waits for another
// load on the Loader to end returns ctx's error, having read nothing, if
// ctx ends first.
func (l *Loader) Load(ctx context.Context, path string, ranges []Range) (Stats, error) {
	return l.load(ctx, path, ranges, nil, false)
}

// load is Load, or LoadFile when whole is set: then the one range is the
// whole file that load opens, into wholeDst.
func (l *Loader) load(ctx context.Context, path string, ranges []Range, wholeDst *cuda.DeviceBuffer, whole bool) (st Stats, err error) {
	start := time.Now()
	st.Resident = -1
	if l == nil {
		return st, fmt.Errorf("load: Load on a nil Loader: %w", cuda.ErrInvalidValue)
	}
	if ctx == nil {
		return st, fmt.Errorf("load: nil context.Context: %w", cuda.ErrInvalidValue)
	}
	if l.turn == nil {
		return st, fmt.Errorf("load: Load on a Loader not made by New: %w", cuda.ErrInvalidValue)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return st, ctx.Err()
	}
	defer func() { <-l.turn }()
	if l.closed {
		return st, ErrClosed
	}
	var total, end int64
	if !whole {
		if total, end, err = checkRanges(ranges, l.ctx.Handle()); err != nil {
			return st, err
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	f, err := os.Open(path)
	if err != nil {
		return st, fmt.Errorf("load: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, fmt.Errorf("load: %w", err)
	}
	if whole {
		ranges = []Range{{Offset: 0, Length: fi.Size(), Dst: wholeDst}}
		if total, end, err = checkRanges(ranges, l.ctx.Handle()); err != nil {
			return st, err
		}
	}
	if end > fi.Size() {
		return st, &ShortFileError{Path: path, Need: end, Size: fi.Size()}
	}
	if total == 0 {
		st.Mode = ModeBuffered
		st.Wall = time.Since(start)
		l.report(0, 0)
		return st, nil
	}

	st.Mode = l.cfg.mode
	if st.Mode == ModeAuto {
		st.Mode = ModeBuffered
		if frac, ok := residency(f, extents(ranges)); ok {
			st.Resident = frac
			if frac < l.cfg.warm {
				st.Mode = ModeDirect
			}
		}
	}
	var direct *os.File
	if st.Mode == ModeDirect {
		switch {
		case !l.aligned:
			st.Fallback = "the pinned stages are not aligned for direct I/O"
		default:
			if direct, err = openDirectFile(path); err != nil {
				st.Fallback = "O_DIRECT refused: " + err.Error()
				direct = nil
				break
			}
			defer direct.Close()
			// The path is opened a second time: by now it may name another
			// file (replaced, or a symbolic link changed), whose data must
			// not be read into ranges checked against f.
			if dfi, err := direct.Stat(); err != nil || !os.SameFile(fi, dfi) {
				st.Fallback = "the path names another file than the one opened first"
				direct = nil
			}
		}
		if direct == nil {
			st.Mode = ModeBuffered
		}
	}
	align := int64(1)
	if direct != nil {
		align = Align
	}
	reads := plan(ranges, l.cfg.stageSize, align)
	st.Reads = len(reads)

	r := &run{l: l, path: path, buffered: f, direct: direct, size: fi.Size(), reads: reads, total: total}
	r.ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	l.report(0, total)
	var wg sync.WaitGroup
	for range min(l.cfg.readers, len(reads)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.reader()
		}()
	}
	wg.Wait()
	// Every stage is back in the free channel: wait for their last copies.
	for _, s := range l.stages {
		if err := r.drain(s); err != nil {
			r.fail(err)
		}
	}
	// Asynchronous faults of the copies are reported by the streams, not
	// by the events.
	for _, s := range l.streams {
		if err := s.Synchronize(context.Background()); err != nil {
			r.fail(fmt.Errorf("load: a copy to the device failed: %w", err))
		}
	}
	st.Bytes = r.done
	st.ReadBytes = r.readBytes.Load()
	if fb := r.fallback.Load(); fb != nil {
		st.Mode, st.Fallback = ModeBuffered, *fb
	}
	st.Wall = time.Since(start)
	if r.err != nil {
		return st, r.err
	}
	if st.Bytes < total { // the readers stopped early: ctx was canceled
		if err := ctx.Err(); err != nil {
			return st, err
		}
		return st, fmt.Errorf("load: %d of %d bytes delivered", st.Bytes, total)
	}
	return st, nil
}

// report calls the progress function, if any.
func (l *Loader) report(done, total int64) {
	if l.cfg.progress != nil {
		l.cfg.progress(done, total)
	}
}

// openDirectFile opens a file for direct reads; tests replace it to
// simulate a file system that refuses O_DIRECT.
var openDirectFile = openDirect

// directReadAt reads from a file opened for direct reads; tests replace it
// to simulate kernels that refuse some direct reads.
var directReadAt = (*os.File).ReadAt

// run is the state of one load.
type run struct {
	l        *Loader
	path     string
	buffered *os.File
	direct   *os.File // nil for buffered loads
	size     int64    // the file's size when it was opened
	reads    []read
	total    int64

	ctx    context.Context
	cancel context.CancelFunc
	next   atomic.Int64 // index of the next read to issue

	readBytes atomic.Int64
	fallback  atomic.Pointer[string] // why direct reads stopped, once they did

	mu   sync.Mutex // guards err, done and the progress calls
	err  error
	done int64
}

// fail records the first error and stops the other readers.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.cancel()
}

// drain waits for the copies queued from s and counts their bytes as
// delivered.
func (r *run) drain(s *stage) error {
	if s.pending == 0 {
		return nil
	}
	n := s.pending
	s.pending = 0
	if err := s.ev.Synchronize(context.Background()); err != nil {
		return fmt.Errorf("load: waiting for a copy to the device: %w", err)
	}
	r.mu.Lock()
	r.done += n
	done := r.done
	r.l.report(done, r.total)
	r.mu.Unlock()
	return nil
}

// reader issues reads until none is left or the load stops: take a free
// stage, wait for its last copies, fill it, queue its copies.
func (r *run) reader() {
	for {
		if r.ctx.Err() != nil {
			return
		}
		i := r.next.Add(1) - 1
		if i >= int64(len(r.reads)) {
			return
		}
		var s *stage
		select {
		case s = <-r.l.free:
		case <-r.ctx.Done():
			return
		}
		err := r.drain(s)
		if err == nil {
			err = r.fill(s, &r.reads[i])
		}
		r.l.free <- s
		if err != nil {
			r.fail(err)
			return
		}
	}
}

// fill reads rd into s and queues its copies. Nothing stays queued from a
// stage whose read failed.
func (r *run) fill(s *stage, rd *read) error {
	buf := s.mem[:rd.length]
	n, err := r.pread(buf, rd.off)
	r.readBytes.Add(int64(n))
	if err != nil {
		return err
	}
	if n < rd.need {
		return &ShortFileError{Path: r.path, Need: rd.off + int64(rd.need), Size: rd.off + int64(n)}
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	var queued int64
	for _, p := range rd.pieces {
		if err := s.stream.CopyHtoD(cuda.WrapDevicePtr(s.stream.Context(), p.dst, p.n), 0, buf[p.stageOff:p.stageOff+p.n]); err != nil {
			err = fmt.Errorf("load: copy of %d bytes to the device: %w", p.n, err)
			if queued > 0 { // wait for what did get queued before the stage is reused
				if rerr := s.ev.Record(s.stream); rerr == nil {
					s.pending = queued
				} else if serr := s.stream.Synchronize(context.Background()); serr != nil {
					err = errors.Join(err, serr)
				}
			}
			return err
		}
		queued += int64(p.n)
	}
	if err := s.ev.Record(s.stream); err != nil {
		if serr := s.stream.Synchronize(context.Background()); serr != nil {
			err = errors.Join(err, serr)
		}
		return fmt.Errorf("load: recording an event: %w", err)
	}
	s.pending = queued
	return nil
}

// pread fills buf from offset off and returns how many bytes it read: all
// of buf, or fewer at the end of the file. Direct reads that the file
// system refuses switch this read and every later one to buffered reads.
//
// A direct read stops at the last multiple of Align in the file, and the
// rest of buf, the file's last partial block, is read buffered: asked for
// an aligned length past an unaligned end of file, os.File.ReadAt follows
// the short read with a read at the unaligned end, which kernels whose
// direct I/O checks alignment before the file's size (ext4 before Linux
// 5.5) refuse with EINVAL.
func (r *run) pread(buf []byte, off int64) (int, error) {
	if r.direct != nil && r.fallback.Load() == nil {
		dn := len(buf)
		if end := r.size / Align * Align; off+int64(dn) > end {
			dn = int(max(0, end-off))
		}
		n, err := readFull(r.direct, buf[:dn], off, Align)
		if err == nil && n == dn && dn < len(buf) {
			m, err := readFull(r.buffered, buf[dn:], off+int64(dn), 1)
			return n + m, r.wrap(err, len(buf), off)
		}
		if err == nil || !isDirectRefusal(err) {
			return n, r.wrap(err, len(buf), off)
		}
		why := "direct read refused: " + err.Error()
		r.fallback.CompareAndSwap(nil, &why)
	}
	n, err := readFull(r.buffered, buf, off, 1)
	return n, r.wrap(err, len(buf), off)
}

func (r *run) wrap(err error, n int, off int64) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("load: reading %d bytes at offset %d of %s: %w", n, off, r.path, err)
}

// readFull reads into buf until it is full or the file ends (os.File's
// ReadAt itself reads on after a short read). Direct reads (align > 1) go
// through directReadAt, and one that returns a count off the alignment is
// taken as the end of the file: no direct read could continue from there.
func readFull(f *os.File, buf []byte, off int64, align int) (int, error) {
	got := 0
	for got < len(buf) {
		readAt := f.ReadAt
		if align > 1 {
			readAt = func(b []byte, off int64) (int, error) { return directReadAt(f, b, off) }
		}
		n, err := readAt(buf[got:], off+int64(got))
		got += n
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		if n == 0 || (align > 1 && n%align != 0) {
			return got, nil
		}
	}
	return got, nil
}
