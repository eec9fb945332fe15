package faultsweep_test

import "testing"

// TestZZTotals prints the figures of every sweep that ran; its file name
// makes it run after them.
func TestZZTotals(t *testing.T) {
	sweepTotals.mu.Lock()
	defer sweepTotals.mu.Unlock()
	if sweepTotals.ops == 0 {
		t.Skip("no sweep ran (filtered out)")
	}
	t.Logf("FAULT SWEEP TOTAL: %d operations, %d driver calls, %d faulted runs", sweepTotals.ops, sweepTotals.calls, sweepTotals.runs)
}
