package fakedrv_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// newDrv returns a fake for t with device 0's primary context current on
// the test's goroutine, which it locks to its OS thread (the fake, like
// CUDA, keeps the current context per thread).
func newDrv(t *testing.T, opts fakedrv.Options) *fakedrv.Driver {
	t.Helper()
	d := fakedrv.New(opts)
	runtime.LockOSThread()
	var primary bool
	if n, _ := d.DeviceGetCount(); n > 0 {
		c := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(0))
		ok(t, d.CtxSetCurrent(c))
		primary = true
	}
	t.Cleanup(func() {
		defer runtime.UnlockOSThread()
		d.ClearFaults()
		if primary {
			ok(t, d.DevicePrimaryCtxRelease(0))
		}
		if err := d.Leaks(); err != nil {
			t.Errorf("leaks at end of test: %v", err)
		}
		d.Close()
	})
	return d
}

// inCtx runs fn on the calling goroutine, locked to its thread, with device
// 0's primary context of d current (the caller holds a reference to it).
func inCtx(t *testing.T, d *fakedrv.Driver, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(0))
	defer d.DevicePrimaryCtxRelease(0)
	if err := d.CtxSetCurrent(c); err != nil {
		t.Error(err)
		return
	}
	fn()
}

func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitBlocked returns once a call of op is blocked on held work of stream
// h (of any stream when all is true).
func waitBlocked(d *fakedrv.Driver, h cudadrv.Stream, all bool, op string) {
	for {
		changed := d.Changed()
		if got, _, _ := d.Blocked(h, all, -1); got == op {
			return
		}
		<-changed
	}
}

// wantCode checks that err is a *cudadrv.Error with the code and the names
// the real binding would give.
func wantCode(t *testing.T, err error, op string, code cudadrv.Result) {
	t.Helper()
	var e *cudadrv.Error
	if !errors.As(err, &e) {
		t.Fatalf("want *cudadrv.Error %d from %s, got %v", code, op, err)
	}
	if e.Code != code || (op != "" && e.Op != op) {
		t.Fatalf("want %s code %d, got %v", op, code, err)
	}
	if !strings.HasPrefix(e.Name, "CUDA_ERROR_") || e.Detail == "" {
		t.Fatalf("error lacks name or detail: %#v", e)
	}
}

var _ cudadrv.Driver = fakedrv.New(fakedrv.Options{})

func TestDevices(t *testing.T) {
	d := newDrv(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{
		{Name: "A", TotalMem: 1 << 30, PCIBusID: "0000:41:00.0"},
		{Name: "B", Attrs: map[cudadrv.DeviceAttribute]int{cudadrv.AttrIntegrated: 1, cudadrv.AttrComputeCapabilityMajor: 8}},
	}})
	if v := must[int](t)(d.DriverGetVersion()); v != 13000 {
		t.Errorf("version %d", v)
	}
	if n := must[int](t)(d.DeviceGetCount()); n != 2 {
		t.Fatalf("count %d", n)
	}
	dev1 := must[cudadrv.Device](t)(d.DeviceGet(1))
	if name := must[string](t)(d.DeviceGetName(dev1)); name != "B" {
		t.Errorf("name %q", name)
	}
	if v := must[int](t)(d.DeviceGetAttribute(cudadrv.AttrIntegrated, dev1)); v != 1 {
		t.Errorf("integrated %d", v)
	}
	if v := must[int](t)(d.DeviceGetAttribute(cudadrv.AttrComputeCapabilityMajor, dev1)); v != 8 {
		t.Errorf("cc major %d", v)
	}
	if v := must[int](t)(d.DeviceGetAttribute(cudadrv.AttrAsyncEngineCount, 0)); v != 2 {
		t.Errorf("default async engines %d", v)
	}
	if v := must[int](t)(d.DeviceGetAttribute(cudadrv.AttrPCIBusID, 0)); v != 0x41 {
		t.Errorf("pci bus attr %#x", v)
	}
	if v := must[uint64](t)(d.DeviceTotalMem(0)); v != 1<<30 {
		t.Errorf("total %d", v)
	}
	if s := must[string](t)(d.DeviceGetPCIBusID(0)); s != "0000:41:00.0" {
		t.Errorf("bus id %q", s)
	}
	_, err := d.DeviceGet(2)
	wantCode(t, err, "cuDeviceGet", cudadrv.ErrorInvalidDevice)
	if !errors.Is(err, cudadrv.ErrNoDevice) {
		t.Errorf("invalid device should match ErrNoDevice: %v", err)
	}
	_, err = d.DeviceGetName(-1)
	wantCode(t, err, "cuDeviceGetName", cudadrv.ErrorInvalidDevice)

	none := newDrv(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{}})
	if n := must[int](t)(none.DeviceGetCount()); n != 0 {
		t.Errorf("no-device count %d", n)
	}
	three := newDrv(t, fakedrv.Options{DeviceCount: 3})
	if n := must[int](t)(three.DeviceGetCount()); n != 3 {
		t.Errorf("count %d", n)
	}
}

