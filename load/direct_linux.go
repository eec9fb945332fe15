//go:build linux

package load

import (
	"errors"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// openDirect opens path read-only with O_DIRECT.
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
}

// isDirectRefusal reports whether err is how a file system refuses an
// O_DIRECT open or read (EINVAL; EOPNOTSUPP on some FUSE file systems).
func isDirectRefusal(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}

// sampleWindows is how many windows of sampleWindow bytes residency samples.
const (
	sampleWindows = 64
	sampleWindow  = 1 << 20
)

// residency returns the share of sampled pages of [lo, hi) of f that are in
// the page cache (mincore on up to sampleWindows windows spread evenly over
// the span), and false when it cannot tell (mmap or mincore refused).
func residency(f *os.File, lo, hi int64) (float64, bool) {
	if hi <= lo {
		return 1, true
	}
	page := int64(os.Getpagesize())
	lo = lo / page * page
	span := hi - lo
	windows := int64(sampleWindows)
	if span <= windows*sampleWindow {
		windows = 1
	}
	win := min(span, int64(sampleWindow))
	if windows == 1 {
		win = span
	}
	var resident, total int64
	for w := int64(0); w < windows; w++ {
		off := lo
		if windows > 1 {
			off += (span - win) * w / (windows - 1)
		}
		off = off / page * page
		n := min(win, hi-off)
		m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return 0, false
		}
		vec := make([]byte, (n+page-1)/page)
		err = mincore(m, vec)
		_ = unix.Munmap(m)
		if err != nil {
			return 0, false
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
