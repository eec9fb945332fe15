// Package testhook gives the tests of other packages of the module access
// to test seams of package pinmem, which its own export_test.go cannot
// reach across packages. Nothing outside tests sets them.
package testhook

// SetRegChunk, installed by package pinmem, sets the largest range one
// cuMemHostRegister call pins (4 GiB normally; a buffer larger than it is
// several registrations, see pinmem.Buffer.Segments) and returns a
// function that restores the previous value. Tests use it to get
// multi-segment buffers of a few MiB instead of over 4 GiB. It must not
// be called while buffers are being allocated concurrently.
var SetRegChunk func(n uintptr) (restore func())