func TestContexts(t *testing.T) {
	d := newDrv(t, fakedrv.Options{DeviceCount: 2})
	c1 := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(1))
	c2 := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(1))
	if c1 != c2 || c1 == 0 {
		t.Fatalf("primary contexts %#x %#x", c1, c2)
	}
	if d.PrimaryRefs(1) != 2 {
		t.Fatalf("refs %d", d.PrimaryRefs(1))
	}
	ok(t, d.CtxSetCurrent(c1))
	if c := must[cudadrv.Context](t)(d.CtxGetCurrent()); c != c1 {
		t.Fatalf("current %#x", c)
	}
	// Memory is accounted to the current device.
	p := must[cudadrv.DevicePtr](t)(d.MemAlloc(1000))
	if a := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrDeviceOrdinal, p)); a != 1 {
		t.Errorf("ordinal %d", a)
	}
	ok(t, d.MemFree(p))
	ok(t, d.DevicePrimaryCtxRelease(1))
	ok(t, d.DevicePrimaryCtxRelease(1))
	wantCode(t, d.DevicePrimaryCtxRelease(1), "cuDevicePrimaryCtxRelease_v2", cudadrv.ErrorInvalidContext)
	if c := must[cudadrv.Context](t)(d.CtxGetCurrent()); c != 0 {
		t.Errorf("released primary still current: %#x", c)
	}
	wantCode(t, d.CtxSetCurrent(c1), "cuCtxSetCurrent", cudadrv.ErrorInvalidContext)

	c := must[cudadrv.Context](t)(d.CtxCreate(cudadrv.CtxMapHost, 0))
	if cur := must[cudadrv.Context](t)(d.CtxGetCurrent()); cur != c {
		t.Errorf("CtxCreate did not make the context current")
	}
	if d.Live().Contexts != 1 {
		t.Errorf("contexts %d", d.Live().Contexts)
	}
	ok(t, d.CtxDestroy(c))
	wantCode(t, d.CtxDestroy(c), "cuCtxDestroy_v2", cudadrv.ErrorInvalidContext)
	wantCode(t, d.CtxDestroy(c1), "cuCtxDestroy_v2", cudadrv.ErrorInvalidContext)
	ok(t, d.CtxSetCurrent(0))
}

func TestHostAlloc(t *testing.T) {
	d := newDrv(t, fakedrv.Options{HostAllocLimit: 1 << 20})
	p := must[unsafe.Pointer](t)(d.MemHostAlloc(4096, cudadrv.MemHostAllocDeviceMap|cudadrv.MemHostAllocPortable))
	// Real, writable memory.
	b := unsafe.Slice((*byte)(p), 4096)
	for i := range b {
		b[i] = byte(i)
	}
	if f := must[uint32](t)(d.MemHostGetFlags(unsafe.Add(p, 100))); f != cudadrv.MemHostAllocDeviceMap|cudadrv.MemHostAllocPortable {
		t.Errorf("flags %#x", f)
	}
	dp := must[cudadrv.DevicePtr](t)(d.MemHostGetDevicePointer(p, 0))
	if uintptr(dp) != uintptr(p) {
		t.Errorf("device pointer %#x of %p", dp, p)
	}
	_, err := d.MemHostGetDevicePointer(p, 1)
	wantCode(t, err, "cuMemHostGetDevicePointer_v2", cudadrv.ErrorInvalidValue)
	if mt := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrMemoryType, dp)); mt != cudadrv.MemoryTypeHost {
		t.Errorf("memory type %d", mt)
	}
	if c := d.Live(); c.HostAllocs != 1 || c.HostAllocBytes != 4096 {
		t.Errorf("live %+v", c)
	}
	// Registering allocated memory overlaps.
	wantCode(t, d.MemHostRegister(unsafe.Add(p, 8), 8, 0), "cuMemHostRegister_v2", cudadrv.ErrorHostMemoryAlreadyRegistered)

	q := must[unsafe.Pointer](t)(d.MemHostAlloc(100, 0))
	_, err = d.MemHostGetDevicePointer(q, 0)
	wantCode(t, err, "cuMemHostGetDevicePointer_v2", cudadrv.ErrorInvalidValue)

	_, err = d.MemHostAlloc(1<<20, 0)
	wantCode(t, err, "cuMemHostAlloc", cudadrv.ErrorOutOfMemory)
	if !errors.Is(err, cudadrv.ErrOutOfMemory) {
		t.Errorf("not ErrOutOfMemory: %v", err)
	}
	_, err = d.MemHostAlloc(0, 0)
	wantCode(t, err, "cuMemHostAlloc", cudadrv.ErrorInvalidValue)
	_, err = d.MemHostAlloc(10, 0x80)
	wantCode(t, err, "cuMemHostAlloc", cudadrv.ErrorInvalidValue)

	wantCode(t, d.MemFreeHost(unsafe.Add(p, 1)), "cuMemFreeHost", cudadrv.ErrorInvalidValue)
	ok(t, d.MemFreeHost(p))
	wantCode(t, d.MemFreeHost(p), "cuMemFreeHost", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemFreeHost(nil), "cuMemFreeHost", cudadrv.ErrorInvalidValue)
	ok(t, d.MemFreeHost(q))
}

