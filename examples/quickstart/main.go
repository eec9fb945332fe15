// Command quickstart copies 64 MiB of pinned host memory to GPU 0 and back
// into an ordinary Go slice, and checks every byte. On a machine without an
// NVIDIA driver or GPU it prints one line saying so and exits with status 3,
// as the pinmem command does.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	if err := run(context.Background()); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "quickstart: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}

	// Pinned host memory: the copy engine reads it by DMA at full speed.
	buf, err := pinmem.Alloc(64<<20, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Free()) }()
	src := buf.Bytes()
	for i := range src {
		src[i] = byte(i % 251)
	}

	d, err := gpu.Alloc(len(src))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	// A Copier moves any Go slice, staging it through pinned buffers.
	cp, err := transfer.New(gpu)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Close(ctx)) }()

	up, err := cp.HtoD(ctx, d, src)
	if err != nil {
		return err
	}
	back := make([]byte, len(src))
	down, err := cp.DtoH(ctx, back, d)
	if err != nil {
		return err
	}
	if !bytes.Equal(back, src) {
		return errors.New("the data read back from the GPU differs")
	}
	fmt.Printf("64 MiB to the GPU at %.1f GB/s and back at %.1f GB/s, every byte checked\n",
		up.GBps(), down.GBps())
	return nil
}
