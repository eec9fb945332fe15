package cuda

import (
	"fmt"
	"runtime"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// Batch collects asynchronous copies and event records, on any streams of
// one context, and issues them in order with one crossing from Go into the
// driver per 16 operations instead of one per operation. Each crossing
// has a fixed cost on top of the driver's own work (Go's runtime.cgocall,
// which cgo pays too); a batch pays it once per 16 operations. Use it where
// a loop issues many small operations (a copy and an event per chunk, say).
//
// A Batch is not safe for concurrent use. The host memory of its copies
// must be pinned and must stay alive until the copies have run, as with
// Stream.CopyHtoD; the Batch itself keeps the slices reachable only until
// Issue returns.
type Batch struct {
	ctx  *Context
	ops  []cudadrv.BatchOp
	keep [][]byte
	err  error
}

// NewBatch returns an empty batch for streams and events of c.
func (c *Context) NewBatch() *Batch { return &Batch{ctx: c} }

// Len returns how many operations are waiting for Issue (0 for a nil Batch).
func (b *Batch) Len() int {
	if b == nil {
		return 0
	}
	return len(b.ops)
}

// add appends op after checking that s (and e, when not nil) are usable
// here. The first problem is kept and returned by Issue.
func (b *Batch) add(s *Stream, e *Event, op cudadrv.BatchOp) *Batch {
	if b == nil || b.err != nil {
		return b
	}
	switch {
	case s == nil:
		b.err = fmt.Errorf("cuda: batch operation %d: nil stream: %w", len(b.ops), ErrInvalidValue)
	case s.destroyed.Load():
		b.err = fmt.Errorf("cuda: batch operation %d: stream %#x already destroyed: %w", len(b.ops), uintptr(s.h), ErrInvalidHandle)
	case s.ctx != b.ctx:
		b.err = fmt.Errorf("cuda: batch operation %d: stream of another context: %w", len(b.ops), ErrInvalidValue)
	case e != nil && e.destroyed.Load():
		b.err = fmt.Errorf("cuda: batch operation %d: event %#x already destroyed: %w", len(b.ops), uintptr(e.h), ErrInvalidHandle)
	case e != nil && e.ctx != b.ctx:
		b.err = fmt.Errorf("cuda: batch operation %d: event of another context: %w", len(b.ops), ErrInvalidValue)
	default:
		op.Stream = s.h
		b.ops = append(b.ops, op)
	}
	return b
}

// CopyHtoD adds an asynchronous copy of src to device address dst on s.
// An empty src adds nothing.
func (b *Batch) CopyHtoD(s *Stream, dst DevicePtr, src []byte) *Batch {
	if b == nil || len(src) == 0 {
		return b
	}
	b.keep = append(b.keep, src)
	return b.add(s, nil, cudadrv.BatchOp{Kind: cudadrv.BatchCopyHtoD, Dev: cudadrv.DevicePtr(dst), Host: hostPtr(src), N: uint64(len(src))})
}

// CopyDtoH adds an asynchronous copy of len(dst) bytes from device address
// src into dst on s. An empty dst adds nothing.
func (b *Batch) CopyDtoH(s *Stream, dst []byte, src DevicePtr) *Batch {
	if b == nil || len(dst) == 0 {
		return b
	}
	b.keep = append(b.keep, dst)
	return b.add(s, nil, cudadrv.BatchOp{Kind: cudadrv.BatchCopyDtoH, Dev: cudadrv.DevicePtr(src), Host: hostPtr(dst), N: uint64(len(dst))})
}

// CopyDtoD adds an asynchronous copy of n bytes between device addresses on s.
func (b *Batch) CopyDtoD(s *Stream, dst, src DevicePtr, n int) *Batch {
	if b == nil {
		return b
	}
	if n < 0 && b.err == nil {
		b.err = fmt.Errorf("cuda: batch operation %d: copy of %d bytes: %w", len(b.ops), n, ErrInvalidValue)
	}
	if n <= 0 {
		return b
	}
	return b.add(s, nil, cudadrv.BatchOp{Kind: cudadrv.BatchCopyDtoD, Dev: cudadrv.DevicePtr(dst), Dev2: cudadrv.DevicePtr(src), N: uint64(n)})
}

// Record adds recording e on s.
func (b *Batch) Record(e *Event, s *Stream) *Batch {
	if b == nil {
		return b
	}
	if e == nil {
		if b.err == nil {
			b.err = fmt.Errorf("cuda: batch operation %d: nil event: %w", len(b.ops), ErrInvalidValue)
		}
		return b
	}
	return b.add(s, e, cudadrv.BatchOp{Kind: cudadrv.BatchEventRecord, Event: e.h})
}

// Issue queues the batch's operations in order and empties the batch. It
// returns how many were queued: all of them with a nil error; otherwise
// those before the one that failed (which, and everything after it, was
// not queued). An invalid argument given to an earlier method is returned
// here, with nothing queued. Issue on a nil Batch returns an error
// matching ErrInvalidValue; the adding methods on a nil Batch do nothing.
func (b *Batch) Issue() (int, error) {
	if b == nil {
		return 0, fmt.Errorf("cuda: nil batch: %w", ErrInvalidValue)
	}
	ops, keep, err := b.ops, b.keep, b.err
	b.ops, b.keep, b.err = b.ops[:0], b.keep[:0], nil
	defer clear(ops) // the slices are reused: drop their references to host memory
	defer clear(keep)
	if err != nil {
		return 0, err
	}
	if len(ops) == 0 {
		return 0, nil
	}
	if err := b.ctx.alive(); err != nil {
		return 0, err
	}
	done := 0
	legacy := false
	for _, op := range ops {
		legacy = legacy || op.Stream == 0
	}
	if !legacy {
		// As Stream.call: the driver takes each operation's context from
		// its stream; retry in context only if it rejects the call.
		n, err := cudadrv.RunBatch(b.ctx.drv, ops)
		done += n
		if !retryInContext(err) {
			runtime.KeepAlive(keep)
			return done, batchErr(pub(err), done, len(ops))
		}
	}
	err = b.ctx.Do(func() error {
		n, err := cudadrv.RunBatch(b.ctx.drv, ops[done:])
		done += n
		return err
	})
	runtime.KeepAlive(keep)
	return done, batchErr(pub(err), done, len(ops))
}

// batchErr says which operation of a batch failed.
func batchErr(err error, i, n int) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: batch operation %d of %d: %w", i, n, err)
}
