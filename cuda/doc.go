// Package cuda is the safe Go face of the NVIDIA driver API that pinmem
// builds on: devices and their properties, primary contexts, streams,
// events, device memory with synchronous and asynchronous copies, and
// modules with kernel launch.
//
// Every call that needs a context runs on a goroutine locked to its OS
// thread with the right context current, so callers never manage thread
// affinity themselves. Every object exposes its raw driver handle, and
// objects created by other code (TensorRT, ONNX Runtime, cgo) can be
// wrapped as borrowed: pinmem uses them and never frees them.
//
// Pinning host memory is deliberately absent here: it belongs to the
// pinmem package, which accounts for every pinned byte.
//
// Errors from the driver are *Error values carrying the driver function,
// the numeric CUresult and the driver's own name and text; they match the
// sentinels below through errors.Is. Success is always a nil error.
package cuda

import "github.com/pinmem/pinmem/internal/cudadrv"

// Error is a failed driver call: Op, Code, Name and Detail as the driver reported them.
type Error = cudadrv.Error

// LoadError says why the driver library or one of its symbols could not be loaded.
type LoadError = cudadrv.LoadError

// Sentinel errors, matched with errors.Is.
var (
	ErrNoDriver          = cudadrv.ErrNoDriver          // no NVIDIA driver library, or it failed to initialise
	ErrNoDevice          = cudadrv.ErrNoDevice          // the driver reports no usable GPU
	ErrNotSupported      = cudadrv.ErrNotSupported      // the driver or device lacks the feature
	ErrOutOfMemory       = cudadrv.ErrOutOfMemory       // memory could not be provided
	ErrInvalidValue      = cudadrv.ErrInvalidValue      // an argument was rejected
	ErrNotReady          = cudadrv.ErrNotReady          // asynchronous work has not finished
	ErrAlreadyRegistered = cudadrv.ErrAlreadyRegistered // host range already page-locked
	ErrNotRegistered     = cudadrv.ErrNotRegistered     // host range not page-locked
	ErrInvalidHandle     = cudadrv.ErrInvalidHandle     // object invalid, destroyed or freed
	ErrKernelImage       = cudadrv.ErrKernelImage       // a PTX/cubin module cannot be loaded
	ErrLaunchFailed      = cudadrv.ErrLaunchFailed      // a kernel faulted or could not launch
)
