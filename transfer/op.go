package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
)

// HtoDAsync starts HtoD and returns at once; the Op reports its result,
// errors included. src must not be modified, nor dst used, until the Op is
// done, which is once no copy of it will read src again. After an early
// exit (ctx ended, a failed enqueue) that is as soon as its CPU copies
// stopped when src is pageable: the copies it left queued touch only
// pinmem's stages, which the Copier's fence keeps until they ran. Where
// src is pinned memory copied directly, the Op waits for those copies,
// bounded by ctx; when ctx ends first, the Op is done with an error
// saying so, and Copier.Fence waits for them before src is reused. Ops
// are not ordered with each other (two may run at once on the two lanes):
// wait for one before starting another that touches the same memory.
func (c *Copier) HtoDAsync(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) *Op {
	return c.async(ctx, HostToDevice, src, dst)
}

// DtoHAsync starts DtoH and returns at once, as HtoDAsync starts HtoD; dst
// must not be used until the Op is done (after an early exit, as for
// HtoDAsync's src).
func (c *Copier) DtoHAsync(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) *Op {
	return c.async(ctx, DeviceToHost, dst, src)
}

// async runs move on a goroutine of its own for an Op.
func (c *Copier) async(ctx context.Context, d Direction, host []byte, dev *cuda.DeviceBuffer) *Op {
	t := &Op{cancel: func() {}, done: make(chan struct{})}
	if err := c.enter(ctx); err != nil {
		t.finish(Stats{Direction: d}, err)
		return t
	}
	tctx, cancel := context.WithCancel(ctx)
	t.cancel = cancel
	go func() {
		defer c.gate.End()
		st, touching, err := c.move(tctx, d, host, dev, byRoute)
		// Done once nothing it queued touches its memory: at once when
		// the copies left queued touch only stages (touching nil).
		if touching != nil {
			select {
			case <-touching:
			default:
				select {
				case <-touching:
				case <-ctx.Done():
					err = pinnedLeft(err, ctx.Err())
				}
			}
		}
		t.finish(st, err)
	}()
	return t
}

// pinnedLeft is the error of an Op whose wait for its copies of pinned
// memory ended with ctx (why) before they ran: the transfer's error err,
// and why where err does not say it already.
func pinnedLeft(err, why error) error {
	const left = "its copies of pinned memory may still run: Copier.Fence waits for them before the memory is reused"
	if errors.Is(err, why) {
		return fmt.Errorf("%w (%s)", err, left)
	}
	return fmt.Errorf("%w; %w (%s)", err, why, left)
}

// Op is an asynchronous transfer in progress.
type Op struct {
	cancel context.CancelFunc
	done   chan struct{}
	stats  Stats
	err    error
}

func (t *Op) finish(s Stats, err error) {
	t.stats, t.err = s, err
	t.cancel()
	close(t.done)
}

// closedChan is returned by a nil Op's Done.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed when the transfer has finished, in place
// or failed. A nil Op is done.
func (t *Op) Done() <-chan struct{} {
	if t == nil {
		return closedChan
	}
	return t.done
}

// Wait returns the transfer's result once it finished, or ctx.Err() when
// ctx ends first; the transfer then goes on (cancel the context given to
// HtoDAsync or DtoHAsync to stop it).
func (t *Op) Wait(ctx context.Context) (Stats, error) {
	if t == nil {
		return Stats{}, errNil("Op")
	}
	if err := checkCtx(ctx); err != nil {
		return Stats{}, err
	}
	select {
	case <-t.done:
		return t.stats, t.err
	case <-ctx.Done():
		return Stats{}, ctx.Err()
	}
}
