package pool

import (
	"fmt"
	"slices"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/pinopt"
)

// Option configures a Pool in New. Options only record their values; New
// checks them and returns a *pinmem.OptionError for the first one it refuses.
type Option func(*config)

type config struct {
	name         string
	nameSet      bool
	flags        pinmem.Flags
	pinOpts      []pinmem.Option
	prewarmSize  int
	prewarmBytes int64
	prewarmSet   bool
	maxCached    int64 // < 0: no cap
	retainOnMiss bool
	stacks       bool
}

// knownFlags are the pinmem flags a pool may pin memory with.
const knownFlags = pinmem.Portable | pinmem.Mapped | pinmem.WriteCombined | pinmem.ReadOnly

// check validates the options as New sees them.
func (c *config) check() error {
	_, pinBad := pinopt.Build(c.pinOpts) // what pinmem.Alloc would refuse
	switch {
	case c.nameSet && c.name == "":
		return &pinmem.OptionError{Func: "pool.New", Option: "WithName", Value: fmt.Sprintf("%q", c.name), Reason: "the name is empty"}
	case c.flags&^knownFlags != 0:
		return &pinmem.OptionError{Func: "pool.New", Option: "WithFlags", Value: fmt.Sprintf("%#x", uint32(c.flags)), Reason: fmt.Sprintf("unknown flag bits %#x", uint32(c.flags&^knownFlags))}
	case pinBad != nil:
		return &pinmem.OptionError{Func: "pool.New", Option: "pinmem." + pinBad.Option, Value: pinBad.Value, Reason: pinBad.Reason + " (in WithFlags)"}
	case c.prewarmSet && (c.prewarmSize <= 0 || c.prewarmSize > maxSize):
		return &pinmem.OptionError{Func: "pool.New", Option: "WithPrewarm", Value: fmt.Sprintf("%d, %d", c.prewarmSize, c.prewarmBytes),
			Reason: fmt.Sprintf("block size outside [1, %d]", int64(maxSize))}
	case c.prewarmSet && c.prewarmBytes < 0:
		return &pinmem.OptionError{Func: "pool.New", Option: "WithPrewarm", Value: fmt.Sprintf("%d, %d", c.prewarmSize, c.prewarmBytes), Reason: "negative total"}
	case c.prewarmSet && c.maxCached >= 0 && c.prewarmBytes > c.maxCached:
		return &pinmem.OptionError{Func: "pool.New", Option: "WithPrewarm", Value: fmt.Sprintf("%d, %d", c.prewarmSize, c.prewarmBytes),
			Reason: fmt.Sprintf("the total exceeds WithMaxCached(%d)", c.maxCached)}
	}
	return nil
}

// WithName sets the pool's name, a label in its errors, Stats and logs.
// Names need not be unique. The default is "pool<N>", N counting the pools
// made by New. New refuses an empty name.
func WithName(name string) Option {
	return func(c *config) { c.name, c.nameSet = name, true }
}

// WithFlags sets the pinmem flags (Portable, Mapped, WriteCombined,
// ReadOnly) and pinmem options (pinmem.WithDevice, pinmem.WithMethod,
// pinmem.WithNUMANode ...) all memory the pool pins is allocated with, as
// transfer.WithStageFlags does for a Copier's stages. Blocks of a Mapped
// pool have device pointers. The default is no flags, on device 0, with
// pinmem.MethodAuto (mmap + cuMemHostRegister for large allocations). New
// refuses unknown flag bits (Option "WithFlags") and the options
// pinmem.Alloc would refuse, with the *pinmem.OptionError Alloc would
// return but for Func "pool.New" and the option's name qualified (Option
// "pinmem.WithThreads", "pinmem.Option" for a nil one); combinations
// pinmem cannot serve fail on the first Get that pins (or in New with
// WithPrewarm).
func WithFlags(f pinmem.Flags, opts ...pinmem.Option) Option {
	opts = slices.Clone(opts) // the caller's slice may change after New
	return func(c *config) { c.flags, c.pinOpts = f, opts }
}

// WithPrewarm pins total bytes in blocks sized for Get(blockSize) when the
// pool is created, and caches them, so that the first Gets of that size
// hit. It pins total rounded up to whole blocks, but stops before a
// block that would take the idle bytes above WithMaxCached. Prewarmed blocks are ordinary idle blocks: they count against
// WithMaxCached and may be released by Trim, a miss or the budget; their
// total counts as bytes in use at once (Stats.PeakInUseBytes), so a miss
// of another size releases only what it needs to stay within it. New
// refuses a blockSize outside [1, pinmem.MaxSize], a negative total and a total
// above WithMaxCached.
func WithPrewarm(blockSize int, total int64) Option {
	return func(c *config) { c.prewarmSize, c.prewarmBytes, c.prewarmSet = blockSize, total, true }
}

// WithMaxCached caps the bytes of idle blocks the pool keeps: when a Put
// takes the idle bytes above max, the least recently released blocks leave
// the cache at once and are unpinned at the next miss, Trim, budget
// reclaim or Close (unpinning may synchronize the device, which a Put
// never does; see Stats.DeferredBytes). A negative max, the default, sets
// no cap (the footprint is still bounded, see WithRetainOnMiss). Idle
// blocks inside a slab that still has blocks in use count as cached but
// cannot be released until the whole slab is idle.
func WithMaxCached(max int64) Option {
	return func(c *config) { c.maxCached = max }
}

// WithRetainOnMiss sets whether a miss may pin new memory without first
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
	return func(c *config) { c.retainOnMiss = retain }
}

// WithStacks sets whether the caller's stack is recorded on every Get, so that the
// error Close returns says where each block still out was taken. It costs
// a stack walk per Get.
func WithStacks(on bool) Option {
	return func(c *config) { c.stacks = on }
}
