package cuda

import (
	"fmt"
	"io"
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
	p, err := pub2(c.drv.MemAlloc(uint64(size)))
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

// check64 is check for an io offset.
func (b *DeviceBuffer) check64(off int64, n int) error {
	if off < 0 || off > int64(b.Size()) {
		if err := b.Err(); err != nil {
			return err
		}
		return fmt.Errorf("cuda: range [%d,+%d) outside device buffer of %d bytes: %w", off, n, b.Size(), ErrInvalidValue)
	}
	return b.check(int(off), n)
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

// WriteAt copies p into the buffer at off and returns when the data is in
// place (io.WriterAt). p may be any Go memory. A range outside the buffer is
// refused with an error matching ErrInvalidValue and nothing is written;
// a freed buffer with ErrInvalidHandle. (The driver's synchronous copy from
// pageable memory returns once the data is staged, before the last DMA has
// landed, and work on non-blocking streams is not ordered after it; WriteAt
// waits for the legacy default stream so that "done" means done.)
//
// WriteAt is the driver's synchronous copy, which cannot be interrupted:
// it is not bounded by a context. The bounded form is Stream.CopyHtoD
// followed by Stream.Synchronize(ctx).
func (b *DeviceBuffer) WriteAt(p []byte, off int64) (n int, err error) {
	if err := b.check64(off, len(p)); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	sc, err := b.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return 0, err
	}
	if err := pub(b.ctx.drv.MemcpyHtoD(cudadrv.DevicePtr(b.ptr.Add(int(off))), hostPtr(p), uint64(len(p)))); err != nil {
		return 0, err
	}
	if err := pub(b.ctx.drv.StreamSynchronize(0)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ReadAt copies len(p) bytes at off out of the buffer into p and returns
// when they are there (io.ReaderAt). As with a file, a read that reaches
// the end of the buffer reads what is there and returns io.EOF; a negative
// off is refused with an error matching ErrInvalidValue, a freed buffer
// with ErrInvalidHandle.
//
// ReadAt is the driver's synchronous copy, which cannot be interrupted: it
// is not bounded by a context. The bounded form is Stream.CopyDtoH
// followed by Stream.Synchronize(ctx).
func (b *DeviceBuffer) ReadAt(p []byte, off int64) (n int, err error) {
	if err := b.Err(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("cuda: read at offset %d of a device buffer: %w", off, ErrInvalidValue)
	}
	n = len(p)
	if off >= int64(b.size) {
		if n == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	if rest := int64(b.size) - off; int64(n) > rest {
		n, err = int(rest), io.EOF
	}
	if n == 0 {
		return 0, err
	}
	sc, serr := b.ctx.enter()
	defer sc.Exit()
	if serr != nil {
		return 0, serr
	}
	if cerr := pub(b.ctx.drv.MemcpyDtoH(hostPtr(p[:n]), cudadrv.DevicePtr(b.ptr.Add(int(off))), uint64(n))); cerr != nil {
		return 0, cerr
	}
	return n, err
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
	if err := pub(b.ctx.drv.MemsetD8(cudadrv.DevicePtr(b.ptr), v, uint64(b.size))); err != nil {
		return err
	}
	return pub(b.ctx.drv.StreamSynchronize(0))
}

func hostPtr(p []byte) hostptr.Ptr { return hostptr.PtrOf(p) }

// The stream-ordered copies take a DeviceBuffer and an offset and check,
// as the synchronous methods do, that the buffer is live and the range lies
// inside it: a freed buffer (or a view of one) is refused with an error
// matching ErrInvalidHandle, a range outside it with ErrInvalidValue, both
// before any driver call. Slice and WrapDevicePtr make buffers of memory
// allocated elsewhere or of part of an allocation.

// CopyHtoD queues a copy of src to dst at off. src must stay alive and
// unchanged until the stream reaches the copy; the copy is truly
// asynchronous, and runs at full speed, only when src is pinned. The
// synchronous form is DeviceBuffer.WriteAt.
func (s *Stream) CopyHtoD(dst *DeviceBuffer, off int, src []byte) error {
	if err := dst.check(off, len(src)); err != nil {
		return err
	}
	if len(src) == 0 {
		return s.usable()
	}
	p := dst.ptr.Add(off)
	return s.call(func() error {
		return s.ctx.drv.MemcpyHtoDAsync(cudadrv.DevicePtr(p), hostPtr(src), uint64(len(src)), s.h)
	})
}

// CopyDtoH queues a copy of len(dst) bytes of src at off into dst. dst
// must stay alive and must not be read until the stream reaches the copy.
// The synchronous form is DeviceBuffer.ReadAt.
func (s *Stream) CopyDtoH(dst []byte, src *DeviceBuffer, off int) error {
	if err := src.check(off, len(dst)); err != nil {
		return err
	}
	if len(dst) == 0 {
		return s.usable()
	}
	p := src.ptr.Add(off)
	return s.call(func() error {
		return s.ctx.drv.MemcpyDtoHAsync(hostPtr(dst), cudadrv.DevicePtr(p), uint64(len(dst)), s.h)
	})
}

// CopyDtoD queues a copy of n bytes of src at srcOff to dst at dstOff
// (there is no synchronous form: queue it and Synchronize the stream).
func (s *Stream) CopyDtoD(dst *DeviceBuffer, dstOff int, src *DeviceBuffer, srcOff, n int) error {
	if err := dst.check(dstOff, n); err != nil {
		return err
	}
	if err := src.check(srcOff, n); err != nil {
		return err
	}
	if n == 0 {
		return s.usable()
	}
	d, p := dst.ptr.Add(dstOff), src.ptr.Add(srcOff)
	return s.call(func() error {
		return s.ctx.drv.MemcpyDtoDAsync(cudadrv.DevicePtr(d), cudadrv.DevicePtr(p), uint64(n), s.h)
	})
}

// Memset queues setting n bytes of dst at off to v. The synchronous form
// is DeviceBuffer.Memset.
func (s *Stream) Memset(dst *DeviceBuffer, off int, v byte, n int) error {
	if err := dst.check(off, n); err != nil {
		return err
	}
	if n == 0 {
		return s.usable()
	}
	p := dst.ptr.Add(off)
	return s.call(func() error { return s.ctx.drv.MemsetD8Async(cudadrv.DevicePtr(p), v, uint64(n), s.h) })
}
