package pinmem

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pinmem/pinmem/internal/track"
)

// Usage is an amount of pinned memory: bytes and the buffers holding them.
type Usage struct {
	Bytes   int64 `json:"bytes"`
	Buffers int64 `json:"buffers"`
}

// LedgerStats is pinmem's exact account of the memory it pinned. Bytes are
// those handed to the driver: the requested size for cuMemHostAlloc and
// registered Go slices, the mapping (rounded up to whole pages, or to 2 MiB
// with huge pages) for pinmem's own mappings. The driver places small
// cuMemHostAlloc allocations side by side in pages it pinned for several
// of them (512 bytes apart on an H100): such a buffer counts its requested
// bytes, not the pages it shares, which the driver pins once for all of
// them and keeps pinned as it sees fit, beyond what any ledger can see.
type LedgerStats struct {
	// Pinned is the memory pinned now, over all kinds and flags.
	Pinned Usage `json:"pinned"`
	// PeakBytes is the highest Pinned.Bytes seen.
	PeakBytes int64 `json:"peak_bytes"`
	// ByKind is Pinned split by Kind (every kind present, zero included).
	ByKind map[Kind]Usage `json:"by_kind"`
	// ByFlags is Pinned split by the buffers' flags (only combinations in use).
	ByFlags map[Flags]Usage `json:"by_flags"`
	// Allocs and Frees count successful pins (Alloc and Register) and releases.
	Allocs int64 `json:"allocs"`
	Frees  int64 `json:"frees"`
	// AllocBytes is the total of bytes ever pinned.
	AllocBytes int64 `json:"alloc_bytes"`
	// Failures counts Alloc and Register calls that returned an error,
	// budget rejections included.
	Failures int64 `json:"failures"`
	// BudgetRejections counts requests refused because of the budget.
	BudgetRejections int64 `json:"budget_rejections"`
	// Dropped counts buffers that became unreachable without a successful
	// Free, and pins that failed and could not be undone (the driver
	// refused to unregister part of them). Their memory stays pinned and
	// counted in Pinned.
	Dropped int64 `json:"dropped"`
	// DroppedOwners counts, by kind ("copier", "pipeline", "multi",
	// "pool"), owners of driver resources that became unreachable without
	// Close (their resources were released by the garbage collector). Only
	// kinds with a drop are present.
	DroppedOwners map[string]int64 `json:"dropped_owners,omitempty"`
	// PinTime is the total time spent pinning (successful calls), and
	// LastPinTime that of the latest one.
	PinTime     time.Duration `json:"pin_ns"`
	LastPinTime time.Duration `json:"last_pin_ns"`
	// UnpinTime is the total time spent in Free, and LastUnpinTime that of the latest one.
	UnpinTime     time.Duration `json:"unpin_ns"`
	LastUnpinTime time.Duration `json:"last_unpin_ns"`
	// Budget is the budget in force, and Reserved what it is charged with
	// now (Pinned plus requests in flight).
	Budget   int64 `json:"budget"`
	Reserved int64 `json:"reserved"`
	// Objects counts the driver objects pinmem's packages hold now, so that
	// a long-running process can watch them for growth.
	Objects DriverObjects `json:"driver_objects"`
}

// DriverObjects counts the driver objects that pinmem's packages (cuda,
// pinmem, pool, transfer, blocks, load ...) created and have not released
// yet. Objects created by other code, and primary contexts, are not
// counted.
type DriverObjects struct {
	Streams int64 `json:"streams"`
	Events  int64 `json:"events"`
	Modules int64 `json:"modules"`
	// Contexts are contexts created with cuda.NewContext.
	Contexts int64 `json:"contexts"`
	// DeviceAllocs and DeviceBytes are device memory allocations and their bytes.
	DeviceAllocs int64 `json:"device_allocs"`
	DeviceBytes  int64 `json:"device_bytes"`
	// HostAllocs are cuMemHostAlloc allocations (KindHostAlloc buffers).
	HostAllocs int64 `json:"host_allocs"`
	// Registrations are cuMemHostRegister calls not yet undone: a buffer
	// registered in segments holds one per segment (Buffer.Segments).
	Registrations int64 `json:"registrations"`
}

// driverObjects reads the record of live driver objects (internal/track).
func driverObjects() DriverObjects {
	t := track.CountAll()
	n := func(k track.Kind) int64 { return int64(t.N[k]) }
	return DriverObjects{
		Streams: n(track.Stream), Events: n(track.Event), Modules: n(track.Module), Contexts: n(track.Context),
		DeviceAllocs: n(track.DeviceMemory), DeviceBytes: t.Bytes[track.DeviceMemory],
		HostAllocs: n(track.HostAlloc), Registrations: n(track.Registration),
	}
}

var ledger struct {
	mu         sync.Mutex
	byKind     [numKinds]Usage
	byFlags    [numFlagCombinations]Usage
	peak       int64
	allocs     int64
	frees      int64
	allocBytes int64
	failures   int64
	rejections int64
	dropped    int64
	pin, unpin time.Duration
	lastPin    time.Duration
	lastUnpin  time.Duration
}

