package pool_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/pool"
)

// A staging pool: blocks carry data to the device asynchronously, and Put
// with the stream keeps a block from being reused before its copy ran.
// Here the GPU is cudatest's fake, so that the example runs anywhere:
// leave the first lines out on a machine with a GPU.
func Example() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	p, err := pool.New(pool.WithName("staging"), pool.WithMaxCached(256<<20))
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := p.Close(context.Background()); err != nil {
			log.Print(err) // lists blocks never Put
		}
	}()

	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Destroy()
	dst, err := ctx.Alloc(3 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer dst.Free()

	for i := range 10 {
		b, err := p.Get(context.Background(), 3<<20) // pinned; a hit after the first round
		if err != nil {
			log.Fatal(err)
		}
		for j := range b.Bytes() {
			b.Bytes()[j] = byte(i)
		}
		if err := s.CopyHtoD(dst, 0, b.Bytes()); err != nil {
			log.Fatal(err)
		}
		// Returns at once; the block is handed out again only after the copy.
		if err := p.Put(b, s); err != nil {
			log.Fatal(err)
		}
	}
	if err := s.Synchronize(context.Background()); err != nil {
		log.Fatal(err)
	}
	st := p.Stats()
	fmt.Println(st.Name, "gets:", st.Gets, "puts:", st.Puts, "in use:", st.InUseBlocks)
	// Output: staging gets: 10 puts: 10 in use: 0
}
