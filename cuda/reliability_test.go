//go:build linux

package cuda_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
	"golang.org/x/sys/unix"
)

func threadID() int { return unix.Gettid() }

// A failed primary-context retain is not remembered: the next call retries
// and succeeds.
func TestPrimaryContextRetriesAfterFailure(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	dev, err := cuda.GetDevice(0)
	must(t, err)
	must(t, fd.FailOn("cuDevicePrimaryCtxRetain", 1, cudadrv.ErrorOutOfMemory))
	if _, err := dev.PrimaryContext(); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("first PrimaryContext = %v, want ErrOutOfMemory", err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil || ctx == nil {
		t.Fatalf("PrimaryContext after a transient failure = %v, %v; want the context", ctx, err)
	}
	again, err := dev.PrimaryContext()
	if err != nil || again != ctx {
		t.Errorf("a third call returns %p, %v; want the same context %p", again, err, ctx)
	}
	if n := fd.Calls("cuDevicePrimaryCtxRetain"); n != 2 {
		t.Errorf("%d retains, want 2 (the failed one and one success)", n)
	}
}

// Properties are read once after a success; a failed read is not cached.
func TestPropertiesCachedOnlyOnSuccess(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	dev, err := cuda.GetDevice(0)
	must(t, err)
	must(t, fd.FailOn("cuDeviceGetAttribute", 3, cudadrv.ErrorUnknown))
	if _, err := dev.Properties(); err == nil {
		t.Fatal("Properties with a failing attribute read succeeded")
	}
	p, err := dev.Properties()
	if err != nil {
		t.Fatalf("Properties after a transient failure: %v", err)
	}
	if !p.CanMapHostMemory || !p.HostRegisterSupported || p.Multiprocessors == 0 {
		t.Errorf("properties after retry %+v: the failure leaked into them", p)
	}
	reads := fd.Calls("cuDeviceGetAttribute")
	if q, err := dev.Properties(); err != nil || q != p {
		t.Errorf("cached Properties = %+v, %v", q, err)
	}
	if n := fd.Calls("cuDeviceGetAttribute"); n != reads {
		t.Errorf("a cached read made %d attribute calls", n-reads)
	}
}

// An injected invalid-value on a core attribute is a failure, not an
// "older driver" fallback that would be cached.
func TestPropertiesCoreAttributeInvalidValueFails(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	dev, err := cuda.GetDevice(0)
	must(t, err)
	must(t, fd.FailOn("cuDeviceGetAttribute", 1, cudadrv.ErrorInvalidValue))
	if _, err := dev.Properties(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("Properties = %v, want the failure", err)
	}
	if p, err := dev.Properties(); err != nil || p.ComputeMajor == 0 {
		t.Errorf("retry = %+v, %v", p, err)
	}
}

// Using a destroyed context leaves the caller's own thread lock in place:
// enter must not release a lock level itself when the deferred Exit
// releases one too, which would undo the caller's LockOSThread.
func TestDestroyedContextKeepsCallersThreadLock(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	dev, err := cuda.GetDevice(0)
	must(t, err)
	ctx, err := cuda.NewContext(dev, 0)
	must(t, err)
	must(t, ctx.Destroy())
	stop := make(chan struct{})
	defer close(stop)
	// Other goroutines keep the scheduler busy, so that an unlocked
	// goroutine migrates between threads.
	for range 4 {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	moved := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := threadID()
		if _, err := ctx.Alloc(4096); !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("Alloc in a destroyed context = %v", err)
		}
		if err := ctx.Synchronize(context.Background()); !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("Synchronize in a destroyed context = %v", err)
		}
		n := 0
		for range 2000 {
			runtime.Gosched()
			if threadID() != tid {
				n++
			}
		}
		moved <- n
	}()
	if n := <-moved; n != 0 {
		t.Errorf("the caller's goroutine ran on another thread %d times: its LockOSThread was undone", n)
	}
}

// Entering a context puts back the context that was current before, so
// code of other libraries on the same locked thread finds its own.
func TestEnterRestoresPreviousContext(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	ctx := testutil.PrimaryContext(t)
	dev := ctx.Device()
	other, err := cuda.NewContext(dev, 0)
	must(t, err)
	defer other.Destroy()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The other library's context is current on this thread.
	must(t, fd.CtxSetCurrent(cudadrv.Context(other.Handle())))
	b, err := ctx.Alloc(4096)
	must(t, err)
	must(t, errOf(b.WriteAt([]byte{1, 2, 3}, 0)))
	must(t, ctx.Synchronize(context.Background()))
	must(t, ctx.Do(func() error { return nil }))
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	must(t, s.Destroy())
	must(t, b.Free())
	cur, err := fd.CtxGetCurrent()
	must(t, err)
	if uintptr(cur) != other.Handle() {
		t.Errorf("current context after pinmem calls is %#x, want the caller's %#x", uintptr(cur), other.Handle())
	}
	// NewContext, too, leaves the caller's context current.
	third, err := cuda.NewContext(dev, 0)
	must(t, err)
	defer third.Destroy()
	if cur, _ := fd.CtxGetCurrent(); uintptr(cur) != other.Handle() {
		t.Errorf("NewContext left %#x current, want %#x", uintptr(cur), other.Handle())
	}
}

