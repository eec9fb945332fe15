package transfer

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/pinmem/pinmem/cuda"
)

// HtoDFrom reads r into the device buffer dst (from offset 0) until r
// reports io.EOF or dst is full (then it reads no further), straight into
// the pinned stages while the copy engine drains the previous one.
// Stats.Bytes is the number of bytes read and copied. A read error other
// than io.EOF stops the transfer and is returned. dst is checked and ctx
// bounds the call as for HtoD; a read in progress is not interrupted.
//
// A reader that is also an io.ReaderAt and an io.Seeker (*os.File,
// *bytes.Reader, ...) is read from its current offset with up to
// Parallelism ReadAt calls at once per stage (of at least 1 MiB each),
// and its offset is left just past the bytes copied, as a Read loop
// would; other readers are read with io.ReadFull.
func (c *Copier) HtoDFrom(ctx context.Context, dst *cuda.DeviceBuffer, r io.Reader) (Stats, error) {
	return c.ioRing(ctx, HostToDevice, dst, r == nil, func(l *lane, st *Stats) error {
		read := func(_ int64, p []byte) (int, error) { return io.ReadFull(r, p) }
		pa, pos, isPositional := positional[io.ReaderAt](r)
		if isPositional {
			read = func(off int64, p []byte) (int, error) { return c.readAt(pa, pos+off, p) }
		}
		err := c.ringIn(ctx, l, dst, st, read)
		if isPositional {
			err = seekPast(r, "reader", pos+st.Bytes, err)
		}
		return err
	})
}

// DtoHTo writes the whole device buffer src to w through the pinned
// stages, the DMA of later stages running ahead, handing w the stages'
// own bytes (as io.Writer requires, w must not retain them). A write
// error stops the transfer; a short write is io.ErrShortWrite. src is
// checked and ctx bounds the call as for DtoH; a write in progress is not
// interrupted. A writer that is also an io.WriterAt and an io.Seeker
// (*os.File) is written as HtoDFrom reads an io.ReaderAt.
func (c *Copier) DtoHTo(ctx context.Context, w io.Writer, src *cuda.DeviceBuffer) (Stats, error) {
	return c.ioRing(ctx, DeviceToHost, src, w == nil, func(l *lane, st *Stats) error {
		wa, pos, isPositional := positional[io.WriterAt](w)
		write := func(off int64, p []byte) (int, error) {
			if isPositional {
				n, err := c.writeAt(wa, pos+off, p)
				if err == nil || n > 0 || off > 0 {
					return n, err
				}
				// Refused before anything was written (O_APPEND):
				// write as a stream.
				isPositional = false
			}
			return w.Write(p)
		}
		err := c.ringOut(ctx, l, src, st, write)
		if isPositional {
			err = seekPast(w, "writer", pos+st.Bytes, err)
		}
		return err
	})
}

