package faultsweep_test

import (
	"fmt"
	"sync"
)

// sweepTotals adds up the figures of every sweep that ran; TestMain prints
// them once all tests ran, in whatever order (-shuffle included).
var sweepTotals totals

type totals struct {
	mu               sync.Mutex
	ops, calls, runs int
}

func (s *totals) add(ops, calls, runs int) {
	s.mu.Lock()
	s.ops += ops
	s.calls += calls
	s.runs += runs
	s.mu.Unlock()
}

// print writes the totals to stdout, or nothing when no sweep ran (all
// filtered out).
func (s *totals) print() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ops > 0 {
		fmt.Printf("FAULT SWEEP TOTAL: %d operations, %d driver calls, %d faulted runs\n", s.ops, s.calls, s.runs)
	}
}
