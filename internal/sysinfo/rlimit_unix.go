//go:build unix

package sysinfo

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// getMemlock is a variable so tests can replace it.
var getMemlock = func() (Rlimit, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return Rlimit{}, fmt.Errorf("sysinfo: getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	return Rlimit{Soft: rlimValue(uint64(rl.Cur)), Hard: rlimValue(uint64(rl.Max))}, nil
}

// rlimValue maps RLIM_INFINITY to Unlimited.
func rlimValue(v uint64) Limit {
	if v == uint64(unix.RLIM_INFINITY) {
		return Unlimited
	}
	return Limit(v)
}
