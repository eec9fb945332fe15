package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/regfile"
)

// openFile is one file of a load, opened.
type openFile struct {
	path   string
	f      *os.File
	fi     os.FileInfo
	direct *os.File // nil unless read with O_DIRECT
	ranges []Range
	base   int   // index of ranges[0] among all the load's ranges
	bytes  int64 // what the load reads of it: its ranges' extents

	mode     Mode                   // how it is read, as chosen and prepared
	fallback atomic.Pointer[string] // why it is read buffered instead, once it is
}

// run is the state of one load.
type run struct {
	l     *Loader
	files []*openFile
	reads []read
	total int64
	where [][2]int // for each range of the load, its file's and its own index
	ready func(file, rng int)

	ctx    context.Context
	cancel context.CancelFunc
	next   atomic.Int64 // index of the next read to issue

	readBytes atomic.Int64
	// inFlight counts the readers still running and the stages whose
	// copies were queued and not yet retired: the load's one bounded wait
	// (waitInFlight) is for all of them.
	inFlight sync.WaitGroup

	// cb holds a token while the pieces that landed are counted and the
	// callbacks run (landed): their calls never overlap and progress never
	// goes back. It is not mu, so that a callback that blocks holds up
	// neither the load's end nor a failing reader.
	cb chan struct{}

	fmu     sync.Mutex
	flights []*flight // queued and not yet counted as landed, in the order queued (guarded by fmu)
	// stopped: the load has returned, and poll queries no event (guarded
	// by fmu). A reader may outlive its load (its ctx ended while the
	// reader ran a ready callback), and the stages it did not take may by
	// then be a later load's, or released by Close.
	stopped bool

	mu       sync.Mutex // guards the fields below
	err      error
	done     int64
	left     []int64 // bytes of each range not yet on the device
	ended    bool    // load returned: no more callbacks
	panicked bool
	panicVal any
}

// load is LoadFiles, or LoadFile when whole is set: then the one range is
// the whole of the one file, into wholeDst.
func (l *Loader) load(ctx context.Context, files []File, wholeDst *cuda.DeviceBuffer, whole bool, ready func(int, int)) (st Stats, err error) {
	start := time.Now()
	st.Resident = -1
	switch {
	case l == nil || l.turn == nil:
		return st, fmt.Errorf("load: Load on a nil Loader or one not made by New: %w", cuda.ErrInvalidValue)
	case ctx == nil:
		return st, fmt.Errorf("load: nil context.Context: %w", cuda.ErrInvalidValue)
	}
	if err := l.take(ctx); err != nil {
		return st, fmt.Errorf("load: waiting for another load on the Loader to end: %w", err)
	}
	defer func() { <-l.turn }()
	if l.closed {
		return st, ErrClosed
	}
	if busy, err := l.idle(ctx); err != nil {
		return st, fmt.Errorf("load: waiting for %d stages still copying for an earlier load: %w", busy, err)
	}
	if err := ctx.Err(); err != nil {
		return st, fmt.Errorf("load: canceled before it began: %w", err)
	}
	r := &run{l: l, ready: ready, cb: make(chan struct{}, 1)}
	defer r.closeFiles()
	if err := r.open(ctx, files, wholeDst, whole); err != nil {
		return st, err
	}
	if r.total == 0 {
		st.Mode = ModeBuffered
		st.Wall = time.Since(start)
		l.report(0, 0)
		return st, nil
	}
	st.Resident = r.decide()
	r.plan()
	st.Reads = len(r.reads)

	r.ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	l.report(0, r.total)
	r.copyAll(ctx)
	r.end(ctx) // after it, no callback starts
	r.mu.Lock()
	st.Bytes, err = r.done, r.err
	panicked, val := r.panicked, r.panicVal
	r.mu.Unlock()
	st.ReadBytes = r.readBytes.Load()
	st.Mode, st.Fallback = r.modes()
	st.Wall = time.Since(start)
	if panicked {
		panic(val)
	}
	if err == nil && st.Bytes < r.total {
		if err = ctx.Err(); err == nil {
			err = fmt.Errorf("load: %d of %d bytes delivered", st.Bytes, r.total)
		}
	}
	return st, err
}

