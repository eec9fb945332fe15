package pinmem

// Test access to pinmem's internal state.

// regCount returns the number of claimed ranges.
func regCount() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return len(registry.ranges)
}

// freeDropped releases every buffer dropped without Free.
func freeDropped() error {
	droppedMu.Lock()
	ds := dropped
	dropped = nil
	droppedMu.Unlock()
	var first error
	for _, s := range ds {
		if s.freed.CompareAndSwap(false, true) {
			if err := s.release(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
