// Command multi moves data between host memory and every GPU of the machine
// at once with a transfer.Multi: Broadcast sends the same bytes (a model's
// weights, say) to every device, Scatter sends each device its own shard
// (a batch split across GPUs), and Gather brings every device's data back.
// The copies to different GPUs run concurrently, each on its own stream;
// with one GPU it still works, with one device.
//
// Every byte is read back and checked. On a machine without an NVIDIA driver
// or GPU it prints one line saying so and exits with status 3, as the pinmem
// command does.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer"
)

// sizes are the bytes moved.
type sizes struct {
	weights int // broadcast to every device
	shard   int // one shard per device
}

func main() {
	if err := run(context.Background(), sizes{weights: 64 << 20, shard: 32 << 20}, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "multi: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "multi:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, sz sizes, w io.Writer) (err error) {
	// Every device's primary context.
	n, err := cuda.DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return cuda.ErrNoDevice
	}
	gpus := make([]*cuda.Context, n)
	for i := range gpus {
		dev, err := cuda.GetDevice(i)
		if err != nil {
			return err
		}
		if gpus[i], err = dev.PrimaryContext(); err != nil {
			return err
		}
	}

	m, err := transfer.NewMulti(gpus)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close(ctx)) }()

	// Device memory: the weights and a shard on every device.
	weights := make([]*cuda.DeviceBuffer, n)
	shards := make([]*cuda.DeviceBuffer, n)
	for i, gpu := range gpus {
		if weights[i], err = gpu.Alloc(sz.weights); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, weights[i].Free()) }()
		if shards[i], err = gpu.Alloc(sz.shard); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, shards[i].Free()) }()
	}

	// Broadcast: the same bytes to every device, staged once by the CPU.
	src := pattern(sz.weights, 1)
	bc, err := m.Broadcast(ctx, weights, src)
	if err != nil {
		return err
	}

	// Scatter: device i gets shard i.
	in := make([][]byte, n)
	for i := range in {
		in[i] = pattern(sz.shard, byte(i+2))
	}
	sc, err := m.Scatter(ctx, shards, in)
	if err != nil {
		return err
	}

	// Gather: every device's weights back to the host at once.
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, sz.weights)
	}
	ga, err := m.Gather(ctx, out, weights)
	if err != nil {
		return err
	}
	for i := range out {
		if !bytes.Equal(out[i], src) {
			return fmt.Errorf("device %d: the broadcast weights read back differ", i)
		}
		back := make([]byte, sz.shard)
		if _, err := shards[i].ReadAt(back, 0); err != nil {
			return err
		}
		if !bytes.Equal(back, in[i]) {
			return fmt.Errorf("device %d: its shard read back differs", i)
		}
	}
	fmt.Fprintf(w, "%d devices: broadcast %d MiB at %.1f GB/s, scattered %d MiB shards at %.1f GB/s, gathered at %.1f GB/s (all devices together), every byte checked\n",
		n, sz.weights>>20, bc.GBps(), sz.shard>>20, sc.GBps(), ga.GBps())
	return nil
}

// pattern returns n bytes that differ with seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*5) ^ seed
	}
	return b
}
