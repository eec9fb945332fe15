//go:build !cgo

// Package cgoref is a yardstick for benchmarks only: a trivial C function
// called through cgo, to compare pinmem's CGO_ENABLED=0 driver-call path
// with what cgo itself costs. pinmem never imports it outside tests.
package cgoref

// Available reports whether this build has cgo; it does not.
const Available = false

// Labs returns |x| in Go: without cgo there is nothing to compare with.
func Labs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
