//go:build linux

package cpuclock

import (
	"syscall"
	"time"
)

// HaveThread reports whether Thread measures the calling thread.
const HaveThread = true

// rusageThread is getrusage(2)'s RUSAGE_THREAD.
const rusageThread = 1

// Thread returns the user plus system CPU time of the calling OS thread;
// the caller must be locked to its thread (runtime.LockOSThread).
func Thread() time.Duration { return rusage(rusageThread) }

// Process returns the user plus system CPU time of the whole process.
func Process() time.Duration { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
