package pool

import (
	"fmt"
	"time"
)

// Stats is a snapshot of a pool's counters. Byte counts of blocks are
// capacities (rounded sizes) unless the name says requested.
type Stats struct {
	Name string // the pool's name (WithName)

	Gets        uint64 // successful Get calls
	Hits        uint64 // Gets served from the cache
	Misses      uint64 // Gets that pinned new memory
	Puts        uint64 // Put calls that took a block back
	OrderedPuts uint64 // Puts with stream work to wait for

	InUseBlocks    int64 // blocks out (taken by Get, not yet Put)
	InUseBytes     int64 // their capacity
	RequestedBytes int64 // the sizes requested for them
	WastedBytes    int64 // InUseBytes - RequestedBytes: lost to rounding
	CachedBlocks   int64 // idle blocks ready for reuse
	CachedBytes    int64
	PendingBlocks  int64 // blocks Put with stream work that has not been seen to finish
	PendingBytes   int64

	PinnedBytes        int64 // all memory the pool holds pinned (slabs whole)
	PeakPinnedBytes    int64
	PeakRequestedBytes int64 // peak of RequestedBytes
	PeakInUseBytes     int64 // peak of InUseBytes: the footprint a miss stays within (see WithRetainOnMiss)
	Slabs              int64 // slabs pinned now

	Pins      uint64 // pinmem allocations made
	Unpins    uint64 // pinmem allocations freed
	Evictions uint64 // idle blocks or slabs taken out of the cache to be unpinned (cap, miss, Trim, budget)
	// Idle memory evicted by the cap on the hit path, whose unpinning (which
	// may synchronize the device) waits for the next miss, Trim, budget reclaim or
	// Close; still counted in PinnedBytes.
	DeferredUnpins int64
	DeferredBytes  int64
	BudgetRetries  uint64 // Gets that hit the pinned budget and retried after releasing idle memory
	BudgetErrors   uint64 // Gets that failed on the budget after that
	Reclaimed      int64  // bytes released at the budget's request
	// Unpinning calls that failed, and the bytes whose release failed and
	// that the driver still holds: they stay in PinnedBytes and are
	// retried by the next miss, Trim, budget reclaim and Close.
	ReleaseErrors   uint64
	UnreleasedBytes int64

	EventsOutstanding int64  // events recorded by Put (or streams, where none could be recorded) whose completion has not been seen
	EventsCreated     uint64 // events created (they are reused)
	EventErrors       uint64 // event record or query failures
	// Events whose destruction failed: the driver still holds them, and
	// the next Trim or Close destroys them again.
	UndestroyedEvents int64

	DriverTime time.Duration // time spent pinning, unpinning and in event calls
}

// hitRate returns Hits / Gets, or 0 before any Get.
func (s Stats) hitRate() float64 {
	if s.Gets == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Gets)
}

// String formats the stats on one line.
func (s Stats) String() string {
	return fmt.Sprintf("pool %s: gets %d (hits %d, %.1f%%; misses %d) puts %d (%d stream-ordered); "+
		"in use %d blocks %s (requested %s, wasted %s); cached %d blocks %s; pending %d blocks %s; "+
		"pinned %s in %d slab(s) and own blocks (peak %s; peak requested %s); pins %d unpins %d evictions %d (deferred %d, %s); "+
		"budget retries %d errors %d reclaimed %s; release errors %d (unreleased %s); events outstanding %d created %d errors %d undestroyed %d; driver %v",
		s.Name, s.Gets, s.Hits, 100*s.hitRate(), s.Misses, s.Puts, s.OrderedPuts,
		s.InUseBlocks, human(s.InUseBytes), human(s.RequestedBytes), human(s.WastedBytes),
		s.CachedBlocks, human(s.CachedBytes), s.PendingBlocks, human(s.PendingBytes),
		human(s.PinnedBytes), s.Slabs, human(s.PeakPinnedBytes), human(s.PeakRequestedBytes),
		s.Pins, s.Unpins, s.Evictions, s.DeferredUnpins, human(s.DeferredBytes), s.BudgetRetries, s.BudgetErrors, human(s.Reclaimed),
		s.ReleaseErrors, human(s.UnreleasedBytes),
		s.EventsOutstanding, s.EventsCreated, s.EventErrors, s.UndestroyedEvents, s.DriverTime)
}

func human(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for (f >= unit || f <= -unit) && i < 5 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, "BKMGTP"[i])
}
