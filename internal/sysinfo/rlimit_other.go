//go:build !unix

package sysinfo

import (
	"errors"
	"fmt"
)

// getMemlock is a variable so tests can replace it.
var getMemlock = func() (Rlimit, error) {
	return Rlimit{}, fmt.Errorf("sysinfo: RLIMIT_MEMLOCK: %w", errors.ErrUnsupported)
}
