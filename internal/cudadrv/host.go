package cudadrv

import (
	"runtime"
	"unsafe"
)

// HostPtr is the address of host memory handed to or received from the
// driver: memory the driver or pinmem mapped (not Go memory), or Go memory
// the caller keeps alive and unmoved. It is unsafe.Pointer under another
// name, so that every package above cudadrv can hold and pass such
// addresses without importing unsafe: this package owns every unsafe
// operation of pinmem, and the helpers below are the only ones the others
// use.
type HostPtr = unsafe.Pointer

// BytesAt returns the n bytes at p as a slice. p must point to at least n
// bytes that stay mapped while the slice is used.
func BytesAt(p HostPtr, n uintptr) []byte { return unsafe.Slice((*byte)(p), n) }

// SliceAt returns the n values of type T at p as a slice (see BytesAt).
func SliceAt[T any](p HostPtr, n uintptr) []T { return unsafe.Slice((*T)(p), n) }

// Offset returns p advanced by off bytes.
func Offset(p HostPtr, off uintptr) HostPtr { return unsafe.Add(p, off) }

// PtrOf returns the address of b's first element (nil for a nil slice).
func PtrOf(b []byte) HostPtr { return unsafe.Pointer(unsafe.SliceData(b)) }

// AddrOf returns the numeric address of b's first element, for range
// arithmetic (never converted back into a pointer).
func AddrOf(b []byte) uintptr { return uintptr(PtrOf(b)) }

// AddrOfWords returns the numeric address of w's first element, for a
// system call argument; the caller keeps w alive across the call.
func AddrOfWords(w []uint64) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(w))) }

// SizeAlign returns the size and alignment of T.
func SizeAlign[T any]() (size, align uintptr) {
	var z T
	return unsafe.Sizeof(z), unsafe.Alignof(z)
}

// AsBytes returns the memory of s as bytes (T must hold no pointers).
func AsBytes[T any](s []T) []byte {
	size, _ := SizeAlign[T]()
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), uintptr(len(s))*size)
}

// KernelParams builds the parameter block cuLaunchKernel takes: an array
// of pointers, one per argument, each to the argument's value (vals[i] in
// the low bytes of a slot, little-endian). Both arrays are Go memory pinned
// with a runtime.Pinner so that the array of pointers holds only pinned Go
// pointers, as passing it to C requires; release unpins them. With no
// values params is nil.
func KernelParams(vals []uint64) (params HostPtr, release func()) {
	if len(vals) == 0 {
		return nil, func() {}
	}
	ptrs := make([]unsafe.Pointer, len(vals))
	var pin runtime.Pinner
	pin.Pin(&vals[0])
	pin.Pin(&ptrs[0])
	for i := range vals {
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	return unsafe.Pointer(&ptrs[0]), pin.Unpin
}
