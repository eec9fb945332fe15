//go:build linux

package pinmem

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/hostptr"
)

// mmapSupported reports whether pinmem can map and register memory itself.
const mmapSupported = true

// mapAnon maps length bytes (a multiple of the page size) of private
// anonymous memory. Mappings of at least hugePageSize start on a
// hugePageSize boundary, so that transparent huge pages can back them. With
// huge it asks for huge pages (MADV_HUGEPAGE) and reports whether the
// kernel accepted; without, it asks for none (MADV_NOHUGEPAGE), which
// matters where THP mode is "always".
func mapAnon(length uintptr, huge bool) (p hostptr.Ptr, hugeOn bool, err error) {
	align := uintptr(0)
	if length >= hugePageSize {
		align = hugePageSize
	}
	total := length + align
	raw, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, false, fmt.Errorf("mmap of %d bytes: %w", total, err)
	}
	liveMappings.Add(1)
	p = raw
	if align > 0 {
		head := (align - uintptr(raw)%align) % align
		p = hostptr.Offset(raw, head)
		if head > 0 {
			_ = unix.MunmapPtr(raw, head)
		}
		if tail := align - head; tail > 0 {
			_ = unix.MunmapPtr(hostptr.Offset(p, length), tail)
		}
	}
	if align > 0 {
		advice := unix.MADV_NOHUGEPAGE
		if huge {
			advice = unix.MADV_HUGEPAGE
		}
		// madvise fails (EINVAL) on kernels without THP: fall back to small pages.
		hugeOn = unix.Madvise(hostptr.BytesAt(p, length), advice) == nil && huge
	}
	return p, hugeOn, nil
}

// liveMappings counts mappings made by mapAnon and not yet unmapped (for tests).
var liveMappings atomic.Int64

// unmapAnon unmaps what mapAnon mapped.
func unmapAnon(p hostptr.Ptr, length uintptr) error {
	if err := unix.MunmapPtr(p, length); err != nil {
		return fmt.Errorf("munmap of %d bytes at %#x: %w", length, uintptr(p), err)
	}
	liveMappings.Add(-1)
	return nil
}

// isENOMEM reports whether err is the system's out-of-memory error.
func isENOMEM(err error) bool { return errors.Is(err, unix.ENOMEM) }