// idle waits until every stage is back in the free channel, that is until
// no copy that an earlier load queued can still run, or until ctx ends. It
// takes the stages already back without waiting, so that a load finding
// them all free never reports a wait; on ctx's end it returns how many
// stages were still out. It puts the pinned stages back first, so that
// the next load's reads take a stage to pin (pin) only once they have
// taken every pinned one: loads of a few reads reuse the same stages.
func (l *Loader) idle(ctx context.Context) (busy int, err error) {
	back := make([]*stage, 0, len(l.stages))
	defer func() {
		for _, pinned := range []bool{true, false} {
			for _, s := range back {
				if (s.mem != nil) == pinned {
					l.free <- s
				}
			}
		}
	}()
	for len(back) < len(l.stages) {
		select {
		case s := <-l.free:
			back = append(back, s)
			continue
		default:
		}
		select {
		case s := <-l.free:
			back = append(back, s)
		case <-ctx.Done():
			return len(l.stages) - len(back), ctx.Err()
		}
	}
	return 0, nil
}

// open checks the ranges and opens the files, before anything is read.
func (r *run) open(ctx context.Context, files []File, wholeDst *cuda.DeviceBuffer, whole bool) error {
	var all []Range
	for i, fl := range files {
		r.files = append(r.files, &openFile{path: fl.Path, ranges: fl.Ranges, base: len(all)})
		all = append(all, fl.Ranges...)
		for j := range fl.Ranges {
			r.where = append(r.where, [2]int{i, j})
		}
	}
	if !whole {
		if err := r.checkRanges(all); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, of := range r.files {
		var err error
		if of.f, of.fi, err = regfile.Open(of.path); err != nil {
			return fmt.Errorf("load: %w", err)
		}
		if whole {
			of.ranges = []Range{{Offset: 0, Length: of.fi.Size(), Dst: wholeDst}}
			r.where = [][2]int{{0, 0}}
			if err := r.checkRanges(of.ranges); err != nil {
				return err
			}
		}
		for _, rg := range of.ranges {
			if rg.Length > 0 && rg.Offset+rg.Length > of.fi.Size() {
				return &ShortFileError{Path: of.path, Need: rg.Offset + rg.Length, Size: of.fi.Size()}
			}
			r.left = append(r.left, rg.Length)
			r.total += rg.Length
		}
	}
	return nil
}

// plan splits every file's ranges into reads and orders them as the files
// and the ranges in them are: every read of the first file, then of the
// second, and so on. Readers take the reads in this order, so that all of
// them work on the first ranges first and ranges land in about the order
// of the files (a checkpoint's tensors in shard order), the load's first
// range soonest, rather than every file advancing at once and each
// range landing after the ranges of all the files up to its offset. The
// first range's reads hold nothing else and are split among the readers
// (headSize), so that it lands once its own bytes are read, not after a
// stage of the next range. The readers, the bytes and the reads are those
// of every file read in stages: a load still reads its files in
// parallel, across a file's end into the next.
func (r *run) plan() {
	for i, of := range r.files {
		align := int64(1)
		if of.direct != nil {
			align = Align
		}
		split := 0 // the load's first range is read alone, split among the readers
		if len(r.reads) == 0 {
			split = r.l.cfg.parallel
		}
		rs := plan(of.ranges, r.l.cfg.stageSize, align, split)
		for k := range rs {
			rs[k].file = i
			for p := range rs[k].pieces {
				rs[k].pieces[p].rng += of.base
			}
		}
		r.reads = append(r.reads, rs...)
	}
}

// copyAll runs the readers and waits, bounded by ctx, until they have
// stopped and every copy they queued has finished; then it checks the
// streams for faults of the copies and the files for changes. A reader
// still running when ctx ends (in a ready callback that blocks, say)
// stops at its next step: it reads nothing more into a stage, and a stage
// it holds goes back to the Loader only once its copies ran.
func (r *run) copyAll(ctx context.Context) {
	for range min(r.l.cfg.parallel, len(r.reads)) {
		r.inFlight.Add(1)
		go func() {
			defer r.inFlight.Done()
			r.reader()
		}()
	}
	if err := r.waitInFlight(ctx); err != nil {
		r.fail(err)
		return
	}
	// Asynchronous faults of the copies are reported by the streams, not
	// by the events. Every copy on them has finished by now (those of
	// earlier loads before this one began).
	for _, s := range r.l.streams {
		if r.failed() != nil {
			return
		}
		if err := s.Synchronize(ctx); err != nil {
			r.fail(fmt.Errorf("load: a copy to the device failed: %w", err))
		}
	}
	if r.failed() == nil {
		r.checkUnchanged()
	}
}

// checkRanges checks rs (every range of the load, or the one whole-file
// range) and names the file and range index of a bad one.
func (r *run) checkRanges(rs []Range) error {
	_, _, err := checkRanges(rs, r.l.cctx.Handle())
	if re, ok := errors.AsType[*RangeError](err); ok && re.Index < len(r.where) {
		w := r.where[re.Index]
		re.Index = w[1]
		if len(r.files) > 1 {
			re.Reason += fmt.Sprintf(" (file %d, %s)", w[0], r.files[w[0]].path)
		}
	}
	return err
}

// choose is the one decision of how a load reads its files: the mode the
// Loader was given, or for ModeAuto buffered reads when at least the warm
// threshold of the sampled pages is in the page cache (or nothing could
// be sampled), direct reads otherwise. ModeMapped is prepared as a
// buffered read (mappedRetired).
func choose(m Mode, resident float64, sampled bool, warm float64) Mode {
	switch {
	case m != ModeAuto:
		return m
	case !sampled || resident >= warm:
		return ModeBuffered
	}
	return ModeDirect
}

// decide chooses how each file is read (choose, from the page-cache
// residency of its ranges when the Loader's mode is ModeAuto) and opens
// what that needs. It returns the share of sampled pages that were
// resident over all files, weighted by the bytes read from each, or -1
// when none was sampled.
func (r *run) decide() float64 {
	var sum, n float64
	for _, of := range r.files {
		ext := extents(of.ranges)
		for _, e := range ext {
			of.bytes += e.hi - e.lo
		}
		frac, ok := 0.0, false
		if r.l.cfg.mode == ModeAuto {
			if frac, ok = residency(of.f, ext); ok {
				sum += frac * float64(of.bytes)
				n += float64(of.bytes)
			}
		}
		of.mode = choose(r.l.cfg.mode, frac, ok, r.l.cfg.warm)
		if why := r.prepare(of); why != "" {
			of.mode = ModeBuffered
			of.fallback.Store(&why)
		}
	}
	if n == 0 {
		return -1
	}
	return sum / n
}

// mappedRetired is why a load asked for ModeMapped reads buffered: on an
// H100 host (PCIe Gen5 x16, 16 cores, a warm 4 GiB checkpoint), copies out
// of read-only registered windows of the page cache ran at 10-20 GB/s at
// every stage size and parallelism tried, against 33-48 GB/s for buffered
// reads into pinned stages: registering page-cache pages costs more than
// the CPU copy it saves.
const mappedRetired = "ModeMapped reads buffered: registering the page cache was slower than copying it (10-20 GB/s against 33-48 on an H100 host)"

// prepare opens what of.mode needs (a direct file) and returns why it
// could not, or "".
func (r *run) prepare(of *openFile) string {
	switch of.mode {
	case ModeDirect:
		d, err := openDirectFile(of.f)
		if err != nil {
			return "O_DIRECT refused: " + err.Error()
		}
		// The file is opened a second time: it must be the same file,
		// whose data is read into ranges checked against of.f.
		if dfi, err := d.Stat(); err != nil || !os.SameFile(of.fi, dfi) {
			d.Close()
			return "the direct open found another file than the one opened first"
		}
		of.direct = d
	case ModeMapped:
		return mappedRetired
	}
	return ""
}

// modes returns the mode that read the most bytes (a file that fell back
// counts as buffered) and the first reason a file fell back, naming the
// file when the load had several.
func (r *run) modes() (Mode, string) {
	var by [ModeMapped + 1]int64
	why := ""
	for _, of := range r.files {
		m := of.mode
		if fb := of.fallback.Load(); fb != nil {
			m = ModeBuffered
			if why == "" {
				why = *fb
				if len(r.files) > 1 {
					why = of.path + ": " + why
				}
			}
		}
		by[m] += of.bytes
	}
	best := ModeBuffered
	for m, b := range by {
		if b > by[best] {
			best = Mode(m)
		}
	}
	return best, why
}

// closeFiles closes the load's files. It writes no field of them: a
// reader may outlive a load whose ctx ended (in a ready callback that
// blocks, say), and its next read of a closed file fails.
func (r *run) closeFiles() {
	for _, of := range r.files {
		if of.direct != nil {
			of.direct.Close()
		}
		if of.f != nil {
			of.f.Close()
		}
	}
}

// checkUnchanged fails the load when a file's size or modification time
// differs from what it was when it was opened: the data loaded may mix
// two versions.
func (r *run) checkUnchanged() {
	for _, of := range r.files {
		fi, err := of.f.Stat()
		if err != nil {
			r.fail(fmt.Errorf("load: %w", err))
			return
		}
		if fi.Size() != of.fi.Size() || !fi.ModTime().Equal(of.fi.ModTime()) {
			r.fail(fmt.Errorf("load: %s: size %d -> %d, modified %v -> %v: %w", of.path,
				of.fi.Size(), fi.Size(), of.fi.ModTime(), fi.ModTime(), ErrChanged))
			return
		}
	}
}

// waitInFlight waits until every reader of this load has stopped and
// every stage it queued copies from has been retired, or until ctx ends.
func (r *run) waitInFlight(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		r.inFlight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// report calls the progress function, if any.
func (l *Loader) report(done, total int64) {
	if l.cfg.progress != nil {
		l.cfg.progress(done, total)
	}
}

// openDirectFile opens the file f is open on again for direct reads; tests
// replace it to simulate a file system that refuses O_DIRECT.
var openDirectFile = openDirect

// directReadAt reads from a file opened for direct reads; tests replace it
// to simulate kernels that refuse some direct reads.
var directReadAt = (*os.File).ReadAt

// fail records the first error and stops the readers.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.cancel()
}

// failed returns the load's first error so far.
func (r *run) failed() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// end marks the load as returned, so that pieces landing later call no
// callback, and waits, bounded by ctx, for a callback in progress to
// return: then none runs after the load returns, unless ctx ended while
// one was blocked.
func (r *run) end(ctx context.Context) {
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
	r.fmu.Lock() // waits for a poll's queries, never for a callback
	r.stopped = true
	r.fmu.Unlock()
	select {
	case r.cb <- struct{}{}:
		<-r.cb
	case <-ctx.Done():
	}
}

// flight is a stage whose copies were queued: its pieces are counted as
// landed once (by retire, or earlier by a reader's poll), and the stage
// goes back to the Loader when retire's wait has returned.
type flight struct {
	s      *stage
	pieces []piece
	wait   func() error
	query  bool        // the event was recorded behind the copies: poll may query it
	landed atomic.Bool // its pieces were counted
}

// reader issues reads until none is left or the load stops: take a stage
// whose copies have finished, fill it, queue its copies and hand it to
// retire, which gives it back once they ran. Between two reads it polls
// the stages in flight.
func (r *run) reader() {
	for r.ctx.Err() == nil {
		r.poll()
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
		if r.ctx.Err() != nil {
			// The select may take a stage after the load returned (r.ctx
			// is canceled before the Loader's turn is given back): by then
			// it is a later load's, or released by Close.
			r.l.free <- s
			return
		}
		f, err := r.fill(s, &r.reads[i])
		if f != nil {
			r.inFlight.Add(1)
			r.fmu.Lock()
			r.flights = append(r.flights, f)
			r.fmu.Unlock()
			go r.retire(f)
		} else {
			r.l.free <- s
		}
		if err != nil {
			r.fail(err)
			return
		}
	}
}

// poll counts as landed the stages in flight whose events have completed,
// without waiting: the retire goroutines, which wait for them, may get no
// thread to run on while every reader is busy reading (readers go from one
// system call to the next without blocking), and then a range would be
// announced only once the readers run out of stages. Each stream's
// copies run in order, so the scan stops querying a stream at its first
// stage still copying. While another goroutine holds the callback token
// it polls nothing and leaves the stages to their retire goroutines.
func (r *run) poll() {
	select {
	case r.cb <- struct{}{}:
		defer func() { <-r.cb }()
	default:
		return
	}
	var ps []piece
	var busy []*cuda.Stream
	r.fmu.Lock()
	if r.stopped {
		r.fmu.Unlock()
		return
	}
	keep := r.flights[:0]
	for _, f := range r.flights {
		if f.landed.Load() {
			continue
		}
		if f.query && !slices.Contains(busy, f.s.stream) {
			// The event's latest record is f's, or a later one's once
			// retire has given the stage back, which it does only after
			// f's copies ran: complete means f's copies ran.
			done, err := f.s.ev.Query()
			if err != nil || done {
				// A fault the query reports is reported once: the load
				// fails here, as retire's wait would have failed it.
				if f.landed.CompareAndSwap(false, true) {
					if err != nil {
						r.fail(fmt.Errorf("load: waiting for a copy to the device: %w", err))
					} else {
						ps = append(ps, f.pieces...)
					}
				}
				continue
			}
			busy = append(busy, f.s.stream)
		}
		keep = append(keep, f)
	}
	clear(r.flights[len(keep):])
	r.flights = keep
	r.fmu.Unlock()
	if len(ps) > 0 {
		r.landed(ps)
	}
}

// retire waits until the copies out of f's stage have run, gives the stage
// back to the Loader and counts the pieces as delivered unless poll did.
// It is the one place where a load's copies are waited for without a
// bound: it runs on its own goroutine, and a load that stops waiting
// leaves it to finish here.
func (r *run) retire(f *flight) {
	defer r.inFlight.Done()
	err := f.wait()
	if err != nil {
		// Not landed: once the stage is refilled, poll would query the
		// next copies' event.
		f.landed.Store(true)
		r.fail(fmt.Errorf("load: waiting for a copy to the device: %w", err))
	}
	r.l.free <- f.s
	if err != nil {
		return
	}
	r.cb <- struct{}{}
	defer func() { <-r.cb }()
	if f.landed.CompareAndSwap(false, true) {
		r.landed(f.pieces)
	}
}

// landed counts the pieces as on the device and makes the callbacks; its
// caller holds the callback token (cb), and mu is not held while a
// callback runs. A panic in one is recovered here, on a loader goroutine,
// stops the load and is raised again by the load on its caller's
// goroutine (unless the load has returned by then).
func (r *run) landed(ps []piece) {
	var whole [][2]int // the ranges now entirely on the device
	r.mu.Lock()
	for _, p := range ps {
		r.done += int64(p.n)
		r.left[p.rng] -= int64(p.n)
		if r.left[p.rng] == 0 && r.ready != nil {
			whole = append(whole, r.where[p.rng])
		}
	}
	done, quiet := r.done, r.ended || r.panicked
	r.mu.Unlock()
	if quiet {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			r.mu.Lock()
			r.panicked, r.panicVal = true, v
			if r.err == nil {
				r.err = fmt.Errorf("load: a callback panicked: %v", v)
			}
			r.mu.Unlock()
			r.cancel()
		}
	}()
	r.l.report(done, r.total)
	for _, w := range whole {
		r.ready(w[0], w[1])
	}
}

