package pinmem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Pin a buffer, copy it to the device and back, and free it. Without a
// driver or a GPU, Alloc fails with an error matching cuda.ErrNoDriver or cuda.ErrNoDevice.
func ExampleAlloc() {
	buf, err := pinmem.Alloc(64<<20, pinmem.Portable)
	if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		fmt.Println("no GPU here:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
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

	copy(buf.Bytes(), "hello, GPU")
	_ = s.CopyHtoD(d, 0, buf.Bytes()) // asynchronous: the source is pinned
	_ = s.CopyDtoH(buf.Bytes(), d, 0)
	_ = s.Synchronize(context.Background())
	fmt.Println(pinmem.Stats())
}

// Zero-copy: a kernel reads and writes mapped host memory through its device pointer.
func ExampleBuffer_DevicePtr() {
	buf, err := pinmem.Alloc(1<<20, pinmem.Mapped)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	p, err := buf.DevicePtr() // pass p to a kernel (cuda.Function.Launch)
	fmt.Println(p != 0, err)
}

// Pin an existing Go slice in place for fast copies; Free unregisters it.
func ExampleRegister() {
	data := make([]byte, 256<<20)
	buf, err := pinmem.Register(data, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free() // data stays valid Go memory afterwards
}

// Typed views of pinned memory.
func ExampleView() {
	buf, err := pinmem.Alloc(4096, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer buf.Free()
	words, _ := pinmem.View[uint32](buf)
	fmt.Println(len(words)) // 1024
}

// Keep pinned memory under a budget; caches give idle memory back when asked.
func ExampleSetBudget() {
	prev := pinmem.SetBudget(8 << 30)
	defer pinmem.SetBudget(prev)
	_, err := pinmem.Alloc(16<<30, 0)
	var be *pinmem.BudgetError
	if errors.As(err, &be) {
		fmt.Println(be.Requested, be.Pinned, be.Limit)
	}
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
