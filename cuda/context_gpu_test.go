package cuda_test

import (
	"context"
	"runtime"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// Stream work skips cuCtxSetCurrent and relies on the driver to reject it
// when another context is current. This checks, on the real driver, that the
// work is right whatever is current on the calling thread: another context,
// no context, or the stream's own.
func TestGPUStreamWorkUnderAnyCurrentContext(t *testing.T) {
	ctx := gpuContext(t)
	drv, err := cudadrv.Get()
	must(t, err)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	mod, err := ctx.LoadModule(kernels.PTX())
	must(t, err)
	defer mod.Destroy()
	fill, err := mod.Function(kernels.KernelFill)
	must(t, err)
	other, err := cuda.NewContext(ctx.Device(), cuda.SchedAuto)
	must(t, err)
	defer other.Destroy()

	const n = 1 << 20
	d, err := ctx.Alloc(n)
	must(t, err)
	defer d.Free()
	in := pinnedHost(t, ctx, n)
	out := pinnedHost(t, ctx, n)
	ev, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	defer ev.Destroy()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, cur := range []struct {
		name string
		h    cudadrv.Context
	}{{"other context", cudadrv.Context(other.Handle())}, {"no context", 0}, {"own context", cudadrv.Context(ctx.Handle())}} {
		must(t, drv.CtxSetCurrent(cur.h))
		copy(in, testutil.RandomBytes(n, uint64(len(cur.name))))
		testutil.Poison(out)
		must(t, s.Memset(d, 0, 0, n))
		must(t, s.CopyHtoD(d, 0, in))
		must(t, s.CopyDtoH(out, d, 0))
		must(t, ev.Record(s))
		must(t, ev.Synchronize(context.Background()))
		if done, err := s.Query(); !done || err != nil {
			t.Errorf("%s: Query = %v, %v", cur.name, done, err)
		}
		testutil.CheckBytes(t, in, out)

		seed := uint32(len(cur.name))
		must(t, fill.Launch(s, cuda.D1(64), cuda.D1(256), 0, d.Ptr(), uint64(n/4), seed))
		must(t, s.CopyDtoH(out, d, 0))
		must(t, s.Synchronize(context.Background()))
		w := unsafe.Slice((*uint32)(unsafe.Pointer(&out[0])), n/4)
		if bad := kernels.VerifyPattern(w, seed, 0); bad >= 0 {
			t.Errorf("%s: kernel output wrong at word %d", cur.name, bad)
		}
		// Synchronous copies enter ctx and leave.
		must(t, errOf(d.WriteAt(in, 0)))
		testutil.Poison(out)
		must(t, errOf(d.ReadAt(out, 0)))
		testutil.CheckBytes(t, in, out)
		// The caller's context is current afterwards: the fast path leaves
		// the thread's context alone, and entering ctx (a rejected call's
		// retry, a synchronous copy) puts the previous one back.
		c, err := drv.CtxGetCurrent()
		must(t, err)
		if c != cur.h {
			t.Errorf("with %s current before the calls, %#x is current after (primary %#x, other %#x)", cur.name, uintptr(c), ctx.Handle(), other.Handle())
		}
	}
}

// BenchmarkIssueBreakdown splits the cost of issuing a 4 KiB async H2D
// copy: the driver call alone through pinmem's trampoline and through
// purego.SyscallN, with the context current on the thread and with none,
// cuCtxGetCurrent both ways (the call overhead with next to no driver
// work), the copy with a cuCtxSetCurrent before it (what every call cost
// before the stream fast path), cuCtxSetCurrent alone, and the public
// Stream.CopyHtoD on an unlocked goroutine, with the context current, and
// with none.
func BenchmarkIssueBreakdown(b *testing.B) {
	ctx := gpuContext(b)
	drv, err := cudadrv.Get()
	if err != nil {
		b.Fatal(err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	d, err := ctx.Alloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free()
	host := pinnedHost(b, ctx, 4096)
	hp := unsafe.Pointer(&host[0])
	cs := cudadrv.Stream(s.Handle())
	cc := cudadrv.Context(ctx.Handle())
	dp := cudadrv.DevicePtr(d.Ptr())
	raw := func() error { return drv.MemcpyHtoDAsync(dp, hp, 4096, cs) }
	public := func() error { return s.CopyHtoD(d, 0, host) }
	getCurrent := func() error { _, err := drv.CtxGetCurrent(); return err }
	// thread: "" runs on whatever thread the benchmark goroutine gets (it is
	// not locked; the context is current there only if an earlier call on
	// that thread made it so); "ctx" locks it with the context current;
	// "none" locks it with no context current.
	cases := []struct {
		name   string
		fn     func() error
		purego bool // route the driver calls through purego.SyscallN
		thread string
	}{
		{"raw-async", raw, false, "ctx"},
		{"raw-async-purego", raw, true, "ctx"},
		{"raw-async-nocurrent", raw, false, "none"},
		{"raw-getcurrent", getCurrent, false, "ctx"},
		{"raw-getcurrent-purego", getCurrent, true, "ctx"},
		{"raw-set+async", func() error {
			if err := drv.CtxSetCurrent(cc); err != nil {
				return err
			}
			return raw()
		}, false, "ctx"},
		{"raw-set", func() error { return drv.CtxSetCurrent(cc) }, false, "ctx"},
		{"public-async", public, false, ""},
		{"public-async-current", public, false, "ctx"},
		{"public-async-nocurrent", public, false, "none"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if c.purego && !cudadrv.PuregoSwitch {
				b.Skip("the purego call path exists only with -tags pinmem_purego")
			}
			prev := cudadrv.UsePuregoCalls(c.purego)
			defer cudadrv.UsePuregoCalls(prev)
			if c.thread != "" {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				want := cc
				if c.thread == "none" {
					want = 0
				}
				if err := drv.CtxSetCurrent(want); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < b.N; i++ {
				if err := c.fn(); err != nil {
					b.Fatal(err)
				}
				if i%callBatch == callBatch-1 {
					b.StopTimer()
					if err := s.Synchronize(context.Background()); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
			b.StopTimer()
			if err := s.Synchronize(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
