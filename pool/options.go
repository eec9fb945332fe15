package pool

import (
	"fmt"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Option configures a Pool in New.
type Option func(*config) error

type config struct {
	name         string
	flags        pinmem.Flags
	device       *cuda.Device
	method       pinmem.Method
	prewarmSize  int
	prewarmBytes int64
	maxCached    int64 // < 0: no cap
	retainOnMiss bool
	stacks       bool
}

// WithName names the pool in its errors and in expvar, where its Stats
// appear as "pinmem.pool.<name>". Two open pools cannot share a name. The
// default is "pool<N>", N counting pools made by New.
func WithName(name string) Option {
	return func(c *config) error {
		if name == "" {
			return fmt.Errorf("pool: empty name: %w", cuda.ErrInvalidValue)
		}
		c.name = name
		return nil
	}
}

// WithFlags sets the pinmem flags (Portable, Mapped, WriteCombined) of all
// memory the pool pins. Blocks of a Mapped pool have device pointers.
func WithFlags(f pinmem.Flags) Option {
	return func(c *config) error { c.flags = f; return nil }
}

// WithDevice sets the device the pool's memory is pinned for (passed to
// pinmem.Alloc as pinmem.WithDevice).
func WithDevice(d *cuda.Device) Option {
	return func(c *config) error { c.device = d; return nil }
}

// WithMethod sets how the pool pins memory; the default, MethodAuto,
// lets pinmem choose (mmap + cuMemHostRegister for large allocations).
func WithMethod(m pinmem.Method) Option {
	return func(c *config) error { c.method = m; return nil }
}

// WithPrewarm pins total bytes in blocks sized for Get(blockSize) when the
// pool is created, and caches them, so that the first Gets of that size
// hit. Prewarmed blocks are ordinary idle blocks: they count against
// WithMaxCached and may be released by Trim, a miss or the budget.
func WithPrewarm(blockSize int, total int64) Option {
	return func(c *config) error {
		if blockSize <= 0 || blockSize > MaxSize || total < 0 {
			return fmt.Errorf("pool: prewarm %d bytes in blocks of %d: %w", total, blockSize, cuda.ErrInvalidValue)
		}
		c.prewarmSize, c.prewarmBytes = blockSize, total
		return nil
	}
}

// WithMaxCached caps the bytes of idle blocks the pool keeps: when a Put
// takes the idle bytes above max, the least recently released blocks leave
// the cache at once and are unpinned at the next miss, Trim, Reclaim or
// Close (unpinning may synchronize the device, which a Put never does;
// see Stats.DeferredBytes). A negative max, the default, sets no cap (the footprint is
// still bounded, see RetainOnMiss). Idle blocks inside a slab that still
// has blocks in use count as cached but cannot be released until the
// whole slab is idle.
func WithMaxCached(max int64) Option {
	return func(c *config) error { c.maxCached = max; return nil }
}

// WithRetainOnMiss(true) makes a miss pin new memory without first
// releasing idle blocks of other classes. By default the pool keeps its
// footprint within the peak of the bytes it has had in use at once (block
// capacities): a miss that would take the pinned bytes above that peak
// first releases idle memory, least recently released first, to make
// room, and pins beyond the peak only when nothing idle is left. Peak
// pinned bytes then stay within the peak of rounded bytes in use (at most
// 1/8 above the peak requested) plus partly used slabs, however the mix
// of sizes drifts. Retaining keeps more blocks cached for later hits, up
// to WithMaxCached.
func WithRetainOnMiss(retain bool) Option {
	return func(c *config) error { c.retainOnMiss = retain; return nil }
}

// WithStacks(true) records the caller's stack on every Get, so that the
// error Close returns says where each block still out was taken. It costs
// a few microseconds per Get.
func WithStacks(on bool) Option {
	return func(c *config) error { c.stacks = on; return nil }
}
