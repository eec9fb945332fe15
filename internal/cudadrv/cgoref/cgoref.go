//go:build cgo

// Package cgoref is a yardstick for benchmarks only: a trivial C function
// called through cgo, to compare pinmem's CGO_ENABLED=0 driver-call path
// with what cgo itself costs. pinmem never imports it outside tests.
package cgoref

/*
#include <stdlib.h>
static long pinmem_cgoref_labs(long x) { return labs(x); }
*/
import "C"

// Available reports whether this build has cgo (and so Labs calls C).
const Available = true

// Labs returns |x|, computed by libc's labs through cgo.
func Labs(x int64) int64 { return int64(C.pinmem_cgoref_labs(C.long(x))) }
