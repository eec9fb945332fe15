package blocks_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
)

// tableBytes is what the 4 tables of a kernel of n descriptors pin.
func tableBytes(n int) uint64 { return 4 * 24 * uint64(n) }

// TestFakeKernelTablesPinnedByFirstLaunch: blocks.New with WithKernel
// pins nothing; a Copy that does not launch the kernel pins nothing; the
// first Copies that launch it, several at once, pin its 4 tables once;
// later ones pin nothing more; Close frees them.
func TestFakeKernelTablesPinnedByFirstLaunch(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 40, pinmem.Mapped)
	const maxBlocks = 64
	base := e.fd.Live()
	objs := pinmem.Stats().Objects.HostAllocs
	held := func() (int, uint64) {
		c := e.fd.Live()
		return c.HostAllocs - base.HostAllocs, c.HostAllocBytes - base.HostAllocBytes
	}
	dma := newCopier(t, e.ctx, blocks.WithKernel(maxBlocks), blocks.WithStrategy(blocks.PerCopy))
	bc := newCopier(t, e.ctx, blocks.WithKernel(maxBlocks))
	if n, b := held(); n != 0 || b != 0 || pinmem.Stats().Objects.HostAllocs != objs {
		t.Fatalf("two New with WithKernel(%d) pinned %d allocations of %d bytes, want none", maxBlocks, n, b)
	}
	l := e.list(e.src.Bytes(), e.in)
	rep, err := dma.Copy(context.Background(), blocks.ToDevice(e.s1, l[:20]))
	must(t, err)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l[:20])
	if n, b := held(); rep.Strategy != blocks.PerCopy || n != 0 || b != 0 {
		t.Fatalf("a %v Copy pinned %d allocations of %d bytes, want none", rep.Strategy, n, b)
	}
	must(t, dma.Close(context.Background()))

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for g := range 4 { // first launches at once: the turn serialises the pinning
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := l[10*g : 10*g+10]
			rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s2, part))
			if err == nil && rep.Strategy != blocks.Kernel {
				err = errors.New("auto did not take the kernel for mapped 4 KiB blocks: " + rep.Strategy.String())
			}
			errs[g] = err
		}()
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	must(t, e.s2.Synchronize(context.Background()))
	e.check(t, l)
	if n, b := held(); n != 4 || b != tableBytes(maxBlocks) || pinmem.Stats().Objects.HostAllocs != objs+4 {
		t.Fatalf("after the first kernel Copies: %d allocations of %d bytes, want 4 tables of %d", n, b, tableBytes(maxBlocks))
	}
	allocCalls := e.fd.Calls("cuMemHostAlloc")
	_, err = bc.Copy(context.Background(), blocks.ToHost(e.s1, e.list(e.dst.Bytes(), e.out)))
	must(t, err)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, e.list(e.dst.Bytes(), e.out))
	if n := e.fd.Calls("cuMemHostAlloc") - allocCalls; n != 0 {
		t.Errorf("a later kernel Copy pinned %d more tables", n)
	}
	must(t, bc.Close(context.Background()))
	if n, b := held(); n != 0 || b != 0 {
		t.Errorf("after Close: %d allocations of %d bytes left", n, b)
	}
}

// TestFakeKernelTablesPinFails: when the driver refuses a table (its
// allocation, or its device address), the Copy returns the driver's
// error having launched nothing; the next Copy pins what is missing,
// without pinning a table twice, and copies every block.
func TestFakeKernelTablesPinFails(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 40, pinmem.Mapped)
	base := e.fd.Live()
	bc := newCopier(t, e.ctx, blocks.WithKernel(64))
	l := e.list(e.src.Bytes(), e.in)
	for _, fail := range []string{"cuMemHostAlloc", "cuMemHostGetDevicePointer_v2"} {
		must(t, e.fd.FailOn(fail, 2, cudadrv.ErrorOutOfMemory))
		launches := e.fd.Calls("cuLaunchKernel")
		if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); !errors.Is(err, cuda.ErrOutOfMemory) || e.fd.Calls("cuLaunchKernel") != launches {
			t.Fatalf("%s refused: %v (%d launches), want the driver's ErrOutOfMemory and no launch", fail, err, e.fd.Calls("cuLaunchKernel")-launches)
		}
		e.fd.ClearFaults()
	}
	_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
	must(t, err)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)
	if c := e.fd.Live(); c.HostAllocs-base.HostAllocs != 4 || c.HostAllocBytes-base.HostAllocBytes != tableBytes(64) {
		t.Errorf("%d allocations of %d bytes, want the 4 tables of %d", c.HostAllocs-base.HostAllocs, c.HostAllocBytes-base.HostAllocBytes, tableBytes(64))
	}
}

