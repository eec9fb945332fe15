//go:build !linux

package pinmem

import (
	"fmt"
	"runtime"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// mbind is Linux-only; elsewhere pinmem does not map memory itself.
func mbind(hostptr.Ptr, uintptr, int, bool) error {
	return fmt.Errorf("mbind on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
}

// firstTouch is Linux-only (CPU affinity).
func firstTouch(hostptr.Ptr, uintptr, []int, int) error {
	return fmt.Errorf("CPU affinity on %s: %w", runtime.GOOS, cuda.ErrNotSupported)
}
