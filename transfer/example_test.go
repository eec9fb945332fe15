package transfer_test

import (
	"bytes"
	"context"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// Copy a Go slice to the GPU and back through the pinned staging ring, then
// run it through a 4-stream pipeline that adds 1 to every byte. Here the
// GPU is cudatest's fake, so that the example runs anywhere, and the
// kernel add_one is a Go function registered with it; on a GPU, leave the
// first lines out and load your kernel's PTX or cubin.
func Example() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	// add_one(ptr, n) adds 1 to each of n bytes.
	if err := drv.RegisterKernel("add_one", 2, func(k *cudatest.Kernel) error {
		mem, err := k.Mem(cuda.DevicePtr(k.Arg(0)), int(k.Arg(1)))
		for i := range mem {
			mem[i]++
		}
		return err
	}); err != nil {
		log.Fatal(err)
	}
	ptx := []byte("// add_one: on the fake GPU, the Go function above\n")

	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	// 3 x 32 MiB pinned stages, up to 12 copy goroutines.
	c, err := transfer.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())

	data := make([]byte, 96<<20) // ordinary Go memory
	for i := range data {
		data[i] = byte(i % 251)
	}
	want := bytes.Clone(data)
	d, err := ctx.Alloc(len(data))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	st, err := c.HtoD(context.Background(), d, data)
	if err != nil {
		log.Fatal(err)
	}
	// st.String() gives the path, GB/s and CPU-s/GB (on the fake, which
	// has no timing model: "no timing on the fake").
	fmt.Println(st.Direction, st.Bytes>>20, "MiB, all staged:", st.StagedBytes == st.Bytes)
	clear(data)
	if _, err := c.DtoH(context.Background(), data, d); err != nil {
		log.Fatal(err)
	}
	fmt.Println("back:", bytes.Equal(data, want))

	mod, err := ctx.LoadModule(ptx)
	if err != nil {
		log.Fatal(err)
	}
	defer mod.Destroy()
	add, err := mod.Function("add_one")
	if err != nil {
		log.Fatal(err)
	}
	p, err := c.NewPipeline(
		transfer.WithChunkSize(32<<20),
		transfer.WithStreams(4),
		transfer.WithOrdered(true),
		transfer.WithWork(transfer.LaunchWork(add, cuda.D1(528), cuda.D1(256), func(ch transfer.Chunk) []any {
			return []any{ch.Dev.Ptr(), uint64(ch.Len)}
		})),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.Run(context.Background(), data, data); err != nil {
		log.Fatal(err)
	}
	fmt.Println("each byte plus one:", data[0] == want[0]+1 && data[len(data)-1] == want[len(want)-1]+1)
	// Output:
	// host-to-device 96 MiB, all staged: true
	// back: true
	// each byte plus one: true
}
