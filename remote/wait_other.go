//go:build !linux

package remote

import (
	"time"

	"golang.org/x/sys/unix"
)

// newWake returns a pipe's read end (UCX is not bound here: no agent starts).
func newWake() (int, error) {
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		return -1, err
	}
	return p[0], nil
}

// nap waits up to d (at least a millisecond) for one of fds.
func nap(fds []unix.PollFd, d time.Duration) {
	_, _ = unix.Poll(fds, int(max(d, time.Millisecond)/time.Millisecond))
}

// yieldCPU does nothing here.
func yieldCPU() {}
