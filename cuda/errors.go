package cuda

import (
	"errors"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// Sentinel errors, matched with errors.Is. Every error pinmem returns (from
// this package, from pinmem, pool and transfer) matches at most one of them.
var (
	ErrNoDriver          = cudadrv.ErrNoDriver          // no NVIDIA driver library, or it failed to initialise
	ErrNoDevice          = cudadrv.ErrNoDevice          // the driver reports no usable GPU
	ErrNotSupported      = cudadrv.ErrNotSupported      // the driver or device lacks the feature
	ErrOutOfMemory       = cudadrv.ErrOutOfMemory       // memory could not be provided
	ErrInvalidValue      = cudadrv.ErrInvalidValue      // an argument was rejected (nil objects included)
	ErrNotReady          = cudadrv.ErrNotReady          // asynchronous work has not finished
	ErrAlreadyRegistered = cudadrv.ErrAlreadyRegistered // host range already page-locked
	ErrInvalidHandle     = cudadrv.ErrInvalidHandle     // object invalid, destroyed or freed
	ErrKernelImage       = cudadrv.ErrKernelImage       // a PTX/cubin module cannot be loaded
	ErrLaunchFailed      = cudadrv.ErrLaunchFailed      // a kernel faulted or could not launch
)

// ErrClosed is the error of a call on something already closed: pool.ErrClosed
// is the same value, as os.ErrClosed is fs.ErrClosed, and transfer.ErrClosed
// and load.ErrClosed wrap it, so that one errors.Is check serves every
// package of pinmem.
var ErrClosed = errors.New("already closed")

// Result is a CUresult, the status code of a driver call, with the values
// of cuda.h. Codes without a constant here are still reported as they are.
type Result int32

// Driver status codes that pinmem handles or reports by name.
const (
	ResultSuccess                     Result = 0
	ResultInvalidValue                Result = 1
	ResultOutOfMemory                 Result = 2
	ResultNotInitialized              Result = 3
	ResultDeinitialized               Result = 4
	ResultStubLibrary                 Result = 34
	ResultNoDevice                    Result = 100
	ResultInvalidDevice               Result = 101
	ResultInvalidImage                Result = 200
	ResultInvalidContext              Result = 201
	ResultNoBinaryForGPU              Result = 209
	ResultNotMapped                   Result = 211
	ResultInvalidPTX                  Result = 218
	ResultJITCompilerNotFound         Result = 221
	ResultUnsupportedPTXVersion       Result = 222
	ResultInvalidHandle               Result = 400
	ResultNotFound                    Result = 500
	ResultNotReady                    Result = 600
	ResultIllegalAddress              Result = 700
	ResultLaunchOutOfResources        Result = 701
	ResultLaunchTimeout               Result = 702
	ResultHostMemoryAlreadyRegistered Result = 712
	ResultHostMemoryNotRegistered     Result = 713
	ResultLaunchFailed                Result = 719
	ResultNotPermitted                Result = 800
	ResultNotSupported                Result = 801
	ResultSystemDriverMismatch        Result = 803
	ResultUnknown                     Result = 999
)

// Error is a failed driver call, as the driver reported it. It matches the
// sentinel of its code (ResultOutOfMemory matches ErrOutOfMemory, and so on)
// through errors.Is. Get one from any error pinmem returns with errors.As.
type Error struct {
	// Op is the driver function that failed, e.g. "cuMemAlloc_v2".
	Op string
	// Code is the CUresult it returned.
	Code Result
	// Name is the driver's name of Code (cuGetErrorName), e.g.
	// "CUDA_ERROR_OUT_OF_MEMORY"; empty when the driver has none.
	Name string
	// Message is the driver's description of Code (cuGetErrorString).
	Message string
}

// Error formats the failure as "op: NAME (code): message".
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	return (&cudadrv.Error{Op: e.Op, Code: cudadrv.Result(e.Code), Name: e.Name, Detail: e.Message}).Error()
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	if e == nil {
		return false
	}
	s := cudadrv.Sentinel(cudadrv.Result(e.Code))
	return s != nil && s == target
}

// LoadError says why the driver library, or one of its symbols, could not
// be loaded. It matches ErrNoDriver, or ErrNotSupported when only a symbol
// is missing (a driver older than pinmem needs for that call).
type LoadError struct {
	// Path is the library that was tried.
	Path string
	// Symbol is the missing driver symbol; empty when the library itself failed.
	Symbol string
	// Err is the loader's (or cuInit's) error.
	Err error
}

// Error describes the failure.
func (e *LoadError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return (&cudadrv.LoadError{Path: e.Path, Symbol: e.Symbol, Err: e.Err}).Error()
}

// Is matches ErrNotSupported for a missing symbol and ErrNoDriver otherwise.
func (e *LoadError) Is(target error) bool {
	if e == nil {
		return false
	}
	return (&cudadrv.LoadError{Path: e.Path, Symbol: e.Symbol, Err: e.Err}).Is(target)
}

// Unwrap returns the loader's error.
func (e *LoadError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// pub returns err with the binding's error types replaced by this
// package's: a *cudadrv.Error becomes an *Error, a *cudadrv.LoadError a
// *LoadError, with the same fields, so that errors.As finds the public
// types. Every driver failure this package returns passes through it once,
// where the driver call is made (before any wrapping).
func pub(err error) error {
	switch e := err.(type) {
	case *cudadrv.Error:
		if e.Code == cudadrv.ErrorNotReady {
			// A poll of work still running: Query turns it into false,
			// so no caller keeps it; one value per query, no allocation.
			switch e.Op {
			case errEventNotReady.Op:
				return errEventNotReady
			case errStreamNotReady.Op:
				return errStreamNotReady
			}
		}
		return &Error{Op: e.Op, Code: Result(e.Code), Name: e.Name, Message: e.Detail}
	case *cudadrv.LoadError:
		return &LoadError{Path: e.Path, Symbol: e.Symbol, Err: e.Err}
	}
	return err
}

// The not-ready errors of the polling queries (pub).
var (
	errEventNotReady  = &Error{Op: "cuEventQuery", Code: ResultNotReady, Name: "CUDA_ERROR_NOT_READY", Message: "device not ready"}
	errStreamNotReady = &Error{Op: "cuStreamQuery", Code: ResultNotReady, Name: "CUDA_ERROR_NOT_READY", Message: "device not ready"}
)

// pub2 is pub for a driver call that returns a value and an error.
func pub2[T any](v T, err error) (T, error) { return v, pub(err) }
