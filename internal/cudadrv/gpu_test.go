package cudadrv_test

import (
	"errors"
	"runtime"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUSymbolsResolved checks that the real driver has every symbol pinmem binds.
func TestGPUSymbolsResolved(t *testing.T) {
	d := testutil.RequireGPU(t)
	if m := cudadrv.MissingSymbols(d); len(m) > 0 {
		t.Errorf("driver lacks %d symbol(s): %v", len(m), m)
	}
	v, err := d.DriverGetVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver version %d, %d symbols bound", v, len(cudadrv.SymbolNames()))
}

// TestGPUConformance runs the misuse checks on the real driver.
func TestGPUConformance(t *testing.T) { conformance(t, testutil.RequireGPU(t)) }

// TestFakeConformance runs the same checks on the fake, so that what the
// fake claims about the driver's errors is checked on the GPU too.
func TestFakeConformance(t *testing.T) {
	d := fakedrv.New(fakedrv.Options{})
	defer d.Close()
	conformance(t, d)
	if err := d.Leaks(); err != nil {
		t.Error(err)
	}
}

// minimalPTX is a module with no kernels; PTX ISA 8.0 (CUDA 12.0) loads on CUDA 12 and 13 drivers.
const minimalPTX = "//\n// empty module for pinmem tests\n//\n.version 8.0\n.target sm_75\n.address_size 64\n"

// primaryCurrent retains device 0's primary context and makes it current on
// the calling (locked) thread; release gives the context back. Failures
// fail tb.
func primaryCurrent(tb testing.TB, d cudadrv.Driver) (ctx cudadrv.Context, release func()) {
	tb.Helper()
	dev, err := d.DeviceGet(0)
	if err != nil {
		tb.Fatalf("DeviceGet: %v", err)
	}
	if ctx, err = d.DevicePrimaryCtxRetain(dev); err != nil {
		tb.Fatalf("DevicePrimaryCtxRetain: %v", err)
	}
	release = func() {
		if err := d.DevicePrimaryCtxRelease(dev); err != nil {
			tb.Errorf("DevicePrimaryCtxRelease: %v", err)
		}
	}
	if err := d.CtxSetCurrent(ctx); err != nil {
		release()
		tb.Fatalf("CtxSetCurrent: %v", err)
	}
	return ctx, release
}

func conformance(t *testing.T, d cudadrv.Driver) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	wantIs := func(what string, err, target error) {
		t.Helper()
		var e *cudadrv.Error
		if !errors.As(err, &e) {
			t.Errorf("%s: want a *cudadrv.Error matching %v, got %v", what, target, err)
			return
		}
		if target != nil && !errors.Is(err, target) {
			t.Errorf("%s: want %v, got %v", what, target, err)
		}
		if e.Name == "" {
			t.Errorf("%s: error has no name: %v", what, err)
		}
	}
	_, release := primaryCurrent(t, d)
	defer release()

	// Device memory misuse.
	wantIs("MemFree(bogus)", d.MemFree(0xdead0000), nil)
	_, err := d.MemAlloc(1 << 50)
	wantIs("MemAlloc(1<<50)", err, cudadrv.ErrOutOfMemory)

	// A round trip through device memory.
	const n = 1 << 16
	p, err := d.MemAlloc(n)
	check("MemAlloc", err)
	defer func() { check("MemFree", d.MemFree(p)) }()
	h, err := d.MemHostAlloc(n, 0)
	check("MemHostAlloc", err)
	defer func() { check("MemFreeHost", d.MemFreeHost(h)) }()
	hb := unsafe.Slice((*byte)(h), n)
	copy(hb, testutil.RandomBytes(n, 42))
	check("MemcpyHtoD", d.MemcpyHtoD(p, h, n))
	got := make([]byte, n)
	check("MemcpyDtoH", d.MemcpyDtoH(unsafe.Pointer(&got[0]), p, n))
	testutil.CheckBytes(t, hb, got)
	if f, err := d.MemHostGetFlags(h); err != nil {
		t.Errorf("MemHostGetFlags: %v", err)
	} else {
		t.Logf("observe: MemHostGetFlags of a flags-0 allocation = %#x", f)
	}
	_, err = d.MemHostGetDevicePointer(h, 0)
	t.Logf("observe: MemHostGetDevicePointer of memory allocated without DEVICEMAP: %v", err)
	t.Logf("observe: MemHostRegister over MemHostAlloc memory: %v", regOver(d, h))

	// Registration misuse.
	var pin runtime.Pinner
	goMem := make([]byte, 3*4096)
	pin.Pin(&goMem[0])
	defer pin.Unpin()
	base := unsafe.Pointer(&goMem[0])
	check("MemHostRegister", d.MemHostRegister(base, 4096, cudadrv.MemHostRegisterDeviceMap))
	err = d.MemHostRegister(unsafe.Add(base, 100), 100, 0)
	wantIs("MemHostRegister(overlap)", err, cudadrv.ErrAlreadyRegistered)
	dp, err := d.MemHostGetDevicePointer(base, 0)
	check("MemHostGetDevicePointer(registered, mapped)", err)
	check("MemsetD8 through the mapped pointer", d.MemsetD8(dp, 0x5a, 16))
	if goMem[0] != 0x5a || goMem[15] != 0x5a || goMem[16] != 0 {
		t.Errorf("memset through the mapped pointer wrote %x", goMem[:17])
	}
	check("MemHostUnregister", d.MemHostUnregister(base))
	err = d.MemHostUnregister(base)
	wantIs("MemHostUnregister(twice)", err, cudadrv.ErrNotRegistered)
	err = d.MemHostUnregister(unsafe.Add(base, 8192))
	wantIs("MemHostUnregister(never registered)", err, cudadrv.ErrNotRegistered)

	// Events and streams.
	ev, err := d.EventCreate(0)
	check("EventCreate", err)
	defer func() { check("EventDestroy", d.EventDestroy(ev)) }()
	check("EventQuery(never recorded)", d.EventQuery(ev))
	s, err := d.StreamCreate(cudadrv.StreamNonBlocking)
	check("StreamCreate", err)
	check("MemsetD8Async", d.MemsetD8Async(p, 1, n, s))
	check("EventRecord", d.EventRecord(ev, s))
	check("EventSynchronize", d.EventSynchronize(ev))
	check("EventQuery", d.EventQuery(ev))
	check("StreamQuery", d.StreamQuery(s))
	check("StreamDestroy", d.StreamDestroy(s))

	// Modules.
	_, err = d.ModuleLoadData(nil)
	wantIs("ModuleLoadData(empty)", err, cudadrv.ErrInvalidValue)
	m, err := d.ModuleLoadData([]byte(minimalPTX))
	check("ModuleLoadData(minimal PTX)", err)
	_, err = d.ModuleGetFunction(m, "no_such_kernel")
	wantIs("ModuleGetFunction(unknown)", err, cudadrv.ErrInvalidHandle)
	var e *cudadrv.Error
	if errors.As(err, &e) && e.Code != cudadrv.ErrorNotFound {
		t.Errorf("ModuleGetFunction(unknown): code %d, want %d", e.Code, cudadrv.ErrorNotFound)
	}
	check("ModuleUnload", d.ModuleUnload(m))
}

// regOver tries to register pinned allocated memory and undoes it if the driver allowed it.
func regOver(d cudadrv.Driver, h unsafe.Pointer) error {
	err := d.MemHostRegister(h, 4096, 0)
	if err == nil {
		_ = d.MemHostUnregister(h)
	}
	return err
}
