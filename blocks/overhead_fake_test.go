package blocks_test

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
)

// BenchmarkCopyFake measures, on the CPU with the fake driver, the
// host-side cost of one Copy of 4096 scattered blocks (shuffled on both
// sides, carved from one pinned, mapped buffer) of 256 bytes, small enough
// that the fake's copies cost little: the checks, the sorts, the pieces
// and the hand-over to the driver, per strategy, each way and both ways
// at once. The fake's block kernel does nothing here (its Go twin would
// cost more than pinmem's whole call), so the kernel's rows are the cost
// a GPU pays before the launch. It says nothing about a GPU's figures;
// "ns/block" is pinmem's cost per block.
//
//	go test ./blocks -run '^$' -bench CopyFake -benchmem
func BenchmarkCopyFake(b *testing.B) {
	const bs, nblk = 256, 4096
	e := newEnv(b, fakedrv.Options{}, bs, nblk, pinmem.Mapped)
	e.fd.RegisterKernel(kernels.KernelBlockCopy, []int{8, 4}, func(*fakedrv.KernelCall) error { return nil })
	in, out := blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in)), blocks.ToHost(e.s2, e.list(e.dst.Bytes(), e.out))
	for _, c := range []struct {
		name string
		opt  blocks.Option
	}{{"per-copy", blocks.WithStrategy(blocks.PerCopy)}, {"driver-batch", blocks.WithStrategy(blocks.DriverBatch)}, {"kernel", blocks.WithKernel(nblk)}} {
		bc := newCopier(b, e.ctx, c.opt)
		for _, dirs := range []struct {
			name  string
			lists []blocks.List
		}{{"h2d", []blocks.List{in}}, {"d2h", []blocks.List{out}}, {"bidir", []blocks.List{out, in}}} {
			b.Run(c.name+"/"+dirs.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bc.Copy(context.Background(), dirs.lists...); err != nil {
						b.Fatal(err)
					}
					must(b, e.s1.Synchronize(context.Background()))
					must(b, e.s2.Synchronize(context.Background()))
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nblk*len(dirs.lists)), "ns/block")
			})
		}
	}
}
