package transfer

import "github.com/pinmem/pinmem/internal/hostptr"

// Elem is the set of element types AsBytes accepts: fixed-size
// numbers, which hold no Go pointers and so may be copied as raw bytes.
type Elem interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~int | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uint | ~uintptr |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// AsBytes returns the memory of s as a byte slice (no copy), for copying
// typed data: c.HtoD(ctx, dst, transfer.AsBytes(xs)).
func AsBytes[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return hostptr.AsBytes(s)
}
