//go:build !linux

// Package pagenode reports the NUMA node that holds a page of the
// process's memory; on this platform it cannot say.
package pagenode

// Of returns -1: no NUMA query here.
func Of(addrs ...uintptr) int { return -1 }
