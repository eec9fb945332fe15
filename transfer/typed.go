package transfer

import (
	"context"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// Elem is the set of element types a typed copy accepts: fixed-size
// numbers, which hold no Go pointers and so may be copied as raw bytes.
type Elem interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~int | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uint | ~uintptr |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// AsBytes returns the memory of s as a byte slice (no copy).
func AsBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return hostptr.AsBytes(s)
}

// HtoDSlice copies the elements of src into the device buffer dst.
func HtoDSlice[T Elem](ctx context.Context, c *Copier, dst *cuda.DeviceBuffer, src []T) (Stats, error) {
	return c.HtoD(ctx, dst, AsBytes(src))
}

// DtoHSlice fills dst with elements from the device buffer src.
func DtoHSlice[T Elem](ctx context.Context, c *Copier, dst []T, src *cuda.DeviceBuffer) (Stats, error) {
	return c.DtoH(ctx, AsBytes(dst), src)
}

// HtoDSliceAsync is the asynchronous HtoDSlice.
func HtoDSliceAsync[T Elem](ctx context.Context, c *Copier, dst *cuda.DeviceBuffer, src []T) *Transfer {
	return c.HtoDAsync(ctx, dst, AsBytes(src))
}

// DtoHSliceAsync is the asynchronous DtoHSlice.
func DtoHSliceAsync[T Elem](ctx context.Context, c *Copier, dst []T, src *cuda.DeviceBuffer) *Transfer {
	return c.DtoHAsync(ctx, AsBytes(dst), src)
}
