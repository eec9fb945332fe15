// Command asyncop copies 64 MiB of ordinary Go memory to the GPU and back
// with a transfer.Copier's asynchronous operations (HtoDAsync, DtoHAsync),
// each under a deadline, trying again with a longer deadline when one
// passes first: the pattern of a service that must not wait forever on a
// busy or stuck GPU.
//
// An Op started with a context that has a deadline stops when the deadline
// passes, with an error matching context.DeadlineExceeded; the Copier stays
// usable and the source may be used again once the Op is done. While an Op
// runs, the caller's goroutine is free: here it computes the checksum the
// data read back is checked against.
//
// Usage:
//
//	asyncop [-timeout 1s] [-attempts 3]
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer"
)

// config is what the flags select.
type config struct {
	size     int
	timeout  time.Duration // the first attempt's deadline; each retry doubles it
	attempts int
}

func main() {
	cfg := config{size: 64 << 20}
	flag.DurationVar(&cfg.timeout, "timeout", time.Second, "deadline of an operation's first attempt (doubled on each retry)")
	flag.IntVar(&cfg.attempts, "attempts", 3, "attempts per operation")
	flag.Parse()
	if cfg.timeout <= 0 || cfg.attempts < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "asyncop: want -timeout above 0, -attempts of at least 1 and no arguments")
		os.Exit(2)
	}
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "asyncop: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "asyncop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	d, err := gpu.Alloc(cfg.size)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Free()) }()
	cp, err := transfer.New(gpu)
	if err != nil {
		return err
	}
	// Close also waits for the copies that an attempt which missed its
	// deadline left queued; ctx bounds that wait.
	defer func() { err = errors.Join(err, cp.Close(ctx)) }()

	src := make([]byte, cfg.size)
	for i := range src {
		src[i] = byte(i * 31)
	}
	up, err := retry(ctx, cfg, w, "host to device", func(ctx context.Context) *transfer.Op {
		return cp.HtoDAsync(ctx, d, src)
	})
	if err != nil {
		return err
	}

	var back []byte
	var want uint32
	down, err := retry(ctx, cfg, w, "device to host", func(ctx context.Context) *transfer.Op {
		// Each attempt reads into a slice of its own: one that missed its
		// deadline may still be written until its Op is done.
		back = make([]byte, cfg.size)
		op := cp.DtoHAsync(ctx, back, d)
		want = crc32.ChecksumIEEE(src) // the CPU's work while the copy runs
		return op
	})
	if err != nil {
		return err
	}
	if crc32.ChecksumIEEE(back) != want || !bytes.Equal(back, src) {
		return errors.New("the data read back from the GPU differs")
	}
	fmt.Fprintf(w, "%d MiB to the GPU at %.1f GB/s and back at %.1f GB/s, each under a deadline, every byte checked\n",
		cfg.size>>20, up.GBps(), down.GBps())
	return nil
}

// retry runs an asynchronous operation, started by start with a context
// that carries its deadline, and waits for it. When the deadline passes
// first it starts the operation again with twice the time, up to
// cfg.attempts times. Any other error, or the end of ctx, ends it at once.
func retry(ctx context.Context, cfg config, w io.Writer, what string, start func(context.Context) *transfer.Op) (transfer.Stats, error) {
	timeout := cfg.timeout
	for attempt := 1; ; attempt++ {
		opCtx, cancel := context.WithTimeout(ctx, timeout)
		op := start(opCtx)
		// Wait bounded by the attempt's deadline. A missed attempt's Op may
		// not be done yet (its copies are queued on a stuck device): its
		// source may still be read and its destination written until it
		// is, so a retry reads into fresh memory. The Copier's fence
		// queues the retry's device copies behind the missed ones, so the
		// retry's data is never overwritten by them.
		st, err := op.Wait(opCtx)
		cancel()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || attempt == cfg.attempts {
			if err != nil {
				err = fmt.Errorf("%s, attempt %d of %d: %w", what, attempt, cfg.attempts, err)
			}
			return st, err
		}
		fmt.Fprintf(w, "%s: attempt %d missed its %v deadline; trying again with %v\n", what, attempt, timeout, 2*timeout)
		timeout *= 2
	}
}