// fill reads rd into s and queues its copies. It returns the flight of
// the pieces it queued, nil when none was; nothing is queued from a stage
// whose read failed.
func (r *run) fill(s *stage, rd *read) (*flight, error) {
	src, err := r.source(s, rd)
	if err == nil {
		err = r.ctx.Err()
	}
	k := 0
	for ; err == nil && k < len(rd.pieces); k++ {
		p := rd.pieces[k]
		if cerr := s.stream.CopyHtoD(cuda.WrapDevicePtr(s.stream.Context(), p.dst, p.n), 0, src[p.stageOff:p.stageOff+p.n]); cerr != nil {
			err = fmt.Errorf("load: copy of %d bytes to the device: %w", p.n, cerr)
			break
		}
	}
	if k == 0 {
		return nil, err
	}
	f := &flight{s: s, pieces: rd.pieces[:k]}
	if rerr := s.ev.Record(s.stream); rerr != nil {
		f.wait = func() error { return s.stream.Synchronize(context.Background()) }
		return f, errors.Join(err, fmt.Errorf("load: recording an event: %w", rerr))
	}
	f.wait, f.query = func() error { return s.ev.Synchronize(context.Background()) }, true
	return f, err
}

// source returns the bytes of rd: s's stage, pinned first if no read
// pinned it before (pin), filled by a read.
func (r *run) source(s *stage, rd *read) ([]byte, error) {
	of := r.files[rd.file]
	if err := r.l.pin(r.ctx, s); err != nil {
		return nil, err
	}
	buf := s.mem[:rd.length]
	n, err := r.pread(of, buf, rd.off)
	r.readBytes.Add(int64(n))
	if err != nil {
		return nil, err
	}
	if n < rd.need {
		return nil, &ShortFileError{Path: of.path, Need: rd.off + int64(rd.need), Size: rd.off + int64(n)}
	}
	return buf, nil
}

