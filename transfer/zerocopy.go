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
// kernels on s (nil: the Copier's stream) using the buffer's device
// address p (b.DevicePtr) and length n, and RunMapped returns when they
// have finished, with their error. Waiting goes through the Copier's
// single waiter. A buffer without pinmem.Mapped gives an error matching
// pinmem.ErrNotMapped.
//
// ctx bounds the wait: when it ends first, RunMapped returns an error
// matching ctx.Err() at once; the kernels may still use b until they
// finish, so b must not be freed before the stream has run them (with
// s == nil, the Copier's next transfer starts only after they have).
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
	if s == nil {
		l, err := c.acquire(ctx)
		if err != nil {
			return err
		}
		releases = append(releases, func() { c.releaseLane(l) })
		s = l.stream
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
		err = errors.Join(werr, err, s.Synchronize(), c.destroyEvent(ev))
		release()
		return err
	}
	if err := c.w.wait(ctx, ev); err != nil && ctx.Err() != nil {
		// The kernels still run: wait for them in the background.
		c.hold()
		go func() {
			defer c.end()
			c.waitDrained(ev)
			_ = c.destroyEvent(ev)
			release()
		}()
		return err
	} else if err != nil {
		werr = errors.Join(werr, err)
	}
	err = errors.Join(werr, s.Synchronize(), c.destroyEvent(ev))
	release()
	return err
}
