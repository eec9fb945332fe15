package cuda

import (
	"fmt"
	"sync/atomic"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/track"
)

// DevicePtr is an address in device (or unified) memory.
type DevicePtr uint64

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int) DevicePtr { return p + DevicePtr(off) }

// DeviceBuffer is a block of device memory, or a view of part of one
// (Slice). A view shares its parent's state: once the parent is freed,
// every view of it reports so (Err) and refuses copies.
type DeviceBuffer struct {
	ctx      *Context
	ptr      DevicePtr
	size     int
	borrowed bool
	alloc    *allocation // shared by a buffer and all its views
}

// allocation is the state of one device allocation, shared by the buffer
// that owns it and every view sliced from it.
type allocation struct {
	base  DevicePtr
	freed atomic.Bool
}

// Alloc allocates size bytes of device memory in c. The caller must Free it.
func (c *Context) Alloc(size int) (*DeviceBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: device allocation of %d bytes: %w", size, ErrInvalidValue)
	}
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return nil, err
	}
	p, err := c.drv.MemAlloc(uint64(size))
	if err != nil {
		return nil, fmt.Errorf("cuda: device allocation of %d bytes: %w", size, err)
	}
	track.Add(track.DeviceMemory, uint64(p), int64(size))
	return &DeviceBuffer{ctx: c, ptr: DevicePtr(p), size: size, alloc: &allocation{base: DevicePtr(p)}}, nil
}

// WrapDevicePtr borrows size bytes of device memory at ptr allocated by
// other code. pinmem never frees it.
func WrapDevicePtr(c *Context, ptr DevicePtr, size int) *DeviceBuffer {
	return &DeviceBuffer{ctx: c, ptr: ptr, size: size, borrowed: true, alloc: &allocation{base: ptr}}
}

// Ptr returns the buffer's device address (0 for a nil DeviceBuffer).
func (b *DeviceBuffer) Ptr() DevicePtr {
	if b == nil {
		return 0
	}
	return b.ptr
}

// Size returns the buffer's size in bytes (0 for a nil DeviceBuffer).
func (b *DeviceBuffer) Size() int {
	if b == nil {
		return 0
	}
	return b.size
}

// Context returns the buffer's context.
func (b *DeviceBuffer) Context() *Context {
	if b == nil {
		return nil
	}
	return b.ctx
}

// Borrowed reports whether the memory belongs to other code.
func (b *DeviceBuffer) Borrowed() bool { return b != nil && b.borrowed }

// Slice returns a borrowed view of n bytes at off. The view shares b's
// state: once b (or the buffer b is a view of) is freed, the view's Err
// reports it and its copies are refused.
func (b *DeviceBuffer) Slice(off, n int) (*DeviceBuffer, error) {
	if err := b.check(off, n); err != nil {
		return nil, err
	}
	return &DeviceBuffer{ctx: b.ctx, ptr: b.ptr.Add(off), size: n, borrowed: true, alloc: b.alloc}, nil
}

// Err reports whether b may be used: nil for live memory; an error matching
// ErrInvalidHandle when b was freed or is a view (Slice) of a buffer that
// was freed, since the driver may by then have given the address to another
// allocation; an error matching ErrInvalidValue for a nil or zero
// DeviceBuffer. Code that copies through raw addresses (Ptr) checks Err
// first.
func (b *DeviceBuffer) Err() error {
	if b == nil || b.alloc == nil || b.ctx == nil {
		return fmt.Errorf("cuda: nil device buffer: %w", ErrInvalidValue)
	}
	if b.alloc.freed.Load() {
		if b.borrowed {
			return fmt.Errorf("cuda: device buffer %#x is a view of %#x, already freed: %w", uint64(b.ptr), uint64(b.alloc.base), ErrInvalidHandle)
		}
		return fmt.Errorf("cuda: device buffer %#x already freed: %w", uint64(b.ptr), ErrInvalidHandle)
	}
	return nil
}

func (b *DeviceBuffer) check(off, n int) error {
	if err := b.Err(); err != nil {
		return err
	}
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return fmt.Errorf("cuda: range [%d,+%d) outside device buffer of %d bytes: %w", off, n, b.size, ErrInvalidValue)
	}
	return nil
}

