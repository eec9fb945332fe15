// Package cudadrv is the only package of pinmem that loads the NVIDIA driver
// library (libcuda.so.1) and calls it. It owns every use of unsafe and purego.
//
// The driver is presented as the Driver interface. Load returns the real one,
// bound at run time with purego so that pinmem builds with CGO_ENABLED=0;
// package fakedrv provides a plain-Go stand-in for CPU tests of logic, error
// paths and fault injection. Swap installs a driver for the whole process.
package cudadrv

import "unsafe"

// Device is a CUdevice: an ordinal-like handle.
type Device int32

// Context is a CUcontext.
type Context uintptr

// Stream is a CUstream. The zero value is the legacy default stream.
type Stream uintptr

// Event is a CUevent.
type Event uintptr

// Module is a CUmodule.
type Module uintptr

// Function is a CUfunction.
type Function uintptr

// DevicePtr is a CUdeviceptr: an address in the device's (or the unified) address space.
type DevicePtr uint64

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// Device attributes pinmem reads. Values from cuda.h.
const (
	AttrMaxThreadsPerBlock                     DeviceAttribute = 1
	AttrClockRate                              DeviceAttribute = 13
	AttrMultiprocessorCount                    DeviceAttribute = 16
	AttrIntegrated                             DeviceAttribute = 18
	AttrCanMapHostMemory                       DeviceAttribute = 19
	AttrComputeMode                            DeviceAttribute = 20
	AttrPCIBusID                               DeviceAttribute = 33
	AttrPCIDeviceID                            DeviceAttribute = 34
	AttrMemoryClockRate                        DeviceAttribute = 36
	AttrGlobalMemoryBusWidth                   DeviceAttribute = 37
	AttrAsyncEngineCount                       DeviceAttribute = 40
	AttrUnifiedAddressing                      DeviceAttribute = 41
	AttrPCIDomainID                            DeviceAttribute = 50
	AttrComputeCapabilityMajor                 DeviceAttribute = 75
	AttrComputeCapabilityMinor                 DeviceAttribute = 76
	AttrManagedMemory                          DeviceAttribute = 83
	AttrPageableMemoryAccess                   DeviceAttribute = 88
	AttrConcurrentManagedAccess                DeviceAttribute = 89
	AttrCanUseHostPointerForRegMem             DeviceAttribute = 91
	AttrHostRegisterSupported                  DeviceAttribute = 99
	AttrPageableMemoryAccessUsesHostPageTables DeviceAttribute = 100
	AttrReadOnlyHostRegisterSupported          DeviceAttribute = 113
	AttrNUMAConfig                             DeviceAttribute = 130
	AttrNUMAID                                 DeviceAttribute = 131
	AttrHostNUMAID                             DeviceAttribute = 134
)

// Flags of cuMemHostAlloc.
const (
	MemHostAllocPortable      uint32 = 0x01
	MemHostAllocDeviceMap     uint32 = 0x02
	MemHostAllocWriteCombined uint32 = 0x04
)

// Flags of cuMemHostRegister.
const (
	MemHostRegisterPortable  uint32 = 0x01
	MemHostRegisterDeviceMap uint32 = 0x02
	MemHostRegisterIOMemory  uint32 = 0x04
	MemHostRegisterReadOnly  uint32 = 0x08
)

// Flags of cuStreamCreate.
const (
	StreamDefault     uint32 = 0x0
	StreamNonBlocking uint32 = 0x1
)

// Flags of cuEventCreate.
const (
	EventDefault       uint32 = 0x0
	EventBlockingSync  uint32 = 0x1
	EventDisableTiming uint32 = 0x2
)

// Flags of cuCtxCreate (scheduling policy and host mapping).
const (
	CtxSchedAuto         uint32 = 0x0
	CtxSchedSpin         uint32 = 0x1
	CtxSchedYield        uint32 = 0x2
	CtxSchedBlockingSync uint32 = 0x4
	CtxMapHost           uint32 = 0x8
)

// PointerAttribute is a CUpointer_attribute.
type PointerAttribute int32

// Pointer attributes pinmem reads.
const (
	PointerAttrContext       PointerAttribute = 1
	PointerAttrMemoryType    PointerAttribute = 2
	PointerAttrDevicePointer PointerAttribute = 3
	PointerAttrHostPointer   PointerAttribute = 4
	PointerAttrIsManaged     PointerAttribute = 8
	PointerAttrDeviceOrdinal PointerAttribute = 9
	PointerAttrRangeStart    PointerAttribute = 11
	PointerAttrRangeSize     PointerAttribute = 12
	PointerAttrMapped        PointerAttribute = 13
)

