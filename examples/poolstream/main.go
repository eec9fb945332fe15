// Command poolstream sends a stream of batches to the GPU through a pool of
// pinned buffers (package pool), the way a data loader feeds a model: each
// batch is written into a pooled block, copied to the device asynchronously
// on a stream, and given back to the pool with that stream at once. The pool
// hands the block out again only after the copy queued before the Put has
// run, so the CPU fills the next batch while the copy engine moves the last
// one, and no block is pinned per batch.
//
// At the end it reads every batch back from the device, checks every byte,
// and prints the pool's hits and misses. On a machine without an NVIDIA
// driver or GPU it prints one line saying so and exits with status 3, as the
// pinmem command does.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/pool"
)

const (
	batches   = 32
	batchSize = 4 << 20
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "poolstream: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "poolstream:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}

	// A non-blocking stream: its copies run beside the CPU's work.
	s, err := gpu.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()

	// The pool. Close releases its pinned memory; its context bounds the
	// wait for copies still using blocks given back with a stream.
	p, err := pool.New(pool.WithName("batches"))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close(ctx)) }()

	// Device memory for every batch, one after the other.
	d, err := gpu.Alloc(batches * batchSize)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	for i := range batches {
		b, err := p.Get(ctx, batchSize) // pinned; a block given back earlier when its copy has run
		if err != nil {
			return err
		}
		fill(b.Bytes(), i)
		if err := s.CopyHtoD(d, i*batchSize, b.Bytes()); err != nil {
			return errors.Join(err, p.Put(b)) // nothing was queued: the block is free at once
		}
		// Give the block back with the stream that reads it: Put returns
		// at once, and the pool reuses the block only after the copy ran.
		if err := p.Put(b, s); err != nil {
			return err
		}
	}
	if err := s.Synchronize(ctx); err != nil {
		return err
	}

	// Read every batch back and check it.
	back := make([]byte, batchSize)
	want := make([]byte, batchSize)
	for i := range batches {
		if _, err := d.ReadAt(back, int64(i*batchSize)); err != nil {
			return err
		}
		fill(want, i)
		if string(back) != string(want) {
			return fmt.Errorf("batch %d differs on the device", i)
		}
	}
	st := p.Stats()
	fmt.Fprintf(w, "%d batches of %d MiB through %d pinned blocks (%d pool hits, %d misses), every byte checked\n",
		batches, batchSize>>20, st.Pins, st.Hits, st.Misses)
	return nil
}

// fill writes batch i's bytes: a pattern that differs from batch to batch.
func fill(b []byte, i int) {
	for j := range b {
		b[j] = byte(j*7 + i*13)
	}
}
