package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// These tests run the cuda package's logic (argument checks, lifecycles,
// borrowed objects, ordering, data flow through the driver interface) on
// the fake driver, on every machine. What they show about the GPU itself
// is nothing: the GPU tests in gpu_test.go do that.

func TestFakeDevicesAndProperties(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{
		{Name: "A", PCIBusID: "0000:1b:00.0"},
		{Name: "B", PCIBusID: "0000:3d:00.0", Attrs: map[cudadrv.DeviceAttribute]int{cudadrv.AttrIntegrated: 1, cudadrv.AttrNUMAConfig: 1, cudadrv.AttrNUMAID: 3}},
	}})
	if v, err := cuda.DriverVersion(); err != nil || v != fakedrv.DriverVersion {
		t.Fatalf("DriverVersion = %d, %v", v, err)
	}
	devs, err := cuda.Devices()
	if err != nil || len(devs) != 2 {
		t.Fatalf("Devices = %v, %v", devs, err)
	}
	again, err := cuda.GetDevice(1)
	if err != nil || again != devs[1] {
		t.Errorf("GetDevice(1) = %p, %v; want the same *Device as Devices()[1] (%p)", again, err, devs[1])
	}
	for _, bad := range []int{-1, 2} {
		if _, err := cuda.GetDevice(bad); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("GetDevice(%d) = %v, want ErrInvalidValue", bad, err)
		}
	}
	p, err := devs[1].Properties()
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "B" || p.PCIBusID != "0000:3d:00.0" || !p.Integrated || p.NUMAID != 3 || p.HostNUMAID != 0 || p.Multiprocessors != 132 || !p.CanMapHostMemory {
		t.Errorf("properties %+v do not reflect the device", p)
	}
	if p0, _ := devs[0].Properties(); p0.NUMAID != -1 || p0.Integrated {
		t.Errorf("device 0: %+v", p0)
	}
	if devs[0].Ordinal() != 0 || devs[1].String() != "cuda device 1" {
		t.Errorf("Ordinal/String: %d %q", devs[0].Ordinal(), devs[1].String())
	}
}

func TestFakeNoDevice(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{}})
	if _, err := cuda.GetDevice(0); !errors.Is(err, cuda.ErrNoDevice) {
		t.Errorf("GetDevice with no devices = %v, want ErrNoDevice", err)
	}
}

func TestFakeLifecyclesAndBorrowed(t *testing.T) {
	fd, ctx := fakeContext(t)
	if ctx.Borrowed() || ctx.Device() == nil || ctx.Handle() == 0 {
		t.Errorf("primary context: borrowed %v, device %v, handle %#x", ctx.Borrowed(), ctx.Device(), ctx.Handle())
	}
	free, total, err := ctx.MemInfo()
	if err != nil || free == 0 || free > total {
		t.Errorf("MemInfo = %d/%d, %v", free, total, err)
	}
	must(t, ctx.Synchronize(context.Background()))
	must(t, ctx.Do(func() error { return nil }))
	want := errors.New("from fn")
	if err := ctx.Do(func() error { return want }); err != want {
		t.Errorf("Do returned %v, want fn's error", err)
	}

	s, err := ctx.NewStream(cuda.StreamBlocking)
	must(t, err)
	if s.Context() != ctx || s.Handle() == 0 {
		t.Errorf("stream context/handle wrong")
	}
	e, err := ctx.NewEvent(cuda.EventBlockingSync)
	must(t, err)
	b, err := ctx.Alloc(4096)
	must(t, err)
	m, err := ctx.LoadModule([]byte("// ptx"))
	must(t, err)
	if m.Handle() == 0 {
		t.Error("module handle is 0")
	}

	// Borrowed objects are used, never released.
	bs := cuda.WrapStream(ctx, s.Handle())
	be := cuda.WrapEvent(ctx, e.Handle())
	bb := cuda.WrapDevicePtr(ctx, b.Ptr(), b.Size())
	bc := cuda.WrapContext(ctx.Device(), ctx.Handle())
	if !bb.Borrowed() || !bc.Borrowed() {
		t.Error("wrapped objects should report borrowed")
	}
	must(t, be.Record(bs))
	must(t, bs.Synchronize(context.Background()))
	for name, err := range map[string]error{"stream": bs.Destroy(), "event": be.Destroy(), "memory": bb.Free(), "context": bc.Destroy()} {
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("releasing a borrowed %s = %v, want ErrInvalidValue", name, err)
		}
	}

	must(t, m.Destroy())
	must(t, e.Destroy())
	must(t, b.Free())
	must(t, s.Destroy())
	for name, err := range map[string]error{
		"unload twice":         m.Destroy(),
		"destroy event twice":  e.Destroy(),
		"free twice":           b.Free(),
		"destroy stream twice": s.Destroy(),
		"use stream after":     s.Synchronize(context.Background()),
		"use event after":      e.Record(bs),
		"query event after":    func() error { _, err := e.Query(); return err }(),
		"function after":       func() error { _, err := m.Function("x"); return err }(),
		"write after free":     errOf(b.WriteAt([]byte{1}, 0)),
	} {
		if !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("%s = %v, want ErrInvalidHandle", name, err)
		}
	}
	if l := fd.Live(); l.Streams != 0 || l.Events != 0 || l.DeviceAllocs != 0 || l.Modules != 0 {
		t.Errorf("fake driver still holds %+v", l)
	}
}

