//go:build linux

package pinmem

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// Memory policies of mbind(2) (linux/mempolicy.h; golang.org/x/sys/unix
// does not define them).
const (
	mpolPreferred = 1
	mpolBind      = 2
)

// mbind sets the memory policy of [p, p+length) to node, preferred or
// strict. It must run before the pages are touched: it moves nothing.
func mbind(p hostptr.Ptr, length uintptr, node int, strict bool) error {
	if node < 0 || node >= 4096 {
		return fmt.Errorf("mbind: node %d out of range", node)
	}
	mask := make([]uint64, node/64+1)
	mask[node/64] |= 1 << (node % 64)
	mode := uintptr(mpolPreferred)
	if strict {
		mode = mpolBind
	}
	// maxnode is the number of bits in the mask plus one (the kernel
	// counts one less, as numactl passes it).
	_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(p), length, mode,
		hostptr.AddrOfWords(mask), uintptr(len(mask)*64+1), 0)
	runtime.KeepAlive(mask)
	if errno != 0 {
		return fmt.Errorf("mbind(%#x, %d, node %d): %w", uintptr(p), length, node, errno)
	}
	return nil
}

// firstTouch faults in [p, p+length) by writing a zero to every page from
// up to threads goroutines, each locked to an OS thread whose CPU affinity
// is set to cpus, so that the kernel's first-touch policy allocates the
// pages on their node. Each thread's affinity is restored before it is
// unlocked.
func firstTouch(p hostptr.Ptr, length uintptr, cpus []int, threads int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	threads = max(1, min(threads, len(cpus), int(length/(16<<20))+1))
	per := roundUp(roundUp(length, uintptr(threads))/uintptr(threads), pageSize)
	mem := hostptr.BytesAt(p, length)
	var wg sync.WaitGroup
	errs := make([]error, threads)
	for i := range threads {
		lo := uintptr(i) * per
		if lo >= length {
			break
		}
		hi := min(lo+per, length)
		wg.Go(func() {
			runtime.LockOSThread()
			var old unix.CPUSet
			if err := unix.SchedGetaffinity(0, &old); err != nil {
				runtime.UnlockOSThread()
				errs[i] = fmt.Errorf("sched_getaffinity: %w", err)
				return
			}
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				runtime.UnlockOSThread()
				errs[i] = fmt.Errorf("sched_setaffinity to %d CPUs: %w", len(cpus), err)
				return
			}
			for off := lo; off < hi; off += pageSize {
				mem[off] = 0
			}
			if unix.SchedSetaffinity(0, &old) == nil {
				runtime.UnlockOSThread()
			}
			// Otherwise the thread keeps the node's affinity: returning
			// while still locked makes the runtime end the thread.
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
