package testutil

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBindThread binds this test's thread to the last CPU, checks that the
// kernel then reports only that CPU, and that undoing restores the former
// affinity.
func TestBindThread(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, set, after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	cpu := runtime.NumCPU() - 1
	undo, err := bindThread(cpu)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	undo()
	if set.Count() != 1 || !set.IsSet(cpu) {
		t.Errorf("bound thread may run on %d CPUs (CPU %d among them: %v), want only CPU %d", set.Count(), cpu, set.IsSet(cpu), cpu)
	}
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("affinity after undo %v, want %v as before", after, before)
	}
	undo, err = bindThread(0)
	if err != nil {
		t.Fatal(err)
	}
	undo()
}
