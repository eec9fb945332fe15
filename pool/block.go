package pool

import (
	"fmt"
	"sync/atomic"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Block is pinned memory taken from a Pool with Get. Give it back with
// Put; after Put, Bytes and Segments return nil and the memory must no
// longer be touched (by the host, or by device work queued after the Put).
type Block struct {
	p          *state
	c          *chunk
	n          int
	id         uint64
	state      atomic.Uint32
	prev, next *Block
	stack      string
}

// Bytes returns the block's memory: Len() bytes, with capacity Cap(). It
// returns nil once the block has been Put. A block over 4 GiB may span
// several registrations, which one driver copy must not cross: copy such
// a block segment by segment (see Segments).
func (b *Block) Bytes() []byte {
	if !b.out() {
		return nil
	}
	return b.c.mem[:b.n]
}

// Segments returns the block's memory (Len() bytes) split at the
// boundaries of the registrations it spans, in order: concatenated they
// are Bytes. Blocks up to 4 GiB are one segment; larger blocks pinned by
// registering memory in chunks (pinmem.Buffer.Segments) have one segment
// per chunk. Each segment's capacity ends at its end. It returns nil once
// the block has been Put.
func (b *Block) Segments() [][]byte {
	if !b.out() {
		return nil
	}
	mem := b.c.mem[:b.n]
	if b.c.buf == nil {
		return [][]byte{mem[:len(mem):len(mem)]}
	}
	return splitAt(mem, b.c.buf.Segments())
}

// splitAt splits mem, which starts where segs start, at the segments'
// boundaries; the last piece ends at the end of mem.
func splitAt(mem []byte, segs [][]byte) [][]byte {
	var out [][]byte
	for _, seg := range segs {
		if len(mem) == 0 {
			break
		}
		n := min(len(seg), len(mem))
		out = append(out, mem[:n:n])
		mem = mem[n:]
	}
	if len(mem) > 0 { // segments shorter than mem: cannot happen for a live buffer
		out = append(out, mem[:len(mem):len(mem)])
	}
	return out
}

// Len returns the size requested from Get (0 for a nil Block).
func (b *Block) Len() int {
	if b == nil {
		return 0
	}
	return b.n
}

// Cap returns the block's capacity: its size class, at least Len().
func (b *Block) Cap() int {
	if b == nil || b.c == nil {
		return 0
	}
	return b.c.size
}

// out reports whether b is a block from Get that has not been Put.
func (b *Block) out() bool { return b != nil && b.c != nil && b.state.Load() == stateOut }

// DevicePtr returns the device address of the block's memory, for kernels
// that read or write it directly (zero-copy). The pool must have been
// created WithFlags(pinmem.Mapped) (or the platform must map all pinned
// memory); otherwise the error is pinmem's (matching pinmem.ErrNotMapped).
// After Put it fails with an error matching pinmem.ErrFreed, and for a nil
// Block with cuda.ErrInvalidValue.
func (b *Block) DevicePtr() (cuda.DevicePtr, error) {
	if b == nil || b.p == nil || b.c == nil {
		return 0, fmt.Errorf("pool: DevicePtr of a nil Block (or one not from Get): %w", cuda.ErrInvalidValue)
	}
	if b.state.Load() != stateOut {
		return 0, fmt.Errorf("pool %s: block %d already returned: %w", b.p.name, b.id, pinmem.ErrFreed)
	}
	c := b.c
	if c.buf != nil {
		return c.buf.DevicePtr()
	}
	if c.slab.hasDptr {
		return c.slab.dptr.Add(c.off), nil
	}
	dp, err := c.slab.buf.DevicePtr()
	if err != nil {
		return 0, err
	}
	return dp.Add(c.off), nil
}
