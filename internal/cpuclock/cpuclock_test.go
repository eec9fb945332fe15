package cpuclock

import (
	"runtime"
	"testing"
	"time"
)

// burn spins for d of wall time.
func burn(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

func TestClocksAdvanceWithWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if Process() != 0 || Thread() != 0 || HaveThread {
			t.Fatal("clocks read where none exists")
		}
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, t0 := Process(), Thread()
	burn(50 * time.Millisecond)
	dp, dt := Process()-p0, Thread()-t0
	if dt < 20*time.Millisecond || dp < dt {
		t.Fatalf("after 50 ms of spinning: thread %v, process %v", dt, dp)
	}
}
