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
