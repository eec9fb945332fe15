package fakedrv_test

import (
	"errors"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// onThread runs fn on a new goroutine locked to its own OS thread and
// waits for it.
func onThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fn()
	}()
	<-done
}

// TestContextPerThread: the context is current on the thread that set it
// only; calls that need one fail elsewhere with CUDA_ERROR_INVALID_CONTEXT,
// work on an explicit stream needs none but is refused under another
// context, and a destroyed context is current nowhere.
func TestContextPerThread(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(0))
	p := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	host := make([]byte, 64)

	type result struct {
		name string
		err  error
	}
	var bare, other []result
	var cur cudadrv.Context
	onThread(func() {
		cur, _ = d.CtxGetCurrent()
		_, err := d.MemAlloc(16)
		bare = append(bare, result{"cuMemAlloc_v2", err})
		_, err = d.MemHostAlloc(16, 0)
		bare = append(bare, result{"cuMemHostAlloc", err})
		err = d.MemHostRegister(unsafe.Pointer(&host[0]), 64, 0)
		bare = append(bare, result{"cuMemHostRegister_v2", err})
		_, err = d.StreamCreate(0)
		bare = append(bare, result{"cuStreamCreate", err})
		_, err = d.EventCreate(0)
		bare = append(bare, result{"cuEventCreate", err})
		_, _, err = d.MemGetInfo()
		bare = append(bare, result{"cuMemGetInfo_v2", err})
		bare = append(bare, result{"cuCtxSynchronize", d.CtxSynchronize()})
		bare = append(bare, result{"cuMemsetD8_v2", d.MemsetD8(p, 1, 1)})
		bare = append(bare, result{"cuMemsetD8Async", d.MemsetD8Async(p, 1, 1, 0)})
		_, err = d.ModuleLoadData([]byte("// ptx"))
		bare = append(bare, result{"cuModuleLoadData", err})

		// An explicit stream carries its context: no current one is needed.
		other = append(other, result{"", d.MemsetD8Async(p, 2, 1, s)})
		other = append(other, result{"", d.StreamSynchronize(s)})
		// Under another context it is refused.
		c, err := d.CtxCreate(0, 0)
		other = append(other, result{"", err})
		other = append(other, result{"cuStreamSynchronize", d.StreamSynchronize(s)})
		other = append(other, result{"", d.CtxDestroy(c)})
		// The destroyed context is current nowhere, so the stream works again.
		other = append(other, result{"", d.StreamQuery(s)})
	})
	if cur != 0 {
		t.Errorf("a fresh thread has context %#x current, want none", cur)
	}
	for _, r := range bare {
		wantCode(t, r.err, r.name, cudadrv.ErrorInvalidContext)
	}
	for _, r := range other {
		if r.name == "" {
			ok(t, r.err)
		} else {
			wantCode(t, r.err, r.name, cudadrv.ErrorInvalidContext)
		}
	}
	// The test's thread kept its context throughout.
	ok(t, d.CtxSynchronize())
	if b := must[[]byte](t)(d.DeviceBytes(p, 1)); b[0] != 2 {
		t.Errorf("device byte %d, want 2 (only the explicit-stream memset ran)", b[0])
	}
	ok(t, d.MemFree(p))
	ok(t, d.StreamDestroy(s))
}

// TestInstall: one owner at a time, nesting within the owner's subtests,
// and restore puts back the previous driver once.
func TestInstall(t *testing.T) {
	a, b := fakedrv.New(fakedrv.Options{}), fakedrv.New(fakedrv.Options{})
	defer a.Close()
	defer b.Close()
	if _, err := fakedrv.Install(nil, "T"); !errors.Is(err, cudadrv.ErrInvalidValue) {
		t.Errorf("Install(nil): %v", err)
	}
	restoreA, err := fakedrv.Install(a, "T")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := cudadrv.Get(); got != a {
		t.Fatalf("Get returned %v, want the installed fake", got)
	}
	if _, err := fakedrv.Install(b, "U"); !errors.Is(err, fakedrv.ErrInstalled) {
		t.Errorf("a second owner's Install: %v, want ErrInstalled", err)
	}
	if _, err := fakedrv.Install(b, "TX"); !errors.Is(err, fakedrv.ErrInstalled) {
		t.Errorf("Install by a test whose name only starts like the owner's: %v, want ErrInstalled", err)
	}
	restoreB, err := fakedrv.Install(b, "T/sub")
	if err != nil {
		t.Fatalf("a subtest's nested Install: %v", err)
	}
	if got, _ := cudadrv.Get(); got != b {
		t.Errorf("Get returned %v, want the nested fake", got)
	}
	restoreB()
	restoreB()
	if got, _ := cudadrv.Get(); got != a {
		t.Errorf("after the nested restore Get returned %v, want the outer fake", got)
	}
	restoreA()
	if got, _ := cudadrv.Get(); got == a || got == b {
		t.Errorf("after restore Get still returns a fake")
	}
	restoreU, err := fakedrv.Install(b, "U")
	if err != nil {
		t.Fatalf("Install after restore: %v", err)
	}
	restoreU()
}

