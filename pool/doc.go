// Package pool is a caching allocator of pinned host memory with
// stream-ordered reuse, bounded rounding waste, a cap on idle memory and
// respect for pinmem's global budget.
//
// Pinning is expensive (cuMemHostAlloc costs about 1.2 ms for 1 MiB and
// 0.6 s for 1 GiB), so programs that need pinned buffers per request reuse
// them. A Pool hands out Blocks with Get and takes them back with Put:
//
//	p, err := pool.New(pool.WithName("staging"))
//	b, err := p.Get(3 << 20)          // 3 MiB, pinned
//	copy(b.Bytes(), data)
//	dev.WriteAsync(stream, 0, b.Bytes())
//	p.Put(b, stream)                   // reused only once the copy has run
//
// What it does differently from PyTorch's caching host allocator and
// CuPy's PinnedMemoryPool:
//
//   - Size classes split each power of two into 8 steps, so rounding
//     wastes less than 12.5% of a request instead of up to 100%; a Get may
//     also take an idle block of a larger class when that still wastes at
//     most 1/8. Small classes (up to SlabMax) are carved from shared slabs;
//     requests above HugeThreshold are pinned on their own at their
//     page-rounded size (a 4 GB request pins 4 GB, not 8), with
//     pinmem.MethodAuto's fast mmap + register path.
//   - Put with streams records one pooled event per stream and returns at
//     once; the block is handed out again only after those events have
//     completed, which Get and Put find out by polling (cuEventQuery). No
//     goroutine or OS thread waits for an event. Put without streams makes
//     no driver call.
//   - Idle memory comes back: the pool keeps its footprint within the peak
//     of the bytes it has had in use at once, releasing idle blocks of
//     other sizes on a miss that would exceed it (unless WithRetainOnMiss);
//     WithMaxCached caps idle bytes, Trim releases them, Close releases
//     everything and reports blocks still out, and pinmem's budget can
//     reclaim idle memory (the pool is a pinmem.Reclaimer). When pinning fails on the budget, the pool
//     releases its idle memory and retries before returning the
//     *pinmem.BudgetError.
//   - Stats counts hits, misses, bytes in use, cached and pending, peak
//     pinned and requested bytes, bytes wasted by rounding, outstanding
//     events and time spent in the driver; it is published with expvar as
//     "pinmem.pool.<name>".
//
// The hit path of Get and of a Put without streams takes one mutex and
// makes no driver call; no lock is ever held across a driver call.
package pool
