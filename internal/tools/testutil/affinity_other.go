//go:build !linux

package testutil

import (
	"runtime"
	"testing"
)

// BindThread locks the calling goroutine to its OS thread until tb ends;
// binding to a CPU is only done on Linux. It returns 0.
func BindThread(tb testing.TB, cpu int) int {
	runtime.LockOSThread()
	tb.Cleanup(runtime.UnlockOSThread)
	return 0
}
