package faultsweep_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/pool"
)

func init() { closedErrs = append(closedErrs, pool.ErrClosed) }

// newPool makes a pool for an operation; when New fails, the cleanup
// retries it, as a caller would, so that the retry releases what the
// failed New could not.
func newPool(e *env, opts ...pool.Option) (*pool.Pool, error) {
	p, err := pool.New(opts...)
	if err != nil {
		e.defer_(func() error {
			p, err := pool.New(opts...)
			if err != nil {
				return err
			}
			return p.Close(context.Background())
		})
		return nil, err
	}
	e.defer_(func() error { return p.Close(context.Background()) })
	return p, nil
}

// poolOp runs a pool's life: New (with prewarm), hits and misses, a Put
// ordered after a stream's work, Trim and Close. mapped says opts make a
// Mapped pool, whose blocks' device pointers are taken too.
func poolOp(name string, mapped bool, opts ...pool.Option) op {
	return op{name: "pool " + name, run: func(e *env) error {
		p, err := newPool(e, opts...)
		if err != nil {
			return err
		}
		s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s.Destroy)
		dev, err := e.ctx.Alloc(1 << 20)
		if err != nil {
			return err
		}
		e.defer_(dev.Free)
		var errs []error
		for _, n := range []int{4 << 10, 1 << 20, 4 << 10, 300 << 10} {
			b, err := p.Get(context.Background(), n)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if mapped {
				if _, err := b.DevicePtr(); err != nil {
					errs = append(errs, err)
				}
			}
			if err := s.CopyHtoD(dev, 0, b.Bytes()[:min(n, dev.Size())]); err != nil {
				errs = append(errs, err)
			}
			if err := p.Put(b, s); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := p.Trim(context.Background()); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, s.Synchronize(context.Background()), p.Close(context.Background()))
		return errors.Join(errs...)
	}}
}

// poolCapOp makes the cap on cached bytes defer unpinning to the next
// miss, and takes a huge block (pinned on its own).
func poolCapOp() op {
	return op{name: "pool cap and huge block", run: func(e *env) error {
		p, err := newPool(e, pool.WithMaxCached(64<<10), pool.WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
		if err != nil {
			return err
		}
		var errs []error
		var blocks []*pool.Block
		for range 3 {
			b, err := p.Get(context.Background(), 64<<10)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			blocks = append(blocks, b)
		}
		for _, b := range blocks {
			errs = append(errs, p.Put(b)) // over the cap: unpinning deferred
		}
		for _, n := range []int{1 << 20, pool.HugeThreshold + 1} {
			b, err := p.Get(context.Background(), n) // a miss: the deferred unpinning happens here
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, p.Put(b))
		}
		errs = append(errs, p.Close(context.Background()))
		return errors.Join(errs...)
	}}
}

// poolBudgetOp runs two pools under a pinned budget that holds only one
// of their blocks: a miss of one pool takes the other's idle memory
// (pinmem's reclaimers), and a pool's own idle memory (its budget retry).
func poolBudgetOp() op {
	return op{name: "pool budget", run: func(e *env) error {
		const blk = 1 << 20
		prev := pinmem.SetBudget(pinmem.Stats().Pinned.Bytes + blk + blk/2)
		e.defer_(func() error { pinmem.SetBudget(prev); return nil })
		p1, err := newPool(e, pool.WithRetainOnMiss(true), pool.WithName("budget1"))
		if err != nil {
			return err
		}
		p2, err := newPool(e, pool.WithRetainOnMiss(true), pool.WithName("budget2"))
		if err != nil {
			return err
		}
		var errs []error
		for _, step := range []struct {
			p *pool.Pool
			n int
		}{{p1, blk}, {p2, blk}, {p2, blk + blk/4}, {p1, blk}} {
			b, err := step.p.Get(context.Background(), step.n)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, step.p.Put(b))
		}
		errs = append(errs, p1.Close(context.Background()), p2.Close(context.Background()))
		pinmem.SetBudget(prev)
		return errors.Join(errs...)
	}}
}

// poolCloseOp closes a pool while a block is still out and another waits
// for stream work that has not run: Close, bounded by a context already
// done, reports both; the block out is Put after Close; once the stream
// has run, a second Close releases the rest and a third says ErrClosed.
// The stream is held with the fake, which runs nothing queued on it until
// it is released.
func poolCloseOp() op {
	return op{name: "pool Close with work pending", run: func(e *env) error {
		p, err := newPool(e, pool.WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
		if err != nil {
			return err
		}
		s1, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s1.Destroy)
		s2, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s2.Destroy)
		dev, err := e.ctx.Alloc(64 << 10)
		if err != nil {
			return err
		}
		e.defer_(dev.Free)
		out, err := p.Get(context.Background(), 4<<10)
		if err != nil {
			return err
		}
		e.defer_(func() error { return p.Put(out) })
		busy, err := p.Get(context.Background(), 64<<10)
		if err != nil {
			return err
		}
		h := cudadrv.Stream(s2.Handle())
		if err := e.fd.HoldStream(h); err != nil {
			return err
		}
		e.defer_(func() error { return e.fd.ReleaseStream(h) })
		var errs []error
		if err := s2.CopyHtoD(dev, 0, busy.Bytes()); err != nil {
			errs = append(errs, err)
		}
		// Two streams, one of them twice: one event each.
		if err := p.Put(busy, s1, s2, s2); err != nil {
			// The pool could neither record an event nor synchronize the
			// stream, and unpins the block at Close. A driver fails to
			// synchronize only a broken context, whose queued work never
			// runs; the fake fails because s2 is held, and would run the
			// copy afterwards. A caller that knows its work may still run
			// lets it finish first.
			errs = append(errs, err, e.fd.ReleaseStream(h))
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		err = p.Close(done)
		if !errors.Is(err, pool.ErrOutstanding) || !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("Close with a block out and one busy: %w", err))
		}
		if err := p.Put(out); err != nil {
			errs = append(errs, err)
		}
		if err := e.fd.ReleaseStream(h); err != nil {
			errs = append(errs, err)
		}
		if err := p.Close(context.Background()); err != nil {
			errs = append(errs, err)
		}
		if err := p.Close(context.Background()); !errors.Is(err, pool.ErrClosed) {
			errs = append(errs, fmt.Errorf("Close of a closed pool: %w", err))
		}
		errs = append(errs, s2.Synchronize(context.Background()))
		return errors.Join(errs...)
	}}
}

func TestSweepPool(t *testing.T) {
	sweep(t, []op{
		poolOp("defaults", false),
		poolOp("prewarmed, mapped", true, pool.WithPrewarm(64<<10, 256<<10), pool.WithFlags(pinmem.Mapped)),
		poolCapOp(),
		poolBudgetOp(),
		poolCloseOp(),
	})
}
