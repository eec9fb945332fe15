// Package uring is a minimal io_uring for reads into registered buffers,
// by raw system calls through golang.org/x/sys/unix: no cgo, and no
// dependency for the few hundred lines the loader needs (the maintained
// pure-Go io_uring libraries carry networking, polling and a runtime of
// their own). A Ring is used by one goroutine at a time. Linux only.
package uring
