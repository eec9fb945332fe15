package cuda_test

import (
	"context"
	"log"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Queue many small copies, each followed by an event the host can wait on
// per chunk, with one crossing into the driver per 16 operations.
func ExampleBatch() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Print(err) // no driver or no GPU here
		return
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

	const chunk, chunks = 64 << 10, 32
	host, err := pinmem.Alloc(chunk*chunks, 0) // async copies need pinned memory
	if err != nil {
		log.Fatal(err)
	}
	defer host.Free()
	d, err := ctx.Alloc(chunk * chunks)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	done := make([]*cuda.Event, chunks)
	for i := range done {
		if done[i], err = ctx.NewEvent(cuda.EventDisableTiming); err != nil {
			log.Fatal(err)
		}
		defer done[i].Destroy()
	}

	b := ctx.NewBatch()
	for i := range chunks {
		off := i * chunk
		b.CopyHtoD(s, d.Ptr()+cuda.DevicePtr(off), host.Bytes()[off:off+chunk]).Record(done[i], s)
	}
	if n, err := b.Issue(); err != nil {
		log.Fatalf("queued %d of %d operations: %v", n, 2*chunks, err)
	}
	if err := done[chunks-1].Synchronize(context.Background()); err != nil {
		log.Fatal(err)
	}
}
