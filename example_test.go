package pinmem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
)

// Pin a buffer, copy it to the device and back, and free it. Without a
// driver or a GPU, Alloc fails with an error matching cuda.ErrNoDriver or
// cuda.ErrNoDevice. Here the GPU is cudatest's fake, so that the example
// runs anywhere: leave the first lines out on a machine with a GPU.
func ExampleAlloc() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	buf, err := pinmem.Alloc(64<<20, pinmem.Portable)
	if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		fmt.Println("no GPU here:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Free()
	fmt.Println("pinned:", pinmem.Stats().Pinned.Bytes>>20, "MiB")

	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	d, err := ctx.Alloc(buf.Len())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Destroy()

	copy(buf.Bytes(), "hello, GPU")
	if err := s.CopyHtoD(d, 0, buf.Bytes()); err != nil { // asynchronous: the source is pinned
		log.Fatal(err)
	}
	clear(buf.Bytes()[:10])
	if err := s.CopyDtoH(buf.Bytes(), d, 0); err != nil {
		log.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("back from the GPU: %s\n", buf.Bytes()[:10])
	// Output:
	// pinned: 64 MiB
	// back from the GPU: hello, GPU
}

// Zero-copy: a kernel reads and writes mapped host memory through its
// device pointer (on cudatest's fake GPU here).
func ExampleBuffer_DevicePtr() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	buf, err := pinmem.Alloc(1<<20, pinmem.Mapped)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	p, err := buf.DevicePtr() // pass p to a kernel (cuda.Function.Launch)
	fmt.Println(p != 0, err)
	// Output: true <nil>
}

// Pin an existing Go slice in place for fast copies; Free unregisters it
// (on cudatest's fake GPU here).
func ExampleRegister() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	data := make([]byte, 256<<20)
	buf, err := pinmem.Register(data, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("registered:", buf.Len()>>20, "MiB, the same memory:", &buf.Bytes()[0] == &data[0])
	if err := buf.Free(); err != nil { // data stays valid Go memory afterwards
		fmt.Println(err)
	}
	// Output: registered: 256 MiB, the same memory: true
}

// Typed views of pinned memory (on cudatest's fake GPU here).
func ExampleView() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	buf, err := pinmem.Alloc(4096, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	words, err := pinmem.View[uint32](buf)
	fmt.Println(len(words), err)
	// Output: 1024 <nil>
}

// Keep pinned memory under a budget: a request beyond it is refused with
// a *BudgetError, before anything is pinned (on cudatest's fake GPU here).
func ExampleSetBudget() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()

	prev := pinmem.SetBudget(8 << 30)
	defer pinmem.SetBudget(prev)
	_, err = pinmem.Alloc(16<<30, 0)
	var be *pinmem.BudgetError
	if errors.As(err, &be) {
		fmt.Println(be.Requested>>30, "GiB requested,", be.Pinned, "pinned, a limit of", be.Limit>>30, "GiB")
	}
	fmt.Println(errors.Is(err, pinmem.ErrBudget))
	// Output:
	// 16 GiB requested, 0 pinned, a limit of 8 GiB
	// true
}

// Copy a large buffer to the device one segment (one registration) at a
// time: a single copy spanning two registrations is refused by the driver.
func ExampleBuffer_Segments() {
	buf, err := pinmem.Alloc(6<<30, 0) // on a discrete GPU: a 4 GiB and a 2 GiB registration
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	dev, _ := cuda.GetDevice(0)
	ctx, _ := dev.PrimaryContext()
	d, err := ctx.Alloc(buf.Len())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	s, _ := ctx.NewStream(cuda.StreamNonBlocking)
	defer s.Destroy()
	off := 0
	for _, seg := range buf.Segments() {
		if err := s.CopyHtoD(d, off, seg); err != nil {
			log.Fatal(err)
		}
		off += len(seg)
	}
	_ = s.Synchronize(context.Background())
}
