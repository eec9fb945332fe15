// Package pagenode reports the NUMA node that holds a page of the
// process's memory (move_pages(2) with no target nodes: a query).
package pagenode

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Of returns the NUMA node of the pages at the given addresses: the node
// when they agree, -1 when they differ or the kernel cannot say (no NUMA
// support, a page not present).
func Of(addrs ...uintptr) int {
	if len(addrs) == 0 {
		return -1
	}
	pages := make([]uintptr, len(addrs))
	copy(pages, addrs)
	st := make([]int32, len(addrs))
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, uintptr(len(pages)), uintptr(unsafe.Pointer(&pages[0])), 0, uintptr(unsafe.Pointer(&st[0])), 0)
	if e != 0 {
		return -1
	}
	for _, s := range st {
		if s < 0 || s != st[0] {
			return -1
		}
	}
	return int(st[0])
}
