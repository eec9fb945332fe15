package transfer

import (
	"context"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// oneStage takes an idle stage for the transfer on l (a small one when
// small; pinned now when none is idle and the engine may grow, bounded by
// ctx) without waiting for one, unless only small stages are there (see
// tryTake), and lays the transfer out in l.ops, in stagePieces parts of
// the stage. It reports false when it has none or a transfer waits for
// stages already: the transfer then takes the ring, which waits bounded
// by ctx, or says why it has none.
func (c *copier) oneStage(ctx context.Context, l *lane, d Direction, host []byte, dev *cuda.DeviceBuffer, small bool) bool {
	s, wait := c.eng.tryTake(ctx, small)
	if wait {
		if ss, err := c.eng.takeFrom(ctx, &c.eng.small, 1); err == nil {
			s = ss[0]
		}
	}
	if s == nil {
		return false
	}
	l.stages = append(l.stages[:0], s)
	n := len(host)
	_, size := stagePieces(d, n, c.o.tune.stagePieces)
	l.ops = l.ops[:0]
	for lo := 0; lo < n; lo += size {
		l.ops = append(l.ops, piece{host: host[lo:min(lo+size, n)], dev: dev, off: lo, s: s, lo: lo})
	}
	return true
}

// singleWait waits, bounded by ctx, for the one-stage transfer on l. On a
// stream of our own: with a context that cannot end (and not WaitSleep)
// the driver's stream synchronisation, which spins; else polling the
// stream for up to the tail spin (WaitPoll: until done) and then sleeping
// on l.done. On a caller's stream, which may take later work, it polls and
// sleeps on l.done recorded behind the copies.
func (c *copier) singleWait(ctx context.Context, l *lane) error {
	own := c.ownStream
	if own && ctx.Done() == nil && c.o.wait != WaitSleep {
		return streamErr(ctx, l.stream)
	}
	query := l.stream.Query
	if !own {
		if err := l.done.Record(l.stream); err != nil {
			return err
		}
		query = l.done.Query
	}
	if c.o.wait != WaitSleep {
		start := time.Now()
		done, err := poll(ctx, query, func(i int) bool {
			return c.o.wait == WaitPoll || i%16 != 15 || time.Since(start) <= tailSpin
		})
		if done || err != nil {
			return err
		}
	}
	if own {
		if err := l.done.Record(l.stream); err != nil {
			return err
		}
	}
	if err := l.w.wait(ctx, l.done); err != nil {
		return err
	}
	if own {
		// The copies' asynchronous errors.
		return streamErr(ctx, l.stream)
	}
	return nil
}
