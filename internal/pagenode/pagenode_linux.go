// Package pagenode reports the NUMA node that holds a page of the
// process's memory (move_pages(2) with no target nodes: a query).
package pagenode

import (
	"encoding/binary"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// Of returns the NUMA node of the pages at the given addresses: the node
// when they agree, -1 when they differ or the kernel cannot say (no NUMA
// support, a page not present).
func Of(addrs ...uintptr) int {
	if len(addrs) == 0 {
		return -1
	}
	pages := make([]uint64, len(addrs))
	for i, a := range addrs {
		pages[i] = uint64(a)
	}
	// The kernel writes one C int per page; two fit in each word.
	st := make([]uint64, (len(addrs)+1)/2)
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, uintptr(len(pages)), hostptr.AddrOfWords(pages), 0, hostptr.AddrOfWords(st), 0)
	runtime.KeepAlive(pages)
	runtime.KeepAlive(st)
	if e != 0 {
		return -1
	}
	var b [8]byte
	node := -1
	for i := range addrs {
		binary.NativeEndian.PutUint64(b[:], st[i/2])
		s := int(int32(binary.NativeEndian.Uint32(b[4*(i%2):])))
		if s < 0 || (i > 0 && s != node) {
			return -1
		}
		node = s
	}
	return node
}
