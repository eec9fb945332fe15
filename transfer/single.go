package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// The single-stage path moves a small pageable transfer through one of the
// engine's pinned stages on the caller's goroutine: the CPU copy (into
// the stage before the DMA, out of it after; by the engine's copy
// goroutines above singleCopyInline), one asynchronous copy per piece on
// a lane's stream, and a wait for that stream. There is no ring and no
// stage event: for a few kilobytes to a few megabytes it costs less than
// the driver's own pageable copy, which bounces the bytes through a
// staging buffer of its own and waits inside the driver call. Unlike that
// copy it is bounded by ctx: when ctx ends first, the transfer returns and
// its copies drain in the background with the lane and the stage held
// until then. It is taken only when a lane and a stage are idle at once;
// otherwise the transfer takes the driver's copy or the ring (short).
// Staged transfers of up to singleStagedMax take it too, in two pieces,
// ahead of the ring.

// The sizes where one stage beats the driver's pageable copy, measured
// side by side on an H200 (BenchmarkSingleStage, paired medians of
// single/driver; docs/PERF.md has the figures):
//   - up to 64 KiB both ways, the stage filled on the caller's goroutine,
//     where the driver's copy costs most per call (at 16 KiB host to
//     device the two tie);
//   - host to device from 256 KiB to 1 MiB in one piece the driver wins:
//     it overlaps its own bounce copies with their DMA, and one
//     goroutine's copy does not; 1 MiB in 4 pieces, each piece's DMA
//     queued behind its copy, is on a par with it;
//   - device to host from 256 KiB to 1 MiB one stage wins or ties;
//   - from 2 MiB to 16 MiB both ways one piece filled or emptied by the
//     engine's copy goroutines wins, by up to 2 times (in pieces, less);
//   - at 16 and 32 MiB two pieces beat the ring (singleStagedMax).
//
// So a transfer tries one stage first in those bands (singleBand) and
// otherwise takes the driver's copy when it is free and a stage when it
// is not (short): the driver's pageable copies of several threads do not
// add up.
var (
	singleSmallMax atomic.Int64 // up to this size, inclusive, both ways: one stage first
	singleH2DMin   atomic.Int64 // host to device from this size to the threshold: one stage first
	singleOff      atomic.Bool  // benchmarks: no single-stage path at all
)

// defaultSingleSmallMax and defaultSingleH2DMin bound the bands of
// pageable transfer sizes that a Copier moves through one pinned stage,
// when one is idle, rather than the driver's pageable copy: up to 64 KiB
// and from 1 MiB host to device, every size below the threshold device
// to host.
const (
	defaultSingleSmallMax = 64 << 10
	defaultSingleH2DMin   = 1 << 20
)

func init() {
	singleSmallMax.Store(defaultSingleSmallMax)
	singleH2DMin.Store(defaultSingleH2DMin)
}

// singleBand reports whether a small pageable transfer of n bytes in
// direction d tries one stage before the driver's copy.
func singleBand(d Direction, n int) bool {
	switch {
	case singleOff.Load():
		return false
	case d == DeviceToHost:
		return true
	}
	return int64(n) <= singleSmallMax.Load() || int64(n) >= singleH2DMin.Load()
}

// singleOn reports whether the single-stage path may be taken at all.
func singleOn() bool { return !singleOff.Load() }

// singleStagedMax is the largest staged transfer (one at or above the
// Copier's threshold) that takes one pinned stage in two pieces, when a
// stage and a lane are idle, instead of the ring. Measured side by side
// on an H200 (BenchmarkSingleStage), one stage in two pieces beat the
// ring at 16 and 32 MiB in both directions: the ring's four pieces each
// pay a fork and join of the copy goroutines, a stage event and a wait,
// and its CPU copies run beside DMA that slows them.
const singleStagedMax = 32 << 20

// oneStage reports whether a pageable transfer of n bytes that the
// thresholds stage tries one pinned stage before the ring.
func (c *copier) oneStage(n int, how strategy) bool {
	return how == byThreshold && singleOn() && n <= min(c.o.stageSize, singleStagedMax)
}

// singleCopyInline is the size up to which the single-stage path copies
// on the caller's goroutine alone; larger copies are split over the
// engine's copy goroutines.
const singleCopyInline = 2 * minPiece

// single tries the single-stage path for a pageable transfer of host in
// st.Direction. handled is false when it did not take the transfer (no
// idle lane or stage, or too large): nothing was done and the caller goes
// on with another path.
func (c *copier) single(ctx context.Context, st *Stats, dev *cuda.DeviceBuffer, host []byte) (out Stats, err error, handled bool) {
	n := len(host)
	if err := ctx.Err(); err != nil {
		return *st, err, true
	}
	if n > c.o.stageSize {
		return *st, nil, false
	}
	var l *lane
	select {
	case l = <-c.free:
	default:
		return *st, nil, false
	}
	// The copies earlier calls left queued run first, as in acquire: a
	// retry is never overwritten by them.
	if err := c.fence.order(l.stream); err != nil {
		c.free <- l
		return *st, err, true
	}
	s := c.eng.tryTake()
	if s == nil {
		c.free <- l
		return *st, nil, false
	}
	l.stages = append(l.stages[:0], s)
	m := startMeter(c.o.stats)
	err = c.singleExec(ctx, l, s, st.Direction, dev.Ptr(), host, st)
	m.stop(st)
	if err != nil {
		return *st, fmt.Errorf("transfer: %s copy of %d bytes: %w", st.Direction, n, err), true
	}
	st.StagedBytes = int64(n)
	st.Stages = 1
	return *st, nil, true
}

