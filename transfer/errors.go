package transfer

import (
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
)

// ErrClosed is returned by a Copier or Pipeline used after Close.
var ErrClosed = errors.New("transfer: closed")

// SizeError says that host and device memory of a copy disagree in size:
// the device buffer (or the host destination) is too small. It matches
// cuda.ErrInvalidValue.
type SizeError struct {
	Op   string // "host-to-device", "device-to-host", "pipeline output" ...
	Need int    // bytes the copy needs
	Have int    // bytes available
}

// Error describes the size mismatch.
func (e *SizeError) Error() string {
	return fmt.Sprintf("transfer: %s copy needs %d bytes, destination has %d: %v", e.Op, e.Need, e.Have, cuda.ErrInvalidValue)
}

// Is reports whether target is cuda.ErrInvalidValue.
func (e *SizeError) Is(target error) bool { return target == cuda.ErrInvalidValue }

// ChunkError is a Pipeline failure in one chunk: in the caller's device
// work, a completion callback, or a copy. It unwraps to the cause.
type ChunkError struct {
	Chunk  int    // chunk index
	Offset int    // offset of the chunk in the input
	Stage  string // "stage-in", "host-to-device", "work", "device-to-host", "complete", "callback"
	Err    error
}

// Error names the chunk, the step and the cause.
func (e *ChunkError) Error() string {
	return fmt.Sprintf("transfer: pipeline chunk %d (offset %d) failed in %s: %v", e.Chunk, e.Offset, e.Stage, e.Err)
}

// Unwrap returns the cause.
func (e *ChunkError) Unwrap() error { return e.Err }