func TestRegister(t *testing.T) {
	d := newDrv(t, fakedrv.Options{RegisterLimit: 1 << 16})
	buf := make([]byte, 8192)
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	p := unsafe.Pointer(&buf[0])
	ok(t, d.MemHostRegister(p, 4096, cudadrv.MemHostRegisterDeviceMap))
	wantCode(t, d.MemHostRegister(unsafe.Add(p, 4095), 10, 0), "cuMemHostRegister_v2", cudadrv.ErrorHostMemoryAlreadyRegistered)
	err := d.MemHostRegister(p, 4096, 0)
	if !errors.Is(err, cudadrv.ErrAlreadyRegistered) {
		t.Fatalf("want ErrAlreadyRegistered, got %v", err)
	}
	// Adjacent is fine.
	ok(t, d.MemHostRegister(unsafe.Add(p, 4096), 4096, 0))
	if dp := must[cudadrv.DevicePtr](t)(d.MemHostGetDevicePointer(unsafe.Add(p, 10), 0)); uintptr(dp) != uintptr(p)+10 {
		t.Errorf("device pointer %#x", dp)
	}
	_, err = d.MemHostGetDevicePointer(unsafe.Add(p, 4096), 0)
	wantCode(t, err, "cuMemHostGetDevicePointer_v2", cudadrv.ErrorInvalidValue)
	_, err = d.MemHostGetFlags(p)
	wantCode(t, err, "cuMemHostGetFlags", cudadrv.ErrorInvalidValue)
	if c := d.Live(); c.Registrations != 2 || c.RegisteredBytes != 8192 {
		t.Errorf("live %+v", c)
	}
	wantCode(t, d.MemHostRegister(nil, 10, 0), "cuMemHostRegister_v2", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemHostRegister(p, 0, 0), "", cudadrv.ErrorInvalidValue)
	big := make([]byte, 1<<16)
	pin.Pin(&big[0])
	wantCode(t, d.MemHostRegister(unsafe.Pointer(&big[0]), 1<<16, 0), "", cudadrv.ErrorOutOfMemory)

	err = d.MemHostUnregister(unsafe.Add(p, 1))
	wantCode(t, err, "cuMemHostUnregister", cudadrv.ErrorHostMemoryNotRegistered)
	if !errors.Is(err, cudadrv.ErrNotRegistered) {
		t.Errorf("want ErrNotRegistered: %v", err)
	}
	ok(t, d.MemHostUnregister(p))
	wantCode(t, d.MemHostUnregister(p), "cuMemHostUnregister", cudadrv.ErrorHostMemoryNotRegistered)
	ok(t, d.MemHostUnregister(unsafe.Add(p, 4096)))

	nosup := newDrv(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{{Attrs: map[cudadrv.DeviceAttribute]int{
		cudadrv.AttrHostRegisterSupported: 0}}}})
	err = nosup.MemHostRegister(p, 16, 0)
	if !errors.Is(err, cudadrv.ErrNotSupported) {
		t.Errorf("want ErrNotSupported, got %v", err)
	}
}

func TestDeviceMemory(t *testing.T) {
	d := newDrv(t, fakedrv.Options{DeviceMemLimit: 1 << 20})
	a := must[cudadrv.DevicePtr](t)(d.MemAlloc(1000))
	b := must[cudadrv.DevicePtr](t)(d.MemAlloc(1000))
	if a < 0x7f0000000000 || a%256 != 0 || b%256 != 0 || b < a+1000 {
		t.Fatalf("addresses %#x %#x", a, b)
	}
	free, total := func() (uint64, uint64) {
		f, tt, err := d.MemGetInfo()
		ok(t, err)
		return f, tt
	}()
	if free != 1<<20-2000 || total != 16<<30 {
		t.Errorf("meminfo %d %d", free, total)
	}
	src := testutil.RandomBytes(1000, 1)
	ok(t, d.MemcpyHtoD(a, unsafe.Pointer(&src[0]), 1000))
	ok(t, d.MemcpyDtoD(b, a, 1000))
	got := make([]byte, 1000)
	ok(t, d.MemcpyDtoH(unsafe.Pointer(&got[0]), b, 1000))
	testutil.CheckBytes(t, src, got)

	ok(t, d.MemsetD8(a+10, 7, 5))
	ok(t, d.MemsetD32(a+16, 0x01020304, 2))
	mem := must[[]byte](t)(d.DeviceBytes(a, 32))
	want := append([]byte(nil), src[:32]...)
	copy(want[10:15], []byte{7, 7, 7, 7, 7})
	copy(want[16:24], []byte{4, 3, 2, 1, 4, 3, 2, 1})
	testutil.CheckBytes(t, want, mem)

	wantCode(t, d.MemsetD32(a+2, 0, 1), "cuMemsetD32_v2", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemcpyDtoD(b, a+1, 1000), "cuMemcpyDtoD_v2", cudadrv.ErrorInvalidValue) // overrun
	wantCode(t, d.MemcpyHtoD(a+1000, unsafe.Pointer(&src[0]), 1), "cuMemcpyHtoD_v2", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemsetD8(0x1234, 0, 1), "cuMemsetD8_v2", cudadrv.ErrorInvalidValue)
	if attr := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrRangeStart, a+5)); attr != uint64(a) {
		t.Errorf("range start %#x", attr)
	}
	if attr := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrMemoryType, a+5)); attr != cudadrv.MemoryTypeDevice {
		t.Errorf("memory type %d", attr)
	}

	_, err := d.MemAlloc(1 << 50)
	wantCode(t, err, "cuMemAlloc_v2", cudadrv.ErrorOutOfMemory)
	_, err = d.MemAlloc(1 << 20)
	wantCode(t, err, "cuMemAlloc_v2", cudadrv.ErrorOutOfMemory)
	_, err = d.MemAlloc(0)
	wantCode(t, err, "cuMemAlloc_v2", cudadrv.ErrorInvalidValue)

	if c := d.Live(); c.DeviceAllocs != 2 || c.DeviceBytes != 2000 {
		t.Errorf("live %+v", c)
	}
	wantCode(t, d.MemFree(a+1), "cuMemFree_v2", cudadrv.ErrorInvalidValue)
	ok(t, d.MemFree(a))
	wantCode(t, d.MemFree(a), "cuMemFree_v2", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemcpyDtoH(unsafe.Pointer(&got[0]), a, 1), "cuMemcpyDtoH_v2", cudadrv.ErrorInvalidValue)
	ok(t, d.MemFree(b))
}

