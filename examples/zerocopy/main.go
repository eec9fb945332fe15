// Command zerocopy has a kernel read its input straight from host memory:
// the batch lives in pinned memory mapped into the GPU's address space
// (pinmem.Alloc with pinmem.Mapped), and the kernel (kernel/kernel.cu, which
// normalises a ResNet-50 input batch with ImageNet's per-channel mean and
// standard deviation) is given the buffer's device pointer, so no copy to
// device memory is queued: the kernel's loads cross the bus. The output is
// read back and every value checked against the CPU's.
//
// Zero-copy saves the copy when the kernel reads its input once and costs a
// trip over the bus on every read when it reads it again; the measurement of
// both ways, reading the input 1 to 8 times, is ./measure:
//
//	go run ./examples/zerocopy/measure -passes 1,2,4,8
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	const images = 32 // a batch of 224x224 RGB images
	if err := run(context.Background(), images*224*224*kernel.Channels, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "zerocopy: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "zerocopy:", err)
		os.Exit(1)
	}
}

// run normalises n float32 values read by the kernel from mapped memory.
func run(ctx context.Context, n int, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	props, err := dev.Properties()
	if err != nil {
		return err
	}
	if !props.CanMapHostMemory {
		return fmt.Errorf("this GPU cannot map host memory: %w", cuda.ErrNotSupported)
	}
	mod, err := gpu.LoadModule(kernel.PTX)
	if err != nil {
		return fmt.Errorf("loading the kernel: %w", err)
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()
	normalize, err := mod.Function(kernel.Name)
	if err != nil {
		return err
	}

	// The input: pinned, mapped. DevicePtr is where the GPU sees it.
	host, err := pinmem.Alloc(4*n, pinmem.Mapped)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, host.Free()) }()
	mapped, err := host.DevicePtr()
	if err != nil {
		return err
	}
	in, err := pinmem.View[float32](host)
	if err != nil {
		return err
	}
	for i := range in {
		in[i] = float32(i*31%256) / 255 // pixel values in [0, 1]
	}

	// The output, in device memory.
	out, err := gpu.Alloc(4 * n)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Free()) }()
	s, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()

	// No copy in: the kernel reads the host buffer through mapped, once
	// (the last argument is how many times it sweeps its input).
	if err := normalize.Launch(s, cuda.D1(1024), cuda.D1(256), 0, mapped, out.Ptr(), uint64(n), uint32(1)); err != nil {
		return err
	}
	// The host buffer must not change before the kernel has read it.
	if err := s.Synchronize(ctx); err != nil {
		return err
	}

	got := make([]float32, n)
	if _, err := out.ReadAt(transfer.AsBytes(got), 0); err != nil {
		return err
	}
	want := make([]float32, n)
	kernel.Normalize(want, in)
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-6*math.Max(1, math.Abs(float64(want[i]))) {
			return fmt.Errorf("value %d = %v, want %v", i, got[i], want[i])
		}
	}
	fmt.Fprintf(w, "%d float32 values (%.1f MiB) normalised by a kernel reading mapped host memory, no copy in, every value checked\n",
		n, float64(4*n)/(1<<20))
	return nil
}
