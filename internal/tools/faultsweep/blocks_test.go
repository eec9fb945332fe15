package faultsweep_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// blocksOp pages 32 scattered blocks of 4 KiB out of one device buffer
// and 32 into another at once, on two streams, with one blocks.Copier
// call of strategy s, and checks every byte.
func blocksOp(s blocks.Strategy) op {
	return op{name: "blocks.Copier " + s.String(), run: func(e *env) error {
		const bs, n = 4 << 10, 32
		var flags pinmem.Flags
		var opts []blocks.Option
		if s == blocks.Kernel {
			flags = pinmem.Mapped // the kernel reaches host memory through its device address
			opts = append(opts, blocks.WithKernel(n))
		}
		host, err := pinmem.Alloc(2*bs*n, flags)
		if err != nil {
			return err
		}
		e.defer_(host.Free)
		src, back := host.Bytes()[:bs*n], host.Bytes()[bs*n:]
		copy(src, testutil.RandomBytes(bs*n, 3))
		want := testutil.RandomBytes(bs*n, 4)
		var in, out *cuda.DeviceBuffer
		for _, d := range []**cuda.DeviceBuffer{&in, &out} {
			if *d, err = e.ctx.Alloc(bs * n); err != nil {
				return err
			}
			e.defer_((*d).Free)
		}
		if _, err := out.WriteAt(want, 0); err != nil {
			return err
		}
		var s1, s2 *cuda.Stream
		for _, st := range []**cuda.Stream{&s1, &s2} {
			if *st, err = e.ctx.NewStream(cuda.StreamNonBlocking); err != nil {
				return err
			}
			e.defer_((*st).Destroy)
		}
		sync := func() error {
			return errors.Join(s1.Synchronize(context.Background()), s2.Synchronize(context.Background()))
		}
		// A failed call may leave copies queued: a careful caller waits for
		// the streams before it frees the memory.
		e.defer_(sync)
		bc, err := blocks.New(e.ctx, append(opts, blocks.WithStrategy(s))...)
		if err != nil {
			if s == blocks.Kernel {
				// As a caller would, the cleanups retry: the retry releases
				// what the failed construction could not.
				e.defer_(func() error {
					bc, err := blocks.New(e.ctx, opts...)
					if err != nil {
						return err
					}
					return bc.Close(context.Background())
				})
			}
			return err
		}
		e.defer_(func() error { return bc.Close(context.Background()) })
		list := func(h []byte, d *cuda.DeviceBuffer) []blocks.Block {
			l := make([]blocks.Block, n)
			for i := range n {
				j := (i * 7) % n // scattered on the device side
				l[i] = blocks.Block{Host: h[i*bs : (i+1)*bs], Dev: d, Off: j * bs}
			}
			return l
		}
		if _, err := bc.Copy(context.Background(), blocks.ToDevice(s1, list(src, in)), blocks.ToHost(s2, list(back, out))); err != nil {
			return errors.Join(err, sync())
		}
		if err := sync(); err != nil {
			return err
		}
		got := make([]byte, bs*n)
		if _, err := in.ReadAt(got, 0); err != nil {
			return err
		}
		for i := range n {
			j := (i * 7) % n
			if !bytes.Equal(got[j*bs:(j+1)*bs], src[i*bs:(i+1)*bs]) || !bytes.Equal(back[i*bs:(i+1)*bs], want[j*bs:(j+1)*bs]) {
				return errors.New("blocks lost data")
			}
		}
		return errors.Join(bc.Close(context.Background()), s1.Destroy(), s2.Destroy(), in.Free(), out.Free(), host.Free())
	}}
}

func TestSweepBlocks(t *testing.T) {
	sweep(t, []op{blocksOp(blocks.Auto), blocksOp(blocks.DriverBatch), blocksOp(blocks.PerCopy), blocksOp(blocks.Kernel)})
}
