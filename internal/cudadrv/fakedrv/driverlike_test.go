package fakedrv_test

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// Tests of places where the fake copies what the driver does and a kinder
// fake would hide a defect; each names the behaviour it copies.

func mapPages(t *testing.T, n int) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem
}

// The driver places small cuMemHostAlloc requests side by side, 512 bytes
// apart, in pages it pinned already: on an H100 (driver 580) two
// allocations of 12 bytes came back at 0x...be00000 and 0x...be00200.
// Larger requests get pages of their own.
func TestSmallHostAllocsShareAPage(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	page := uintptr(os.Getpagesize())
	a := must[unsafe.Pointer](t)(d.MemHostAlloc(12, 0))
	b := must[unsafe.Pointer](t)(d.MemHostAlloc(12, 0))
	if uintptr(b)-uintptr(a) != 512 || uintptr(a)&^(page-1) != uintptr(b)&^(page-1) {
		t.Errorf("two 12-byte allocations at %p and %p: want 512 bytes apart in one page", a, b)
	}
	var small []unsafe.Pointer
	for _, n := range []uint64{100, 512, 1000, 4096, 128 << 10} {
		p := must[unsafe.Pointer](t)(d.MemHostAlloc(n, 0))
		if uintptr(p)%512 != 0 {
			t.Errorf("allocation of %d bytes at %p: not 512-byte aligned", n, p)
		}
		small = append(small, p)
	}
	big := must[unsafe.Pointer](t)(d.MemHostAlloc(1<<20, 0))
	if uintptr(big)%page != 0 {
		t.Errorf("allocation of 1 MiB at %p: not page-aligned", big)
	}
	// Each is its own allocation: a pointer into one is that one.
	for _, p := range []unsafe.Pointer{a, b} {
		start := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrRangeStart, cudadrv.DevicePtr(uintptr(p)+11)))
		size := must[uint64](t)(d.PointerGetAttribute(cudadrv.PointerAttrRangeSize, cudadrv.DevicePtr(uintptr(p)+11)))
		if uintptr(start) != uintptr(p) || size != 12 {
			t.Errorf("range of %p+11: start %#x size %d, want %p and 12", p, start, size, p)
		}
	}
	// Registering a page that holds an allocation is refused.
	wantCode(t, d.MemHostRegister(unsafe.Pointer(uintptr(a)&^(page-1)), uint64(page), 0), "cuMemHostRegister_v2", cudadrv.ErrorHostMemoryAlreadyRegistered)
	// Freeing one leaves its neighbour's bytes alone.
	unsafe.Slice((*byte)(b), 12)[0] = 42
	ok(t, d.MemFreeHost(a))
	if unsafe.Slice((*byte)(b), 12)[0] != 42 {
		t.Error("freeing a changed its neighbour b")
	}
	// A pointer inside an allocation is not one cuMemFreeHost takes.
	wantCode(t, d.MemFreeHost(unsafe.Add(b, 1)), "cuMemFreeHost", cudadrv.ErrorInvalidValue)
	for _, p := range append(small, b, big) {
		ok(t, d.MemFreeHost(p))
	}
	if c := d.Live(); c.HostAllocs != 0 || c.HostAllocBytes != 0 {
		t.Errorf("live after freeing all: %+v", c)
	}
}

// The driver registers memory that shares a page with a registered range
// but no byte (seen on an H100, driver 580: bytes 200-300 of a page whose
// bytes 0-100 were registered), and refuses a range with a registered byte
// with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
func TestRegisterSharingAPageButNoByte(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	mem := mapPages(t, 3)
	page := os.Getpagesize()
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[0]), 100, 0))
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[200]), 100, 0))
	wantCode(t, d.MemHostRegister(unsafe.Pointer(&mem[50]), 100, 0), "cuMemHostRegister_v2", cudadrv.ErrorHostMemoryAlreadyRegistered)
	wantCode(t, d.MemHostRegister(unsafe.Pointer(&mem[250]), uint64(page), 0), "cuMemHostRegister_v2", cudadrv.ErrorHostMemoryAlreadyRegistered)
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[page]), uint64(page), 0))
	ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[page])))
	ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[200])))
	ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[0])))
}