// ioRing runs move, the body of HtoDFrom or DtoHTo, on a lane with the
// Copier's ring of stages; nilIO: the reader or writer is nil.
func (c *Copier) ioRing(ctx context.Context, d Direction, dev *cuda.DeviceBuffer, nilIO bool, move func(l *lane, st *Stats) error) (Stats, error) {
	st := Stats{Direction: d}
	if err := c.enter(ctx); err != nil {
		return st, err
	}
	defer c.gate.End()
	what, op, verb := "destination", "HtoDFrom a nil io.Reader", "reading into device memory"
	if d == DeviceToHost {
		what, op, verb = "source", "DtoHTo a nil io.Writer", "writing device memory"
	}
	if err := checkBuf(dev, c.cctx.Device(), what+" device buffer"); err != nil {
		return st, err
	}
	if nilIO {
		return st, fmt.Errorf("transfer: %s: %w", op, cuda.ErrInvalidValue)
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m := startMeter(c.o.stats)
	l, err := c.acquire(ctx)
	if err != nil {
		return st, err
	}
	if err := c.borrow(ctx, l, c.o.depth); err != nil {
		c.releaseLane(l)
		return st, err
	}
	first := l.startTimer()
	if first == nil {
		first = c.abandonOnPanic(l, func() error { return move(l, &st) })
	}
	_, err = c.finish(ctx, l, nil, true, first, &st, func() {})
	m.stop(&st)
	if err != nil {
		return st, fmt.Errorf("transfer: %s after %d bytes: %w", verb, st.Bytes, err)
	}
	return st, nil
}

// ringIn reads into the stages of l's ring in turn, queuing each stage's
// copy to dst once it is read, until read reports the end or dst is full.
func (c *copier) ringIn(ctx context.Context, l *lane, dst *cuda.DeviceBuffer, st *Stats, read func(off int64, p []byte) (int, error)) error {
	for off := 0; off < dst.Size(); {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, err := l.ring.next(ctx)
		if err != nil {
			return err
		}
		want := min(len(s.mem), dst.Size()-off)
		n, rerr := read(int64(off), s.mem[:want])
		if n > 0 {
			if err := l.ring.queued(0, false, s.htod(l.stream, dst, off, 0, n)); err != nil {
				return err
			}
			off += n
			st.Bytes += int64(n)
			st.StagedBytes += int64(n)
			st.Stages++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("reading: %w", rerr)
		}
	}
	return nil
}

// ringOut copies src out through the stages of l's ring, handing write
// each stage's bytes and their offset in src, with later stages' DMA
// queued ahead (the ring's window). Every stage holds a stage size, so
// the oldest pending stage holds src from done, the bytes written.
func (c *copier) ringOut(ctx context.Context, l *lane, src *cuda.DeviceBuffer, st *Stats, write func(off int64, p []byte) (int, error)) error {
	for next, done, size := 0, 0, src.Size(); done < size; {
		if next < size && !l.ring.full() { // queue the next stage's DMA first
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := l.ring.next(ctx)
			if err != nil {
				return err
			}
			n := min(len(s.mem), size-next)
			if err := l.ring.queued(0, true, s.dtoh(l.stream, src, next, 0, n)); err != nil {
				return err
			}
			next += n
			continue
		}
		s, err := l.ring.oldest(ctx, false)
		if err != nil {
			return err
		}
		n := min(len(s.mem), size-done)
		nw, werr := write(int64(done), s.mem[:n])
		done += n
		st.Bytes += int64(nw)
		st.StagedBytes += int64(nw)
		st.Stages++
		if werr == nil && nw < n {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			return fmt.Errorf("writing: %w", werr)
		}
	}
	return nil
}

// minIOPiece is the smallest share of a stage for one ReadAt or WriteAt.
const minIOPiece = 1 << 20

// positional returns x as a T (io.ReaderAt or io.WriterAt) and its
// offset when it is one and an io.Seeker that knows its offset (a pipe
// does not).
func positional[T any](x any) (at T, pos int64, ok bool) {
	at, isAt := x.(T)
	sk, isSeeker := x.(io.Seeker)
	if !isAt || !isSeeker {
		return at, 0, false
	}
	pos, err := sk.Seek(0, io.SeekCurrent)
	return at, pos, err == nil
}

// seekPast sets the offset of x, an io.Seeker, to end; err, the
// transfer's error, comes first.
func seekPast(x any, what string, end int64, err error) error {
	if _, serr := x.(io.Seeker).Seek(end, io.SeekStart); serr != nil && err == nil {
		return fmt.Errorf("setting the %s's offset: %w", what, serr)
	}
	return err
}

// eachAt calls f on up to parallelism pieces of p (of at least
// minIOPiece) at once, at off plus their offset, and returns the bytes
// done from the start of p without a gap; short: a piece came back short,
// with err its error (maybe nil).
func (c *copier) eachAt(p []byte, off int64, f func(p []byte, off int64) (int, error)) (done int, short bool, err error) {
	parts := max(1, min(c.o.parallelism, len(p)/minIOPiece))
	size := (len(p) + parts - 1) / parts
	ns := make([]int, parts)
	errs := make([]error, parts)
	piece := func(i int) {
		lo := i * size
		ns[i], errs[i] = f(p[lo:min(lo+size, len(p))], off+int64(lo))
	}
	var wg sync.WaitGroup
	for i := range parts - 1 {
		wg.Go(func() { piece(i) })
	}
	func() {
		// Even when f panics here, no call of f outlives eachAt: they
		// write into a stage the fence may hand to another transfer.
		defer wg.Wait()
		piece(parts - 1) // the caller takes the last
	}()
	for i := range parts {
		done += ns[i]
		if ns[i] < min(size, len(p)-i*size) {
			return done, true, errs[i]
		}
	}
	return done, false, nil
}

// readAt is io.ReadFull of p with parallel ReadAt calls at off (a full
// last piece with io.EOF is not short).
func (c *copier) readAt(ra io.ReaderAt, off int64, p []byte) (int, error) {
	n, short, err := c.eachAt(p, off, ra.ReadAt)
	switch {
	case !short:
		return n, nil
	case err != nil && err != io.EOF:
		return n, err
	case n == 0:
		return 0, io.EOF
	}
	return n, io.ErrUnexpectedEOF
}

// writeAt writes p to wa at off with parallel WriteAt calls and returns
// the bytes written without a gap and the first error (io.ErrShortWrite
// for a short write without one).
func (c *copier) writeAt(wa io.WriterAt, off int64, p []byte) (int, error) {
	n, short, err := c.eachAt(p, off, wa.WriteAt)
	if short && err == nil {
		err = io.ErrShortWrite
	}
	return n, err
}
