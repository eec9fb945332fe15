package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestSuiteShare: a part's share of a time budget is what is left in
// proportion to its weight among the parts still to run, at least a
// second; shares of a run that keeps to them add up to the budget.
func TestSuiteShare(t *testing.T) {
	parts := SuiteParts()
	var total float64
	for _, p := range parts {
		if p.Weight <= 0 {
			t.Errorf("part %s has no weight", p.Name)
		}
		total += p.Weight
	}
	const budget = 8 * time.Minute
	left, wl := time.Duration(budget), total
	var sum time.Duration
	for _, p := range parts {
		share := SuiteShare(left, p.Weight, wl)
		if want := time.Duration(float64(budget) * p.Weight / total); share < want-time.Millisecond || share > want+time.Millisecond {
			t.Errorf("%s: share %v, want %v (its weight's part of the budget)", p.Name, share, want)
		}
		sum += share
		left -= share // the part kept to its share
		wl -= p.Weight
	}
	if sum < budget-time.Second || sum > budget {
		t.Errorf("shares add up to %v, want %v", sum, budget)
	}
	// A part that overran leaves the next ones less; nothing left still
	// gives each a second.
	if got := SuiteShare(time.Minute, 1, 4); got != 15*time.Second {
		t.Errorf("SuiteShare(1m, 1, 4) = %v, want 15s", got)
	}
	if got := SuiteShare(-time.Minute, 1, 4); got != time.Second {
		t.Errorf("SuiteShare of an overrun budget = %v, want 1s", got)
	}
}

// TestSampleBudgetOnFake: under a sample budget every row is still
// measured, with the fewest samples the budget keeps and a note saying the
// budget cut them; without one, every sample asked for is taken.
func TestSampleBudgetOnFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	s, err := Open(t.Context(), 0, SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	cfg := BandwidthConfig{Kinds: []string{KindPinned, KindCopier, KindPageableSync}, Sizes: []int64{64 << 10}, Samples: 9, MinBytes: 64 << 10}
	s.SetSampleBudget(time.Nanosecond, MinBudgetSamples)
	rs, err := s.Bandwidth(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != bwRows(cfg) {
		t.Fatalf("%d rows under a budget, want every one of %d", len(rs), bwRows(cfg))
	}
	for _, r := range rs {
		if r.Skipped || !r.Verified || r.Samples != MinBudgetSamples || !strings.Contains(r.Note, "2 of 9 samples: the row's share of the time budget") {
			t.Errorf("under a budget: %s %s: %d samples, note %q", r.Kind, r.Dir, r.Samples, r.Note)
		}
	}
	bl, err := s.Blocks(t.Context(), BlocksConfig{Sizes: []int64{4 << 10}, Blocks: 8, Kinds: []string{BlockKindContiguous, BlockKindPerCopy}, Dirs: []string{DirH2D}, Samples: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range bl {
		if r.Samples != MinBudgetSamples || !strings.Contains(r.Note, "share of the time budget") {
			t.Errorf("blocks under a budget: %s: %d samples, note %q", r.Kind, r.Samples, r.Note)
		}
	}
	s.SetSampleBudget(0, 1)
	rs, err = s.Bandwidth(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Samples != 9 || strings.Contains(r.Note, "budget") {
			t.Errorf("without a budget: %s %s: %d samples, note %q", r.Kind, r.Dir, r.Samples, r.Note)
		}
	}
}
