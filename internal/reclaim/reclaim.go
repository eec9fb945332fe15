// Package reclaim holds pinmem's caches of pinned memory (a pool's idle
// blocks, a Copier's registration cache): when a request would take the
// pinned total over pinmem's budget, pinmem asks them to give idle memory
// back before it refuses the request.
package reclaim

import "sync"

// Reclaimer is a cache of pinned memory that can give idle memory back.
type Reclaimer interface {
	// Reclaim frees up to (or more than) want bytes of idle pinned memory
	// and returns how much it freed. It is called without any pinmem lock
	// held and may call pinmem.Buffer.Free.
	Reclaim(want int64) (freed int64)
}

// Func adapts a function to a Reclaimer.
type Func func(want int64) (freed int64)

// Reclaim calls f.
func (f Func) Reclaim(want int64) int64 { return f(want) }

var (
	mu      sync.Mutex
	entries = map[*entry]struct{}{}
)

type entry struct{ r Reclaimer }

// Add registers r to be asked for memory when a request would exceed the
// budget. The returned function removes it again. A nil r is not
// registered (its remove does nothing).
func Add(r Reclaimer) (remove func()) {
	if r == nil {
		return func() {}
	}
	e := &entry{r}
	mu.Lock()
	entries[e] = struct{}{}
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			delete(entries, e)
			mu.Unlock()
		})
	}
}

// All returns the registered Reclaimers, in no particular order.
func All() []Reclaimer {
	mu.Lock()
	defer mu.Unlock()
	rs := make([]Reclaimer, 0, len(entries))
	for e := range entries {
		rs = append(rs, e.r)
	}
	return rs
}
