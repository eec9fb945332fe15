package cuda_test

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// BenchmarkCopyBlocksFake measures, on the CPU with the fake driver,
// the host-side cost of CopyBlocks for 4096 scattered blocks (shuffled on
// both sides, carved from one pinned buffer) of 256 bytes, small enough
// that the fake's copies cost little: the checks, the sort, the plan and
// the hand-over to the driver, per strategy. It says nothing about a
// GPU's figures; its ns/op divided by 4096 is pinmem's cost per block.
//
//	go test ./cuda -run '^$' -bench CopyBlocksFake -benchmem
func BenchmarkCopyBlocksFake(b *testing.B) {
	const bs, nblk = 256, 4096
	e := newBlockEnv(b, fakedrv.Options{}, bs, nblk)
	l := e.list(e.src.Bytes())
	for _, st := range []cuda.BlockStrategy{cuda.BlockPerCopy, cuda.BlockDriverBatch} {
		b.Run(st.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockStrategy(st)); err != nil {
					b.Fatal(err)
				}
				if err := e.s.Synchronize(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/nblk, "ns/block")
		})
	}
}