func TestZeroCopyThroughDevicePointer(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	h := must[unsafe.Pointer](t)(d.MemHostAlloc(64, cudadrv.MemHostAllocDeviceMap))
	dp := must[cudadrv.DevicePtr](t)(d.MemHostGetDevicePointer(h, 0))
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	ok(t, d.MemsetD8(dev, 9, 64))
	ok(t, d.MemcpyDtoD(dp, dev, 64))
	testutil.CheckBytes(t, slices.Repeat([]byte{9}, 64), unsafe.Slice((*byte)(h), 64))
	ok(t, d.MemFree(dev))
	ok(t, d.MemFreeHost(h))
}

// TestKernelMemAcrossRanges: a kernel reaches mapped host memory that
// runs from one registration into the next one right after it, as on a
// GPU; not over a gap, nor into a range registered without the device-map
// flag, nor past an allocation's end.
func TestKernelMemAcrossRanges(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	buf := make([]byte, 4*4096)
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	base := unsafe.Pointer(&buf[0])
	p := unsafe.Add(base, (4096-uintptr(base)%4096)%4096) // page-aligned, 3 pages left
	page := func(i int) unsafe.Pointer { return unsafe.Add(p, i*4096) }
	ok(t, d.MemHostRegister(page(0), 4096, cudadrv.MemHostRegisterDeviceMap))
	ok(t, d.MemHostRegister(page(1), 4096, cudadrv.MemHostRegisterDeviceMap))
	ok(t, d.MemHostRegister(page(2), 4096, 0)) // not mapped
	defer func() {
		for i := range 3 {
			ok(t, d.MemHostUnregister(page(i)))
		}
	}()
	var got []error
	d.RegisterKernel("touch", []int{8, 8}, func(k *fakedrv.KernelCall) error {
		b, err := k.Mem(k.Ptr(0), k.Uint64(1))
		if err == nil {
			for i := range b {
				b[i] = 7
			}
		}
		got = append(got, err)
		return nil
	})
	m := must[cudadrv.Module](t)(d.ModuleLoadData([]byte("\n//\n// Generated\n.version 8.0\n")))
	defer d.ModuleUnload(m)
	f := must[cudadrv.Function](t)(d.ModuleGetFunction(m, "touch"))
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	defer d.StreamDestroy(s)
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	defer d.MemFree(dev)
	launch := func(at uintptr, n uint64) error {
		got = nil
		args := [2]uint64{uint64(at), n}
		ptrs := [2]unsafe.Pointer{unsafe.Pointer(&args[0]), unsafe.Pointer(&args[1])}
		one := [3]uint32{1, 1, 1}
		ok(t, d.LaunchKernel(f, one, one, 0, s, unsafe.Pointer(&ptrs[0])))
		ok(t, d.StreamSynchronize(s))
		return got[0]
	}
	if err := launch(uintptr(page(0))+100, 4096); err != nil {
		t.Errorf("across two adjacent mapped registrations: %v", err)
	}
	testutil.CheckBytes(t, slices.Repeat([]byte{7}, 4096), unsafe.Slice((*byte)(unsafe.Add(page(0), 100)), 4096))
	if err := launch(uintptr(page(1))+100, 4096); err == nil {
		t.Error("into a registration without the device-map flag: no error")
	}
	if err := launch(uintptr(dev), 65); err == nil {
		t.Error("past a device allocation's end: no error")
	}
	ok(t, d.MemHostUnregister(page(1)))
	if err := launch(uintptr(page(0))+100, 4096); err == nil {
		t.Error("over an unregistered page: no error")
	}
	ok(t, d.MemHostRegister(page(1), 4096, cudadrv.MemHostRegisterDeviceMap))
}

