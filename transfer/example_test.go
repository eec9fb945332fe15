package transfer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/transfer"
)

// Copy a Go slice to the GPU and back through the pinned staging ring, then
// run it through a 4-stream pipeline that adds 1 to every byte.
func Example() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	// 3 x 32 MiB pinned stages, up to 12 copy goroutines; WithStats(true)
	// measures the CPU time a copy costs.
	c, err := transfer.New(ctx, transfer.WithStats(true))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	data := make([]byte, 256<<20) // ordinary Go memory
	d, err := ctx.Alloc(len(data))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	st, err := c.HtoD(context.Background(), d, data)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%.1f GB/s, %.2f CPU-s/GB\n", st.GBps(), st.CPUPerGB())
	if _, err := c.DtoH(context.Background(), data, d); err != nil {
		log.Fatal(err)
	}

	mod, err := ctx.LoadModule(kernels.Image())
	if err != nil {
		log.Fatal(err)
	}
	defer mod.Destroy()
	add, err := mod.Function(kernels.KernelAdd)
	if err != nil {
		log.Fatal(err)
	}
	p, err := c.NewPipeline(
		transfer.WithChunkSize(32<<20),
		transfer.WithStreams(4),
		transfer.WithOrdered(true),
		transfer.WithWork(transfer.LaunchWork(add, cuda.D1(528), cuda.D1(256), func(ch transfer.Chunk) []any {
			return []any{ch.Dev.Ptr(), uint64(ch.Len), uint8(1)}
		})),
		transfer.WithDone(func(ch transfer.Chunk) error {
			// ch.Out holds chunk ch.Index's result.
			return nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.Run(context.Background(), data, data); err != nil {
		log.Fatal(err)
	}
}
