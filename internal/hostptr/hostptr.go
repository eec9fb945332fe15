// Package hostptr holds pinmem's host-pointer helpers: the only place
// outside the driver binding that uses unsafe. Every package above it
// holds and passes host addresses as Ptr without importing unsafe.
package hostptr

import "unsafe"

// Ptr is the address of host memory handed to or received from the
// driver: memory the driver or pinmem mapped (not Go memory), or Go memory
// the caller keeps alive and unmoved. It is unsafe.Pointer under another
// name, so that every package above it can hold and pass such
// addresses without importing unsafe: this package owns every unsafe
// operation of pinmem, and the helpers below are the only ones the others
// use.
type Ptr = unsafe.Pointer

// BytesAt returns the n bytes at p as a slice. p must point to at least n
// bytes that stay mapped while the slice is used.
func BytesAt(p Ptr, n uintptr) []byte { return unsafe.Slice((*byte)(p), n) }

// SliceAt returns the n values of type T at p as a slice (see BytesAt).
func SliceAt[T any](p Ptr, n uintptr) []T { return unsafe.Slice((*T)(p), n) }

// Offset returns p advanced by off bytes.
func Offset(p Ptr, off uintptr) Ptr { return unsafe.Add(p, off) }

// PtrOf returns the address of b's first element (nil for a nil slice).
func PtrOf(b []byte) Ptr { return unsafe.Pointer(unsafe.SliceData(b)) }

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