// Methods on nil objects and nil arguments return typed errors, never
// panic.
func TestNilReceiversAndArguments(t *testing.T) {
	_, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	ev, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	defer ev.Destroy()
	var (
		nc *cuda.Context
		ns *cuda.Stream
		ne *cuda.Event
		nb *cuda.DeviceBuffer
		nm *cuda.Module
		nf *cuda.Function
		nd *cuda.Device
	)
	host := make([]byte, 8)
	dev, err := ctx.Alloc(8)
	must(t, err)
	defer dev.Free()
	cases := map[string]func() error{
		"Context.Alloc":         func() error { _, err := nc.Alloc(8); return err },
		"Context.NewStream":     func() error { _, err := nc.NewStream(0); return err },
		"Context.NewEvent":      func() error { _, err := nc.NewEvent(0); return err },
		"Context.LoadModule":    func() error { _, err := nc.LoadModule([]byte("x")); return err },
		"Context.Do":            func() error { return nc.Do(func() error { return nil }) },
		"Context.Do(nil)":       func() error { return ctx.Do(nil) },
		"Context.Synchronize":   func() error { return nc.Synchronize(context.Background()) },
		"Context.MemInfo":       func() error { _, _, err := nc.MemInfo(); return err },
		"Context.Destroy":       nc.Destroy,
		"Stream.CopyHtoD":       func() error { return ns.CopyHtoD(dev, 0, host) },
		"Stream.CopyHtoD(nil)":  func() error { return s.CopyHtoD(nb, 0, host) },
		"Stream.CopyDtoH":       func() error { return ns.CopyDtoH(host, dev, 0) },
		"Stream.CopyDtoH(nil)":  func() error { return s.CopyDtoH(host, nb, 0) },
		"Stream.CopyDtoD":       func() error { return ns.CopyDtoD(dev, 0, dev, 0, 8) },
		"Stream.CopyDtoD(nil)":  func() error { return s.CopyDtoD(dev, 0, nb, 0, 8) },
		"Stream.Memset":         func() error { return ns.Memset(dev, 0, 0, 8) },
		"Stream.Memset(nil)":    func() error { return s.Memset(nb, 0, 0, 8) },
		"Stream.Synchronize":    func() error { return ns.Synchronize(context.Background()) },
		"Stream.Query":          func() error { _, err := ns.Query(); return err },
		"Stream.WaitEvent":      func() error { return ns.WaitEvent(ev) },
		"Stream.WaitEvent(nil)": func() error { return s.WaitEvent(nil) },
		"Stream.Destroy":        ns.Destroy,
		"WrapStream(nil)":       func() error { return cuda.WrapStream(nil, 1).Synchronize(context.Background()) },
		"Event.Record":          func() error { return ne.Record(s) },
		"Event.Record(nil)":     func() error { return ev.Record(nil) },
		"Event.Synchronize":     func() error { return ne.Synchronize(context.Background()) },
		"Event.Query":           func() error { _, err := ne.Query(); return err },
		"Event.Elapsed":         func() error { _, err := ne.Elapsed(ev); return err },
		"Event.Elapsed(nil)":    func() error { _, err := ev.Elapsed(nil); return err },
		"Event.Destroy":         ne.Destroy,
		"WrapEvent(nil)":        func() error { return cuda.WrapEvent(nil, 1).Synchronize(context.Background()) },
		"DeviceBuffer.WriteAt":  func() error { _, err := nb.WriteAt(host, 0); return err },
		"DeviceBuffer.ReadAt":   func() error { _, err := nb.ReadAt(host, 0); return err },
		"DeviceBuffer.Memset":   func() error { return nb.Memset(0) },
		"DeviceBuffer.Slice":    func() error { _, err := nb.Slice(0, 1); return err },
		"DeviceBuffer.Free":     nb.Free,
		"DeviceBuffer.Err":      nb.Err,
		"WrapDevicePtr(nil)":    func() error { _, err := cuda.WrapDevicePtr(nil, 1, 8).WriteAt(host, 0); return err },
		"Module.Function":       func() error { _, err := nm.Function("k"); return err },
		"Module.Destroy":        nm.Destroy,
		"Function.Launch":       func() error { return nf.Launch(s, cuda.D1(1), cuda.D1(1), 0) },
		"Device.Name":           func() error { _, err := nd.Name(); return err },
		"Device.Attribute":      func() error { _, err := nd.Attribute(cuda.AttrIntegrated); return err },
		"Device.Properties":     func() error { _, err := nd.Properties(); return err },
		"Device.PrimaryContext": func() error { _, err := nd.PrimaryContext(); return err },
		"NewContext(nil)":       func() error { _, err := cuda.NewContext(nil, 0); return err },
		"WrapContext(nil)":      func() error { return cuda.WrapContext(nil, 1).Synchronize(context.Background()) },
	}
	for name, f := range cases {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panics: %v", name, r)
				}
			}()
			if err := f(); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s = %v, want ErrInvalidValue", name, err)
			}
		}()
	}
	// Accessors that return no error are safe on nil too.
	_ = nc.Handle() + ns.Handle() + ne.Handle() + nm.Handle() + nf.Handle()
	_, _, _ = nf.Name(), nd.Ordinal(), nd.String()
	_, _ = nc.Device(), ns.Context()
	_, _, _, _ = nb.Ptr(), nb.Size(), nb.Context(), nb.Borrowed()
}

