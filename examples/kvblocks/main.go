// Command kvblocks pages a KV cache the way an inference server does: 4096
// blocks of 16 KiB that live in one device allocation are paged out, each
// to a free slot of a pinned host pool, the device blocks are evicted
// (cleared), and the blocks are paged back in to new device slots. Each
// direction is one cuda.Stream.CopyBlocks call with one completion event,
// instead of 4096 driver copies; every byte is checked at the end. On a
// machine without an NVIDIA driver or GPU it prints one line saying so and
// exits with status 1.
//
//	kvblocks [-blocks 4096] [-kib 16] [-strategy auto|driver-batch|per-copy|kernel]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

type config struct {
	blocks, blockSize int
	strategy          cuda.BlockStrategy
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("kvblocks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("blocks", 4096, "number of KV blocks")
	kib := fs.Int("kib", 16, "block size in KiB")
	strategy := fs.String("strategy", "auto", "auto, driver-batch, per-copy or kernel")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *n <= 0 || *kib <= 0 {
		return config{}, errors.New("-blocks and -kib must be positive")
	}
	cfg := config{blocks: *n, blockSize: *kib << 10}
	switch *strategy {
	case "auto":
		cfg.strategy = cuda.BlockAuto
	case "driver-batch":
		cfg.strategy = cuda.BlockDriverBatch
	case "per-copy":
		cfg.strategy = cuda.BlockPerCopy
	case "kernel":
		cfg.strategy = cuda.BlockKernelCopy
	default:
		return config{}, fmt.Errorf("unknown -strategy %q", *strategy)
	}
	return cfg, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	if _, err := run(context.Background(), cfg, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "kvblocks: this needs an NVIDIA GPU:", err)
		} else {
			fmt.Fprintln(os.Stderr, "kvblocks:", err)
		}
		os.Exit(1)
	}
}

// result is what one run measured.
type result struct {
	strategy cuda.BlockStrategy
	out, in  float64 // GB/s of the page-out and the page-in
}

func run(_ context.Context, cfg config, w io.Writer) (res result, err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return res, err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return res, err
	}
	n, bs := cfg.blocks, cfg.blockSize
	size := n * bs

	// The device's KV cache: one allocation of n block slots.
	kv, err := gpu.Alloc(size)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, kv.Free()) }()
	// The host pool the blocks are paged out to: pinned, so the copy
	// engines reach it by DMA and CopyBlocks accepts it; mapped, so the
	// kernel strategy can reach it too.
	pool, err := pinmem.Alloc(size, pinmem.Mapped)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, pool.Free()) }()
	s, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()
	done, err := gpu.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, done.Destroy()) }()

	// The cache's contents, as the model would have written them.
	want := make([]byte, size)
	r := rand.New(rand.NewPCG(16, 4096))
	for i := 0; i+8 <= size; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			want[i+j] = byte(v >> (8 * j))
		}
	}
	if _, err := kv.WriteAt(want, 0); err != nil {
		return res, err
	}

	// Block b sits in device slot b; the server gives it host slot
	// hostSlot[b] when paging out and device slot devSlot[b] when paging
	// back in (free slots are rarely in order).
	hostSlot, devSlot := r.Perm(n), r.Perm(n)
	out := make([]cuda.BlockCopy, n)
	in := make([]cuda.BlockCopy, n)
	host := pool.Bytes()
	for b := range n {
		h := host[hostSlot[b]*bs : (hostSlot[b]+1)*bs]
		out[b] = cuda.BlockCopy{Host: h, Dev: kv, Off: b * bs}
		in[b] = cuda.BlockCopy{Host: h, Dev: kv, Off: devSlot[b] * bs}
	}
	opts := []cuda.BlockOption{cuda.WithBlockStrategy(cfg.strategy), cuda.WithBlockEvent(done)}
	if cfg.strategy == cuda.BlockKernelCopy {
		k, kerr := gpu.NewBlockKernel(n)
		if kerr != nil {
			return res, kerr
		}
		defer func() { err = errors.Join(err, k.Close()) }()
		opts = append(opts, cuda.WithBlockKernel(k))
	}
	page := func(dir cuda.Direction, l []cuda.BlockCopy) (float64, cuda.BlockStrategy, error) {
		t0 := time.Now()
		rep, err := s.CopyBlocks(dir, l, opts...)
		if err != nil {
			return 0, 0, errors.Join(err, s.Synchronize(context.Background()))
		}
		if err := done.Synchronize(context.Background()); err != nil {
			return 0, 0, err
		}
		return float64(rep.Bytes) / float64(time.Since(t0).Nanoseconds()), rep.Strategy, nil
	}

	if res.out, res.strategy, err = page(cuda.DeviceToHost, out); err != nil {
		return res, fmt.Errorf("paging out: %w", err)
	}
	if err := kv.Memset(0); err != nil { // evicted: the slots are reused
		return res, err
	}
	if res.in, _, err = page(cuda.HostToDevice, in); err != nil {
		return res, fmt.Errorf("paging in: %w", err)
	}

	got := make([]byte, size)
	if _, err := kv.ReadAt(got, 0); err != nil {
		return res, err
	}
	for b := range n {
		d := devSlot[b]
		if !bytes.Equal(got[d*bs:(d+1)*bs], want[b*bs:(b+1)*bs]) {
			return res, fmt.Errorf("block %d came back to device slot %d with other bytes", b, d)
		}
	}
	fmt.Fprintf(w, "paged %d blocks of %d KiB out at %.1f GB/s and back in at %.1f GB/s (%v), every byte checked\n",
		n, bs>>10, res.out, res.in, res.strategy)
	return res, nil
}
