package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// RunMapped runs device work directly on the Mapped buffer b (zero-copy:
// the kernels read and write the host memory over PCIe): work enqueues
// kernels on s (nil: the stream of one of the Copier's lanes, which the
// call holds until the kernels have run) using the buffer's device
// address p (b.DevicePtr) and length n, and RunMapped returns when they
// have finished, with their error. Waiting goes through a waiter of the
// Copier's. A buffer without pinmem.Mapped gives an error matching
// pinmem.ErrNotMapped.
//
// ctx bounds the wait: when it ends first, RunMapped returns an error
// matching ctx.Err() at once; the kernels may still use b until they
// finish, so b must not be freed before the stream has run them (with
// s == nil, the lane stays taken until they have; the Copier's transfers
// meanwhile take its other lane, not ordered after the kernels).
func (c *Copier) RunMapped(ctx context.Context, s *cuda.Stream, b *pinmem.Buffer, work func(s *cuda.Stream, p cuda.DevicePtr, n int) error) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.end()
	if b == nil || work == nil {
		return fmt.Errorf("transfer: RunMapped with a nil buffer or work function: %w", cuda.ErrInvalidValue)
	}
	p, err := b.DevicePtr()
	if err != nil {
		return fmt.Errorf("transfer: zero-copy: %w", err)
	}
	releases := []func(){}
	w := c.w
	if s == nil {
		l, err := c.acquire(ctx)
		if err != nil {
			return err
		}
		releases = append(releases, func() { c.releaseLane(l) })
		s, w = l.stream, l.w
	}
	release := func() {
		for _, f := range releases {
			f()
		}
	}
	ev, err := c.cctx.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming)
	if err != nil {
		release()
		return err
	}
	werr := work(s, p, b.Len())
	if err := ev.Record(s); err != nil {
		err = errors.Join(werr, err, s.Synchronize(context.Background()), c.destroyEvent(ev))
		release()
		return err
	}
	if err := w.wait(ctx, ev); err != nil && ctx.Err() != nil {
		// The kernels still run: wait for them in the background.
		c.hold()
		go func() {
			defer c.end()
			waitDrained(w, ev)
			_ = c.destroyEvent(ev)
			release()
		}()
		return err
	} else if err != nil {
		werr = errors.Join(werr, err)
	}
	err = errors.Join(werr, s.Synchronize(context.Background()), c.destroyEvent(ev))
	release()
	return err
}
