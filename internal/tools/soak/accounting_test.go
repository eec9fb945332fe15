package soak_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/track"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

// usage is what the soak's process holds at one moment: the Go heap, the
// resident set, pinmem's ledger, the pool, the registration caches and
// the driver objects pinmem made. The soak reports it at the start, the
// middle and the end, so that memory that grows can be told apart by
// owner.
type usage struct {
	heapInuse, heapSys, heapReleased uint64 // runtime.MemStats
	nextGC, totalAlloc, mallocs      uint64 // the heap's goal, and what was ever allocated
	goSys                            uint64 // all the Go runtime holds from the OS, less what it released
	numGC                            uint32
	rss, rssAnon, rssShmem           uint64 // /proc/self/status
	pinned, pinnedBufs               int64  // pinmem.Stats().Pinned
	poolPinned, poolCached           int64  // the pool's PinnedBytes and CachedBytes
	cached                           int    // registrations held by the Copiers' registration caches
	cachedBytes                      int64
	objects                          [len(objectKinds)]int // live driver objects by kind (track)
}

// objectKinds are the driver objects the soak counts.
var objectKinds = [...]track.Kind{track.Stream, track.Event, track.DeviceMemory, track.HostAlloc, track.Registration}

// owners are what the soak reads its pool and caches from.
type owners struct {
	pool    *pool.Pool
	mu      sync.Mutex
	copiers map[*transfer.Copier]bool
}

func (o *owners) add(c *transfer.Copier) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.copiers == nil {
		o.copiers = map[*transfer.Copier]bool{}
	}
	o.copiers[c] = true
}

func (o *owners) remove(c *transfer.Copier) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.copiers, c)
}

// measure reads the usage now. ReadMemStats stops the world for a moment.
func (o *owners) measure() usage {
	var u usage
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u.heapInuse, u.heapSys, u.heapReleased = ms.HeapInuse, ms.HeapSys, ms.HeapReleased
	u.nextGC, u.totalAlloc, u.mallocs, u.numGC = ms.NextGC, ms.TotalAlloc, ms.Mallocs, ms.NumGC
	u.goSys = ms.Sys - ms.HeapReleased
	if st, err := (sysinfo.Reader{}).ProcStatus(); err == nil {
		u.rss, u.rssAnon, u.rssShmem = st.VmRSS, st.RssAnon, st.RssShmem
	}
	ls := pinmem.Stats()
	u.pinned, u.pinnedBufs = ls.Pinned.Bytes, ls.Pinned.Buffers
	if o.pool != nil {
		ps := o.pool.Stats()
		u.poolPinned, u.poolCached = ps.PinnedBytes, ps.CachedBytes
	}
	o.mu.Lock()
	for c := range o.copiers {
		cs := c.CacheStats()
		u.cached += cs.Entries
		u.cachedBytes += cs.Bytes
	}
	o.mu.Unlock()
	for i, k := range objectKinds {
		u.objects[i], _ = track.Count(k)
	}
	return u
}

// String is the usage on one line, in MiB and counts.
func (u usage) String() string {
	var objs []string
	for i, k := range objectKinds {
		objs = append(objs, fmt.Sprintf("%s %d", k, u.objects[i]))
	}
	other := int64(u.rss) - int64(u.goSys) - u.pinned
	return fmt.Sprintf("Go heap in use %d MiB (sys %d, released %d, goal %d; %d GCs, %d MiB in %d allocations so far); RSS %d MiB (anon %d, shmem %d; %d neither the Go runtime's nor pinned); ledger %d MiB in %d buffers; pool %d MiB pinned, %d cached; registration caches %d entries, %d MiB; driver objects: %s",
		u.heapInuse>>20, u.heapSys>>20, u.heapReleased>>20, u.nextGC>>20, u.numGC, u.totalAlloc>>20, u.mallocs, u.rss>>20, u.rssAnon>>20, u.rssShmem>>20, other>>20,
		u.pinned>>20, u.pinnedBufs, u.poolPinned>>20, u.poolCached>>20, u.cached, u.cachedBytes>>20, strings.Join(objs, ", "))
}

// peaks are the highest figures seen in one half of the soak.
type peaks struct {
	rss, heapInuse      uint64
	pinned, cachedBytes int64
	objects             int // streams, events and device allocations: pinned memory is in pinned
}

func (p *peaks) add(u usage) {
	p.rss = max(p.rss, u.rss)
	p.heapInuse = max(p.heapInuse, u.heapInuse)
	p.pinned = max(p.pinned, u.pinned)
	p.cachedBytes = max(p.cachedBytes, u.cachedBytes)
	n := 0
	for i, c := range u.objects {
		if objectKinds[i] != track.HostAlloc && objectKinds[i] != track.Registration {
			n += c
		}
	}
	p.objects = max(p.objects, n)
}

// sampler samples the usage every period until stop is closed, keeping
// the peaks of each half of the run and the usage at its middle. Each
// sample collects the Go heap's garbage first, so that the heap in use is
// the live heap and the resident set does not follow the collector's
// pacing: the soak keeps some 1.2 GiB of Go buffers live, so by default
// (GOGC=100) the heap may grow to twice that before a collection, and a
// run of a few minutes measures garbage still below that goal, not
// memory that anything holds.
type sampler struct {
	first, second peaks
	middle        usage
	done          chan struct{}
}

func sample(o *owners, start time.Time, total time.Duration, stop <-chan struct{}) *sampler {
	s := &sampler{done: make(chan struct{})}
	period := max(total/40, 100*time.Millisecond)
	go func() {
		defer close(s.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		midTaken := false
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				runtime.GC()
				u := o.measure()
				if now.Sub(start) < total/2 {
					s.first.add(u)
					continue
				}
				if !midTaken {
					s.middle, midTaken = u, true
				}
				s.second.add(u)
			}
		}
	}()
	return s
}

// growth returns an error for each figure whose peak in the second half
// exceeds its peak in the first by more than 10% (and slack, for a count
// that is small): the resident set, the live Go heap, and the streams,
// events and device allocations. Pinned bytes are reported, not checked
// here: the pool keeps its footprint within the peak of the bytes it had
// in use at once (pool.WithRetainOnMiss), a record that random demand
// raises now and then; the resident set holds them, and the ledger must
// be back at its baseline after Close.
func (s *sampler) growth() []error {
	var errs []error
	check := func(what string, first, second, slack float64) {
		if second > first*1.1+slack {
			errs = append(errs, fmt.Errorf("%s grew after the first half: peak %.0f, then %.0f (more than 10%% up)", what, first, second))
		}
	}
	check("RSS (MiB)", float64(s.first.rss>>20), float64(s.second.rss>>20), 0)
	check("Go heap in use (MiB)", float64(s.first.heapInuse>>20), float64(s.second.heapInuse>>20), 0)
	check("streams, events and device allocations", float64(s.first.objects), float64(s.second.objects), 8)
	return errs
}
