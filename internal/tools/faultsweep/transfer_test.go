package faultsweep_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/transfer"
)

func init() { closedErrs = append(closedErrs, transfer.ErrClosed) }

// Small stages and few copy goroutines: every path of a transfer (several
// stages, a partial last stage, the ring wrapping) with few driver calls.
const (
	stageSize = 64 << 10
	xferSize  = 2*stageSize + 4096
)

func smallRing(opts ...transfer.Option) []transfer.Option {
	return append([]transfer.Option{transfer.WithStageSize(stageSize), transfer.WithDepth(2), transfer.WithParallelism(2)}, opts...)
}

// newCopier makes a Copier closed by the cleanups. When New fails, the
// cleanups retry it, as a caller would: the retry releases what the
// failed New could not.
func newCopier(e *env, c *cuda.Context, opts ...transfer.Option) (*transfer.Copier, error) {
	cp, err := transfer.New(c, opts...)
	if err != nil {
		e.defer_(func() error {
			cp, err := transfer.New(c, opts...)
			if err != nil {
				return err
			}
			return cp.Close(context.Background())
		})
		return nil, err
	}
	e.defer_(func() error { return cp.Close(context.Background()) })
	return cp, nil
}

func devAlloc(e *env, c *cuda.Context, n int) (*cuda.DeviceBuffer, error) {
	d, err := c.Alloc(n)
	if err != nil {
		return nil, err
	}
	e.defer_(d.Free)
	return d, nil
}

// copierOp runs a Copier's life on size bytes: New, each form of copy
// both ways (blocking, asynchronous, reader and writer), a direct copy of
// pinned memory, and Close.
func copierOp(name string, size int, opts func(e *env) ([]transfer.Option, error)) op {
	return op{name: "Copier " + name, run: func(e *env) error {
		bg := context.Background()
		o, err := opts(e)
		if err != nil {
			return err
		}
		cp, err := newCopier(e, e.ctx, o...)
		if err != nil {
			return err
		}
		d, err := devAlloc(e, e.ctx, size)
		if err != nil {
			return err
		}
		src := testutil.RandomBytes(size, 3)
		got := make([]byte, size)
		check := func(what string) error {
			if !bytes.Equal(got, src) {
				return fmt.Errorf("%s: the data came back different", what)
			}
			clear(got)
			return nil
		}
		if _, err := cp.HtoD(bg, d, src); err != nil {
			return err
		}
		if _, err := cp.DtoH(bg, got, d); err != nil {
			return err
		}
		if err := check("HtoD, DtoH"); err != nil {
			return err
		}
		if _, err := cp.HtoDAsync(bg, d, src).Wait(bg); err != nil {
			return err
		}
		if _, err := cp.DtoHAsync(bg, got, d).Wait(bg); err != nil {
			return err
		}
		if err := check("HtoDAsync, DtoHAsync"); err != nil {
			return err
		}
		if _, err := cp.HtoDFrom(bg, d, bytes.NewReader(src)); err != nil {
			return err
		}
		var w bytes.Buffer
		if _, err := cp.DtoHTo(bg, &w, d); err != nil {
			return err
		}
		copy(got, w.Bytes())
		if err := check("HtoDFrom, DtoHTo"); err != nil {
			return err
		}
		pinned, err := pinmem.Alloc(size, pinmem.Portable)
		if err != nil {
			return err
		}
		e.defer_(pinned.Free)
		remove := cp.AddPinned(pinned)
		copy(pinned.Bytes(), src)
		st, err := cp.HtoD(bg, d, pinned.Bytes())
		remove()
		if err != nil {
			return err
		}
		if st.DirectBytes != int64(size) {
			return fmt.Errorf("a pinned source was staged: %v", st)
		}
		if _, err := cp.DtoH(bg, got, d); err != nil {
			return err
		}
		if err := check("direct HtoD"); err != nil {
			return err
		}
		return errors.Join(cp.Close(bg), pinned.Free(), d.Free())
	}}
}

// registrationOp copies one large Go slice twice through a Copier with
// the registration cache: registered on the first copy, copied directly
// on the second, unregistered when the cache forgets it.
func registrationOp() op {
	return op{name: "Copier registration cache", run: func(e *env) error {
		bg := context.Background()
		cp, err := newCopier(e, e.ctx, smallRing(transfer.WithRegistrationCache(0), transfer.WithRegistrationMin(64<<10))...)
		if err != nil {
			return err
		}
		const n = 256 << 10
		d, err := devAlloc(e, e.ctx, n)
		if err != nil {
			return err
		}
		src := testutil.RandomBytes(n, 4)
		got := make([]byte, n)
		for range 2 {
			if _, err := cp.HtoD(bg, d, src); err != nil {
				return err
			}
		}
		if _, err := cp.DtoH(bg, got, d); err != nil {
			return err
		}
		if !bytes.Equal(got, src) {
			return errors.New("the data came back different")
		}
		cp.Forget(src)
		cp.Forget(got)
		return errors.Join(cp.Close(bg), d.Free())
	}}
}

