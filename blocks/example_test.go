package blocks_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
)

// A KV cache pages two blocks out to host memory and two others in, both
// at once on two streams, here on cudatest's fake GPU.
func Example() {
	drv, err := cudatest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drv.Close()
	if err := pageOutAndIn(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// driver-batch: 4 blocks, 2 calls
	// paged out: true
	// paged in: true
}

func pageOutAndIn(ctx context.Context) error {
	const bs = 512 << 10 // block size
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	bc, err := blocks.New(gpu)
	if err != nil {
		return err
	}
	defer bc.Close(ctx)
	out, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer out.Destroy()
	in, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer in.Destroy()
	cache, err := gpu.Alloc(4 * bs) // four device slots
	if err != nil {
		return err
	}
	defer cache.Free()
	host, err := pinmem.Alloc(4*bs, 0) // four host slots
	if err != nil {
		return err
	}
	defer host.Free()
	h := host.Bytes()
	for i := range h {
		h[i] = byte(i / bs) // host slots 2 and 3 hold blocks to page in
	}
	if err := cache.Memset(9); err != nil { // device slots 0 and 1 hold blocks to page out
		return err
	}

	evicted := []blocks.Block{{Host: h[0:bs], Dev: cache, Off: 1 * bs}, {Host: h[bs : 2*bs], Dev: cache, Off: 0}}
	restored := []blocks.Block{{Host: h[2*bs : 3*bs], Dev: cache, Off: 3 * bs}, {Host: h[3*bs:], Dev: cache, Off: 2 * bs}}
	rep, err := bc.Copy(ctx, blocks.ToHost(out, evicted), blocks.ToDevice(in, restored))
	if err != nil {
		return err
	}
	fmt.Printf("%v: %d blocks, %d calls\n", rep.Strategy, rep.Blocks, rep.Calls)
	// Each list is done when its stream passes it.
	if err := out.Synchronize(ctx); err != nil {
		return err
	}
	if err := in.Synchronize(ctx); err != nil {
		return err
	}
	fmt.Println("paged out:", bytes.Equal(h[:2*bs], bytes.Repeat([]byte{9}, 2*bs)))
	slot := make([]byte, bs)
	if _, err := cache.ReadAt(slot, int64(3*bs)); err != nil {
		return err
	}
	fmt.Println("paged in:", bytes.Equal(slot, h[2*bs:3*bs]))
	return nil
}
