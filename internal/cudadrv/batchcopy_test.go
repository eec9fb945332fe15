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

// TestGPUBatchCopy runs the batch-copy checks on the real driver, in the
// form its version names and, where the driver exports it too, in the
// 12.8 form (a CUDA 13 driver keeps cuMemcpyBatchAsync for binaries built
// against 12.8 headers).
func TestGPUBatchCopy(t *testing.T) {
	d := testutil.RequireGPU(t)
	if cudadrv.BatchCopySymbolOf(d) == "" {
		testutil.SkipFeature(t, "driver without cuMemcpyBatchAsync")
	}
	t.Run(cudadrv.BatchCopySymbolOf(d), func(t *testing.T) { batchCopyChecks(t, d) })
	if cudadrv.BatchCopySymbolOf(d) == cudadrv.SymMemcpyBatchAsyncV2 {
		restore, ok := cudadrv.ForceBatchCopyV1(d)
		defer restore()
		if !ok {
			t.Logf("observe: the driver lacks %s (the 12.8 form)", cudadrv.SymMemcpyBatchAsyncV1)
			return
		}
		t.Run(cudadrv.SymMemcpyBatchAsyncV1, func(t *testing.T) { batchCopyChecks(t, d) })
	}
}

// TestFakeBatchCopy runs the same checks on the fake as a 13.0 and a 12.8
// driver, so what the fake claims is checked on the GPU too.
func TestFakeBatchCopy(t *testing.T) {
	for _, v := range []int{13000, 12080} {
		d := fakedrv.New(fakedrv.Options{DriverVersion: v})
		t.Run(cudadrv.BatchCopySymbolOf(d), func(t *testing.T) { batchCopyChecks(t, d) })
		if err := d.Leaks(); err != nil {
			t.Error(err)
		}
		d.Close()
	}
	// Before 12.8 there is no batch copy.
	d := fakedrv.New(fakedrv.Options{DriverVersion: 12040})
	defer d.Close()
	if _, err := d.MemcpyBatchAsync([]cudadrv.DevicePtr{1}, []cudadrv.DevicePtr{2}, []uint64{1}, make([]cudadrv.MemcpyAttributes, 1), []uint64{0}, 3); !errors.Is(err, cudadrv.ErrNotSupported) {
		t.Errorf("batch copy on a 12.4 fake = %v, want ErrNotSupported", err)
	}
}

// batchCopyChecks copies 16 blocks of 4 KiB scattered both ways with one
// batch each and checks every byte, then the refusals: the legacy
// default stream and an invalid source access order.
func batchCopyChecks(t *testing.T, d cudadrv.Driver) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	bc, ok := d.(cudadrv.BatchCopier)
	if !ok {
		t.Fatalf("%T does not implement BatchCopier", d)
	}
	_, release := primaryCurrent(t, d)
	defer release()
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	const bs, nb = 4096, 16
	dev, err := d.MemAlloc(bs * nb)
	check("MemAlloc", err)
	defer func() { check("MemFree", d.MemFree(dev)) }()
	h, err := d.MemHostAlloc(2*bs*nb, 0)
	check("MemHostAlloc", err)
	defer func() { check("MemFreeHost", d.MemFreeHost(h)) }()
	hb := unsafe.Slice((*byte)(h), 2*bs*nb)
	src, dst := hb[:bs*nb], hb[bs*nb:]
	copy(src, testutil.RandomBytes(bs*nb, 11))
	testutil.Poison(dst)
	s, err := d.StreamCreate(cudadrv.StreamNonBlocking)
	check("StreamCreate", err)
	defer func() { check("StreamDestroy", d.StreamDestroy(s)) }()
	hostAddr := func(b []byte, i int) cudadrv.DevicePtr {
		return cudadrv.DevicePtr(uintptr(unsafe.Pointer(&b[i*bs])))
	}
	devSlot := func(i int) int { return (i * 5) % nb } // scattered
	var dsts, srcs []cudadrv.DevicePtr
	var sizes []uint64
	for i := range nb {
		dsts = append(dsts, dev+cudadrv.DevicePtr(devSlot(i)*bs))
		srcs = append(srcs, hostAddr(src, i))
		sizes = append(sizes, bs)
	}
	attrs := []cudadrv.MemcpyAttributes{{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream}}
	idx := []uint64{0}
	if fail, err := bc.MemcpyBatchAsync(dsts, srcs, sizes, attrs, idx, s); err != nil || fail != -1 {
		t.Fatalf("HtoD batch: %d, %v", fail, err)
	}
	// Back the other way, into dst's slots 15..0, with two attribute entries.
	dsts, srcs = dsts[:0], srcs[:0]
	for i := range nb {
		dsts = append(dsts, hostAddr(dst, nb-1-i))
		srcs = append(srcs, dev+cudadrv.DevicePtr(devSlot(i)*bs))
	}
	attrs2 := []cudadrv.MemcpyAttributes{attrs[0], {SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream, Flags: cudadrv.MemcpyFlagPreferOverlapWithCompute}}
	if fail, err := bc.MemcpyBatchAsync(dsts, srcs, sizes, attrs2, []uint64{0, nb / 2}, s); err != nil || fail != -1 {
		t.Fatalf("DtoH batch: %d, %v", fail, err)
	}
	check("StreamSynchronize", d.StreamSynchronize(s))
	for i := range nb {
		testutil.CheckBytes(t, src[i*bs:(i+1)*bs], dst[(nb-1-i)*bs:(nb-i)*bs])
	}

	// Refusals.
	if _, err := bc.MemcpyBatchAsync(dsts, srcs, sizes, attrs, idx, 0); !errors.Is(err, cudadrv.ErrInvalidValue) {
		t.Errorf("batch on the legacy default stream = %v, want ErrInvalidValue", err)
	}
	// An invalid source access order (0, CU_MEMCPY_SRC_ACCESS_ORDER_INVALID)
	// on the second attribute entry. (A bad address would not do: the real
	// driver takes any address it does not know for pageable host memory.)
	badAttrs := []cudadrv.MemcpyAttributes{attrs[0], {}}
	fail, err := bc.MemcpyBatchAsync(dsts, srcs, sizes, badAttrs, []uint64{0, 3}, s)
	var de *cudadrv.Error
	if !errors.As(err, &de) || de.Op != cudadrv.BatchCopySymbolOf(d) || !errors.Is(err, cudadrv.ErrInvalidValue) {
		t.Errorf("batch with an invalid access order = %v, want %s's INVALID_VALUE", err, cudadrv.BatchCopySymbolOf(d))
	}
	t.Logf("observe: %s with an invalid access order from copy 3: %v, failIdx %d", cudadrv.BatchCopySymbolOf(d), err, fail)
	if fail < -1 || fail >= nb {
		t.Errorf("failIdx = %d, outside the batch", fail)
	}
	if cudadrv.BatchCopySymbolOf(d) == cudadrv.SymMemcpyBatchAsyncV2 && fail != -1 {
		t.Errorf("the 13.0 form has no failIdx, got %d", fail)
	}
	check("StreamSynchronize", d.StreamSynchronize(s))
}
