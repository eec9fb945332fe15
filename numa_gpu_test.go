package pinmem

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUNUMAPlacement allocates a portable mapping for every device (placed
// on the device's NUMA node when the host has several), checks that the
// placement agrees with the plan for the device, and copies random data
// from it to every device and back into poisoned memory: portable memory
// pinned for one device serves all of them.
func TestGPUNUMAPlacement(t *testing.T) {
	testutil.RequireGPU(t)
	count, err := cuda.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	var devs []*cuda.Device
	for i := range count {
		dev, err := cuda.GetDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, dev)
	}
	const n = 64 << 20
	for _, dev := range devs {
		plan, _ := planNUMA(dev, sysinfo.Reader{})
		t.Logf("%v: plan %+v", dev, plan)
		b, err := Alloc(n, Portable, WithDevice(dev), WithMethod(MethodMmapRegister))
		testutil.SkipIfNotSupported(t, err)
		pl := b.Placement()
		t.Logf("%v: buffer placed: %v", dev, pl)
		switch {
		case plan.Node < 0 && pl.Node != -1:
			t.Errorf("%v: no node planned but placed on %d", dev, pl.Node)
		case plan.Node >= 0 && pl.Node != plan.Node && pl.Note == "":
			t.Errorf("%v: planned node %d, placed %+v without a reason", dev, plan.Node, pl)
		}
		src := testutil.RandomBytes(n, uint64(dev.Ordinal())+7)
		copy(b.Bytes(), src)
		for _, other := range devs {
			ctx, err := other.PrimaryContext()
			if err != nil {
				t.Fatal(err)
			}
			d, err := ctx.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ctx.NewStream(cuda.StreamNonBlocking)
			if err != nil {
				t.Fatal(err)
			}
			// Poison on the copy's own stream: a memset on the legacy
			// stream is not ordered before work on a non-blocking stream
			// (a GPU run caught exactly that race here).
			if err := s.Memset(d, 0, 0xEE, n); err != nil {
				t.Fatal(err)
			}
			if err := s.CopyHtoD(d, 0, b.Bytes()); err != nil {
				t.Fatalf("portable buffer of %v to %v: %v", dev, other, err)
			}
			if err := s.Synchronize(context.Background()); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, n)
			testutil.Poison(back)
			if _, err := d.ReadAt(back, 0); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, src, back)
			if err := s.Destroy(); err != nil {
				t.Fatal(err)
			}
			if err := d.Free(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
}
