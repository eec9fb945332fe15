package cudadrv

import (
	"errors"
	"fmt"
)

// Result is a CUresult: the status code every driver API call returns.
type Result int32

// Driver status codes that pinmem handles by name. The values are those of
// cuda.h; the full list is the driver's own.
const (
	Success                          Result = 0
	ErrorInvalidValue                Result = 1
	ErrorOutOfMemory                 Result = 2
	ErrorNotInitialized              Result = 3
	ErrorDeinitialized               Result = 4
	ErrorStubLibrary                 Result = 34
	ErrorNoDevice                    Result = 100
	ErrorInvalidDevice               Result = 101
	ErrorInvalidImage                Result = 200
	ErrorInvalidContext              Result = 201
	ErrorNoBinaryForGPU              Result = 209
	ErrorNotMapped                   Result = 211
	ErrorInvalidPTX                  Result = 218
	ErrorJITCompilerNotFound         Result = 221
	ErrorUnsupportedPTXVersion       Result = 222
	ErrorInvalidHandle               Result = 400
	ErrorNotFound                    Result = 500
	ErrorNotReady                    Result = 600
	ErrorIllegalAddress              Result = 700
	ErrorLaunchOutOfResources        Result = 701
	ErrorLaunchTimeout               Result = 702
	ErrorHostMemoryAlreadyRegistered Result = 712
	ErrorHostMemoryNotRegistered     Result = 713
	ErrorLaunchFailed                Result = 719
	ErrorNotPermitted                Result = 800
	ErrorNotSupported                Result = 801
	ErrorSystemDriverMismatch        Result = 803
	ErrorUnknown                     Result = 999
)

// Sentinel errors. Every error pinmem returns matches at most one of these
// through errors.Is; the public packages re-export them.
var (
	// ErrNoDriver: the NVIDIA driver library could not be loaded or initialised.
	ErrNoDriver = errors.New("no NVIDIA driver")
	// ErrNoDevice: the driver is present but reports no usable GPU.
	ErrNoDevice = errors.New("no CUDA device")
	// ErrNotSupported: the driver, device or kernel lacks the feature.
	ErrNotSupported = errors.New("not supported")
	// ErrOutOfMemory: the driver or the host could not provide the memory.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrInvalidValue: an argument was rejected (by pinmem or by the driver).
	ErrInvalidValue = errors.New("invalid value")
	// ErrNotReady: asynchronous work has not finished yet (a query, not a failure).
	ErrNotReady = errors.New("not ready")
	// ErrAlreadyRegistered: the host range is already page-locked.
	ErrAlreadyRegistered = errors.New("host memory already registered")
	// ErrNotRegistered: the host range is not page-locked.
	ErrNotRegistered = errors.New("host memory not registered")
	// ErrInvalidHandle: a stream, event, module or pointer is not (or no longer) valid.
	ErrInvalidHandle = errors.New("invalid handle")
	// ErrKernelImage: a PTX or cubin module could not be loaded (often: the driver is older than the PTX).
	ErrKernelImage = errors.New("kernel image cannot be loaded")
	// ErrLaunchFailed: a kernel faulted or could not be launched; the context may be unusable.
	ErrLaunchFailed = errors.New("kernel launch failed")
)

// Error is a failed driver call: the operation, the numeric CUresult and the
// driver's own name and description of it.
type Error struct {
	Op     string // the driver function, e.g. "cuMemAlloc_v2"
	Code   Result // the numeric CUresult
	Name   string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Detail string // cuGetErrorString
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", int32(e.Code))
	}
	if e.Detail != "" {
		return fmt.Sprintf("%s: %s (%d): %s", e.Op, name, int32(e.Code), e.Detail)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Op, name, int32(e.Code))
}

// Is reports whether the error's code belongs to the sentinel target.
func (e *Error) Is(target error) bool {
	s := Sentinel(e.Code)
	return s != nil && s == target
}

// Sentinel returns the sentinel error that the code r matches, or nil.
func Sentinel(r Result) error {
	switch r {
	case ErrorInvalidValue:
		return ErrInvalidValue
	case ErrorOutOfMemory:
		return ErrOutOfMemory
	case ErrorNotInitialized, ErrorDeinitialized, ErrorStubLibrary, ErrorSystemDriverMismatch:
		return ErrNoDriver
	case ErrorNoDevice, ErrorInvalidDevice:
		return ErrNoDevice
	case ErrorInvalidImage, ErrorNoBinaryForGPU, ErrorInvalidPTX, ErrorJITCompilerNotFound, ErrorUnsupportedPTXVersion:
		return ErrKernelImage
	case ErrorInvalidHandle, ErrorInvalidContext, ErrorNotFound:
		return ErrInvalidHandle
	case ErrorNotReady:
		return ErrNotReady
	case ErrorHostMemoryAlreadyRegistered:
		return ErrAlreadyRegistered
	case ErrorHostMemoryNotRegistered, ErrorNotMapped:
		return ErrNotRegistered
	case ErrorIllegalAddress, ErrorLaunchOutOfResources, ErrorLaunchTimeout, ErrorLaunchFailed:
		return ErrLaunchFailed
	case ErrorNotSupported, ErrorNotPermitted:
		return ErrNotSupported
	}
	return nil
}

// LoadError says why the driver library or one of its symbols could not be loaded.
// It matches ErrNoDriver, or ErrNotSupported when only a symbol is missing.
type LoadError struct {
	Path   string // the library that was tried
	Symbol string // the missing symbol, empty when the library itself failed
	Err    error  // the loader's error
}

func (e *LoadError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("driver %s has no symbol %s (driver too old?): %v", e.Path, e.Symbol, e.Err)
	}
	return fmt.Sprintf("cannot load NVIDIA driver library %s: %v", e.Path, e.Err)
}

// Is matches ErrNotSupported for a missing symbol and ErrNoDriver otherwise.
func (e *LoadError) Is(target error) bool {
	if e.Symbol != "" {
		return target == ErrNotSupported
	}
	return target == ErrNoDriver
}

func (e *LoadError) Unwrap() error { return e.Err }
