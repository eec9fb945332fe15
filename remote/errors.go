package remote

import (
	"errors"

	"github.com/pinmem/pinmem/cuda"

	"github.com/pinmem/pinmem/remote/internal/ucx"
)

// Errors of this package, matched with errors.Is. Every error it returns
// is an *Error matching one of them (or cuda.ErrInvalidValue for a bad
// argument), and wraps the cause: the backend's error, or the context's
// error when a wait was cut short by ctx.
var (
	// ErrUnavailable: the transport library (UCX's libucp.so.0) could not be
	// loaded: not installed, too old, or no binding for this platform.
	ErrUnavailable = ucx.ErrUnavailable
	// ErrBadKey: a remote key that is not one (truncated, corrupt, of an
	// unknown version or backend).
	ErrBadKey = errors.New("remote: malformed remote key")
	// ErrStaleKey: a remote key whose agent is gone (exited, killed or
	// closed) or whose region was closed.
	ErrStaleKey = errors.New("remote: stale remote key")
	// ErrOutOfRange: a block outside its local or remote region.
	ErrOutOfRange = errors.New("remote: block outside its region")
	// ErrPeer: the remote side failed or could not be reached during a
	// transfer, or its connection was failed after a transfer on it was
	// cut short by its context; import the key again to reconnect.
	ErrPeer = errors.New("remote: peer failed")
	// ErrClosed: the agent, region or remote region was closed.
	ErrClosed = errors.New("remote: closed")
	// ErrBusy: a region, or the pinmem buffer under it, has transfers in
	// flight (a Free of the buffer is refused with it).
	ErrBusy = errors.New("remote: transfers in flight")
)

// errNil is the error of a method called on a nil or zero Agent, Region
// or Remote (one not made by this package).
func errNil(op, what string) error {
	return &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: "nil or zero " + what + ": not made by NewAgent, Register, Alloc or Import"}
}

// Error is a failed operation of this package.
type Error struct {
	Op     string // e.g. "remote.Put"
	Kind   error  // the sentinel it matches
	Detail string // what was wrong, with the values
	Err    error  // the cause: the backend's error or ctx.Err(); may be nil
}

// Error says what failed, why, and the cause.
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	s := e.Op + ": " + e.Kind.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches the error's sentinel.
func (e *Error) Is(target error) bool { return e != nil && target == e.Kind }

// Unwrap returns the cause.
func (e *Error) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}
