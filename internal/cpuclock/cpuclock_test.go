package cpuclock

import (
	"runtime"
	"testing"
	"time"
)

func TestClocksAdvanceWithWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if Process() != 0 || Thread() != 0 || HaveThread {
			t.Fatal("clocks read where none exists")
		}
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Spin until the thread clock shows 20 ms of work, or 10 s of wall
	// time pass (a loaded machine gives the thread less than a core).
	p0, t0, start := Process(), Thread(), time.Now()
	for Thread()-t0 < 20*time.Millisecond && time.Since(start) < 10*time.Second {
	}
	dp, dt := Process()-p0, Thread()-t0
	if dt < 20*time.Millisecond || dp < dt {
		t.Fatalf("after %v of spinning: thread %v, process %v", time.Since(start), dt, dp)
	}
}