func TestStreamOrderingAndHold(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	h := must[unsafe.Pointer](t)(d.MemHostAlloc(16, 0))
	hb := unsafe.Slice((*byte)(h), 16)
	copy(hb, "0123456789abcdef")
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(16))
	ev := must[cudadrv.Event](t)(d.EventCreate(0))
	ev0 := must[cudadrv.Event](t)(d.EventCreate(0))

	ok(t, d.EventQuery(ev)) // never recorded: complete
	ok(t, d.HoldStream(s))
	ok(t, d.EventRecord(ev0, s))
	ok(t, d.MemcpyHtoDAsync(dev, h, 16, s))
	ok(t, d.MemsetD8Async(dev, 'x', 4, s))
	ok(t, d.EventRecord(ev, s))
	if n := d.Pending(s); n != 4 {
		t.Fatalf("pending %d", n)
	}
	if err := d.EventQuery(ev); !errors.Is(err, cudadrv.ErrNotReady) {
		t.Fatalf("event query while held: %v", err)
	}
	wantCode(t, d.StreamQuery(s), "cuStreamQuery", cudadrv.ErrorNotReady)
	_, err := d.EventElapsedTime(ev0, ev)
	wantCode(t, err, "cuEventElapsedTime", cudadrv.ErrorNotReady)
	// Nothing ran: device memory untouched.
	testutil.CheckBytes(t, make([]byte, 16), must[[]byte](t)(d.DeviceBytes(dev, 16)))
	// The host buffer may not be reused yet; the source is read when the copy runs.
	copy(hb, "ABCDEFGHIJKLMNOP")

	done := make(chan error)
	go func() { done <- d.StreamSynchronize(s) }()
	waitBlocked(d, s, false, "cuStreamSynchronize")
	select {
	case err := <-done:
		t.Fatalf("StreamSynchronize returned while held: %v", err)
	default:
	}
	ok(t, d.ReleaseStream(s))
	ok(t, <-done)
	ok(t, d.EventQuery(ev))
	ok(t, d.StreamQuery(s))
	testutil.CheckBytes(t, []byte("xxxxEFGHIJKLMNOP"), must[[]byte](t)(d.DeviceBytes(dev, 16)))
	if ms := must[float32](t)(d.EventElapsedTime(ev0, ev)); ms < 0 {
		t.Errorf("elapsed %v", ms)
	}
	ok(t, d.EventDestroy(ev))
	ok(t, d.EventDestroy(ev0))
	wantCode(t, d.EventDestroy(ev), "cuEventDestroy_v2", cudadrv.ErrorInvalidHandle)
	ok(t, d.StreamDestroy(s))
	wantCode(t, d.StreamDestroy(s), "cuStreamDestroy_v2", cudadrv.ErrorInvalidHandle)
	wantCode(t, d.StreamSynchronize(s), "cuStreamSynchronize", cudadrv.ErrorInvalidHandle)
	ok(t, d.MemFree(dev))
	ok(t, d.MemFreeHost(h))
}

func TestStreamWaitEvent(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	a := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	b := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	ev := must[cudadrv.Event](t)(d.EventCreate(cudadrv.EventDisableTiming))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(8))
	y := must[cudadrv.DevicePtr](t)(d.MemAlloc(8))
	ok(t, d.HoldStream(a))
	ok(t, d.MemsetD8Async(x, 1, 8, a))
	ok(t, d.EventRecord(ev, a))
	ok(t, d.StreamWaitEvent(b, ev, 0))
	ok(t, d.MemcpyDtoDAsync(y, x, 8, b))
	// b is not held but waits for a.
	wantCode(t, d.StreamQuery(b), "", cudadrv.ErrorNotReady)
	testutil.CheckBytes(t, make([]byte, 8), must[[]byte](t)(d.DeviceBytes(y, 8)))
	_, err := d.EventElapsedTime(ev, ev)
	wantCode(t, err, "", cudadrv.ErrorInvalidHandle) // timing disabled
	ok(t, d.ReleaseStream(a))
	ok(t, d.StreamSynchronize(b))
	testutil.CheckBytes(t, slices.Repeat([]byte{1}, 8), must[[]byte](t)(d.DeviceBytes(y, 8)))
	for _, s := range []cudadrv.Stream{a, b} {
		ok(t, d.StreamDestroy(s))
	}
	ok(t, d.EventDestroy(ev))
	ok(t, d.MemFree(x))
	ok(t, d.MemFree(y))
}

func TestLegacyDefaultStream(t *testing.T) {
	d := newDrv(t, fakedrv.Options{WaitTimeout: 50 * time.Millisecond})
	blocking := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamDefault))
	nb := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(8))
	ok(t, d.HoldStream(blocking))
	ok(t, d.MemsetD8Async(x, 1, 8, blocking))
	// Work on a non-blocking stream does not wait.
	ok(t, d.MemsetD8Async(x, 2, 4, nb))
	ok(t, d.StreamSynchronize(nb))
	// A synchronous call on the legacy stream waits for the held blocking stream: it times out.
	err := d.MemsetD8(x, 3, 8)
	wantCode(t, err, "cuMemsetD8_v2", cudadrv.ErrorLaunchTimeout)
	// Work queued on the default stream blocks a later blocking stream op too.
	ok(t, d.MemsetD8Async(x+4, 5, 4, 0))
	wantCode(t, d.StreamQuery(0), "", cudadrv.ErrorNotReady)
	ok(t, d.ReleaseStream(blocking))
	ok(t, d.CtxSynchronize())
	testutil.CheckBytes(t, []byte{1, 1, 1, 1, 5, 5, 5, 5}, must[[]byte](t)(d.DeviceBytes(x, 8)))
	ok(t, d.StreamDestroy(blocking))
	ok(t, d.StreamDestroy(nb))
	ok(t, d.MemFree(x))
}

