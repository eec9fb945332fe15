//go:build !linux

package fakedrv

// threadID identifies the calling OS thread. Outside Linux the fake has no
// portable thread id and treats the whole process as one thread, so it does
// not catch a context left current on another thread there.
func threadID() int { return 0 }