// Memory types reported by PointerAttrMemoryType.
const (
	MemoryTypeHost    = 1
	MemoryTypeDevice  = 2
	MemoryTypeArray   = 3
	MemoryTypeUnified = 4
)

// Driver is the set of CUDA driver API calls pinmem uses. Methods are named
// after the driver functions without the "cu" prefix and version suffix.
// Every method returns a nil error on CUDA_SUCCESS and an *Error otherwise.
//
// Host pointers are unsafe.Pointer. A pointer the driver keeps after the
// call returns (async copy sources and destinations, registered ranges,
// kernel parameter blocks) must not point into ordinary Go memory unless the
// caller keeps it alive and unmoved (runtime.Pinner) until the driver is done.
type Driver interface {
	// DriverGetVersion returns the CUDA version the driver supports, e.g. 13000.
	DriverGetVersion() (int, error)
	DeviceGetCount() (int, error)
	DeviceGet(ordinal int) (Device, error)
	DeviceGetName(dev Device) (string, error)
	DeviceGetAttribute(attr DeviceAttribute, dev Device) (int, error)
	DeviceTotalMem(dev Device) (uint64, error)
	DeviceGetPCIBusID(dev Device) (string, error)

	DevicePrimaryCtxRetain(dev Device) (Context, error)
	DevicePrimaryCtxRelease(dev Device) error
	CtxCreate(flags uint32, dev Device) (Context, error)
	CtxDestroy(ctx Context) error
	CtxSetCurrent(ctx Context) error
	CtxGetCurrent() (Context, error)
	CtxSynchronize() error
	MemGetInfo() (free, total uint64, err error)

	StreamCreate(flags uint32) (Stream, error)
	StreamDestroy(s Stream) error
	StreamSynchronize(s Stream) error
	// StreamQuery returns nil when all work is done and an error matching ErrNotReady when not.
	StreamQuery(s Stream) error
	StreamWaitEvent(s Stream, e Event, flags uint32) error

	EventCreate(flags uint32) (Event, error)
	EventDestroy(e Event) error
	EventRecord(e Event, s Stream) error
	EventSynchronize(e Event) error
	// EventQuery returns nil when the event has completed and an error matching ErrNotReady when not.
	EventQuery(e Event) error
	// EventElapsedTime returns the milliseconds between two recorded events.
	EventElapsedTime(start, end Event) (float32, error)

	MemAlloc(size uint64) (DevicePtr, error)
	MemFree(p DevicePtr) error
	MemsetD8(p DevicePtr, v byte, n uint64) error
	MemsetD8Async(p DevicePtr, v byte, n uint64, s Stream) error
	MemsetD32(p DevicePtr, v uint32, n uint64) error
	MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error
	MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error
	MemcpyDtoD(dst, src DevicePtr, n uint64) error
	MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error
	MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error
	MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error

	MemHostAlloc(size uint64, flags uint32) (unsafe.Pointer, error)
	MemFreeHost(p unsafe.Pointer) error
	MemHostRegister(p unsafe.Pointer, size uint64, flags uint32) error
	MemHostUnregister(p unsafe.Pointer) error
	MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (DevicePtr, error)
	MemHostGetFlags(p unsafe.Pointer) (uint32, error)
	// PointerGetAttribute reads one attribute of at most 8 bytes, widened to uint64.
	PointerGetAttribute(attr PointerAttribute, p DevicePtr) (uint64, error)

	// ModuleLoadData loads a PTX (NUL-terminated text) or cubin image. The
	// implementation copies the image; the caller may reuse it afterwards.
	ModuleLoadData(image []byte) (Module, error)
	ModuleUnload(m Module) error
	ModuleGetFunction(m Module, name string) (Function, error)
	// LaunchKernel launches f. params points to an array of pointers, one per
	// kernel argument, each to the argument's value; all of it must be
	// memory the Go garbage collector does not move or free during the call.
	LaunchKernel(f Function, grid, block [3]uint32, sharedMem uint32, s Stream, params unsafe.Pointer) error

	// ErrorName and ErrorString are cuGetErrorName and cuGetErrorString.
	ErrorName(r Result) string
	ErrorString(r Result) string
}