func TestFakeOwnedContext(t *testing.T) {
	fd, ctx := fakeContext(t)
	c2, err := cuda.NewContext(ctx.Device(), cuda.SchedBlockingSync|cuda.MapHost)
	must(t, err)
	if c2.Handle() == ctx.Handle() {
		t.Error("NewContext returned the primary context")
	}
	b, err := c2.Alloc(64)
	must(t, err)
	must(t, b.Free())
	must(t, c2.Destroy())
	if err := c2.Destroy(); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("second Destroy = %v", err)
	}
	if _, err := c2.Alloc(64); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("Alloc in a destroyed context = %v", err)
	}
	if fd.Live().Contexts != 0 {
		t.Errorf("context left: %+v", fd.Live())
	}
	if err := ctx.Destroy(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("destroying the primary context = %v", err)
	}
}

func TestFakeCopiesAndBounds(t *testing.T) {
	_, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	const n = 10000
	a, err := ctx.Alloc(n)
	must(t, err)
	defer a.Free()
	b, err := ctx.Alloc(n)
	must(t, err)
	defer b.Free()
	src := testutil.RandomBytes(n, 9)
	must(t, a.Memset(0x11))
	must(t, errOf(a.WriteAt(src[:n-100], 100)))
	must(t, s.CopyDtoD(b, 0, a, 0, n))
	must(t, s.Synchronize(context.Background()))
	got := make([]byte, n)
	must(t, errOf(b.ReadAt(got, 0)))
	for i := 0; i < 100; i++ {
		if got[i] != 0x11 {
			t.Fatalf("byte %d = %#x, want the memset value", i, got[i])
		}
	}
	testutil.CheckBytes(t, src[:n-100], got[100:])

	// Async, through a view, on a stream.
	view, err := b.Slice(10, 20)
	must(t, err)
	if view.Size() != 20 || view.Ptr() != b.Ptr().Add(10) || view.Context() != ctx {
		t.Errorf("view %d bytes at %#x", view.Size(), view.Ptr())
	}
	must(t, s.Memset(view, 0, 0x22, view.Size()))
	must(t, s.CopyHtoD(view, 5, []byte{1, 2, 3}))
	must(t, s.CopyDtoD(a, 0, b, 0, 64))
	out := make([]byte, 20)
	must(t, s.CopyDtoH(out, view, 0))
	must(t, s.Synchronize(context.Background()))
	want := []byte{0x22, 0x22, 0x22, 0x22, 0x22, 1, 2, 3, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22}
	testutil.CheckBytes(t, want, out)

	// Zero-length operations are no-ops; negative or out-of-range ones are typed errors.
	must(t, errOf(a.WriteAt(nil, 0)))
	must(t, errOf(a.ReadAt(nil, 0)))
	must(t, s.CopyHtoD(a, 0, nil))
	must(t, s.CopyDtoH(nil, a, 0))
	must(t, s.CopyDtoD(a, 0, b, 0, 0))
	must(t, s.Memset(a, 0, 0, 0))
	for name, err := range map[string]error{
		"s dtod -1":      s.CopyDtoD(a, 0, b, 0, -1),
		"s memset -1":    s.Memset(a, 0, 0, -1),
		"write past end": errOf(a.WriteAt([]byte{1}, int64(n))),
		"read -1":        errOf(a.ReadAt(make([]byte, 1), -1)),
		"alloc -5":       func() error { _, err := ctx.Alloc(-5); return err }(),
		"slice past end": func() error { _, err := a.Slice(n, 1); return err }(),
	} {
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s = %v, want ErrInvalidValue", name, err)
		}
	}
}

