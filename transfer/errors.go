package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// ErrClosed is returned by a Copier, Pipeline or Multi used after Close
// (and by a Pipeline whose Copier was closed). It matches cuda.ErrClosed.
var ErrClosed = lifecycle.Closed("transfer: closed")

// ErrWrongDevice is returned when a device buffer is not on the device
// the call copies with (for a Multi, the one at the buffer's index).
var ErrWrongDevice = errors.New("transfer: device buffer on another device")

// SizeError says that a copy's destination is too small. It matches
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
	Stage  string // "host-to-device", "work", "device-to-host", "record", "complete" or "callback"
	Err    error
}

// Error names the chunk, the step and the cause.
func (e *ChunkError) Error() string {
	return fmt.Sprintf("transfer: pipeline chunk %d (offset %d) failed in %s: %v", e.Chunk, e.Offset, e.Stage, e.Err)
}

// Unwrap returns the cause.
func (e *ChunkError) Unwrap() error { return e.Err }

// errNil is the error of a method called on a nil receiver.
func errNil(what string) error {
	return fmt.Errorf("transfer: nil %s: %w", what, cuda.ErrInvalidValue)
}

// checkCtx refuses a nil context.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("transfer: nil context.Context: %w", cuda.ErrInvalidValue)
	}
	return nil
}

// checkBuf checks that b is not nil, not freed and (when it knows its
// context) on device dev.
func checkBuf(b *cuda.DeviceBuffer, dev *cuda.Device, what string) error {
	if b == nil {
		return fmt.Errorf("transfer: nil %s: %w", what, cuda.ErrInvalidValue)
	}
	if err := b.Err(); err != nil {
		return fmt.Errorf("transfer: %s: %w", what, err)
	}
	if bc := b.Context(); bc != nil && dev != nil {
		if bd := bc.Device(); bd != nil && bd.Ordinal() != dev.Ordinal() {
			return fmt.Errorf("transfer: %s on device %d, copying with device %d: %w", what, bd.Ordinal(), dev.Ordinal(), ErrWrongDevice)
		}
	}
	return nil
}
