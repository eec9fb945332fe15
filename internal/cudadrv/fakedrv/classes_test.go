package fakedrv_test

import (
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// TestBatchCopyClasses: a batch copy counts as a host-to-device copy when
// one of its copies goes from pinned host memory to the device, as a
// device-to-host one when one goes back, and a fault on the class fails it.
func TestBatchCopyClasses(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	defer d.StreamDestroy(s)
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(4096))
	defer d.MemFree(dev)
	host := must[unsafe.Pointer](t)(d.MemHostAlloc(4096, 0))
	defer d.MemFreeHost(host)
	hp := cudadrv.DevicePtr(uintptr(host))
	attrs := []cudadrv.MemcpyAttributes{{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream}}
	batch := func(dst, src cudadrv.DevicePtr) error {
		_, err := d.MemcpyBatchAsync([]cudadrv.DevicePtr{dst}, []cudadrv.DevicePtr{src}, []uint64{4096}, attrs, []uint64{0}, s)
		return err
	}
	ok(t, batch(dev, hp))
	ok(t, batch(hp, dev))
	if h, g := d.Calls(fakedrv.ClassHtoD), d.Calls(fakedrv.ClassDtoH); h != 1 || g != 1 {
		t.Errorf("Calls: %d host-to-device, %d device-to-host; want 1 and 1", h, g)
	}
	ok(t, d.FailOn(fakedrv.ClassHtoD, 0, cudadrv.ErrorLaunchFailed))
	wantCode(t, batch(dev, hp), "", cudadrv.ErrorLaunchFailed)
	ok(t, batch(hp, dev))
	d.ClearFaults()
	ok(t, d.StreamSynchronize(s))
}

// TestHandlesApart: two fakes give out different handles and device
// addresses, so that pinmem's record of live objects, keyed by handle,
// never takes one fake's object for another's.
func TestHandlesApart(t *testing.T) {
	a, b := newDrv(t, fakedrv.Options{}), fakedrv.New(fakedrv.Options{})
	defer b.Close()
	sa := must[cudadrv.Stream](t)(a.StreamCreate(0))
	defer a.StreamDestroy(sa)
	pa := must[cudadrv.DevicePtr](t)(a.MemAlloc(256))
	defer a.MemFree(pa)
	inCtx(t, b, func() {
		sb := must[cudadrv.Stream](t)(b.StreamCreate(0))
		defer b.StreamDestroy(sb)
		pb := must[cudadrv.DevicePtr](t)(b.MemAlloc(256))
		defer b.MemFree(pb)
		if sa == sb || pa == pb {
			t.Errorf("two fakes gave stream %#x and %#x, device memory %#x and %#x", sa, sb, pa, pb)
		}
	})
}

// TestBlockedAndStreams: Streams lists the live streams in creation
// order; Blocked names a call blocked on a held stream, and a query that
// found it not ready only when made after the caller's previous look.
func TestBlockedAndStreams(t *testing.T) {
	d := newDrv(t, fakedrv.Options{WaitTimeout: -1})
	s1 := must[cudadrv.Stream](t)(d.StreamCreate(0))
	defer d.StreamDestroy(s1)
	s2 := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	if got := d.Streams(); len(got) != 2 || got[0].Handle != s1 || got[1].Handle != s2 {
		t.Errorf("Streams = %+v, want %#x then %#x", got, s1, s2)
	}
	ok(t, d.StreamDestroy(s2))
	if got := d.Streams(); len(got) != 1 || got[0].Handle != s1 {
		t.Errorf("Streams after destroying the second = %+v", got)
	}
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	defer d.MemFree(dev)
	ok(t, d.HoldStream(s1))
	ok(t, d.MemsetD8Async(dev, 1, 64, s1))
	op, polls, err := d.Blocked(s1, false, -1)
	if op != "" || err != nil {
		t.Errorf("Blocked with nothing waiting = %q, %v", op, err)
	}
	if d.StreamQuery(s1) == nil {
		t.Fatal("StreamQuery of held work succeeded")
	}
	if op, _, _ := d.Blocked(s1, false, polls); op != "cuStreamQuery" {
		t.Errorf("Blocked after a query found held work = %q, want cuStreamQuery", op)
	}
	_, polls, _ = d.Blocked(s1, false, -1)
	if op, _, _ := d.Blocked(s1, false, polls); op != "" {
		t.Errorf("Blocked with no query since the last look = %q, want none", op)
	}
	done := make(chan error)
	go inCtx(t, d, func() { done <- d.StreamSynchronize(s1) })
	for {
		ch := d.Changed()
		if op, _, _ := d.Blocked(0, true, -1); op == "cuStreamSynchronize" {
			break
		}
		<-ch
	}
	ok(t, d.ReleaseStream(s1))
	ok(t, <-done)
	if _, _, err := d.Blocked(0x1234, false, -1); err == nil {
		t.Error("Blocked on an unknown stream: no error")
	}
}

