package pinmem

import (
	"fmt"

	"github.com/pinmem/pinmem/internal/freehook"
)

// runFreeHooks asks whoever registered the buffer with something else
// (package remote's transport registrations) to drop it before Free
// releases it; one that cannot (a transfer is in flight) refuses the Free,
// which then changes nothing.
func runFreeHooks(s *bufState) error {
	if s.freed.Load() {
		return nil
	}
	if err := freehook.Run(uintptr(s.ptr)); err != nil {
		return fmt.Errorf("pinmem: Free of %s buffer at %#x refused: %w", s.kind, uintptr(s.ptr), err)
	}
	return nil
}
