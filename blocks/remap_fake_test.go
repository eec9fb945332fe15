package blocks_test

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/testhook"
)

// remapDriver is the fake driver with the device address of the mapped
// host memory in [lo, hi) moved by off, as on a device whose registered
// memory has a device address other than its host address
// (AttrCanUseHostPointerForRegisteredMem 0): pinned ranges that follow
// one another on the host then map apart on the device.
type remapDriver struct {
	*fakedrv.Driver
	lo, hi, off uint64
}

func (d remapDriver) PointerGetAttribute(a cudadrv.PointerAttribute, p cudadrv.DevicePtr) (uint64, error) {
	v, err := d.Driver.PointerGetAttribute(a, p)
	if err == nil && a == cudadrv.PointerAttrDevicePointer && uint64(p) >= d.lo && uint64(p) < d.hi {
		v += d.off
	}
	return v, err
}

// TestFakeAutoKernelOverTables: under Auto, a list whose blocks the
// kernel's tables hold but whose descriptors they do not (blocks crossing
// between pinned ranges that map apart take one descriptor per range)
// goes to the copy engines, as Auto's doc says for lists the tables do
// not hold, instead of being refused.
func TestFakeAutoKernelOverTables(t *testing.T) {
	const chunk = 64 << 10
	t.Cleanup(testhook.SetRegChunk(chunk))
	const bs, nblk = 48 << 10, 16 // many 48 KiB blocks cross a 64 KiB boundary
	e := newEnv(t, fakedrv.Options{}, bs, nblk, 0)
	b, err := pinmem.Alloc(bs*nblk, pinmem.Mapped, pinmem.WithMethod(pinmem.MethodMmapRegister))
	must(t, err)
	defer b.Free()
	segs := b.Segments()
	if len(segs) < 3 {
		t.Fatalf("%d registrations, want several", len(segs))
	}
	copy(b.Bytes(), e.src.Bytes())
	// The second registration maps apart from its neighbours.
	s1 := segs[1]
	lo := uint64(hostptr.AddrOf(s1))
	t.Cleanup(cudadrv.Swap(remapDriver{Driver: e.fd, lo: lo, hi: lo + uint64(len(s1)), off: 1 << 40}))
	l := e.list(b.Bytes(), e.in)
	bc := newCopier(t, e.ctx, blocks.WithKernel(nblk))
	rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
	if err != nil {
		t.Fatalf("Auto, %d blocks for tables of %d, some crossing ranges that map apart: %v", nblk, nblk, err)
	}
	if rep.Strategy == blocks.Kernel || rep.Blocks != nblk {
		t.Fatalf("report %+v, want the copy engines for %d blocks", rep, nblk)
	}
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)
}
