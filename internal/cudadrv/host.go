package cudadrv

import (
	"runtime"
	"unsafe"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// HostPtr is a host address handed to or received from the driver
// (hostptr.Ptr, which is unsafe.Pointer).
type HostPtr = hostptr.Ptr

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
