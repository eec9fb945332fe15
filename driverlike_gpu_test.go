package pinmem

import (
	"errors"
	"os"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// On the GPU: the driver's behaviour the fake copies (cudatest), checked
// where it decides pinmem's design. Each test logs what the driver did.

// Small cuMemHostAlloc allocations: all succeed as separate buffers, each
// with its own bytes, found by Lookup, whether or not the driver placed
// them in shared pages (on an H100 with driver 580 it did, 512 bytes
// apart, which the fake copies).
func TestGPUSmallAllocationsShareAPage(t *testing.T) {
	testutil.RequireGPU(t)
	page := uintptr(os.Getpagesize())
	sizes := []int{12, 12, 100, 512, 1000, 4096, 128 << 10}
	var bufs []*Buffer
	defer func() {
		for _, b := range bufs {
			if err := b.Free(); err != nil {
				t.Error(err)
			}
		}
	}()
	shared := 0
	for i, n := range sizes {
		b, err := Alloc(n, 0, WithMethod(MethodHostAlloc))
		if err != nil {
			t.Fatalf("Alloc(%d) after %d small allocations: %v", n, i, err)
		}
		p := uintptr(unsafe.Pointer(&b.Bytes()[0]))
		for _, o := range bufs {
			q := uintptr(unsafe.Pointer(&o.Bytes()[0]))
			if p/page <= (q+uintptr(o.Len())-1)/page && q/page <= (p+uintptr(n)-1)/page {
				shared++
			}
		}
		t.Logf("Alloc(%d) at %#x (offset %#x in its page)", n, p, p%page)
		bufs = append(bufs, b)
	}
	t.Logf("%d pairs of buffers share a page", shared)
	for i, b := range bufs {
		for j := range b.Bytes() {
			b.Bytes()[j] = byte(i + 1)
		}
	}
	for i, b := range bufs {
		for j, v := range b.Bytes() {
			if v != byte(i+1) {
				t.Fatalf("buffer %d byte %d = %d: a neighbour's bytes", i, j, v)
			}
		}
		if got, ok := Lookup(b.Bytes()[b.Len()-1:]); !ok || got != b {
			t.Errorf("Lookup of the last byte of buffer %d: %v %v", i, got, ok)
		}
	}
}

// cuMemHostRegister of memory sharing a page with a registered range but
// no byte is registered by the driver (an H100, driver 580, registered
// bytes 200-300 of a page whose bytes 0-100 were registered), and so by the
// fake and pinmem's registry; a range with a registered byte is refused
// with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED by both, and a read-only
// range in a page shared with a writable registration with
// CUDA_ERROR_INVALID_VALUE.
func TestGPUDriverRegistersASharedPage(t *testing.T) {
	testutil.RequireGPU(t)
	tg, err := resolve(options{})
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	mem := make([]byte, 3*page)
	o := int(-uintptr(unsafe.Pointer(&mem[0])) & uintptr(page-1))
	at := func(i int) unsafe.Pointer { return unsafe.Pointer(&mem[o+i]) }
	if err := tg.do(func() error { return tg.drv.d.MemHostRegister(at(0), 100, 0) }); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := tg.do(func() error { return tg.drv.d.MemHostUnregister(at(0)) }); err != nil {
			t.Error(err)
		}
	}()
	err = tg.do(func() error { return tg.drv.d.MemHostRegister(at(200), 100, 0) })
	t.Logf("cuMemHostRegister of bytes 200-300 of a page whose bytes 0-100 are registered: %v", err)
	if err != nil {
		t.Errorf("the driver refused a range sharing a page, no byte, with a registered one: the fake and pinmem's registry accept it")
	} else if err := tg.do(func() error { return tg.drv.d.MemHostUnregister(at(200)) }); err != nil {
		t.Error(err)
	}
	err = tg.do(func() error { return tg.drv.d.MemHostRegister(at(400), 100, cudadrv.MemHostRegisterReadOnly) })
	t.Logf("read-only cuMemHostRegister of bytes 400-500 of a page whose bytes 0-100 are registered writable: %v", err)
	if err == nil {
		_ = tg.do(func() error { return tg.drv.d.MemHostUnregister(at(400)) })
		t.Errorf("the driver registered a read-only range in a page shared with a writable registration: the fake and pinmem's registry refuse it")
	} else if !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("the driver refused it with %v; the fake says CUDA_ERROR_INVALID_VALUE", err)
	}
	err = tg.do(func() error { return tg.drv.d.MemHostRegister(at(50), 100, 0) })
	t.Logf("cuMemHostRegister of bytes 50-150 of a page whose bytes 0-100 are registered: %v", err)
	if err == nil {
		_ = tg.do(func() error { return tg.drv.d.MemHostUnregister(at(50)) })
		t.Errorf("the driver registered bytes registered already: the fake and pinmem's registry refuse them")
	} else if !errors.Is(err, cuda.ErrAlreadyRegistered) {
		t.Errorf("the driver refused it with %v; the fake says CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", err)
	}
}