// pread fills buf from offset off of of and returns how many bytes it
// read: all of buf, or fewer at the end of the file. Direct reads that the
// file system refuses switch this read and every later one to buffered
// reads.
//
// A direct read stops at the last multiple of Align in the file, and the
// rest of buf, the file's last partial block, is read buffered: asked for
// an aligned length past an unaligned end of file, os.File.ReadAt follows
// the short read with a read at the unaligned end, which kernels whose
// direct I/O checks alignment before the file's size (ext4 before Linux
// 5.5) refuse with EINVAL.
func (r *run) pread(of *openFile, buf []byte, off int64) (int, error) {
	if of.direct != nil && of.fallback.Load() == nil && hostptr.AddrOf(buf)%Align != 0 {
		why := "the pinned stages are not aligned for direct I/O"
		of.fallback.CompareAndSwap(nil, &why)
	}
	if of.direct != nil && of.fallback.Load() == nil {
		dn := len(buf)
		if end := of.fi.Size() / Align * Align; off+int64(dn) > end {
			dn = int(max(0, end-off))
		}
		n, err := readFull(of.direct, buf[:dn], off, Align)
		if err == nil && n == dn && dn < len(buf) {
			m, err := readFull(of.f, buf[dn:], off+int64(dn), 1)
			return n + m, wrapRead(of, err, len(buf), off)
		}
		if err == nil || !isDirectRefusal(err) {
			return n, wrapRead(of, err, len(buf), off)
		}
		why := "direct read refused: " + err.Error()
		of.fallback.CompareAndSwap(nil, &why)
	}
	n, err := readFull(of.f, buf, off, 1)
	return n, wrapRead(of, err, len(buf), off)
}

func wrapRead(of *openFile, err error, n int, off int64) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("load: reading %d bytes at offset %d of %s: %w", n, off, of.path, err)
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
