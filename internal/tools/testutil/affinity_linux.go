package testutil

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// BindThread locks the calling goroutine to its OS thread and binds that
// thread to cpu (sched_setaffinity), undoing both when tb ends; cpu 0 only
// locks the thread. It returns the CPU bound to (0 for none).
func BindThread(tb testing.TB, cpu int) int {
	tb.Helper()
	runtime.LockOSThread()
	undo, err := bindThread(cpu)
	if err != nil {
		tb.Logf("thread not bound to CPU %d: %v", cpu, err)
		cpu = 0
	}
	tb.Cleanup(func() {
		undo()
		runtime.UnlockOSThread()
	})
	return cpu
}

// bindThread binds the calling thread (which must be locked) to cpu, when
// cpu > 0, and returns the function that restores its former affinity.
func bindThread(cpu int) (undo func(), err error) {
	undo = func() {}
	if cpu <= 0 {
		return undo, nil
	}
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return undo, err
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return undo, err
	}
	return func() { _ = unix.SchedSetaffinity(0, &old) }, nil
}