func ledgerAdd(k Kind, f Flags, n int64, d time.Duration) {
	l := &ledger
	l.mu.Lock()
	l.byKind[k].Bytes += n
	l.byKind[k].Buffers++
	l.byFlags[f&allFlags].Bytes += n
	l.byFlags[f&allFlags].Buffers++
	l.allocs++
	l.allocBytes += n
	l.pin += d
	l.lastPin = d
	var total int64
	for _, u := range l.byKind {
		total += u.Bytes
	}
	l.peak = max(l.peak, total)
	l.mu.Unlock()
}

// ledgerOrphan counts n bytes still pinned by the driver after a failed
// pin could not be undone (see keepOrphan), as one buffer.
func ledgerOrphan(k Kind, f Flags, n int64) {
	l := &ledger
	l.mu.Lock()
	l.byKind[k].Bytes += n
	l.byKind[k].Buffers++
	l.byFlags[f&allFlags].Bytes += n
	l.byFlags[f&allFlags].Buffers++
	l.mu.Unlock()
}

// ledgerUnpinned credits n bytes of a buffer that the driver released.
func ledgerUnpinned(k Kind, f Flags, n int64) {
	l := &ledger
	l.mu.Lock()
	l.byKind[k].Bytes -= n
	l.byFlags[f&allFlags].Bytes -= n
	l.mu.Unlock()
}

// ledgerReleased counts a buffer whose release has completed (its bytes
// were credited by ledgerUnpinned).
func ledgerReleased(k Kind, f Flags, d time.Duration) {
	l := &ledger
	l.mu.Lock()
	l.byKind[k].Buffers--
	l.byFlags[f&allFlags].Buffers--
	l.frees++
	l.unpin += d
	l.lastUnpin = d
	l.mu.Unlock()
}

func ledgerFailed() {
	ledger.mu.Lock()
	ledger.failures++
	ledger.mu.Unlock()
}

func ledgerRejected() {
	ledger.mu.Lock()
	ledger.rejections++
	ledger.mu.Unlock()
}

func ledgerDropped() {
	ledger.mu.Lock()
	ledger.dropped++
	ledger.mu.Unlock()
}

// Stats returns a snapshot of the ledger.
func Stats() LedgerStats {
	l := &ledger
	s := LedgerStats{ByKind: make(map[Kind]Usage, numKinds), ByFlags: map[Flags]Usage{}}
	l.mu.Lock()
	for k, u := range l.byKind {
		s.ByKind[Kind(k)] = u
		s.Pinned.Bytes += u.Bytes
		s.Pinned.Buffers += u.Buffers
	}
	for f, u := range l.byFlags {
		if u != (Usage{}) {
			s.ByFlags[Flags(f)] = u
		}
	}
	s.PeakBytes = l.peak
	s.Allocs, s.Frees, s.AllocBytes = l.allocs, l.frees, l.allocBytes
	s.Failures, s.BudgetRejections, s.Dropped = l.failures, l.rejections, l.dropped
	s.PinTime, s.LastPinTime, s.UnpinTime, s.LastUnpinTime = l.pin, l.lastPin, l.unpin, l.lastUnpin
	l.mu.Unlock()
	s.Budget = Budget()
	s.Reserved = reserved.Load()
	if owners := track.DroppedCounts(); len(owners) > 0 {
		s.DroppedOwners = owners
	}
	s.Objects = driverObjects()
	return s
}

// String formats the ledger as a table.
func (s LedgerStats) String() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "pinned by\tbytes\tbuffers\t\n")
	for k := Kind(0); k < numKinds; k++ {
		u := s.ByKind[k]
		fmt.Fprintf(w, "%s\t%d\t%d\t\n", k, u.Bytes, u.Buffers)
	}
	fs := make([]Flags, 0, len(s.ByFlags))
	for f := range s.ByFlags {
		fs = append(fs, f)
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i] < fs[j] })
	for _, f := range fs {
		u := s.ByFlags[f]
		fmt.Fprintf(w, "flags %s\t%d\t%d\t\n", f, u.Bytes, u.Buffers)
	}
	fmt.Fprintf(w, "total\t%d\t%d\t\n", s.Pinned.Bytes, s.Pinned.Buffers)
	w.Flush()
	fmt.Fprintf(&b, "peak %s; budget %s (reserved %s)\n", fmtBytes(s.PeakBytes), fmtBytes(s.Budget), fmtBytes(s.Reserved))
	fmt.Fprintf(&b, "allocs %d (%s), frees %d, failures %d, budget rejections %d, dropped without Free %d\n",
		s.Allocs, fmtBytes(s.AllocBytes), s.Frees, s.Failures, s.BudgetRejections, s.Dropped)
	if len(s.DroppedOwners) > 0 {
		kinds := make([]string, 0, len(s.DroppedOwners))
		for k := range s.DroppedOwners {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		b.WriteString("dropped without Close:")
		for _, k := range kinds {
			fmt.Fprintf(&b, " %s %d", k, s.DroppedOwners[k])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "time pinning %v (last %v), unpinning %v (last %v)\n", s.PinTime, s.LastPinTime, s.UnpinTime, s.LastUnpinTime)
	o := s.Objects
	fmt.Fprintf(&b, "driver objects: streams %d, events %d, modules %d, contexts %d, device allocations %d (%s), host allocations %d, registrations %d\n",
		o.Streams, o.Events, o.Modules, o.Contexts, o.DeviceAllocs, fmtBytes(o.DeviceBytes), o.HostAllocs, o.Registrations)
	return b.String()
}
