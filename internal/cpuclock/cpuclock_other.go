//go:build !linux

package cpuclock

import "time"

// HaveThread reports whether Thread measures the calling thread.
const HaveThread = false

// Thread returns 0: no per-thread CPU clock here.
func Thread() time.Duration { return 0 }

// Process returns 0: no process CPU clock here.
func Process() time.Duration { return 0 }
