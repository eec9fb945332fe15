// Command kvblocks does one step of a KV cache offloader the way an
// inference server does it: while the blocks of finished requests are
// paged out of GPU memory to a pinned host pool, the blocks of resumed
// requests are paged back in, both at once on two streams with one
// blocks.Copier call. The blocks sit in shuffled slots on both sides, as a
// free list hands them out; every byte is checked at the end. On a machine
// without an NVIDIA driver or GPU it prints one line saying so and exits
// with status 3.
//
//	kvblocks [-blocks 1024] [-kib 2048] [-strategy auto|driver-batch|per-copy|kernel]
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
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
)

type config struct {
	blocks, blockSize int
	strategy          blocks.Strategy
}

var strategies = map[string]blocks.Strategy{"auto": blocks.Auto, "driver-batch": blocks.DriverBatch, "per-copy": blocks.PerCopy, "kernel": blocks.Kernel}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("kvblocks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("blocks", 1024, "blocks paged each way")
	kib := fs.Int("kib", 2048, "block size in KiB")
	strategy := fs.String("strategy", "auto", "auto, driver-batch, per-copy or kernel")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	s, ok := strategies[*strategy]
	switch {
	case fs.NArg() > 0:
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	case *n <= 0 || *kib <= 0:
		return config{}, errors.New("-blocks and -kib must be positive")
	case !ok:
		return config{}, fmt.Errorf("unknown -strategy %q", *strategy)
	}
	return config{blocks: *n, blockSize: *kib << 10, strategy: s}, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	if _, err := run(context.Background(), cfg, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "kvblocks: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		} else {
			fmt.Fprintln(os.Stderr, "kvblocks:", err)
		}
		os.Exit(1)
	}
}

// run pages cfg.blocks blocks out and as many in at once, checks them and
// returns the report of the copy.
func run(ctx context.Context, cfg config, w io.Writer) (rep blocks.Report, err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return rep, err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return rep, err
	}
	n, bs := cfg.blocks, cfg.blockSize

	// The GPU's KV cache and the host pool: 2n block slots each. The pool
	// is pinned, so the copy engines reach it by DMA, and mapped, so the
	// kernel strategy can reach it too.
	kv, err := gpu.Alloc(2 * n * bs)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, kv.Free()) }()
	pool, err := pinmem.Alloc(2*n*bs, pinmem.Mapped)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, pool.Free()) }()
	var out, in *cuda.Stream
	for _, s := range []**cuda.Stream{&out, &in} {
		if *s, err = gpu.NewStream(cuda.StreamNonBlocking); err != nil {
			return rep, err
		}
		defer func() { err = errors.Join(err, (*s).Destroy()) }()
	}
	// The kernel for Kernel, and for Auto, which takes it for small blocks
	// (the pool is mapped), as package blocks recommends.
	var opts []blocks.Option
	if cfg.strategy == blocks.Kernel || cfg.strategy == blocks.Auto {
		opts = append(opts, blocks.WithKernel(n))
	}
	bc, err := blocks.New(gpu, append(opts, blocks.WithStrategy(cfg.strategy))...)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, bc.Close(ctx)) }()

	// Finished requests' blocks fill GPU slots 0..n-1; resumed requests'
	// blocks wait in host slots n..2n-1, paged out by an earlier step.
	r := rand.New(rand.NewPCG(16, 4096))
	finished, resumed := make([]byte, n*bs), pool.Bytes()[n*bs:]
	for _, b := range [][]byte{finished, resumed} {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	}
	want := bytes.Clone(resumed)
	if _, err := kv.WriteAt(finished, 0); err != nil {
		return rep, err
	}

	// The free lists hand out slots in no order: block b goes out to host
	// slot hostSlot[b], and resumed block b comes in to GPU slot n+gpuSlot[b].
	hostSlot, gpuSlot := r.Perm(n), r.Perm(n)
	host := pool.Bytes()
	evict := make([]blocks.Block, n)
	restore := make([]blocks.Block, n)
	for b := range n {
		evict[b] = blocks.Block{Host: host[hostSlot[b]*bs:][:bs], Dev: kv, Off: b * bs}
		restore[b] = blocks.Block{Host: resumed[b*bs:][:bs], Dev: kv, Off: (n + gpuSlot[b]) * bs}
	}

	t0 := time.Now()
	rep, err = bc.Copy(ctx, blocks.ToHost(out, evict), blocks.ToDevice(in, restore))
	if err != nil {
		return rep, errors.Join(fmt.Errorf("paging: %w", err), out.Synchronize(ctx), in.Synchronize(ctx))
	}
	if err := errors.Join(out.Synchronize(ctx), in.Synchronize(ctx)); err != nil {
		return rep, err
	}
	secs := time.Since(t0).Seconds()

	got := make([]byte, bs)
	for b := range n {
		if !bytes.Equal(evict[b].Host, finished[b*bs:][:bs]) {
			return rep, fmt.Errorf("block %d came out to host slot %d with other bytes", b, hostSlot[b])
		}
		if _, err := kv.ReadAt(got, int64((n+gpuSlot[b])*bs)); err != nil {
			return rep, err
		}
		if !bytes.Equal(got, want[b*bs:][:bs]) {
			return rep, fmt.Errorf("block %d came in to GPU slot %d with other bytes", b, n+gpuSlot[b])
		}
	}
	fmt.Fprintf(w, "paged %d blocks of %d KiB out and %d in at once: %.1f GB/s both ways (%v, %d driver calls), every byte checked\n",
		n, bs>>10, n, float64(rep.Bytes)/secs/1e9, rep.Strategy, rep.Calls)
	return rep, nil
}
