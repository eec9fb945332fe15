package fakedrv

import "golang.org/x/sys/unix"

// threadID identifies the calling OS thread, the unit a CUDA context is
// current on.
func threadID() int { return unix.Gettid() }