func TestPauseAndCtxSynchronize(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(0))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(8))
	d.Pause()
	ok(t, d.MemsetD8Async(x, 1, 8, s))
	if d.Live().PendingOps != 1 {
		t.Fatalf("pending %+v", d.Live())
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		waitBlocked(d, 0, true, "cuCtxSynchronize")
		d.Resume()
	}()
	ok(t, d.CtxSynchronize())
	wg.Wait()
	testutil.CheckBytes(t, slices.Repeat([]byte{1}, 8), must[[]byte](t)(d.DeviceBytes(x, 8)))
	ok(t, d.StreamDestroy(s))
	ok(t, d.MemFree(x))
}

func TestUseAfterFreeInQueuedWork(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	h := must[unsafe.Pointer](t)(d.MemHostAlloc(64, 0))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	ok(t, d.HoldStream(s))
	ok(t, d.MemcpyDtoHAsync(h, x, 64, s))
	ok(t, d.MemFreeHost(h)) // too early: the copy has not run
	ok(t, d.ReleaseStream(s))
	err := d.StreamSynchronize(s)
	wantCode(t, err, "cuStreamSynchronize", cudadrv.ErrorIllegalAddress)
	if !strings.Contains(err.Error(), "freed") {
		t.Errorf("error does not say why: %v", err)
	}
	// On the driver an illegal address breaks the context: the error is
	// sticky, reported again by every later call in it, cuStreamQuery of
	// any stream included (not once, as an injected non-sticky fault is).
	wantCode(t, d.StreamSynchronize(s), "cuStreamSynchronize", cudadrv.ErrorIllegalAddress)
	wantCode(t, d.StreamQuery(s), "cuStreamQuery", cudadrv.ErrorIllegalAddress)
	wantCode(t, d.StreamQuery(0), "cuStreamQuery", cudadrv.ErrorIllegalAddress)
	_, err = d.MemAlloc(64)
	wantCode(t, err, "cuMemAlloc_v2", cudadrv.ErrorIllegalAddress)
	if len(d.AsyncErrors()) != 1 {
		t.Errorf("async errors %v", d.AsyncErrors())
	}
	d.ClearFaults() // the test's reset of the broken context
	ok(t, d.StreamQuery(s))
	// Device memory freed under queued work.
	ok(t, d.HoldStream(s))
	ok(t, d.MemsetD8Async(x, 0, 64, s))
	ok(t, d.MemFree(x))
	ok(t, d.ReleaseStream(s))
	wantCode(t, d.CtxSynchronize(), "cuCtxSynchronize", cudadrv.ErrorIllegalAddress)
	wantCode(t, d.CtxSynchronize(), "cuCtxSynchronize", cudadrv.ErrorIllegalAddress)
	ok(t, d.StreamDestroy(s)) // releases still work, so that a test can clean up
}

func TestPageableAsync(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(4))
	src := []byte{1, 2, 3, 4}
	ok(t, d.HoldStream(s))
	ok(t, d.MemcpyHtoDAsync(x, unsafe.Pointer(&src[0]), 4, s))
	src[0] = 99 // staged at call time: not seen
	done := make(chan error)
	dst := make([]byte, 4)
	go func() { done <- d.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), x, 4, s) }()
	waitBlocked(d, s, false, "cuMemcpyDtoHAsync_v2")
	select {
	case err := <-done:
		t.Fatalf("DtoH to pageable memory returned while the stream was held: %v", err)
	default:
	}
	ok(t, d.ReleaseStream(s))
	ok(t, <-done)
	testutil.CheckBytes(t, []byte{1, 2, 3, 4}, dst)
	if n := d.PageableAsyncCopies(); n != 2 {
		t.Errorf("pageable copies %d", n)
	}
	ok(t, d.StreamDestroy(s))
	ok(t, d.MemFree(x))
}

func TestDestroyStreamWithPendingWork(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(0))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(4))
	ev := must[cudadrv.Event](t)(d.EventCreate(0))
	ok(t, d.HoldStream(s))
	ok(t, d.MemsetD8Async(x, 6, 4, s))
	ok(t, d.EventRecord(ev, s))
	ok(t, d.StreamDestroy(s)) // work still runs
	ok(t, d.EventSynchronize(ev))
	testutil.CheckBytes(t, []byte{6, 6, 6, 6}, must[[]byte](t)(d.DeviceBytes(x, 4)))
	if d.Live().Streams != 0 || d.Live().PendingOps != 0 {
		t.Errorf("live %+v", d.Live())
	}
	ok(t, d.EventDestroy(ev))
	ok(t, d.MemFree(x))
}

