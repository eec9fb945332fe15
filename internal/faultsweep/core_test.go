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
	"github.com/pinmem/pinmem/pool"
)

func init() { closedErrs = append(closedErrs, pool.ErrClosed) }

// allocOp pins size bytes with flags and method, writes and reads them
// back, and frees them.
func allocOp(size int, flags pinmem.Flags, m pinmem.Method) op {
	return op{fmt.Sprintf("Alloc(%d,%v,%v)", size, flags, m), func(e *env) error {
		b, err := pinmem.Alloc(size, flags, pinmem.WithMethod(m))
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		copy(b.Bytes(), "pinmem")
		if !bytes.HasPrefix(b.Bytes(), []byte("pinmem")) {
			return errors.New("pinned memory does not hold what was written")
		}
		if flags&pinmem.Mapped != 0 {
			if _, err := b.DevicePtr(); err != nil {
				return errors.Join(err, b.Free())
			}
		}
		return b.Free()
	}}
}

func registerOp(size int, flags pinmem.Flags) op {
	return op{fmt.Sprintf("Register(%d,%v)", size, flags), func(e *env) error {
		mem := make([]byte, size)
		b, err := pinmem.Register(mem, flags)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		return b.Free()
	}}
}

// poolOp runs a pool's life: New (with prewarm), hits and misses, a Put
// ordered after a stream's work, Trim and Close.
func poolOp(opts ...pool.Option) op {
	return op{fmt.Sprintf("pool(%d options)", len(opts)), func(e *env) error {
		p, err := pool.New(opts...)
		if err != nil {
			// A caller retries New: the retry releases what the failed
			// New could not.
			e.defer_(func() error {
				p, err := pool.New(opts...)
				if err != nil {
					return err
				}
				return p.Close(context.Background())
			})
			return err
		}
		e.defer_(func() error { return p.Close(context.Background()) })
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
			b, err := p.Get(n)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := s.CopyHtoD(dev.Ptr(), b.Bytes()[:min(n, dev.Size())]); err != nil {
				errs = append(errs, err)
			}
			if err := p.Put(b, s); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := p.Trim(); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, s.Synchronize(), p.Close(context.Background()))
		return errors.Join(errs...)
	}}
}

// deviceOp covers cuda's objects: device memory, copies both ways, a
// stream, events, a batch, a module and a launch.
func deviceOp() op {
	return op{"cuda objects", func(e *env) error {
		d, err := e.ctx.Alloc(64 << 10)
		if err != nil {
			return err
		}
		e.defer_(d.Free)
		src := testutil.RandomBytes(64<<10, 1)
		if err := d.Write(0, src); err != nil {
			return err
		}
		got := make([]byte, len(src))
		if err := d.Read(0, got); err != nil {
			return err
		}
		if !bytes.Equal(got, src) {
			return errors.New("device round trip lost data")
		}
		s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s.Destroy)
		ev, err := e.ctx.NewEvent(cuda.EventDefault)
		if err != nil {
			return err
		}
		e.defer_(ev.Destroy)
		host, err := pinmem.Alloc(64<<10, 0)
		if err != nil {
			return err
		}
		e.defer_(host.Free)
		if _, err := e.ctx.NewBatch().CopyHtoD(s, d.Ptr(), host.Bytes()).CopyDtoH(s, host.Bytes(), d.Ptr()).Record(ev, s).Issue(); err != nil {
			return errors.Join(err, s.Synchronize())
		}
		if err := ev.Synchronize(); err != nil {
			return err
		}
		mod, err := e.ctx.LoadModule([]byte("// sweep module\n"))
		if err != nil {
			return err
		}
		e.defer_(mod.Unload)
		f, err := mod.Function("sweep_noop")
		if err != nil {
			return err
		}
		if err := f.Launch(s, cuda.D1(1), cuda.D1(32), 0, d.Ptr(), uint32(1)); err != nil {
			return errors.Join(err, s.Synchronize())
		}
		return errors.Join(s.Synchronize(), host.Free(), mod.Unload(), ev.Destroy(), s.Destroy(), d.Free())
	}}
}

func TestSweepHostMemory(t *testing.T) {
	var ops []op
	for _, m := range []pinmem.Method{pinmem.MethodAuto, pinmem.MethodHostAlloc, pinmem.MethodMmapRegister} {
		for _, f := range []pinmem.Flags{0, pinmem.Mapped, pinmem.Portable | pinmem.WriteCombined} {
			if m == pinmem.MethodMmapRegister && f&pinmem.WriteCombined != 0 {
				continue // write-combined memory comes from cuMemHostAlloc only
			}
			ops = append(ops, allocOp(1<<20, f, m))
		}
	}
	ops = append(ops, registerOp(1<<20, 0), registerOp(256<<10, pinmem.Mapped))
	sweep(t, ops)
}

func TestSweepPool(t *testing.T) {
	sweep(t, []op{poolOp(), poolOp(pool.WithPrewarm(64<<10, 256<<10), pool.WithFlags(pinmem.Mapped))})
}

func TestSweepDevice(t *testing.T) {
	sweep(t, []op{deviceOp()})
}
