package pinmem

import (
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/internal/reclaim"
)

// Test access to pinmem's internal state.

// regCount returns the number of claimed ranges.
func regCount() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return len(registry.ranges)
}

// freeDropped releases every buffer dropped without Free.
func freeDropped() error {
	var first error
	for _, v := range lifecycle.TakeKept() {
		s, ok := v.(*bufState)
		if !ok {
			continue
		}
		s.freed.Store(true)
		s.relMu.Lock()
		if !s.released {
			if err := s.release(); err != nil && first == nil {
				first = err
			}
		}
		s.relMu.Unlock()
	}
	return first
}

// AddReclaimer registers r with pinmem's budget (see internal/reclaim).
func AddReclaimer(r reclaim.Reclaimer) func() { return reclaim.Add(r) }

// HugePages reports whether the buffer is pinmem's own mapping and the
// kernel accepted the request to back it with transparent huge pages.
func (b *Buffer) HugePages() bool { return b != nil && b.s != nil && b.s.huge }

// Kind returns where the memory came from.
func (b *Buffer) Kind() Kind {
	if b == nil || b.s == nil {
		return 0
	}
	return b.s.kind
}
