package transfer

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// BenchmarkSmallOverheadFake measures, on the CPU with the fake driver,
// what a Copier adds to a small transfer beside the driver's own copy: the
// same 4 KiB copy through Copier.HtoD/DtoH (one pinned stage) and through
// DeviceBuffer.WriteAt/ReadAt. The fake driver's copy costs the
// same on both sides, so the difference per operation (ns/op, allocs/op)
// is pinmem's own. It says nothing about a GPU's figures.
//
//	go test ./transfer -run '^$' -bench SmallOverheadFake -benchmem
func BenchmarkSmallOverheadFake(b *testing.B) {
	testutil.UseFake(b, fakedrv.Options{})
	cctx := testutil.PrimaryContext(b)
	c, err := New(cctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	d, err := cctx.Alloc(4 << 10)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Free() })
	h := make([]byte, 4<<10)
	bg := context.Background()
	run := func(name string, f func() error) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(h)))
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("H2D/driver", func() error { _, err := d.WriteAt(h, 0); return err })
	run("H2D/copier", func() error { _, err := c.HtoD(bg, d, h); return err })
	run("D2H/driver", func() error { _, err := d.ReadAt(h, 0); return err })
	run("D2H/copier", func() error { _, err := c.DtoH(bg, h, d); return err })
}
