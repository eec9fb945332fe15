package faultsweep_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/testutil"
)

// blocksOp pages 32 scattered blocks of 4 KiB out to the device and back
// with Stream.CopyBlocks (strategy s, and through a staging buffer when
// staged), with one event as the completion of each direction, and
// checks every byte.
func blocksOp(s cuda.BlockStrategy, staged bool) op {
	name := "CopyBlocks " + s.String()
	if staged {
		name += " staged"
	}
	return op{name: name, run: func(e *env) error {
		const bs, n = 4 << 10, 32
		var flags pinmem.Flags
		if s == cuda.BlockKernelCopy {
			flags = pinmem.Mapped // the kernel reaches host memory through its device address
		}
		host, err := pinmem.Alloc(2*bs*n, flags)
		if err != nil {
			return err
		}
		e.defer_(host.Free)
		src, back := host.Bytes()[:bs*n], host.Bytes()[bs*n:]
		if staged {
			src, back = make([]byte, bs*n), make([]byte, bs*n) // pageable: through host as staging
		}
		copy(src, testutil.RandomBytes(bs*n, 3))
		d, err := e.ctx.Alloc(bs * n)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		st, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(st.Destroy)
		if staged {
			// A failed DeviceToHost list may leave the device writing the
			// staging buffer (cuda.ErrStagingInUse): a careful caller waits
			// for the stream before it frees the buffer.
			e.defer_(func() error { return st.Synchronize(context.Background()) })
		}
		ev, err := e.ctx.NewEvent(cuda.EventDisableTiming)
		if err != nil {
			return err
		}
		e.defer_(ev.Destroy)
		list := func(h []byte) []cuda.BlockCopy {
			l := make([]cuda.BlockCopy, n)
			for i := range n {
				j := (i * 7) % n // scattered on the device side
				l[i] = cuda.BlockCopy{Host: h[i*bs : (i+1)*bs], Dev: d, Off: j * bs}
			}
			return l
		}
		opts := []cuda.BlockOption{cuda.WithBlockStrategy(s), cuda.WithBlockEvent(ev)}
		var k *cuda.BlockKernel
		if s == cuda.BlockKernelCopy {
			if k, err = e.ctx.NewBlockKernel(n); err != nil {
				// As a caller would, the cleanups retry: the retry releases
				// what the failed construction could not.
				e.defer_(func() error {
					k, err := e.ctx.NewBlockKernel(n)
					if err != nil {
						return err
					}
					return k.Close()
				})
				return err
			}
			e.defer_(k.Close)
			opts = append(opts, cuda.WithBlockKernel(k))
		}
		if staged {
			opts = append(opts, cuda.WithBlockStaging(host.Bytes()))
		}
		for _, c := range []struct {
			dir cuda.Direction
			h   []byte
		}{{cuda.HostToDevice, src}, {cuda.DeviceToHost, back}} {
			if _, err := st.CopyBlocks(c.dir, list(c.h), opts...); err != nil {
				return errors.Join(fmt.Errorf("%v: %w", c.dir, err), st.Synchronize(context.Background()))
			}
			if err := ev.Synchronize(context.Background()); err != nil {
				return errors.Join(err, st.Synchronize(context.Background()))
			}
		}
		if !bytes.Equal(src, back) {
			return errors.New("block round trip lost data")
		}
		var kerr error
		if k != nil {
			kerr = k.Close()
		}
		return errors.Join(st.Synchronize(context.Background()), kerr, ev.Destroy(), st.Destroy(), d.Free(), host.Free())
	}}
}

func TestSweepBlocks(t *testing.T) {
	sweep(t, []op{
		blocksOp(cuda.BlockAuto, false),
		blocksOp(cuda.BlockDriverBatch, false),
		blocksOp(cuda.BlockPerCopy, false),
		blocksOp(cuda.BlockKernelCopy, false),
		blocksOp(cuda.BlockAuto, true),
	})
}
