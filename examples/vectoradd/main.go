// Command vectoradd adds two vectors on the GPU, the first program of most
// CUDA courses, with pinmem: the arrays live in pinned host memory
// (pinmem.Alloc, seen as []float32 through pinmem.View), a and b are copied
// to device memory, the kernel (kernel/kernel.cu, loaded from its PTX) adds
// them, and c is copied back. The copies and the kernel are queued on one
// stream, in order, and from pinned memory the copies run by DMA without
// the CPU. Every element of c is checked.
//
// The article pinmem grew from times this addition with pageable and with
// pinned arrays; that measurement is ./measure:
//
//	go run ./examples/vectoradd/measure -sizes 16MiB,256MiB
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel"
)

func main() {
	if err := run(context.Background(), 16<<20, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "vectoradd: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "vectoradd:", err)
		os.Exit(1)
	}
}

// run computes c = a + b for n float32 elements.
func run(ctx context.Context, n int, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	name, err := dev.Name()
	if err != nil {
		return err
	}

	// The kernel: the driver compiles the PTX for this GPU.
	mod, err := gpu.LoadModule(kernel.PTX)
	if err != nil {
		return fmt.Errorf("loading the kernel: %w", err)
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()
	add, err := mod.Function(kernel.Name)
	if err != nil {
		return err
	}
	s, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()

	// a, b and c in pinned host memory and in device memory.
	var host [3]*pinmem.Buffer
	var vec [3][]float32
	var d [3]*cuda.DeviceBuffer
	for i := range host {
		if host[i], err = pinmem.Alloc(4*n, 0); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, host[i].Free()) }()
		if vec[i], err = pinmem.View[float32](host[i]); err != nil {
			return err
		}
		if d[i], err = gpu.Alloc(4 * n); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, d[i].Free()) }()
	}
	a, b, c := vec[0], vec[1], vec[2]
	for i := range a {
		a[i], b[i] = float32(i%4096), float32(i%1000)/4 // sums exact in float32
	}

	// Copy in, add, copy out: queued on s, they run in this order.
	if err := s.CopyHtoD(d[0], 0, host[0].Bytes()); err != nil {
		return err
	}
	if err := s.CopyHtoD(d[1], 0, host[1].Bytes()); err != nil {
		return err
	}
	if err := add.Launch(s, cuda.D1((n+255)/256), cuda.D1(256), 0, d[0].Ptr(), d[1].Ptr(), d[2].Ptr(), uint64(n)); err != nil {
		return err
	}
	if err := s.CopyDtoH(host[2].Bytes(), d[2], 0); err != nil {
		return err
	}
	// Nothing in host[2] may be read before the copy ran.
	if err := s.Synchronize(ctx); err != nil {
		return err
	}

	for i := range c {
		if c[i] != a[i]+b[i] {
			return fmt.Errorf("c[%d] = %v, want %v + %v", i, c[i], a[i], b[i])
		}
	}
	fmt.Fprintf(w, "c = a + b for %d float32 elements on %s, every element checked\n", n, name)
	return nil
}
