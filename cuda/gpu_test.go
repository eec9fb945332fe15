package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func gpuContext(t testing.TB) *cuda.Context { return testutil.GPUContext(t) }

func TestGPUDeviceProperties(t *testing.T) {
	ctx := gpuContext(t)
	v, err := cuda.DriverVersion()
	if err != nil || v < 10000 {
		t.Fatalf("DriverVersion = %d, %v", v, err)
	}
	devs, err := cuda.Devices()
	if err != nil || len(devs) == 0 {
		t.Fatalf("Devices = %d, %v", len(devs), err)
	}
	if devs[0] != ctx.Device() {
		t.Errorf("GetDevice(0) and Devices()[0] differ")
	}
	for _, d := range devs {
		p, err := d.Properties()
		if err != nil {
			t.Fatalf("device %d: %v", d.Ordinal(), err)
		}
		t.Logf("device %d: %+v", d.Ordinal(), p)
		if p.Name == "" || p.ComputeMajor < 5 || p.Multiprocessors <= 0 || p.TotalMemory < 1<<30 || p.AsyncEngines <= 0 {
			t.Errorf("implausible properties: %+v", p)
		}
		if !regexp.MustCompile(`^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$`).MatchString(p.PCIBusID) {
			t.Errorf("PCI bus id %q has an unexpected form", p.PCIBusID)
		}
		if !p.UnifiedAddressing {
			t.Errorf("a 64-bit Linux GPU should report unified addressing")
		}
	}
	if _, err := cuda.GetDevice(len(devs)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("GetDevice(out of range) = %v, want ErrInvalidValue", err)
	}
	free, total, err := ctx.MemInfo()
	if err != nil || free == 0 || free > total {
		t.Errorf("MemInfo = %d/%d, %v", free, total, err)
	}
}

func TestGPUStreamsAndEvents(t *testing.T) {
	ctx := gpuContext(t)
	for _, sf := range []cuda.StreamFlags{cuda.StreamBlocking, cuda.StreamNonBlocking} {
		s, err := ctx.NewStream(sf)
		if err != nil {
			t.Fatal(err)
		}
		buf, err := ctx.Alloc(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		for _, ef := range []cuda.EventFlags{cuda.EventDefault, cuda.EventBlockingSync} {
			start, err := ctx.NewEvent(ef)
			if err != nil {
				t.Fatal(err)
			}
			end, err := ctx.NewEvent(ef)
			if err != nil {
				t.Fatal(err)
			}
			if err := start.Record(s); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 8; i++ {
				if err := s.Memset(buf, 0, byte(i), buf.Size()); err != nil {
					t.Fatal(err)
				}
			}
			if err := end.Record(s); err != nil {
				t.Fatal(err)
			}
			if err := end.Synchronize(context.Background()); err != nil {
				t.Fatal(err)
			}
			if done, err := end.Query(); !done || err != nil {
				t.Errorf("Query after Synchronize = %v, %v", done, err)
			}
			el, err := end.Elapsed(start)
			if err != nil || el <= 0 {
				t.Errorf("Elapsed = %v, %v", el, err)
			}
			if done, err := s.Query(); !done || err != nil {
				t.Errorf("stream Query = %v, %v", done, err)
			}
			must(t, start.Destroy())
			must(t, end.Destroy())
			if err := end.Destroy(); !errors.Is(err, cuda.ErrInvalidHandle) {
				t.Errorf("second Destroy = %v, want ErrInvalidHandle", err)
			}
		}
		// An event without timing cannot report elapsed time: a typed driver error.
		a, _ := ctx.NewEvent(cuda.EventDisableTiming)
		b, _ := ctx.NewEvent(cuda.EventDisableTiming)
		must(t, a.Record(s))
		must(t, b.Record(s))
		must(t, s.WaitEvent(b))
		must(t, s.Synchronize(context.Background()))
		var de *cuda.Error
		if _, err := b.Elapsed(a); !errors.As(err, &de) {
			t.Errorf("Elapsed on timing-disabled events = %v, want a *cuda.Error", err)
		}
		must(t, a.Destroy())
		must(t, b.Destroy())
		must(t, buf.Free())
		must(t, s.Destroy())
		if err := s.Synchronize(context.Background()); !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("Synchronize after Destroy = %v, want ErrInvalidHandle", err)
		}
	}
}

// pinnedHost allocates page-locked memory with the raw binding (the cuda
// package has no public pinning; package pinmem owns that).
func pinnedHost(t testing.TB, ctx *cuda.Context, n int) []byte {
	t.Helper()
	d, err := cudadrv.Get()
	if err != nil {
		t.Fatal(err)
	}
	var p unsafe.Pointer
	err = ctx.Do(func() error {
		var err error
		p, err = d.MemHostAlloc(uint64(n), 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctx.Do(func() error { return d.MemFreeHost(p) }); err != nil {
			t.Error(err)
		}
	})
	return unsafe.Slice((*byte)(p), n)
}

func TestGPUCopiesRandomData(t *testing.T) {
	ctx := gpuContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 3, 4096, 65537, 1 << 20, 16<<20 + 13}
	for _, n := range sizes {
		src := testutil.RandomBytes(n, uint64(n))
		a, err := ctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		// Synchronous: pageable Go memory -> device -> device -> Go memory.
		must(t, a.Memset(0x5A))
		must(t, b.Memset(0xA5))
		must(t, errOf(a.WriteAt(src, 0)))
		must(t, s.CopyDtoD(b, 0, a, 0, n))
		must(t, s.Synchronize(context.Background()))
		got := make([]byte, n)
		testutil.Poison(got)
		must(t, errOf(b.ReadAt(got, 0)))
		testutil.CheckBytes(t, src, got)

		// Asynchronous from pinned memory, at an odd offset.
		off := rng.IntN(n)
		part := n - off
		hin := pinnedHost(t, ctx, part)
		copy(hin, src[off:])
		hout := pinnedHost(t, ctx, part)
		testutil.Poison(hout)
		must(t, s.Memset(b, 0, 0xEE, n))
		must(t, s.CopyHtoD(b, off, hin))
		must(t, s.CopyDtoD(a, 0, b, 0, n))
		must(t, s.CopyDtoH(hout, a, off))
		must(t, s.Synchronize(context.Background()))
		testutil.CheckBytes(t, src[off:], hout)
		// The bytes before off were set by the async memset.
		head := make([]byte, off)
		must(t, errOf(a.ReadAt(head, 0)))
		if !bytes.Equal(head, bytes.Repeat([]byte{0xEE}, off)) {
			t.Errorf("size %d: async memset did not reach the first %d bytes", n, off)
		}
		must(t, a.Free())
		must(t, b.Free())
	}
}