func TestModulesAndKernels(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	_, err := d.ModuleLoadData(nil)
	wantCode(t, err, "cuModuleLoadData", cudadrv.ErrorInvalidValue)
	_, err = d.ModuleLoadData([]byte("garbage"))
	wantCode(t, err, "cuModuleLoadData", cudadrv.ErrorInvalidImage)
	if !errors.Is(err, cudadrv.ErrKernelImage) {
		t.Errorf("want ErrKernelImage: %v", err)
	}
	m := must[cudadrv.Module](t)(d.ModuleLoadData([]byte("\n//\n// Generated\n.version 8.0\n")))
	_, err = d.ModuleGetFunction(m, "fill")
	wantCode(t, err, "cuModuleGetFunction", cudadrv.ErrorNotFound)

	var calls int
	d.RegisterKernel("fill", []int{8, 4, 8}, func(k *fakedrv.KernelCall) error {
		calls++
		b, err := k.Mem(k.Ptr(0), k.Uint64(2))
		if err != nil {
			return err
		}
		for i := range b {
			b[i] = byte(k.Uint32(1))
		}
		return nil
	})
	d.RegisterKernel("boom", nil, func(k *fakedrv.KernelCall) error { return errors.New("boom") })
	f := must[cudadrv.Function](t)(d.ModuleGetFunction(m, "fill"))
	if f2 := must[cudadrv.Function](t)(d.ModuleGetFunction(m, "fill")); f2 != f {
		t.Errorf("function handles differ: %#x %#x", f, f2)
	}
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(16))

	// Parameters live in memory the caller frees right after the launch.
	params := must[unsafe.Pointer](t)(d.MemHostAlloc(64, 0))
	args := unsafe.Slice((*unsafe.Pointer)(params), 3)
	vals := unsafe.Add(params, 24)
	*(*uint64)(vals) = uint64(x)
	*(*uint32)(unsafe.Add(vals, 8)) = 0x42
	*(*uint64)(unsafe.Add(vals, 16)) = 16
	args[0], args[1], args[2] = vals, unsafe.Add(vals, 8), unsafe.Add(vals, 16)
	ok(t, d.HoldStream(s))
	one := [3]uint32{1, 1, 1}
	ok(t, d.LaunchKernel(f, one, [3]uint32{32, 1, 1}, 0, s, params))
	ok(t, d.MemFreeHost(params))
	if calls != 0 {
		t.Fatal("kernel ran on a held stream")
	}
	ok(t, d.ReleaseStream(s))
	ok(t, d.StreamSynchronize(s))
	if calls != 1 {
		t.Fatalf("kernel calls %d", calls)
	}
	testutil.CheckBytes(t, slices.Repeat([]byte{0x42}, 16), must[[]byte](t)(d.DeviceBytes(x, 16)))

	wantCode(t, d.LaunchKernel(f, [3]uint32{0, 1, 1}, one, 0, s, params), "cuLaunchKernel", cudadrv.ErrorInvalidValue)
	wantCode(t, d.LaunchKernel(f, one, [3]uint32{2048, 1, 1}, 0, s, params), "cuLaunchKernel", cudadrv.ErrorInvalidValue)
	wantCode(t, d.LaunchKernel(f, one, one, 0, s, nil), "cuLaunchKernel", cudadrv.ErrorInvalidValue)

	boom := must[cudadrv.Function](t)(d.ModuleGetFunction(m, "boom"))
	ok(t, d.LaunchKernel(boom, one, one, 0, s, nil))
	err = d.StreamSynchronize(s)
	wantCode(t, err, "cuStreamSynchronize", cudadrv.ErrorLaunchFailed)
	if !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Errorf("want ErrLaunchFailed: %v", err)
	}
	// A kernel's failure is sticky on a GPU: every later call in the
	// context reports it again.
	wantCode(t, d.StreamQuery(s), "cuStreamQuery", cudadrv.ErrorLaunchFailed)
	wantCode(t, d.StreamSynchronize(s), "cuStreamSynchronize", cudadrv.ErrorLaunchFailed)
	d.ClearFaults()

	ok(t, d.ModuleUnload(m))
	wantCode(t, d.LaunchKernel(f, one, one, 0, s, nil), "cuLaunchKernel", cudadrv.ErrorInvalidHandle)
	wantCode(t, d.ModuleUnload(m), "cuModuleUnload", cudadrv.ErrorInvalidHandle)
	_, err = d.ModuleGetFunction(m, "fill")
	wantCode(t, err, "cuModuleGetFunction", cudadrv.ErrorInvalidHandle)
	ok(t, d.StreamDestroy(s))
	ok(t, d.MemFree(x))
}