func TestFakeEventsOrderAndTiming(t *testing.T) {
	fd, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	d, err := ctx.Alloc(16)
	must(t, err)
	defer d.Free()
	start, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	defer start.Destroy()
	end, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	defer end.Destroy()

	must(t, fd.HoldStream(cudadrv.Stream(s.Handle())))
	must(t, start.Record(s))
	must(t, s.Memset(d, 0, 7, 16))
	must(t, end.Record(s))
	if done, err := end.Query(); done || err != nil {
		t.Errorf("event behind a held stream: done %v, %v", done, err)
	}
	if done, err := s.Query(); done || err != nil {
		t.Errorf("held stream: done %v, %v", done, err)
	}
	released := make(chan error, 1)
	go func() { released <- fd.ReleaseStream(cudadrv.Stream(s.Handle())) }()
	must(t, end.Synchronize(context.Background()))
	must(t, <-released)
	if done, err := end.Query(); !done || err != nil {
		t.Errorf("after Synchronize: done %v, %v", done, err)
	}
	if el, err := end.Elapsed(start); err != nil || el < 0 {
		t.Errorf("Elapsed = %v, %v", el, err)
	}
	// A second stream waits for an event of the first.
	s2, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s2.Destroy()
	must(t, s2.WaitEvent(end))
	out := make([]byte, 16)
	must(t, s2.CopyDtoH(out, d, 0))
	must(t, s2.Synchronize(context.Background()))
	for i, v := range out {
		if v != 7 {
			t.Fatalf("byte %d = %d after waiting for the event", i, v)
		}
	}
}

func TestFakeLaunchArguments(t *testing.T) {
	fd, ctx := fakeContext(t)
	var seen struct {
		p    cudadrv.DevicePtr
		n    uint64
		b    uint8
		f    uint32
		i16  uint16
		flag uint32
	}
	fd.RegisterKernel("args", []int{8, 8, 1, 4, 2, 4}, func(k *fakedrv.KernelCall) error {
		seen.p, seen.n = k.Ptr(0), k.Uint64(1)
		seen.b = k.Arg(2)[0]
		seen.f = k.Uint32(3)
		seen.i16 = binary.LittleEndian.Uint16(k.Arg(4))
		seen.flag = k.Uint32(5)
		return nil
	})
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	m, err := ctx.LoadModule([]byte("// ptx"))
	must(t, err)
	defer m.Destroy()
	f, err := m.Function("args")
	must(t, err)
	if f.Name() != "args" || f.Handle() == 0 {
		t.Errorf("function %q handle %#x", f.Name(), f.Handle())
	}
	must(t, f.Launch(s, cuda.D1(1), cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, cuda.DevicePtr(0x1234), uint64(1<<40), uint8(200), float32(1.5), int16(-2), true))
	must(t, s.Synchronize(context.Background()))
	if seen.p != 0x1234 || seen.n != 1<<40 || seen.b != 200 || seen.f != 0x3fc00000 || seen.i16 != 0xfffe || seen.flag != 1 {
		t.Errorf("kernel saw %+v", seen)
	}
	too := make([]any, 65)
	for i := range too {
		too[i] = 1
	}
	for name, err := range map[string]error{
		"empty grid":     f.Launch(s, cuda.Dim3{}, cuda.D1(1), 0),
		"empty block":    f.Launch(s, cuda.D1(1), cuda.Dim3{X: 1}, 0),
		"too many args":  f.Launch(s, cuda.D1(1), cuda.D1(1), 0, too...),
		"slice argument": f.Launch(s, cuda.D1(1), cuda.D1(1), 0, []byte{1}),
	} {
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s = %v, want ErrInvalidValue", name, err)
		}
	}
}