// TestFakeKernelNoMappedMemory: New with WithKernel refuses a device that
// cannot map host memory (its tables could never be pinned), as before
// the tables moved to the first launch.
func TestFakeKernelNoMappedMemory(t *testing.T) {
	e := newEnv(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{{Attrs: map[cudadrv.DeviceAttribute]int{cudadrv.AttrCanMapHostMemory: 0}}}}, 4096, 4, 0)
	if bc, err := blocks.New(e.ctx, blocks.WithKernel(8)); !errors.Is(err, cuda.ErrNotSupported) {
		if bc != nil {
			_ = bc.Close(context.Background())
		}
		t.Fatalf("WithKernel on a device without mapped memory: %v, want ErrNotSupported", err)
	}
	bc, err := blocks.New(e.ctx)
	must(t, err)
	must(t, bc.Close(context.Background()))
}

// TestFakeKernelTablesPinCanceled: a first kernel Copy whose context ends
// while it pins the tables (at the first table's cuMemHostAlloc) pins no
// further table and returns an error matching ctx.Err(), having launched
// nothing (a table of WithKernel(1<<26) is 1.5 GiB, about a second to
// pin); the next Copy pins the rest and copies every block.
func TestFakeKernelTablesPinCanceled(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 40, pinmem.Mapped)
	bc := newCopier(t, e.ctx, blocks.WithKernel(64))
	l := e.list(e.src.Bytes(), e.in)
	allocs, launches := e.fd.Calls("cuMemHostAlloc"), e.fd.Calls("cuLaunchKernel")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.fd.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemHostAlloc" {
			cancel()
		}
		return cudadrv.Success
	})
	_, err := bc.Copy(ctx, blocks.ToDevice(e.s1, l))
	e.fd.SetHook(nil)
	if !errors.Is(err, context.Canceled) || e.fd.Calls("cuLaunchKernel") != launches {
		t.Fatalf("Copy canceled while pinning the tables: %v (%d launches), want context.Canceled and no launch", err, e.fd.Calls("cuLaunchKernel")-launches)
	}
	if n := e.fd.Calls("cuMemHostAlloc") - allocs; n > 1 {
		t.Errorf("the canceled Copy pinned %d tables, want at most 1 (none after the cancel)", n)
	}
	_, err = bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
	must(t, err)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)
	if n := e.fd.Calls("cuMemHostAlloc") - allocs; n != 4 {
		t.Errorf("%d tables pinned in all, want 4", n)
	}
}

// TestFakeKernelLaunchWidth: a list of more blocks than the device has SMs
// (the fake reports 132) is one launch of one CTA per SM, the kernel
// striding over the rest (kernelGrid); a shorter list, one CTA per block.
// Every block is copied either way.
func TestFakeKernelLaunchWidth(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 200, pinmem.Mapped)
	var mu sync.Mutex
	var grids []uint32
	e.fd.RegisterKernel(kernels.KernelBlockCopy, []int{8, 4}, func(k *fakedrv.KernelCall) error {
		mu.Lock()
		grids = append(grids, k.Grid[0])
		mu.Unlock()
		count := int(k.Uint32(1))
		descs, err := k.Mem(k.Ptr(0), uint64(count*kernels.BlockDescSize))
		if err != nil {
			return err
		}
		return kernels.BlockCopyTwin(descs, count, func(a, n uint64) ([]byte, error) { return k.Mem(cudadrv.DevicePtr(a), n) })
	})
	bc := newCopier(t, e.ctx, blocks.WithStrategy(blocks.Kernel), blocks.WithKernel(200))
	l := e.list(e.src.Bytes(), e.in)
	for _, n := range []int{200, 50} {
		_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l[:n]))
		must(t, err)
		must(t, e.s1.Synchronize(context.Background()))
		e.check(t, l[:n])
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(grids, []uint32{132, 50}) {
		t.Errorf("launch widths %v, want [132 50]: one CTA per SM at most", grids)
	}
}
