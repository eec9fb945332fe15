package transfer

import (
	"context"
	"fmt"
	"io"

	"github.com/pinmem/pinmem/cuda"
)

// HtoDFrom reads r into the device buffer dst (from offset 0) until r
// reports io.EOF or dst is full, reading straight into the pinned stages
// (io.ReadFull on the stage's own bytes: no extra heap copy) while the copy
// engine drains the previous stage. Stats.Bytes is the number of bytes
// read and copied. When dst fills up, HtoDFrom stops without reading
// further; the reader may have more. A read error other than io.EOF
// stops the transfer and is returned. dst is checked and ctx bounds the
// call as for HtoD; a Read in progress is not interrupted.
func (c *Copier) HtoDFrom(ctx context.Context, dst *cuda.DeviceBuffer, r io.Reader) (Stats, error) {
	st := Stats{Direction: HostToDevice}
	if err := c.enter(ctx); err != nil {
		return st, err
	}
	defer c.end()
	if err := checkBuf(dst, c.cctx.Device(), "destination device buffer"); err != nil {
		return st, err
	}
	if r == nil {
		return st, fmt.Errorf("transfer: HtoDFrom a nil io.Reader: %w", cuda.ErrInvalidValue)
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m := startMeter(c.o.stats)
	if err := c.acquire(ctx); err != nil {
		return st, err
	}
	if err := c.borrow(ctx, c.o.depth); err != nil {
		c.releaseRing()
		return st, err
	}
	first := c.startTimer()
	for k, off := 0, 0; first == nil && off < dst.Size(); k++ {
		if err := ctx.Err(); err != nil {
			first = err
			break
		}
		s := c.stageAt(k)
		if err := c.reuse(ctx, s); err != nil {
			first = err
			break
		}
		want := min(len(s.mem), dst.Size()-off)
		n, rerr := io.ReadFull(r, s.mem[:want])
		if n > 0 {
			if err := c.queued(s, s.htod(c.stream, dst.Ptr().Add(off), n)); err != nil {
				first = err
				break
			}
			off += n
			st.Bytes += int64(n)
			st.StagedBytes += int64(n)
			st.Stages++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			first = fmt.Errorf("reading: %w", rerr)
		}
	}
	err := c.finish(ctx, first, &st, func() {})
	m.stop(&st)
	if err != nil {
		return st, fmt.Errorf("transfer: reading into device memory after %d bytes: %w", st.Bytes, err)
	}
	return st, nil
}

// DtoHTo writes the whole device buffer src to w, copying it out through
// the pinned stages with the DMA of later stages running ahead, and
// handing w the stage's own bytes (no extra heap copy; as io.Writer
// requires, w must not retain them). A write error stops the transfer; a
// short write is io.ErrShortWrite. src is checked and ctx bounds the call
// as for DtoH; a Write in progress is not interrupted.
func (c *Copier) DtoHTo(ctx context.Context, w io.Writer, src *cuda.DeviceBuffer) (Stats, error) {
	st := Stats{Direction: DeviceToHost}
	if err := c.enter(ctx); err != nil {
		return st, err
	}
	defer c.end()
	if err := checkBuf(src, c.cctx.Device(), "source device buffer"); err != nil {
		return st, err
	}
	if w == nil {
		return st, fmt.Errorf("transfer: DtoHTo a nil io.Writer: %w", cuda.ErrInvalidValue)
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	m := startMeter(c.o.stats)
	if err := c.acquire(ctx); err != nil {
		return st, err
	}
	if err := c.borrow(ctx, c.o.depth); err != nil {
		c.releaseRing()
		return st, err
	}
	type pending struct {
		off, n int
		s      *stage
	}
	var q []pending
	first := c.startTimer()
	size := src.Size()
	next, k := 0, 0
	for first == nil {
		for next < size && len(q) < len(c.stages) {
			if err := ctx.Err(); err != nil {
				first = err
				break
			}
			s := c.stageAt(k)
			k++
			n := min(len(s.mem), size-next)
			if err := c.queued(s, s.dtoh(c.stream, src.Ptr().Add(next), n)); err != nil {
				first = err
				break
			}
			q = append(q, pending{next, n, s})
			next += n
		}
		if first != nil || len(q) == 0 {
			break
		}
		h := q[0]
		q = q[1:]
		if err := c.w.wait(ctx, h.s.ev); err != nil {
			first = err
			break
		}
		nw, werr := w.Write(h.s.mem[:h.n])
		st.Bytes += int64(nw)
		st.StagedBytes += int64(nw)
		st.Stages++
		if werr == nil && nw < h.n {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			first = fmt.Errorf("writing: %w", werr)
		}
	}
	err := c.finish(ctx, first, &st, func() {})
	m.stop(&st)
	if err != nil {
		return st, fmt.Errorf("transfer: writing device memory after %d bytes: %w", st.Bytes, err)
	}
	return st, nil
}