// TestQueuesWork: the calls that take asynchronous faults are the fake's
// copies, memsets and launches, each one the fake implements; a rule for
// a call that queues no work is refused instead of being used up unseen.
func TestQueuesWork(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	n := 0
	for _, op := range append(fakedrv.Ops(), fakedrv.Classes()...) {
		err := d.FailAsync(op, 1, cudadrv.ErrorLaunchFailed)
		if fakedrv.QueuesWork(op) != (err == nil) {
			t.Errorf("FailAsync(%q) = %v, QueuesWork = %v", op, err, fakedrv.QueuesWork(op))
		}
		if fakedrv.QueuesWork(op) {
			n++
		}
	}
	if n != 15 { // 11 copy and memset symbols, cuLaunchKernel, 3 classes
		t.Errorf("%d ops take asynchronous faults, want 15", n)
	}
	d.ClearFaults()
}

// TestAsyncFaultHitsWork: an asynchronous fault drawn by a call that is
// refused (it queues no work) goes to the next call's work instead of
// being lost.
func TestAsyncFaultHitsWork(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	defer d.StreamDestroy(s)
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(64))
	defer d.MemFree(dev)
	host := must[unsafe.Pointer](t)(d.MemHostAlloc(64, 0))
	defer d.MemFreeHost(host)
	ok(t, d.FailAsync(fakedrv.ClassHtoD, 1, cudadrv.ErrorLaunchFailed))
	wantCode(t, d.MemcpyHtoDAsync(dev+64, host, 64, s), "cuMemcpyHtoDAsync_v2", cudadrv.ErrorInvalidValue)
	ok(t, d.MemcpyHtoDAsync(dev, host, 64, s))
	wantCode(t, d.StreamSynchronize(s), "cuStreamSynchronize", cudadrv.ErrorLaunchFailed)
	// Drawn once: the next copy runs.
	ok(t, d.MemcpyHtoDAsync(dev, host, 64, s))
	ok(t, d.StreamSynchronize(s))
}

// The driver's batch copy refuses the legacy default stream (handle 0 and
// CU_STREAM_LEGACY, 1) with CUDA_ERROR_INVALID_VALUE and takes the
// per-thread default stream (CU_STREAM_PER_THREAD, 2), which is a real
// stream to it (as NVIDIA's cuda.core documents for its copy_batch).
func TestBatchCopyDefaultStreams(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	dev := must[cudadrv.DevicePtr](t)(d.MemAlloc(4096))
	defer d.MemFree(dev)
	host := must[unsafe.Pointer](t)(d.MemHostAlloc(4096, 0))
	defer d.MemFreeHost(host)
	unsafe.Slice((*byte)(host), 4096)[7] = 42
	attrs := []cudadrv.MemcpyAttributes{{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream}}
	batch := func(s cudadrv.Stream) error {
		_, err := d.MemcpyBatchAsync([]cudadrv.DevicePtr{dev}, []cudadrv.DevicePtr{cudadrv.DevicePtr(uintptr(host))}, []uint64{4096}, attrs, []uint64{0}, s)
		return err
	}
	for _, s := range []cudadrv.Stream{0, 1} {
		wantCode(t, batch(s), "", cudadrv.ErrorInvalidValue)
	}
	ok(t, batch(2))
	ok(t, d.StreamSynchronize(2))
	got := make([]byte, 4096)
	ok(t, d.MemcpyDtoH(unsafe.Pointer(&got[0]), dev, 4096))
	if got[7] != 42 {
		t.Errorf("batch copy on CU_STREAM_PER_THREAD: byte 7 is %d on the device, want 42", got[7])
	}
}
