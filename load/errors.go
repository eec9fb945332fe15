package load

import (
	"errors"
	"fmt"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// Errors of this package, matched with errors.Is.
var (
	// ErrRange: a Range is invalid (negative, overflowing, without a
	// destination, larger than its destination, in another context, or
	// overlapping another range's destination). The error is a *RangeError.
	ErrRange = errors.New("load: invalid range")
	// ErrShortFile: a range runs past the end of the file, or the file
	// ended early while it was read (it was truncated during the load).
	ErrShortFile = errors.New("load: file shorter than the ranges")
	// ErrChanged: a file's size or modification time changed while it was
	// loaded; the data on the device may mix its old and new contents. A
	// change that leaves both as they were (within the file system's
	// timestamp granularity) goes unseen.
	ErrChanged = errors.New("load: file changed during the load")
	// ErrClosed: the Loader was closed. It matches cuda.ErrClosed.
	ErrClosed = lifecycle.Closed("load: loader closed")
)

// RangeError says which range of a load is invalid and why. It matches
// ErrRange and cuda.ErrInvalidValue.
type RangeError struct {
	Index  int    // the range's index in the slice given to Load
	Range  Range  // the range
	Reason string // what is wrong
}

// Error names the range and the reason.
func (e *RangeError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("load: range %d (offset %d, length %d): %s", e.Index, e.Range.Offset, e.Range.Length, e.Reason)
}

// Is matches ErrRange and cuda.ErrInvalidValue.
func (e *RangeError) Is(target error) bool {
	return e != nil && (target == ErrRange || target == cuda.ErrInvalidValue)
}

// ShortFileError says that a file is shorter than a load needs. It
// matches ErrShortFile.
type ShortFileError struct {
	Path string // the file
	Need int64  // the end offset a range needs
	Size int64  // the file's size (as stat saw it, or where a read ended)
}

// Error names the file and the sizes.
func (e *ShortFileError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("load: %s: the ranges need %d bytes, the file has %d", e.Path, e.Need, e.Size)
}

// Is matches ErrShortFile.
func (e *ShortFileError) Is(target error) bool { return e != nil && target == ErrShortFile }