// Free releases the memory. A second Free returns an error matching
// ErrInvalidHandle; freeing a borrowed buffer or a view is refused with
// ErrInvalidValue. When the driver fails to free it, the buffer stays
// allocated and usable, and Free may be called again.
func (b *DeviceBuffer) Free() error {
	if err := b.Err(); b == nil || b.alloc == nil || b.ctx == nil {
		return err
	}
	if b.borrowed {
		return fmt.Errorf("cuda: device buffer %#x is borrowed: %w", uint64(b.ptr), ErrInvalidValue)
	}
	if !b.alloc.freed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: device buffer %#x already freed: %w", uint64(b.ptr), ErrInvalidHandle)
	}
	return release(b.ctx, &b.alloc.freed, track.DeviceMemory, uint64(b.ptr), func() error {
		return b.ctx.drv.MemFree(cudadrv.DevicePtr(b.ptr))
	})
}

// CopyFromHost copies src into the buffer at off and returns when the data is in
// place. src may be any Go memory. (The driver's synchronous copy from
// pageable memory returns once the data is staged, before the last DMA has
// landed, and work on non-blocking streams is not ordered after it; CopyFromHost
// waits for the legacy default stream so that "done" means done.) The
// stream-ordered form is Stream.CopyHtoD.
func (b *DeviceBuffer) CopyFromHost(off int, src []byte) error {
	if err := b.check(off, len(src)); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	sc, err := b.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	if err := b.ctx.drv.MemcpyHtoD(cudadrv.DevicePtr(b.ptr.Add(off)), hostPtr(src), uint64(len(src))); err != nil {
		return err
	}
	return b.ctx.drv.StreamSynchronize(0)
}

// CopyToHost copies len(dst) bytes at off out of the buffer and returns when they
// are in dst. The stream-ordered form is Stream.CopyDtoH.
func (b *DeviceBuffer) CopyToHost(off int, dst []byte) error {
	if err := b.check(off, len(dst)); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	sc, err := b.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	return b.ctx.drv.MemcpyDtoH(hostPtr(dst), cudadrv.DevicePtr(b.ptr.Add(off)), uint64(len(dst)))
}

// Memset sets every byte of the buffer to v and returns when it is done
// (cuMemsetD8 itself is asynchronous for device memory; Memset waits for
// the legacy default stream). Slice selects part of a buffer; the
// stream-ordered form is Stream.Memset.
func (b *DeviceBuffer) Memset(v byte) error {
	if err := b.check(0, b.Size()); err != nil {
		return err
	}
	if b.size == 0 {
		return nil
	}
	sc, err := b.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	if err := b.ctx.drv.MemsetD8(cudadrv.DevicePtr(b.ptr), v, uint64(b.size)); err != nil {
		return err
	}
	return b.ctx.drv.StreamSynchronize(0)
}

func hostPtr(p []byte) hostptr.Ptr { return hostptr.PtrOf(p) }

// The stream-ordered copies take raw device addresses, so that a copy can
// start anywhere in an allocation; the driver checks only that an address
// lies in some allocation of the context. Code that derives them from a
// DeviceBuffer checks its Err and the range first (the synchronous
// DeviceBuffer methods do both).

// CopyHtoD queues a copy of src to device address dst. src must stay alive
// and unchanged until the stream reaches the copy; the copy is truly
// asynchronous, and runs at full speed, only when src is pinned. The
// synchronous form is DeviceBuffer.CopyFromHost.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return s.usable()
	}
	return s.call(func() error {
		return s.ctx.drv.MemcpyHtoDAsync(cudadrv.DevicePtr(dst), hostPtr(src), uint64(len(src)), s.h)
	})
}

// CopyDtoH queues a copy of len(dst) bytes from device address src into
// dst. dst must stay alive and must not be read until the stream reaches
// the copy. The synchronous form is DeviceBuffer.CopyToHost.
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return s.usable()
	}
	return s.call(func() error {
		return s.ctx.drv.MemcpyDtoHAsync(hostPtr(dst), cudadrv.DevicePtr(src), uint64(len(dst)), s.h)
	})
}

// CopyDtoD queues a copy of n bytes between device addresses (there is no
// synchronous form: queue it and Synchronize the stream).
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: copy of %d bytes: %w", n, ErrInvalidValue)
	}
	if n == 0 {
		return s.usable()
	}
	return s.call(func() error {
		return s.ctx.drv.MemcpyDtoDAsync(cudadrv.DevicePtr(dst), cudadrv.DevicePtr(src), uint64(n), s.h)
	})
}

// Memset queues setting n bytes at dst to v. The synchronous form is
// DeviceBuffer.Memset.
func (s *Stream) Memset(dst DevicePtr, v byte, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: memset of %d bytes: %w", n, ErrInvalidValue)
	}
	if n == 0 {
		return s.usable()
	}
	return s.call(func() error { return s.ctx.drv.MemsetD8Async(cudadrv.DevicePtr(dst), v, uint64(n), s.h) })
}