func TestGPUKernels(t *testing.T) {
	ctx := gpuContext(t)
	mod, err := ctx.LoadModule(kernels.PTX())
	if err != nil {
		t.Fatalf("loading pinmem's PTX: %v", err)
	}
	defer mod.Destroy()
	fill, err := mod.Function(kernels.KernelFill)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := mod.Function(kernels.KernelChecksum)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	const words = 1<<22 + 7
	buf, err := ctx.Alloc(words * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	out, err := ctx.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	seed := rand.Uint32()
	must(t, buf.Memset(0xCD))
	must(t, fill.Launch(s, cuda.D1(264), cuda.D1(256), 0, buf.Ptr(), uint64(words), seed))
	must(t, s.Memset(out, 0, 0, 8))
	must(t, sum.Launch(s, cuda.D1(264), cuda.D1(256), 0, buf.Ptr(), uint64(words), out.Ptr()))
	must(t, s.Synchronize(context.Background()))
	host := make([]byte, words*4)
	must(t, errOf(buf.ReadAt(host, 0)))
	w := unsafe.Slice((*uint32)(unsafe.Pointer(&host[0])), words)
	for i, v := range w {
		if want := kernels.Pattern(seed, uint64(i)); v != want {
			t.Fatalf("word %d = %#x, want %#x", i, v, want)
		}
	}
	var got [8]byte
	must(t, errOf(out.ReadAt(got[:], 0)))
	if g, want := *(*uint64)(unsafe.Pointer(&got[0])), kernels.Checksum(w); g != want {
		t.Errorf("device checksum %#x, host %#x", g, want)
	}
	if _, err := mod.Function("no_such_kernel"); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("unknown kernel: %v, want ErrInvalidHandle (CUDA_ERROR_NOT_FOUND)", err)
	}
	if err := fill.Launch(s, cuda.D1(1), cuda.D1(1), 0, "a string"); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("string argument: %v, want ErrInvalidValue", err)
	}
}

func TestGPUMisuseIsTyped(t *testing.T) {
	ctx := gpuContext(t)
	if _, err := ctx.Alloc(1 << 50); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("Alloc(1 PiB) = %v, want ErrOutOfMemory", err)
	}
	if _, err := ctx.Alloc(0); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Alloc(0) = %v, want ErrInvalidValue", err)
	}
	// An address that is no allocation: the driver must reject it, typed.
	err := errOf(cuda.WrapDevicePtr(ctx, 0x10, 3).WriteAt([]byte{1, 2, 3}, 0))
	var de *cuda.Error
	if !errors.As(err, &de) || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("copy to a bogus device address = %v, want a *cuda.Error matching ErrInvalidValue", err)
	}
	b, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := errOf(b.WriteAt(make([]byte, 100), int64(4000))); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("write past the end = %v, want ErrInvalidValue", err)
	}
	if _, err := b.Slice(-1, 2); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Slice(-1) = %v", err)
	}
	view, err := b.Slice(1024, 1024)
	must(t, err)
	if err := view.Free(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("freeing a borrowed view = %v, want ErrInvalidValue", err)
	}
	must(t, b.Free())
	if err := b.Free(); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("double Free = %v, want ErrInvalidHandle", err)
	}
	if err := errOf(b.WriteAt([]byte{1}, 0)); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("use after Free = %v, want ErrInvalidHandle", err)
	}
	if _, err := ctx.LoadModule([]byte("this is not PTX")); !errors.Is(err, cuda.ErrKernelImage) {
		t.Errorf("LoadModule(garbage) = %v, want ErrKernelImage", err)
	}
}

func TestGPUBorrowedAndSecondContext(t *testing.T) {
	ctx := gpuContext(t)
	own, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	borrowed := cuda.WrapStream(ctx, own.Handle())
	if err := borrowed.Destroy(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("destroying a borrowed stream = %v", err)
	}
	must(t, borrowed.Synchronize(context.Background()))
	must(t, own.Destroy())
	if err := ctx.Destroy(); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("destroying the primary context = %v", err)
	}

	c2, err := cuda.NewContext(ctx.Device(), cuda.SchedAuto)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Handle() == ctx.Handle() {
		t.Errorf("NewContext returned the primary context")
	}
	buf, err := c2.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	data := testutil.RandomBytes(1<<20, 7)
	must(t, errOf(buf.WriteAt(data, 0)))
	got := make([]byte, len(data))
	must(t, errOf(buf.ReadAt(got, 0)))
	testutil.CheckBytes(t, data, got)
	must(t, buf.Free())
	must(t, c2.Destroy())
	if err := c2.Destroy(); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("second Destroy = %v", err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// errOf returns the error of an io call (ReadAt, WriteAt).
func errOf(_ int, err error) error { return err }