// The driver refuses a registration sharing a page with another when one
// of the two is read-only and the other not, with CUDA_ERROR_INVALID_VALUE
// (an H100, driver 580, for read-only after writable and writable after
// read-only); portable and device-map registrations mix with plain ones.
func TestRegisterSharingAPageReadOnlyAndWritable(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	mem := mapPages(t, 3)
	page := os.Getpagesize()
	ro := cudadrv.MemHostRegisterReadOnly
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[0]), 100, 0))
	wantCode(t, d.MemHostRegister(unsafe.Pointer(&mem[200]), 100, ro), "cuMemHostRegister_v2", cudadrv.ErrorInvalidValue)
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[200]), 100, cudadrv.MemHostRegisterPortable|cudadrv.MemHostRegisterDeviceMap))
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[page]), 100, ro))
	wantCode(t, d.MemHostRegister(unsafe.Pointer(&mem[page+200]), 100, 0), "cuMemHostRegister_v2", cudadrv.ErrorInvalidValue)
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[page+200]), 100, ro))
	for _, off := range []int{page + 200, page, 200, 0} {
		ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[off])))
	}
}

// One driver copy may not span two registrations, even adjacent ones, nor
// run from one small allocation into its neighbour: the driver refuses it
// with CUDA_ERROR_INVALID_VALUE (seen on an H100 for a copy spanning two
// registration segments of one buffer).
func TestCopySpanningTwoRegistrationsIsRefused(t *testing.T) {
	d := newDrv(t, fakedrv.Options{})
	mem := mapPages(t, 2)
	page := os.Getpagesize()
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[0]), uint64(page), 0))
	ok(t, d.MemHostRegister(unsafe.Pointer(&mem[page]), uint64(page), 0))
	x := must[cudadrv.DevicePtr](t)(d.MemAlloc(uint64(2 * page)))
	s := must[cudadrv.Stream](t)(d.StreamCreate(cudadrv.StreamNonBlocking))
	wantCode(t, d.MemcpyHtoDAsync(x, unsafe.Pointer(&mem[0]), uint64(2*page), s), "cuMemcpyHtoDAsync_v2", cudadrv.ErrorInvalidValue)
	wantCode(t, d.MemcpyDtoHAsync(unsafe.Pointer(&mem[page-8]), x, 16, s), "cuMemcpyDtoHAsync_v2", cudadrv.ErrorInvalidValue)
	// Each one alone copies.
	ok(t, d.MemcpyHtoDAsync(x, unsafe.Pointer(&mem[0]), uint64(page), s))
	ok(t, d.MemcpyHtoDAsync(x+cudadrv.DevicePtr(page), unsafe.Pointer(&mem[page]), uint64(page), s))
	a := must[unsafe.Pointer](t)(d.MemHostAlloc(512, 0))
	b := must[unsafe.Pointer](t)(d.MemHostAlloc(512, 0))
	if uintptr(b) == uintptr(a)+512 {
		wantCode(t, d.MemcpyHtoDAsync(x, a, 1024, s), "cuMemcpyHtoDAsync_v2", cudadrv.ErrorInvalidValue)
	} else {
		t.Errorf("two 512-byte allocations at %p and %p, want adjacent", a, b)
	}
	ok(t, d.StreamSynchronize(s))
	ok(t, d.StreamDestroy(s))
	ok(t, d.MemFree(x))
	ok(t, d.MemFreeHost(a))
	ok(t, d.MemFreeHost(b))
	ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[0])))
	ok(t, d.MemHostUnregister(unsafe.Pointer(&mem[page])))
}
