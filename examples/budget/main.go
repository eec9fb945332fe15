// Command budget shows pinmem's pinned-memory budget, which follows the
// advice of the article pinmem grew from: keep pinned memory well under the
// physical memory, and know how much is pinned. Every process has a budget
// (by default half of the physical memory it may use; PINMEM_BUDGET or
// pinmem.SetBudget change it); a request that would go over it fails with a
// *pinmem.BudgetError (errors.Is pinmem.ErrBudget) before anything is
// pinned, and pinmem.Stats is the exact account of what pinmem has pinned.
//
// The program sets a budget of 256 MiB, pins 48 MiB buffers until the
// budget refuses one, prints the refusal and the ledger, frees everything
// and checks that the ledger is back where it started. The measurement that
// sets the ledger beside /proc/meminfo for each way of pinning is ./measure:
//
//	go run ./examples/budget/measure -budget 1GiB
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

func main() {
	if err := run(256<<20, 48<<20, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "budget: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "budget:", err)
		os.Exit(1)
	}
}

// run pins chunk-byte buffers under a budget of limit bytes until the
// budget refuses one.
func run(limit int64, chunk int, w io.Writer) (err error) {
	prev := pinmem.SetBudget(limit)
	defer pinmem.SetBudget(prev)
	before := pinmem.Stats().Pinned

	var bufs []*pinmem.Buffer
	defer func() {
		for _, b := range bufs {
			err = errors.Join(err, b.Free())
		}
	}()
	var refusal *pinmem.BudgetError
	for {
		b, err := pinmem.Alloc(chunk, 0)
		if errors.As(err, &refusal) {
			break // nothing was pinned for this request
		}
		if err != nil {
			return err
		}
		bufs = append(bufs, b)
	}
	now := pinmem.Stats().Pinned
	fmt.Fprintf(w, "budget %d MiB: %d buffers of %d MiB pinned, the next refused: %v\n",
		limit>>20, len(bufs), chunk>>20, refusal)
	fmt.Fprintf(w, "the ledger: %d MiB more in %d more buffers (pinmem.Stats)\n",
		(now.Bytes-before.Bytes)>>20, now.Buffers-before.Buffers)
	if now.Bytes-before.Bytes != int64(len(bufs)*chunk) {
		return fmt.Errorf("the ledger grew by %d bytes, want %d", now.Bytes-before.Bytes, len(bufs)*chunk)
	}

	for _, b := range bufs {
		if err := b.Free(); err != nil {
			return err
		}
	}
	bufs = nil
	if after := pinmem.Stats().Pinned; after != before {
		return fmt.Errorf("after Free the ledger holds %+v, want %+v", after, before)
	}
	fmt.Fprintln(w, "every buffer freed: the ledger is back where it started")
	return nil
}