// pipelineOp runs chunks through host-to-device, a kernel adding one to
// every byte, and device-to-host, over two streams.
func pipelineOp(name string, popts ...transfer.PipelineOption) op {
	return op{name: "Pipeline " + name, run: func(e *env) error {
		bg := context.Background()
		cp, err := newCopier(e, e.ctx, smallRing()...)
		if err != nil {
			return err
		}
		mod, err := e.ctx.LoadModule([]byte("// sweep module\n"))
		if err != nil {
			return err
		}
		e.defer_(mod.Destroy)
		f, err := mod.Function("sweep_inc")
		if err != nil {
			return err
		}
		var done int
		opts := append([]transfer.PipelineOption{
			transfer.WithChunkSize(stageSize), transfer.WithStreams(2), transfer.WithInFlight(2),
			transfer.WithWork(transfer.LaunchWork(f, cuda.D1(1), cuda.D1(32), func(ch transfer.Chunk) []any {
				return []any{ch.Dev.Ptr(), uint32(ch.Len)}
			})),
			transfer.WithDone(func(transfer.Chunk) error { done++; return nil }),
		}, popts...)
		p, err := cp.NewPipeline(opts...)
		if err != nil {
			e.defer_(func() error {
				p, err := cp.NewPipeline(opts...)
				if err != nil {
					return err
				}
				return p.Close(bg)
			})
			return err
		}
		e.defer_(func() error { return p.Close(bg) })
		in := testutil.RandomBytes(xferSize, 5)
		out := make([]byte, len(in))
		st, err := p.Run(bg, in, out)
		if err != nil {
			return err
		}
		for i := range in {
			if out[i] != in[i]+1 {
				return fmt.Errorf("byte %d: %d, want %d (%v)", i, out[i], in[i]+1, st)
			}
		}
		if done != st.Chunks || st.Chunks != (xferSize+stageSize-1)/stageSize {
			return fmt.Errorf("%d Done callbacks, %d chunks", done, st.Chunks)
		}
		return errors.Join(p.Close(bg), cp.Close(bg), mod.Destroy())
	}}
}

// errCallback is what the callbacks of pipelinePanicOp panic with.
var errCallback = errors.New("sweep: callback panicked")

// pipelinePanicOp runs a Pipeline whose Done (or work) callback panics on
// its second chunk: the panic reaches Run's caller, once the chunks in
// flight are handed off; the Pipeline then runs again, right to the byte.
func pipelinePanicOp(inWork bool) op {
	name := "Pipeline panicking Done"
	if inWork {
		name = "Pipeline panicking work"
	}
	return op{name: name, run: func(e *env) error {
		bg := context.Background()
		cp, err := newCopier(e, e.ctx, smallRing()...)
		if err != nil {
			return err
		}
		armed := true
		hook := func(ch transfer.Chunk) {
			if armed && ch.Index == 1 {
				armed = false
				panic(errCallback)
			}
		}
		opts := []transfer.PipelineOption{transfer.WithChunkSize(stageSize), transfer.WithStreams(2), transfer.WithInFlight(2)}
		if inWork {
			opts = append(opts, transfer.WithWork(func(_ *cuda.Stream, ch transfer.Chunk) error { hook(ch); return nil }))
		} else {
			opts = append(opts, transfer.WithDone(func(ch transfer.Chunk) error { hook(ch); return nil }))
		}
		p, err := cp.NewPipeline(opts...)
		if err != nil {
			e.defer_(func() error {
				p, err := cp.NewPipeline(opts...)
				if err != nil {
					return err
				}
				return p.Close(bg)
			})
			return err
		}
		e.defer_(func() error { return p.Close(bg) })
		in := testutil.RandomBytes(xferSize, 9)
		out := make([]byte, len(in))
		run := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					if r != errCallback {
						panic(r)
					}
					err = errCallback
				}
			}()
			_, err = p.Run(bg, in, out)
			return err
		}
		if err := run(); err != errCallback {
			if err == nil && armed {
				return errors.New("Run returned without calling the callback of chunk 1")
			}
			if err == nil {
				return errors.New("Run returned nil after its callback panicked")
			}
			return err // a fault stopped the Run before the callback
		}
		if err := cp.Fence(bg); err != nil {
			return err
		}
		clear(out)
		if _, err := p.Run(bg, in, out); err != nil {
			return err
		}
		if !bytes.Equal(out, in) {
			return errors.New("the Run after a panic came back different")
		}
		return errors.Join(p.Close(bg), cp.Close(bg))
	}}
}

// mappedStreamOp runs RunMapped on a stream of the caller's.
func mappedStreamOp() op {
	return op{name: "Copier RunMapped on a caller's stream", run: func(e *env) error {
		bg := context.Background()
		cp, err := newCopier(e, e.ctx, smallRing()...)
		if err != nil {
			return err
		}
		s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		e.defer_(s.Destroy)
		b, err := pinmem.Alloc(4096, pinmem.Mapped)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		if err := cp.RunMapped(bg, s, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
			return s.Memset(cuda.WrapDevicePtr(s.Context(), p, n), 0, 7, n)
		}); err != nil {
			return err
		}
		if !bytes.Equal(b.Bytes(), bytes.Repeat([]byte{7}, 4096)) {
			return errors.New("the memset did not write the mapped memory")
		}
		return errors.Join(cp.Close(bg), b.Free(), s.Destroy())
	}}
}

