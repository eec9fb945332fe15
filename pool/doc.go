// Package pool is a caching allocator of pinned host memory with
// stream-ordered reuse, bounded rounding waste, a cap on idle memory and
// respect for pinmem's global budget.
//
// Pinning is expensive (about a millisecond for a megabyte through
// cuMemHostAlloc, tens of milliseconds per gigabyte even on pinmem's mmap
// path, and it may wait for the device), so programs that need
// pinned buffers per request reuse them. A Pool hands out Blocks with Get
// and takes them back with Put:
//
//	p, err := pool.New(pool.WithName("staging"))
//	if err != nil {
//		return err
//	}
//	defer func() { err = errors.Join(err, p.Close(ctx)) }()
//	b, err := p.Get(ctx, 3<<20) // 3 MiB, pinned
//	if err != nil {
//		return err
//	}
//	copy(b.Bytes(), data)
//	if err := stream.CopyHtoD(dst, 0, b.Bytes()); err != nil {
//		return errors.Join(err, p.Put(b))
//	}
//	return p.Put(b, stream) // reused only once the copy has run
//
// What it does differently from PyTorch's caching host allocator and
// CuPy's PinnedMemoryPool:
//
//   - Size classes split each power of two into 8 steps, so rounding
//     wastes less than 12.5% of a request instead of up to 100%; a Get may
//     also take an idle block of a larger class when that still wastes at
//     most 1/8. Small classes (up to 256 KiB) are carved from shared slabs;
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
//     reclaim idle memory on behalf of other allocations.
//     When pinning fails on the budget, the pool releases its idle memory
//     and retries once before returning the *pinmem.BudgetError; Get never
//     waits for memory to come back.
//   - Stats counts hits, misses, bytes in use, cached and pending, peak
//     pinned and requested bytes, bytes wasted by rounding, outstanding
//     events, failed releases and time spent in the driver. The pool
//     publishes nothing by itself: package prom exports Stats to
//     Prometheus.
//
// The hit path of Get and of a Put without streams takes one mutex and
// makes no driver call; no lock is ever held across a driver call.
//
// # Blocks over 4 GiB
//
// A block larger than one registration (pinned with cuMemHostRegister in
// chunks of at most 4 GiB) spans several registrations, and one driver
// copy must not cross from one into the next: copy such a block segment by
// segment with Block.Segments.
//
// # Close, failures and dropped pools
//
// Every call that can wait takes a context that bounds the wait: Get (a
// miss pins memory, which may wait for the device), Trim (unpinning may
// too) and Close (which also waits for the stream work of blocks Put with
// streams). Pinning and unpinning cannot be interrupted in the driver:
// when ctx ends first they finish in the background, a pinned block goes
// to the pool's cache, and Close waits for them. When Close's ctx expires
// the pool is closed but blocks whose stream work has not run stay pinned
// until a later Put or Close sees their work finished.
// A failed unpinning keeps the memory in the pool's books (the driver still
// holds it) and is retried by the next miss, Trim, budget reclaim or Close.
// A Pool dropped without Close is reported through pinmem's logger and
// counted as a dropped pool; its cleanup releases idle memory and blocks
// whose work has finished, and leaves blocks still out, or still used by
// stream work, pinned.
//
// # Implicit synchronization
//
// Pinning and unpinning host memory can wait for all outstanding work on
// the device: the CUDA programming guide lists page-locked host
// allocation among the operations that serialize streams, and
// cuMemFreeHost and cuMemHostUnregister wait for the device in current
// drivers (cuMemHostAlloc and cuMemHostRegister do in some). A Get that
// misses pins new memory, and may first unpin idle memory (see
// WithRetainOnMiss and the budget), so a miss may wait until every kernel
// and copy queued on the device has finished, including work on other
// streams that waits for the host (a kernel polling a host flag then
// deadlocks until it times out); Get's ctx bounds that wait. Trim, the
// budget's reclaim and Close unpin and may synchronize too. The hit paths
// never synchronize: a Get hit and a Put make no pinning or unpinning
// driver call (an ordered Put records events, which never waits), and idle
// memory that a Put takes over WithMaxCached leaves the cache at once but
// is unpinned at the next miss,
// Trim, budget reclaim or Close (Stats.DeferredBytes). Code that must not
// stall while the device is busy should warm the pool first (WithPrewarm,
// or Get and Put the sizes it needs) so that its Gets hit.
package pool
