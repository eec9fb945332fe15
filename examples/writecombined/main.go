// Command writecombined uses write-combined pinned memory the way it is
// meant to be used: as an upload buffer the CPU only writes. Write-combined
// memory (pinmem.WriteCombined, cuMemHostAlloc's
// CU_MEMHOSTALLOC_WRITECOMBINED) is not cached by the CPU: its writes are
// gathered and sent out in bursts, which can make host-to-device copies from
// it faster, and its reads go to memory one by one, which makes them very
// slow. So the program fills the buffer with sequential writes from a Go
// slice, copies it to the GPU, and checks the result by copying the device
// memory back into ordinary memory, never reading the buffer itself.
//
// The measurement of CPU writes, copies and CPU reads with default and
// write-combined memory is ./measure:
//
//	go run ./examples/writecombined/measure -size 64MiB
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

func main() {
	if err := run(64<<20, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "writecombined: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "writecombined:", err)
		os.Exit(1)
	}
}

func run(size int, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}

	// The upload buffer: pinned and write-combined.
	up, err := pinmem.Alloc(size, pinmem.WriteCombined)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, up.Free()) }()
	d, err := gpu.Alloc(size)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	// The data is made in ordinary memory and written into the buffer in
	// one sequential copy: the writes stream out in bursts.
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*13 + i>>12)
	}
	copy(up.Bytes(), src)

	// To the GPU: a synchronous copy, by DMA from the pinned buffer.
	if _, err := d.WriteAt(up.Bytes(), 0); err != nil {
		return err
	}

	// The check reads the device memory back into ordinary memory: reading
	// up.Bytes() with the CPU would be the slow path this memory has.
	back := make([]byte, size)
	if _, err := d.ReadAt(back, 0); err != nil {
		return err
	}
	if !bytes.Equal(back, src) {
		return errors.New("the bytes copied to the GPU differ")
	}
	fmt.Fprintf(w, "%d MiB written into write-combined pinned memory and copied to the GPU, every byte checked\n", size>>20)
	return nil
}