// TestInstallProcessWide: any test may install over a process-wide fake
// (owner ""), and a process-wide install is refused over a test's.
func TestInstallProcessWide(t *testing.T) {
	a, b := fakedrv.New(fakedrv.Options{}), fakedrv.New(fakedrv.Options{})
	defer a.Close()
	defer b.Close()
	restoreA, err := fakedrv.Install(a, "")
	if err != nil {
		t.Fatal(err)
	}
	restoreB, err := fakedrv.Install(b, "T")
	if err != nil {
		t.Fatalf("a test's Install over the process-wide fake: %v", err)
	}
	if _, err := fakedrv.Install(a, ""); !errors.Is(err, fakedrv.ErrInstalled) {
		t.Errorf("a process-wide Install over a test's: %v, want ErrInstalled", err)
	}
	restoreB()
	if got, _ := cudadrv.Get(); got != a {
		t.Errorf("Get returned %v, want the process-wide fake", got)
	}
	restoreA()
}

// TestCtxSynchronizeOwnContext: cuCtxSynchronize waits for the work of
// the current context and reports its faults only: another context's held
// work does not block it, and another context's fault stays for that
// context to report.
func TestCtxSynchronizeOwnContext(t *testing.T) {
	d := newDrv(t, fakedrv.Options{DeviceCount: 2, WaitTimeout: time.Minute})
	c0 := must[cudadrv.Context](t)(d.CtxGetCurrent())
	c1 := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(1))
	defer d.DevicePrimaryCtxRelease(1)
	ok(t, d.CtxSetCurrent(c1))
	s1 := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	p1 := must[cudadrv.DevicePtr](t)(d.MemAlloc(16))
	ok(t, d.FailAsync("cuMemsetD8Async", 1, cudadrv.ErrorLaunchFailed))
	ok(t, d.MemsetD8Async(p1, 1, 16, s1)) // faults
	ok(t, d.MemsetD8Async(p1, 2, 16, 0))  // on the legacy default stream, in c1
	ok(t, d.HoldStream(0))
	ok(t, d.HoldStream(s1))
	ok(t, d.MemsetD8Async(p1, 3, 16, s1))
	ok(t, d.MemsetD8Async(p1, 4, 16, 0))

	ok(t, d.CtxSetCurrent(c0))
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.CtxSetCurrent(c0); err != nil {
			done <- err
			return
		}
		done <- d.CtxSynchronize()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("cuCtxSynchronize of a context with no work of its own: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cuCtxSynchronize of one context waited for another context's held work")
	}

	ok(t, d.CtxSetCurrent(c1))
	ok(t, d.ReleaseStream(s1))
	ok(t, d.ReleaseStream(0))
	wantCode(t, d.CtxSynchronize(), "cuCtxSynchronize", cudadrv.ErrorLaunchFailed)
	ok(t, d.StreamDestroy(s1))
	ok(t, d.MemFree(p1))
	ok(t, d.CtxSetCurrent(c0))
}

// TestClearFaultsKeepsOtherContexts: ClearFaults forgets the unreported
// faults of the contexts a sticky fault broke, and keeps another
// context's, on the legacy default stream too.
func TestClearFaultsKeepsOtherContexts(t *testing.T) {
	d := newDrv(t, fakedrv.Options{DeviceCount: 2})
	c0 := must[cudadrv.Context](t)(d.CtxGetCurrent())
	p0 := must[cudadrv.DevicePtr](t)(d.MemAlloc(16))
	ok(t, d.FailAsync("cuMemsetD8Async", 1, cudadrv.ErrorLaunchFailed))
	ok(t, d.MemsetD8Async(p0, 1, 16, 0)) // c0's fault, on the legacy default stream

	c1 := must[cudadrv.Context](t)(d.DevicePrimaryCtxRetain(1))
	defer d.DevicePrimaryCtxRelease(1)
	ok(t, d.CtxSetCurrent(c1))
	s1 := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	p1 := must[cudadrv.DevicePtr](t)(d.MemAlloc(16))
	ok(t, d.AddRule("cuMemsetD8Async", 1, cudadrv.ErrorIllegalAddress, true, true))
	ok(t, d.MemsetD8Async(p1, 1, 16, s1)) // breaks c1
	if d.Stuck(c1) == nil {
		t.Fatal("the sticky fault did not break its context")
	}
	d.ClearFaults()
	ok(t, d.CtxSynchronize()) // c1's fault is forgotten
	ok(t, d.StreamDestroy(s1))
	ok(t, d.MemFree(p1))

	ok(t, d.CtxSetCurrent(c0))
	wantCode(t, d.CtxSynchronize(), "cuCtxSynchronize", cudadrv.ErrorLaunchFailed)
	ok(t, d.MemFree(p0))
}
