package pinmem

import (
	"fmt"
	"sort"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// OverlapError is returned when memory to be pinned shares a byte with a
// buffer pinmem pinned already (the same memory pinned twice). Buffers that
// only share a page are both valid, as on the driver: it places small
// cuMemHostAlloc allocations side by side in pages it pinned already, and
// it registers memory sharing a page with a registered range (both seen on
// an H100, driver 580). It matches cuda.ErrAlreadyRegistered.
type OverlapError struct {
	Start, End           uintptr // the requested range [Start, End), byte for byte
	OtherStart, OtherEnd uintptr // the bytes of the live buffer it collides with
}

// Error describes the failure with its figures.
func (e *OverlapError) Error() string {
	if e == nil {
		return "<nil>"
	}
	same := ""
	if e.Start == e.OtherStart && e.End == e.OtherEnd {
		same = " (the same memory pinned twice)"
	}
	return fmt.Sprintf("pinmem: host range [%#x,%#x) overlaps already pinned range [%#x,%#x)%s: host memory already registered",
		e.Start, e.End, e.OtherStart, e.OtherEnd, same)
}

// Is reports whether target is cuda.ErrAlreadyRegistered.
func (e *OverlapError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == cuda.ErrAlreadyRegistered
}

// hostRange is the bytes of one pinned buffer, exactly as pinned, and the
// buffer (nil while the range is claimed but the buffer is not made yet).
type hostRange struct {
	lo, hi uintptr
	ro     bool // registered read-only
	s      *bufState
}

// The registry holds the byte ranges of the live buffers, sorted by start
// and disjoint, so also sorted by end. It refuses what the driver refuses,
// the same byte pinned twice, and a page registered both read-only and
// writable (an H100, driver 580, refused the second of two such
// registrations sharing a page with CUDA_ERROR_INVALID_VALUE, and accepted
// every other pair of flags), and keeps no page rounding of its own.
var registry struct {
	mu     sync.RWMutex // Lookup reads on every transfer, concurrently
	ranges []hostRange
}

// regInsert claims [lo, hi), registered read-only when ro, or reports the
// range it collides with.
func regInsert(lo, hi uintptr, ro bool) error { return regInsertState(lo, hi, ro, nil) }

// regInsertState claims [lo, hi) for s (nil: bound later by regBind).
func regInsertState(lo, hi uintptr, ro bool, s *bufState) error {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	// The first range ending past lo is the only one that can share a byte
	// with [lo, hi).
	if i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].hi > lo }); i < len(r.ranges) && r.ranges[i].lo < hi {
		o := r.ranges[i]
		return &OverlapError{Start: lo, End: hi, OtherStart: o.lo, OtherEnd: o.hi}
	}
	// The ranges sharing a page with [lo, hi) end past its first page's
	// start and begin before its last page's end.
	pl, ph := lo&^(pageSize-1), roundUp(hi, pageSize)
	for i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].hi > pl }); i < len(r.ranges) && r.ranges[i].lo < ph; i++ {
		if o := r.ranges[i]; o.ro != ro {
			return fmt.Errorf("pinmem: host range [%#x,%#x) shares a page with pinned range [%#x,%#x), and one of the two is read-only: the driver refuses a page registered both read-only and writable (register page-aligned memory to mix them): %w",
				lo, hi, o.lo, o.hi, cuda.ErrInvalidValue)
		}
	}
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].lo > lo })
	r.ranges = append(r.ranges, hostRange{})
	copy(r.ranges[i+1:], r.ranges[i:])
	r.ranges[i] = hostRange{lo, hi, ro, s}
	return nil
}

// regBind records s as the buffer pinned in the range claimed at s.regLo.
func regBind(s *bufState) {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].lo >= s.regLo })
	if i < len(r.ranges) && r.ranges[i].lo == s.regLo {
		r.ranges[i].s = s
	}
}

// Lookup returns the buffer pinmem pinned that holds the lowest-addressed
// part of p, wherever the buffer came from (Alloc, Register, a pool's
// arena, a registration cache), so that code handed an arbitrary slice
// can copy the pinned part of it directly instead of staging it. ok is
// false when no byte of p lies in a live buffer (an empty p, pageable
// memory, a buffer already freed or dropped). The buffer may cover only
// part of p, and p may overlap further buffers after it: look up the
// rest of p past the end of the buffer's Bytes to find them. Buffers are
// compared byte for byte: two small cuMemHostAlloc buffers that the
// driver placed in one page are told apart. Split copies at the buffer's
// Segments: one driver copy must not span two registrations.
//
// The answer describes the moment of the call: the caller must make sure
// the buffer is not freed while it uses it, as for any other use of its
// memory.
func Lookup(p []byte) (b *Buffer, ok bool) {
	if len(p) == 0 {
		return nil, false
	}
	lo := hostptr.AddrOf(p)
	hi := lo + uintptr(len(p))
	r := &registry
	r.mu.RLock()
	defer r.mu.RUnlock()
	for i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].hi > lo }); i < len(r.ranges) && r.ranges[i].lo < hi; i++ {
		s := r.ranges[i].s
		if s == nil || s.freed.Load() {
			continue
		}
		if b := s.self.Value(); b != nil {
			return b, true
		}
	}
	return nil, false
}

// regRemove releases the range starting at lo.
func regRemove(lo uintptr) {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].lo >= lo })
	if i < len(r.ranges) && r.ranges[i].lo == lo {
		r.ranges = append(r.ranges[:i], r.ranges[i+1:]...)
	}
}
