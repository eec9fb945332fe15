package transfer

import (
	"context"
	"runtime"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// The one-stage shape of the staged executor (exec with ring false)
// moves a pageable transfer that route gives to one stage through one of
// the engine's pinned stages on the caller's goroutine, in stagePieces
// pieces of that stage: no ring and no stage event, and a wait for the
// lane's stream at the end (singleWait). It is taken only when a lane and
// a stage are idle at once; otherwise the transfer goes through the ring,
// which waits for them bounded by ctx.

// oneStage takes an idle lane and an idle stage without waiting and lays
// a transfer of host to or from dev out in l.ops, in stagePieces parts of
// the stage. l is nil when none is idle, or a transfer waits for stages
// already (it is not overtaken): the transfer then takes the ring.
func (c *copier) oneStage(d Direction, host []byte, dev *cuda.DeviceBuffer) (*lane, error) {
	var l *lane
	select {
	case l = <-c.free:
	default:
		return nil, nil
	}
	// The copies earlier calls left queued run first, as in acquire: a
	// retry is never overwritten by them.
	if err := c.fence.order(l.stream); err != nil {
		c.free <- l
		return nil, err
	}
	s := c.eng.tryTake()
	if s == nil {
		c.free <- l
		return nil, nil
	}
	l.stages = append(l.stages[:0], s)
	n := len(host)
	_, size := stagePieces(d, n, c.o.tune.stagePieces)
	l.ops = l.ops[:0]
	for lo := 0; lo < n; lo += size {
		l.ops = append(l.ops, piece{host: host[lo:min(lo+size, n)], dev: dev, off: lo, s: s, lo: lo})
	}
	return l, nil
}

// copyStage copies src into dst, between host memory and a stage: on the
// caller's goroutine when small, else with the engine's copy goroutines
// split over up to the Copier's parallelism, and returns the CPU time it
// took when the Copier measures (WithStats): the caller's thread CPU time
// where getrusage(RUSAGE_THREAD) exists (the goroutine locked to its
// thread meanwhile), else the copy's wall time.
func (c *copier) copyStage(dst, src []byte) time.Duration {
	if len(src) > singleCopyInline {
		return c.eng.pool.copyN(c.o.parallelism, c.o.tune.subPieces, dst, src)
	}
	if !c.o.stats {
		copy(dst, src)
		return 0
	}
	if !haveThreadCPU {
		t0 := time.Now()
		copy(dst, src)
		return time.Since(t0)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := threadCPU()
	copy(dst, src)
	return threadCPU() - c0
}

// singleWait waits for the copies queued on l's stream, bounded by ctx.
// On a stream of the Copier's own, which holds nothing else: a context
// that cannot end, under WaitHybrid or WaitPoll, waits in the driver's
// stream synchronisation (which spins while the process has fewer
// contexts than CPUs); one that can end polls the stream (one driver call
// a query, no event recorded while it polls) for up to the tail spin
// (WaitPoll: until done), checking ctx between queries. On a caller's
// stream (WithStream), which may take more work meanwhile, it polls the
// lane's done event recorded behind the copies instead. Then it sleeps on
// that event through the lane's waiter. When the wait returns early,
// abandon records l.done behind the copies for the fence.
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
		// Collects the copies' asynchronous errors; nothing else is queued.
		return streamErr(ctx, l.stream)
	}
	return nil
}
