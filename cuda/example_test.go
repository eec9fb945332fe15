package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// Copy data to the GPU and back, and run one of pinmem's kernels on it.
// On a machine without an NVIDIA driver the first call returns an error
// matching cuda.ErrNoDriver.
func Example() {
	dev, err := cuda.GetDevice(0)
	if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		fmt.Println("no GPU here:", err)
		return
	}
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

	buf, err := ctx.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Free()
	if _, err := buf.WriteAt(make([]byte, 1<<20), 0); err != nil {
		log.Fatal(err)
	}

	mod, err := ctx.LoadModule(kernels.PTX())
	if errors.Is(err, cuda.ErrKernelImage) {
		fmt.Println("the driver is too old for pinmem's kernels:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer mod.Destroy()
	add, err := mod.Function(kernels.KernelAdd)
	if err != nil {
		log.Fatal(err)
	}
	if err := add.Launch(s, cuda.D1(256), cuda.D1(256), 0, buf.Ptr(), uint64(buf.Size()), uint8(1)); err != nil {
		log.Fatal(err)
	}
	out := make([]byte, buf.Size())
	if err := s.CopyDtoH(out, buf, 0); err != nil {
		log.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(out[0], out[len(out)-1]) // 1 1
}

// Errors carry the driver's own name and text and match sentinels.
func ExampleError() {
	_, err := cuda.DeviceCount()
	var de *cuda.Error
	switch {
	case errors.As(err, &de):
		fmt.Println(de.Op, de.Code, de.Name, de.Message)
	case errors.Is(err, cuda.ErrNoDriver):
		fmt.Println("no NVIDIA driver")
	}
}
