package track

import (
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
)

// Owners that hold driver objects or pinned memory (a Copier, Pipeline,
// Multi or Pool) and became unreachable without Close are counted here by
// name and reported through the process-wide logger, as pinmem reports a
// Buffer dropped without Free. The counts are read by pinmem.Stats.

var (
	droppedMu sync.Mutex
	dropped   = map[string]int64{}
	logger    atomic.Pointer[slog.Logger]
)

// SetLogger sets the logger that reports dropped owners and buffers and
// returns the previous one. nil makes the reports silent (the counts are
// kept either way).
func SetLogger(l *slog.Logger) (prev *slog.Logger) { return logger.Swap(l) }

// Logger returns the logger set by SetLogger, or nil.
func Logger() *slog.Logger { return logger.Load() }

// Dropped counts one owner of the given kind ("copier", "pipeline",
// "multi", "pool", "buffer") that became unreachable without Close and
// logs it at warning level with the attributes given.
func Dropped(kind string, attrs ...any) {
	droppedMu.Lock()
	dropped[kind]++
	droppedMu.Unlock()
	if l := logger.Load(); l != nil {
		l.Warn("pinmem: "+kind+" dropped without Close; its resources were released by the garbage collector", attrs...)
	}
}

// DroppedCounts returns the number of dropped owners per kind.
func DroppedCounts() map[string]int64 {
	droppedMu.Lock()
	defer droppedMu.Unlock()
	out := make(map[string]int64, len(dropped))
	for k, v := range dropped {
		out[k] = v
	}
	return out
}

// DroppedKinds returns the kinds with a non-zero count, sorted.
func DroppedKinds() []string {
	m := DroppedCounts()
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
