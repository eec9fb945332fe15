package remote

import (
	"time"

	"golang.org/x/sys/unix"
)

// newWake returns the descriptor that wakes the agent's thread for a job:
// an eventfd.
func newWake() (int, error) { return unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC) }

// nap waits up to d for one of fds.
func nap(fds []unix.PollFd, d time.Duration) {
	_, _ = unix.Ppoll(fds, &unix.Timespec{Nsec: int64(d)}, nil)
}

// yieldCPU gives the CPU to another ready thread (sched_yield).
func yieldCPU() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
