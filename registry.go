package pinmem

import (
	"fmt"
	"sort"
	"sync"

	"github.com/pinmem/pinmem/cuda"
)

// OverlapError is returned when a range to be pinned overlaps memory
// pinmem has already pinned (compared at page granularity, as the driver
// pins whole pages). It matches cuda.ErrAlreadyRegistered.
type OverlapError struct {
	Start, End           uintptr // the requested range [Start, End), rounded out to pages
	OtherStart, OtherEnd uintptr // the pinned range it overlaps, rounded out to pages
}

// Error describes the failure with its figures.
func (e *OverlapError) Error() string {
	if e == nil {
		return "<nil>"
	}
	same := ""
	if e.Start == e.OtherStart && e.End == e.OtherEnd {
		same = " (the same memory registered twice)"
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

type hostRange struct{ lo, hi uintptr }

var registry struct {
	mu     sync.Mutex
	ranges []hostRange // sorted by lo, disjoint
}

// regInsert claims [lo, hi) or reports the range it overlaps.
func regInsert(lo, hi uintptr) error {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].hi > lo })
	if i < len(r.ranges) && r.ranges[i].lo < hi {
		o := r.ranges[i]
		return &OverlapError{Start: lo, End: hi, OtherStart: o.lo, OtherEnd: o.hi}
	}
	r.ranges = append(r.ranges, hostRange{})
	copy(r.ranges[i+1:], r.ranges[i:])
	r.ranges[i] = hostRange{lo, hi}
	return nil
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