// mappedOp runs a kernel on a mapped buffer's device address.
func mappedOp() op {
	return op{name: "Copier RunMapped", run: func(e *env) error {
		bg := context.Background()
		cp, err := newCopier(e, e.ctx, smallRing()...)
		if err != nil {
			return err
		}
		b, err := pinmem.Alloc(4096, pinmem.Mapped)
		if err != nil {
			return err
		}
		e.defer_(b.Free)
		mod, err := e.ctx.LoadModule([]byte("// sweep module\n"))
		if err != nil {
			return err
		}
		e.defer_(mod.Destroy)
		f, err := mod.Function("sweep_fill")
		if err != nil {
			return err
		}
		if err := cp.RunMapped(bg, nil, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
			return f.Launch(s, cuda.D1(1), cuda.D1(32), 0, p, uint32(9))
		}); err != nil {
			return err
		}
		if !bytes.Equal(b.Bytes()[:16], bytes.Repeat([]byte{9}, 16)) {
			return errors.New("the kernel did not write the mapped memory")
		}
		return errors.Join(cp.Close(bg), mod.Destroy(), b.Free())
	}}
}

// multiOp broadcasts to, scatters to and gathers from both devices; the
// devices' transfers run concurrently.
func multiOp() op {
	return op{name: "Multi", concurrent: true, run: func(e *env) error {
		bg := context.Background()
		dev1, err := cuda.GetDevice(1)
		if err != nil {
			return err
		}
		ctx1, err := dev1.PrimaryContext()
		if err != nil {
			return err
		}
		ctxs := []*cuda.Context{e.ctx, ctx1}
		m, err := transfer.NewMulti(ctxs, smallRing()...)
		if err != nil {
			e.defer_(func() error {
				m, err := transfer.NewMulti(ctxs, smallRing()...)
				if err != nil {
					return err
				}
				return m.Close(bg)
			})
			return err
		}
		e.defer_(func() error { return m.Close(bg) })
		var dsts []*cuda.DeviceBuffer
		for _, c := range ctxs {
			d, err := devAlloc(e, c, xferSize)
			if err != nil {
				return err
			}
			dsts = append(dsts, d)
		}
		src := testutil.RandomBytes(xferSize, 6)
		if _, err := m.Broadcast(bg, dsts, src); err != nil {
			return err
		}
		got := [][]byte{make([]byte, xferSize), make([]byte, xferSize)}
		if _, err := m.Gather(bg, got, dsts); err != nil {
			return err
		}
		for i := range got {
			if !bytes.Equal(got[i], src) {
				return fmt.Errorf("device %d: Broadcast then Gather changed the data", i)
			}
		}
		srcs := [][]byte{testutil.RandomBytes(xferSize, 7), testutil.RandomBytes(xferSize, 8)}
		if _, err := m.Scatter(bg, dsts, srcs); err != nil {
			return err
		}
		for i, d := range dsts {
			if _, err := d.ReadAt(got[i], 0); err != nil {
				return err
			}
		}
		for i := range got {
			if !bytes.Equal(got[i], srcs[i]) {
				return fmt.Errorf("device %d: Scatter then Gather changed the data", i)
			}
		}
		return errors.Join(m.Close(bg), dsts[0].Free(), dsts[1].Free())
	}}
}

func TestSweepTransfer(t *testing.T) {
	sweep(t, []op{
		copierOp("defaults", xferSize, func(*env) ([]transfer.Option, error) { return smallRing(), nil }),
		copierOp("stats, sleep", stageSize+4096, func(*env) ([]transfer.Option, error) {
			return smallRing(transfer.WithStats(true), transfer.WithWait(transfer.WaitSleep)), nil
		}),
		copierOp("borrowed stream, portable stages", stageSize+4096, func(e *env) ([]transfer.Option, error) {
			s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
			if err != nil {
				return nil, err
			}
			e.defer_(s.Destroy)
			return smallRing(transfer.WithStream(s), transfer.WithStageFlags(pinmem.Portable)), nil
		}),
		// Up to 64 KiB a pageable transfer goes through one stage on the
		// caller's goroutine (the single-stage path).
		copierOp("one stage", 16<<10, func(*env) ([]transfer.Option, error) { return smallRing(), nil }),
		copierOp("one stage, stats, sleep", 16<<10, func(*env) ([]transfer.Option, error) {
			return smallRing(transfer.WithStats(true), transfer.WithWait(transfer.WaitSleep)), nil
		}),
		// A staged transfer that one stage holds takes one stage before
		// the ring.
		copierOp("staged in one stage", stageSize, func(*env) ([]transfer.Option, error) {
			return smallRing(), nil
		}),
		registrationOp(),
		pipelineOp("unordered"),
		pipelineOp("ordered, pinned stages", transfer.WithOrdered(true), transfer.WithPinStages(true)),
		pipelinePanicOp(false),
		pipelinePanicOp(true),
		mappedOp(),
		mappedStreamOp(),
		multiOp(),
	})
}
