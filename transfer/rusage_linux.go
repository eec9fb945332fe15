//go:build linux

package transfer

import (
	"syscall"
	"time"
)

// rusageThread is RUSAGE_THREAD of getrusage(2), Linux only.
const rusageThread = 1

const haveThreadCPU = true

func tvDur(tv syscall.Timeval) time.Duration {
	return time.Duration(tv.Sec)*time.Second + time.Duration(tv.Usec)*time.Microsecond
}

// threadCPU returns the user+system CPU time of the calling OS thread; the
// caller must be locked to its thread.
func threadCPU() time.Duration { return rusage(rusageThread) }

// processCPU returns the user+system CPU time of the whole process.
func processCPU() time.Duration { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return tvDur(ru.Utime) + tvDur(ru.Stime)
}
