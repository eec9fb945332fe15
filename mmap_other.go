//go:build !linux

package pinmem

import (
	"fmt"
	"sync/atomic"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

var liveMappings atomic.Int64

// mmapSupported reports whether pinmem can map and register memory itself.
const mmapSupported = false

func mapAnon(length uintptr, huge bool) (hostptr.Ptr, bool, error) {
	return nil, false, fmt.Errorf("pinmem: mapping memory for registration is implemented only on Linux: %w", cuda.ErrNotSupported)
}

func unmapAnon(p hostptr.Ptr, length uintptr) error { return nil }

func isENOMEM(err error) bool { return false }