// A release the driver refuses leaves the object held, tracked and usable,
// and the release can be retried: the books equal what the driver holds.
func TestFailedReleaseCanBeRetried(t *testing.T) {
	fd, ctx := fakeContext(t)
	b, err := ctx.Alloc(4096)
	must(t, err)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	ev, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	mod, err := ctx.LoadModule(kernels.PTX())
	must(t, err)
	own, err := cuda.NewContext(ctx.Device(), 0)
	must(t, err)
	before := len(track.Live())
	for _, c := range []struct {
		op      string
		release func() error
		use     func() error
	}{
		{"cuMemFree_v2", b.Free, func() error { _, err := b.WriteAt([]byte{1}, 0); return err }},
		{"cuStreamDestroy_v2", s.Destroy, func() error { return s.Synchronize(context.Background()) }},
		{"cuEventDestroy_v2", ev.Destroy, func() error { return ev.Record(s) }},
		{"cuModuleUnload", mod.Destroy, func() error {
			// The fake registers no kernels: any answer but "unloaded" will do.
			if _, err := mod.Function(kernels.KernelFill); err != nil && strings.Contains(err.Error(), "already unloaded") {
				return err
			}
			return nil
		}},
		{"cuCtxDestroy_v2", own.Destroy, func() error { return own.Synchronize(context.Background()) }},
	} {
		must(t, fd.FailOn(c.op, 1, cudadrv.ErrorUnknown))
		if err := c.release(); err == nil {
			t.Errorf("%s failing: release succeeded", c.op)
		}
		if n := len(track.Live()); n != before {
			t.Errorf("%s failing: %d objects tracked, want %d (the driver still holds it)", c.op, n, before)
		}
		if err := c.use(); err != nil {
			t.Errorf("%s failing: the object is no longer usable: %v", c.op, err)
		}
	}
	fd.ClearFaults()
	for _, f := range []func() error{b.Free, ev.Destroy, s.Destroy, mod.Destroy, own.Destroy} {
		must(t, f())
		before--
	}
	if n := len(track.Live()); n != before {
		t.Errorf("after the retries %d objects tracked, want %d", n, before)
	}
	if n := fd.Live(); n.DeviceAllocs != 0 || n.Streams != 0 || n.Events != 0 {
		t.Errorf("the fake still holds %+v", n)
	}
}

// An attribute newer than the driver is not asked for; one the driver's
// version defines must be read.
func TestPropertiesAttributeNewerThanDriver(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DriverVersion: 11000})
	dev, err := cuda.GetDevice(0)
	must(t, err)
	// The fake answers 1 for it whatever its version; a real 11.0 driver
	// would reject it, and Properties must not fail for that.
	if v, err := dev.Attribute(cuda.AttrReadOnlyHostRegisterSupported); err != nil || v != 1 {
		t.Fatalf("fake attribute = %d, %v", v, err)
	}
	p, err := dev.Properties()
	must(t, err)
	if p.ReadOnlyHostRegisterSupported {
		t.Error("CUDA 11.0 reported read-only registration, an 11.1 attribute")
	}
	if !p.HostRegisterSupported {
		t.Error("HostRegisterSupported lost")
	}
}
