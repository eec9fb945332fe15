// Package regfile opens regular files for reading, for load and
// safetensors: without blocking (an ordinary open of a FIFO blocks until a
// writer comes; O_NONBLOCK changes nothing for a regular file), refusing
// anything but a regular file (a FIFO, a device, a directory) with an
// error matching fs.ErrInvalid.
package regfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// flags open a file for reading without blocking.
const flags = os.O_RDONLY | syscall.O_NONBLOCK

// Open opens the regular file at path and returns it with its FileInfo.
func Open(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, flags, 0)
	return check(f, err, path)
}

// OpenIn opens the regular file name inside root (which it may not leave)
// and returns it with its FileInfo.
func OpenIn(root *os.Root, name string) (*os.File, fs.FileInfo, error) {
	f, err := root.OpenFile(name, flags, 0)
	return check(f, err, name)
}

// check returns f with its FileInfo when f is a regular file, else closes
// it and returns the error.
func check(f *os.File, err error, path string) (*os.File, fs.FileInfo, error) {
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file (%v): %w", path, fi.Mode().Type(), fs.ErrInvalid)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}