// singlePieces, when not 0, is how many pieces a single-stage transfer
// is cut into (each at least singlePieceMin bytes): host to device, the
// DMA of each piece is queued as soon as the CPU has copied it into the
// stage, so that it overlaps the CPU's copy of the next; device to host,
// the transfer goes in two halves at most, the CPU copying the first out
// while the second is in flight (one event marks the first half's end).
// 0 (the default) cuts a host-to-device transfer smaller than
// singleWholeMin into 4 pieces copied on the caller's goroutine, one of
// singleHalvesMin or more into two halves both ways, and leaves every
// other one whole (see the measurements above). Atomic so that a GPU
// benchmark can compare settings.
var singlePieces atomic.Int32

const (
	singlePieceMin  = 256 << 10
	singleWholeMin  = 4 * singleCopyInline // from here the copy goroutines fill a stage whole
	singleHalvesMin = 16 << 20             // from here a stage is filled and emptied in two halves
)

// singleCuts returns the number of pieces of a single-stage transfer of n
// bytes in direction d and the size of all but the last (a multiple of
// 4 KiB).
func singleCuts(d Direction, n int) (k, size int) {
	k = int(singlePieces.Load())
	if k == 0 {
		k = 1
		switch {
		case d == HostToDevice && n < singleWholeMin:
			k = 4
		case n >= singleHalvesMin:
			k = 2
		}
	}
	k = min(k, n/singlePieceMin)
	if d == DeviceToHost {
		k = min(k, 2)
	}
	if k <= 1 {
		return 1, n
	}
	size = ((n+k-1)/k + 4095) &^ 4095
	return (n + size - 1) / size, size
}

// singleExec runs the single-stage copy on lane l with stage s and gives
// both back (at once, or after the copy drained when ctx ended first).
func (c *copier) singleExec(ctx context.Context, l *lane, s *stage, d Direction, dev cuda.DevicePtr, host []byte, st *Stats) error {
	n := len(host)
	k, size := singleCuts(d, n)
	var err, stopped error
	if d == HostToDevice {
		for i := 0; i < k && err == nil; i++ {
			if i > 0 {
				// No more pieces once ctx ended; those queued drain.
				if stopped = ctx.Err(); stopped != nil {
					break
				}
			}
			lo, hi := i*size, min((i+1)*size, n)
			st.CopyCPU += c.singleCopy(s.mem[lo:hi], host[lo:hi])
			if i == 0 {
				err = l.startTimer()
			}
			if err == nil {
				err = s.htod(l.stream, dev, lo, hi)
			}
		}
	} else {
		err = l.startTimer()
		if err == nil {
			err = s.dtoh(l.stream, dev, 0, size)
		}
		if err == nil && k > 1 {
			if err = l.near.Record(l.stream); err == nil {
				err = s.dtoh(l.stream, dev, size, n)
			}
		}
	}
	if stopped != nil || err != nil {
		// Whatever was queued before must run before the stage goes back.
		c.abandon(l, func() {})
		return firstErr(stopped, err)
	}
	timed := l.t1 != nil && l.t1.Record(l.stream) == nil
	if d == DeviceToHost && k > 1 {
		// The first half is copied out while the second is in flight.
		if werr := l.w.wait(ctx, l.near); werr != nil {
			c.abandon(l, func() {})
			return werr
		}
		st.CopyCPU += c.singleCopy(host[:size], s.mem[:size])
	}
	if werr := c.singleWait(ctx, l); werr != nil {
		c.abandon(l, func() {})
		return werr
	}
	if timed {
		if dt, err := l.t1.Elapsed(l.t0); err == nil {
			st.Device = dt
		}
	}
	if d == DeviceToHost {
		lo := 0
		if k > 1 {
			lo = size
		}
		st.CopyCPU += c.singleCopy(host[lo:], s.mem[lo:n])
	}
	c.releaseLane(l)
	return nil
}

// singleCopy copies src into dst, on the caller's goroutine when small,
// else with the engine's copy goroutines, and returns the CPU time it
// took when the Copier measures (WithStats): the caller's thread CPU time
// where getrusage(RUSAGE_THREAD) exists (the goroutine locked to its
// thread meanwhile), else the copy's wall time.
func (c *copier) singleCopy(dst, src []byte) time.Duration {
	if len(src) > singleCopyInline {
		return c.cpuCopy(dst, src)
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
// that event through the lane's waiter. l.done is recorded behind the
// copies whenever the wait returns early, so that abandon can wait for it.
func (c *copier) singleWait(ctx context.Context, l *lane) error {
	own := c.ownStream
	if own && ctx.Done() == nil && c.o.wait != WaitSleep {
		return streamErr(ctx, l.stream)
	}
	recorded := false
	record := func() error {
		if recorded {
			return nil
		}
		recorded = true
		return l.done.Record(l.stream)
	}
	if !own {
		if err := record(); err != nil {
			return err
		}
	}
	if c.o.wait != WaitSleep {
		start := time.Now()
		for i := 0; ; i++ {
			var done bool
			var err error
			if own {
				done, err = l.stream.Query()
			} else {
				done, err = l.done.Query()
			}
			if err != nil || done {
				return err
			}
			if err := ctx.Err(); err != nil {
				if rerr := record(); rerr != nil {
					return errors.Join(err, rerr)
				}
				return err
			}
			if c.o.wait == WaitHybrid && i%16 == 15 && time.Since(start) > tailSpin {
				break
			}
			runtime.Gosched()
		}
	}
	if err := record(); err != nil {
		return err
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

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
