//go:build !linux

package pinmem

import (
	"fmt"
	"runtime"
	"unsafe"
)

// mbind is Linux-only; elsewhere pinmem does not map memory itself.
func mbind(unsafe.Pointer, uintptr, int, bool) error {
	return fmt.Errorf("mbind on %s: %w", runtime.GOOS, ErrNotSupported)
}

// firstTouch is Linux-only (CPU affinity).
func firstTouch(unsafe.Pointer, uintptr, []int, int) error {
	return fmt.Errorf("CPU affinity on %s: %w", runtime.GOOS, ErrNotSupported)
}
