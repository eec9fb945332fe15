package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
)

// Copy data to the GPU, run a kernel on it and copy it back. On a machine
// without an NVIDIA driver the first call returns an error matching
// cuda.ErrNoDriver. Here the GPU is cudatest's fake, so that the example
// runs anywhere, and the kernel add_one is a Go function registered with
// it; on a GPU, leave the first lines out and load your kernel's PTX or
// cubin.
func Example() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	// add_one(ptr, n) adds 1 to each of n bytes.
	ptx := []byte("// add_one: on the fake GPU, the Go function below\n")
	if err := drv.RegisterKernel("add_one", 2, func(k *cudatest.Kernel) error {
		mem, err := k.Mem(cuda.DevicePtr(k.Arg(0)), int(k.Arg(1)))
		for i := range mem {
			mem[i]++
		}
		return err
	}); err != nil {
		log.Fatal(err)
	}

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

	mod, err := ctx.LoadModule(ptx)
	if errors.Is(err, cuda.ErrKernelImage) {
		fmt.Println("the driver cannot load this image:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer mod.Destroy()
	add, err := mod.Function("add_one")
	if err != nil {
		log.Fatal(err)
	}
	if err := add.Launch(s, cuda.D1(256), cuda.D1(256), 0, buf.Ptr(), uint64(buf.Size())); err != nil {
		log.Fatal(err)
	}
	out := make([]byte, buf.Size())
	if err := s.CopyDtoH(out, buf, 0); err != nil {
		log.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(out[0], out[len(out)-1])
	// Output: 1 1
}

// Errors carry the driver's own name and text and match sentinels (an
// out-of-memory failure injected into cudatest's fake GPU here).
func ExampleError() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	if err := drv.FailOn("cuMemAlloc_v2", cudatest.Once(), cuda.ResultOutOfMemory); err != nil {
		log.Fatal(err)
	}
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	_, err = ctx.Alloc(1 << 20)
	var de *cuda.Error
	switch {
	case errors.As(err, &de):
		fmt.Println(de.Op, de.Name, errors.Is(err, cuda.ErrOutOfMemory))
	case errors.Is(err, cuda.ErrNoDriver):
		fmt.Println("no NVIDIA driver")
	}
	// Output: cuMemAlloc_v2 CUDA_ERROR_OUT_OF_MEMORY true
}
