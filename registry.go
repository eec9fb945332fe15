package pinmem

import (
	"fmt"
	"sort"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// OverlapError is returned when memory to be pinned is pinned by pinmem
// already: it shares a byte with a live buffer (the same memory pinned
// twice), or it is to be registered with cuMemHostRegister and shares a
// page with a live buffer (the driver pins and records whole pages, and
// refuses to register a page that is pinned). Two cuMemHostAlloc
// allocations may share a page: the driver places small ones side by side
// in pages it pinned already. It matches cuda.ErrAlreadyRegistered.
type OverlapError struct {
	Start, End           uintptr // the requested range [Start, End), byte for byte
	OtherStart, OtherEnd uintptr // the bytes of the live buffer it collides with
	// SharedPage is true when no byte is shared, only a page.
	SharedPage bool
}

// Error describes the failure with its figures.
func (e *OverlapError) Error() string {
	if e == nil {
		return "<nil>"
	}
	if e.SharedPage {
		return fmt.Sprintf("pinmem: host range [%#x,%#x) shares a page with already pinned range [%#x,%#x), and the driver registers whole pages: host memory already registered",
			e.Start, e.End, e.OtherStart, e.OtherEnd)
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
	reg    bool // registered with cuMemHostRegister: its pages are the driver's record
	s      *bufState
}

// The registry holds the byte ranges of the live buffers, sorted by start
// and disjoint, so also sorted by end. It refuses what the driver refuses:
// the same byte pinned twice, and a registration sharing a page with
// pinned memory. It keeps no page rounding of its own: the driver places
// small cuMemHostAlloc allocations side by side in one page.
var registry struct {
	mu     sync.RWMutex // Lookup reads on every transfer, concurrently
	ranges []hostRange
}

// regInsert claims [lo, hi), registered with cuMemHostRegister when reg,
// or reports the range it collides with.
func regInsert(lo, hi uintptr, reg bool) error { return regInsertState(lo, hi, reg, nil) }

// regInsertState claims [lo, hi) for s (nil: bound later by regBind).
func regInsertState(lo, hi uintptr, reg bool, s *bufState) error {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	pl, ph := lo&^(pageSize-1), roundUp(hi, pageSize)
	// Every range that shares a page with [lo, hi) ends past pl and starts
	// before ph; the first ending past pl is found by binary search.
	for i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].hi > pl }); i < len(r.ranges) && r.ranges[i].lo < ph; i++ {
		o := r.ranges[i]
		bytes := o.lo < hi && lo < o.hi
		if bytes || reg || o.reg {
			return &OverlapError{Start: lo, End: hi, OtherStart: o.lo, OtherEnd: o.hi, SharedPage: !bytes}
		}
	}
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].lo > lo })
	r.ranges = append(r.ranges, hostRange{})
	copy(r.ranges[i+1:], r.ranges[i:])
	r.ranges[i] = hostRange{lo, hi, reg, s}
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
