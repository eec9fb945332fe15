package pool

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pinmem/pinmem/cuda"
)

var (
	// ErrClosed is returned by Get and Trim on a closed pool, and by Close
	// once the pool has released everything. It is cuda.ErrClosed.
	ErrClosed = cuda.ErrClosed
	// ErrOutstanding matches the *OutstandingError Close returns when
	// blocks were still out.
	ErrOutstanding = errors.New("pool: blocks still out at Close")
)

// Outstanding describes one block that was still out when its pool was closed.
type Outstanding struct {
	ID    uint64 // the block's sequence number in its pool, from 1
	Size  int    // the size requested from Get
	Cap   int    // the block's capacity
	Stack string // where Get was called, when the pool records stacks (WithStacks)
}

// OutstandingError is returned by Close when blocks taken with Get had not
// been Put. Their memory stays pinned and valid until they are Put, which
// then unpins it.
type OutstandingError struct {
	Pool   string        // the pool's name
	Blocks []Outstanding // the blocks still out, in the order they were taken
}

// Error lists the blocks (the first 16) with their sizes and, when
// recorded, where they were taken.
func (e *OutstandingError) Error() string {
	if e == nil {
		return "<nil>"
	}
	var b strings.Builder
	var bytes int64
	for _, o := range e.Blocks {
		bytes += int64(o.Cap)
	}
	fmt.Fprintf(&b, "pool %s: %d block(s) (%d bytes) still out at Close:", e.Pool, len(e.Blocks), bytes)
	for i, o := range e.Blocks {
		if i == 16 {
			fmt.Fprintf(&b, "\n  ... and %d more", len(e.Blocks)-i)
			break
		}
		fmt.Fprintf(&b, "\n  block %d: %d bytes (capacity %d)", o.ID, o.Size, o.Cap)
		if o.Stack != "" {
			b.WriteString(", taken at:\n")
			b.WriteString(o.Stack)
		}
	}
	return b.String()
}

// Is matches ErrOutstanding.
func (e *OutstandingError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == ErrOutstanding
}