func TestFaultInjection(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	if err := d.FailOn("cuMemHostAloc", 1, cudadrv.ErrorOutOfMemory); err == nil {
		t.Error("unknown op accepted")
	}
	if err := d.FailOn("cuMemHostAlloc", 1, cudadrv.Success); err == nil {
		t.Error("success code accepted")
	}
	ok(t, d.FailOn("cuMemHostAlloc", 2, cudadrv.ErrorOutOfMemory))
	p := must[unsafe.Pointer](t)(d.MemHostAlloc(10, 0))
	_, err := d.MemHostAlloc(10, 0)
	wantCode(t, err, "cuMemHostAlloc", cudadrv.ErrorOutOfMemory)
	var e *cudadrv.Error
	errors.As(err, &e)
	if e.Name != "CUDA_ERROR_OUT_OF_MEMORY" || !strings.HasPrefix(e.Detail, "out of memory") {
		t.Errorf("error fields %#v", e)
	}
	q := must[unsafe.Pointer](t)(d.MemHostAlloc(10, 0)) // fired once only
	if d.Live().HostAllocs != 2 {
		t.Errorf("failed call had an effect: %+v", d.Live())
	}
	if n := d.Calls("cuMemHostAlloc"); n != 3 {
		t.Errorf("calls %d", n)
	}
	ok(t, d.MemFreeHost(p))
	ok(t, d.MemFreeHost(q))

	ok(t, d.FailOn("cuStreamCreate", 0, cudadrv.ErrorNotSupported))
	for range 3 {
		_, err := d.StreamCreate(0)
		wantCode(t, err, "cuStreamCreate", cudadrv.ErrorNotSupported)
	}
	d.ClearFaults()
	s := must[cudadrv.Stream](t)(d.StreamCreate(0))

	// Asynchronous fault: the call succeeds, the synchronization reports it.
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(8))
	h := must[unsafe.Pointer](t)(d.MemHostAlloc(8, 0))
	ok(t, d.FailAsync("cuMemcpyHtoDAsync_v2", 1, cudadrv.ErrorIllegalAddress))
	ok(t, d.MemcpyHtoDAsync(x, h, 8, s))
	wantCode(t, d.StreamSynchronize(s), "cuStreamSynchronize", cudadrv.ErrorIllegalAddress)

	var seen []string
	d.SetHook(func(op string) cudadrv.Result {
		seen = append(seen, op)
		if op == "cuEventCreate" {
			return cudadrv.ErrorInvalidContext
		}
		return cudadrv.Success
	})
	_, err = d.EventCreate(0)
	wantCode(t, err, "cuEventCreate", cudadrv.ErrorInvalidContext)
	ok(t, d.StreamSynchronize(s))
	if !slices.Equal(seen, []string{"cuEventCreate", "cuStreamSynchronize"}) {
		t.Errorf("hook saw %v", seen)
	}
	d.SetHook(nil)
	ok(t, d.StreamDestroy(s))
	ok(t, d.MemFree(x))
	ok(t, d.MemFreeHost(h))
}

// TestOpNamesMatchBinding checks that every op name the fake reports is a
// symbol of the real binding and that the fake uses each one.
func TestOpNamesMatchBinding(t *testing.T) {
	names := cudadrv.SymbolNames()
	for _, op := range fakedrv.Ops() {
		if !slices.Contains(names, op) {
			t.Errorf("op %s not in cudadrv.SymbolNames", op)
		}
	}
	// The source must use each op name as a string constant.
	var src strings.Builder
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		ok(t, err)
		src.Write(b)
	}
	for _, op := range fakedrv.Ops() {
		if !strings.Contains(src.String(), `"`+op+`"`) {
			t.Errorf("fake never names op %s", op)
		}
	}
	re := regexp.MustCompile(`"(cu[A-Z][A-Za-z0-9_]+)"`)
	for _, m := range re.FindAllStringSubmatch(src.String(), -1) {
		if !slices.Contains(names, m[1]) {
			t.Errorf("fake uses op %s, which the binding does not have", m[1])
		}
	}
}

func TestErrorNames(t *testing.T) {
	d := fakedrv.New(fakedrv.Options{})
	if d.ErrorName(cudadrv.ErrorHostMemoryAlreadyRegistered) != "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED" {
		t.Error("712 name")
	}
	if d.ErrorName(cudadrv.Result(12345)) != "" || d.ErrorString(cudadrv.Result(12345)) != "" {
		t.Error("unknown code has a name")
	}
}

func TestClose(t *testing.T) {
	d := fakedrv.New(fakedrv.Options{})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ok(t, d.CtxSetCurrent(must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(0))))
	p := must[unsafe.Pointer](t)(d.MemHostAlloc(10, 0))
	_ = p
	ok(t, d.Close())
	_, err := d.MemAlloc(1)
	wantCode(t, err, "cuMemAlloc_v2", cudadrv.ErrorDeinitialized)
	ok(t, d.Close())
}

// TestConcurrent hammers the fake from many goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inCtx(t, d, func() { hammer(t, d, g) })
		}()
	}
	wg.Wait()
}

// hammer is one goroutine of TestConcurrent: copies, memsets and events on
// its own stream, checked after each round.
func hammer(t *testing.T, d *fakedrv.Driver, g int) {
	s, err := d.StreamCreate(uint32(g % 2))
	if err != nil {
		t.Error(err)
		return
	}
	h, _ := d.MemHostAlloc(256, 0)
	x, _ := d.MemAlloc(256)
	ev, _ := d.EventCreate(0)
	want := testutil.RandomBytes(256, uint64(g))
	for i := range 50 {
		copy(unsafe.Slice((*byte)(h), 256), want)
		if i%7 == 0 {
			d.HoldStream(s)
			go d.ReleaseStream(s)
		}
		d.MemcpyHtoDAsync(x, h, 256, s)
		d.EventRecord(ev, s)
		d.MemsetD8Async(x, byte(i), 1, s)
		d.MemcpyDtoHAsync(h, x, 256, s)
		if err := d.StreamSynchronize(s); err != nil {
			t.Error(err)
		}
		d.EventQuery(ev)
		got := unsafe.Slice((*byte)(h), 256)
		if got[0] != byte(i) || testutil.FirstMismatch(want[1:], got[1:]) >= 0 {
			t.Errorf("goroutine %d iteration %d: wrong data", g, i)
			break
		}
	}
	d.EventDestroy(ev)
	d.MemFree(x)
	d.MemFreeHost(h)
	d.StreamDestroy(s)
}
