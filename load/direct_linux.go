//go:build linux

package load

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// openDirect opens the file f is open on again, read-only with O_DIRECT,
// through /proc/self/fd: whatever its path names by now, and without
// blocking.
func openDirect(f *os.File) (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDONLY|unix.O_DIRECT|unix.O_NONBLOCK, 0)
}

// isDirectRefusal reports whether err is how a file system refuses an
// O_DIRECT open or read (EINVAL; EOPNOTSUPP on some FUSE file systems).
func isDirectRefusal(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}

// sampleWindows is how many windows of sampleWindow bytes residency
// samples: 1024 pages of 4 KiB a file at most, since mincore's time grows
// with the pages it looks up.
const (
	sampleWindows = 64
	sampleWindow  = 64 << 10
)

// residency returns the share of sampled pages of the extents ext of f
// (sorted, disjoint) that are in the page cache, and false when it cannot
// tell (mmap or mincore refused). It samples up to sampleWindows windows of
// at most sampleWindow bytes spread evenly over the extents' bytes taken
// end to end, so that the bytes between the extents, which the load does
// not read, do not count; a window ends where its extent ends.
func residency(f *os.File, ext []extent) (float64, bool) {
	var length int64
	for _, e := range ext {
		length += e.hi - e.lo
	}
	if length <= 0 {
		return 1, true
	}
	page := int64(os.Getpagesize())
	windows := int64(sampleWindows)
	// Short extents are covered by windows side by side; longer ones are
	// sampled by windows of sampleWindow bytes spread evenly.
	win := min(int64(sampleWindow), (length+windows-1)/windows)
	windows = min(windows, (length+win-1)/win)
	// One mapping of the extents' span serves every window: mapping and
	// unmapping each window cost as much as its mincore (on a 2-core host,
	// 4 shards of 128 MiB took 5.5 ms with a mapping for each window of 1
	// MiB, 1.9 ms with windows of 64 KiB and 0.9 ms with one mapping; the
	// first tensor of a load waits for it). Where the span cannot be
	// mapped (too large for the address space), each window is mapped
	// alone.
	spanLo := ext[0].lo / page * page
	var span []byte
	if n := ext[len(ext)-1].hi - spanLo; n <= math.MaxInt {
		if m, err := unix.Mmap(int(f.Fd()), spanLo, int(n), unix.PROT_READ, unix.MAP_SHARED); err == nil {
			span = m
			defer func() { _ = unix.Munmap(m) }()
		}
	}
	var resident, total int64
	k, before := 0, int64(0) // the extent holding the window, and the bytes of the extents before it
	for w := range windows {
		// The window's start among the extents' bytes: w/(windows-1) of
		// the way to length-win, computed without overflow.
		var v int64
		if windows > 1 {
			d := windows - 1
			v = (length-win)/d*w + (length-win)%d*w/d
		}
		for v >= before+ext[k].hi-ext[k].lo {
			before += ext[k].hi - ext[k].lo
			k++
		}
		lo := ext[k].lo + v - before
		hi := min(lo+win, ext[k].hi)
		lo = lo / page * page
		vec := make([]byte, (hi-lo+page-1)/page)
		if span != nil {
			if err := mincore(span[lo-spanLo:hi-spanLo], vec); err != nil {
				return 0, false
			}
		} else {
			m, err := unix.Mmap(int(f.Fd()), lo, int(hi-lo), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				return 0, false
			}
			err = mincore(m, vec)
			_ = unix.Munmap(m)
			if err != nil {
				return 0, false
			}
		}
		for _, v := range vec {
			resident += int64(v & 1)
		}
		total += int64(len(vec))
	}
	if total == 0 {
		return 1, true
	}
	return float64(resident) / float64(total), true
}

// mincore fills vec with the residency of the pages of m (golang.org/x/sys
// has no wrapper). Both are live Go values for the whole call: m is a
// mapping and vec heap memory, neither of which moves.
func mincore(m, vec []byte) error {
	_, _, e := unix.Syscall(unix.SYS_MINCORE, hostptr.AddrOf(m), uintptr(len(m)), hostptr.AddrOf(vec))
	runtime.KeepAlive(m)
	runtime.KeepAlive(vec)
	if e != 0 {
		return e
	}
	return nil
}
