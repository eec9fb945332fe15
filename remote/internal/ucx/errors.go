package ucx

import (
	"errors"
	"fmt"
)

// ErrUnavailable: libucp could not be loaded (not installed, too old, or
// this platform has no binding).
var ErrUnavailable = errors.New("UCX (libucp.so.0) not available")

// ErrConfig: UCX refused a configuration setting (an unknown value for
// the variable, or one it cannot parse): a bad argument, not a missing
// library.
var ErrConfig = errors.New("UCX refused a configuration setting")

// LoadError says why libucp could not be loaded. It matches ErrUnavailable.
type LoadError struct {
	Path string // the library that was tried
	Err  error  // the loader's error
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("cannot load UCX library %s (install libucx0, or a UCX release, or set %s): %v", e.Path, EnvLibrary, e.Err)
}

// Is matches ErrUnavailable.
func (e *LoadError) Is(target error) bool { return target == ErrUnavailable }

func (e *LoadError) Unwrap() error { return e.Err }

// Status is a ucs_status_t (a packed enum: one signed byte): 0 is UCS_OK, 1 UCS_INPROGRESS, negative values
// are errors. The values are those of ucs/type/status.h (UCX 1.x, stable).
type Status int32

// Status codes that pinmem handles by name.
const (
	OK                    Status = 0
	InProgress            Status = 1
	ErrNoMessage          Status = -1
	ErrNoResource         Status = -2
	ErrIOError            Status = -3
	ErrNoMemory           Status = -4
	ErrInvalidParam       Status = -5
	ErrUnreachable        Status = -6
	ErrInvalidAddr        Status = -7
	ErrNoElem             Status = -12
	ErrBusy               Status = -15
	ErrCanceled           Status = -16
	ErrTimedOut           Status = -20
	ErrUnsupported        Status = -22
	ErrRejected           Status = -23
	ErrNotConnected       Status = -24
	ErrConnectionReset    Status = -25
	ErrFirstEndpointFail  Status = -60
	ErrEndpointTimeout    Status = -80
	ErrLastEndpointFail   Status = -89
	errLast               Status = -100
	statusMaxPointerValue        = ^uintptr(0) - 99 // (uintptr)UCS_ERR_LAST: a status pointer at or above it is an error
)

// PeerFailure reports whether s says the remote side is gone or cannot be
// reached (the endpoint failed).
func (s Status) PeerFailure() bool {
	switch {
	case s <= ErrFirstEndpointFail && s >= ErrLastEndpointFail:
		return true
	case s == ErrUnreachable, s == ErrConnectionReset, s == ErrNotConnected, s == ErrTimedOut, s == ErrRejected, s == ErrIOError:
		return true
	}
	return false
}

// Error is a failed UCX call: the function, its status and UCX's own
// description of it.
type Error struct {
	Op     string // e.g. "ucp_mem_map"
	Status Status
	Detail string // ucs_status_string
}

func (e *Error) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("%s: %s (status %d)", e.Op, e.Detail, int32(e.Status))
	}
	return fmt.Sprintf("%s: status %d", e.Op, int32(e.Status))
}
