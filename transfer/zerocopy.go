package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// RunMapped runs device work directly on the Mapped buffer b (zero-copy):
// work enqueues kernels on s (nil: the stream of one of the Copier's
// lanes) using b's device address p and length n, and RunMapped returns
// when they have run, with their error. A buffer without pinmem.Mapped
// gives an error matching pinmem.ErrNotMapped. When ctx ends first,
// RunMapped returns an error matching ctx.Err() at once and the kernels,
// which may still use b, go to the Copier's fence (see Fence). The wait
// never holds up the Copier's transfers.
func (c *Copier) RunMapped(ctx context.Context, s *cuda.Stream, b *pinmem.Buffer, work func(s *cuda.Stream, p cuda.DevicePtr, n int) error) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.gate.End()
	if b == nil || work == nil {
		return fmt.Errorf("transfer: RunMapped with a nil buffer or work function: %w", cuda.ErrInvalidValue)
	}
	p, err := b.DevicePtr()
	if err != nil {
		return fmt.Errorf("transfer: zero-copy: %w", err)
	}
	var l *lane
	if s == nil {
		if l, err = c.acquire(ctx); err != nil {
			return err
		}
		s = l.stream
	} else if err := c.fence.order(ctx, s); err != nil {
		return err
	}
	release := func() {
		if l != nil {
			c.releaseLane(l)
		}
	}
	ev, err := c.cctx.NewEvent(syncEvent)
	if err != nil {
		release()
		return err
	}
	var w *waiter
	d := drain{evs: []*cuda.Event{ev}}
	handOff := func() {
		// The kernels may still run, and the waiter still sleep on ev.
		c.fence.handOff(c.gate.Hold, c.gate.End, d, func() {
			if w != nil {
				w.close()
			}
			_ = c.destroyEvent(ev)
			release()
		})
	}
	returned := false
	defer func() {
		if !returned { // work panicked: the kernels it queued go to the fence
			if ev.Record(s) != nil {
				d = drain{streams: []*cuda.Stream{s}}
			}
			handOff()
		}
	}()
	werr := work(s, p, b.Len())
	returned = true
	w = newWaiter() // the call's own: the lanes' waiters stay free
	if err = ev.Record(s); err == nil {
		err = w.wait(ctx, ev)
	} else {
		d = drain{streams: []*cuda.Stream{s}}
	}
	if err != nil && (ctx.Err() != nil || d.streams != nil) {
		handOff()
		return errors.Join(werr, err)
	}
	w.close() // it served the wait
	if l != nil && err == nil && c.ownStream {
		// Collect the kernels' asynchronous errors on the lane's stream
		// of our own, which holds nothing else; a caller's stream (given
		// here or WithStream) may hold later work, its errors are the
		// caller's.
		err = streamErr(ctx, s)
	}
	err = errors.Join(werr, err, c.destroyEvent(ev))
	release()
	return err
}
