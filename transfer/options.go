package transfer

import (
	"fmt"
	"runtime"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/pinopt"
)

// Copier defaults, chosen for a PCIe Gen5 x16 GPU on a 16-core host.
const (
	// DefaultStageSize is the size of one pinned staging buffer: 32 MiB.
	// Pinned copies reach full PCIe speed from about 16 MiB, and larger
	// stages only delay the overlap of CPU copy and DMA.
	DefaultStageSize = 32 << 20
	// DefaultDepth is the number of staging buffers a transfer uses (its
	// ring): the CPU fills one while the copy engine drains another, with
	// one spare to absorb jitter.
	DefaultDepth = 3
	// DefaultParallelism is the most CPU copy goroutines a Copier uses by
	// default (capped by runtime.NumCPU): Go copies into pinned memory
	// scale up to about this many goroutines and slow down beyond.
	DefaultParallelism = 12
	// DefaultRegistrationMin is the smallest page-aligned range the
	// registration cache pins; below it registering costs more than it saves.
	DefaultRegistrationMin = 1 << 20
)

// Tuning constants of the copy planner.
const (
	// minPiece is the smallest share of a stage given to one copy
	// goroutine; smaller copies use fewer goroutines.
	minPiece = 256 << 10
	// minChunk is the smallest piece a transfer is split into when it is
	// smaller than a few stages, so that CPU copies and DMA still overlap.
	minChunk = 1 << 20
	// tailSpin bounds how long a WaitHybrid transfer polls its last event
	// before it sleeps in the driver after all.
	tailSpin = 2 * time.Millisecond
	// tailBytes is the size of the last piece of a long direct copy under
	// WaitHybrid: the transfer sleeps in the driver until the rest has run
	// and polls only while this piece runs (well under a millisecond).
	tailBytes = 8 << 20
)

// tuning are the copy planner's constants, measured on an H200 (the
// figures are in the comments of the fields' defaults). Each Copier holds
// its own copy in its options; the GPU benchmarks vary them through
// export_test.go.
type tuning struct {
	// chunkPieces: a staged transfer smaller than chunkPieces stages is
	// cut into at least that many pieces, so that the CPU's copy of one
	// piece overlaps the DMA of another; each piece costs a fork and join
	// of the copy goroutines and an event.
	chunkPieces int
	// subPieces: sub-pieces of one CPU copy per goroutine taking part (at
	// least minPiece bytes each); 1 gives each goroutine one share.
	subPieces int
	// stagePieces: when not 0, the pieces of a transfer through one stage
	// (stagePieces' schedule otherwise).
	stagePieces int
	// stageSpin: how long a WaitHybrid staged transfer polls a stage it
	// waits for before it sleeps in the driver (0: sleep at once).
	stageSpin time.Duration
	// outSpin: how long a Pipeline's output goroutine polls a chunk that
	// is not the Run's last before it sleeps in the driver (WaitHybrid).
	// Measured with Go frames (BenchmarkPipelineKnobs), 2 ms against
	// 200 us moved 1080p frames 1.16 to 1.31 times faster on one host and
	// 0.97 to 1.03 times on another, 4K frames 0.97 to 1.02 times.
	outSpin time.Duration
}

// defaultTuning returns the measured tuning.
func defaultTuning() tuning {
	return tuning{chunkPieces: 4, subPieces: 4, stageSpin: time.Millisecond, outSpin: 2 * time.Millisecond}
}

type options struct {
	tune        tuning
	stageSize   int
	depth       int
	parallelism int
	stream      *cuda.Stream
	cacheOn     bool
	cacheLimit  int64
	cacheMin    int
	stageFlags  pinmem.Flags
	stageOpts   []pinmem.Option
	stats       bool
	wait        WaitMode
}

// Option configures a Copier or a Multi. Options only record their value;
// New and NewMulti validate them and name the option at fault.
type Option func(*options)

// WaitMode is how a transfer waits for the copy engine to finish.
type WaitMode uint8

// Wait modes.
const (
	// WaitHybrid (the default) sleeps in the driver (a blocking-sync event:
	// no CPU) until all but the transfer's last piece has run, then polls
	// the end for a short while so that the driver's wake-up latency does
	// not land on it. Inside a staged transfer, a wait for a stage polls
	// for up to 1 ms before it sleeps, for the same reason: that wake-up
	// would otherwise land on every piece.
	WaitHybrid WaitMode = iota
	// WaitSleep sleeps in the driver to the end: no CPU, but the driver
	// wakes the sleeper some time after the copy ends.
	WaitSleep
	// WaitPoll polls the transfer's last event from the moment everything
	// is queued, yielding the processor between queries, as the driver's
	// own default (spin) scheduling does: the lowest latency, one busy core
	// while the copy runs.
	WaitPoll
)

// String returns "hybrid", "sleep" or "poll".
func (m WaitMode) String() string {
	if m <= WaitPoll {
		return [...]string{"hybrid", "sleep", "poll"}[m]
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(m))
}

// WithWait sets how transfers wait for the copy engine (default
// WaitHybrid).
func WithWait(m WaitMode) Option { return func(o *options) { o.wait = m } }

// WithStageSize sets the size of each pinned staging buffer (rounded up to
// 4 KiB; positive). Default DefaultStageSize.
func WithStageSize(n int) Option { return func(o *options) { o.stageSize = n } }

// WithDepth sets the number of staging buffers a transfer uses, its ring
// (at least 1; 2 or more for any overlap), borrowed from the context's
// staging engine, which holds one or two rings (see Copier). Default
// DefaultDepth. load.WithDepth is the same knob for a Loader's stages.
func WithDepth(n int) Option { return func(o *options) { o.depth = n } }

// WithParallelism sets the number of goroutines that copy between Go memory
// and a stage (1 means the transfer's own goroutine only). Default:
// DefaultParallelism, at most runtime.NumCPU(). load.WithParallelism is
// the same knob for the goroutines that fill a Loader's stages from files.
func WithParallelism(n int) Option { return func(o *options) { o.parallelism = n } }

// WithStream makes the Copier issue its copies on s (borrowed: the Copier
// never destroys it) instead of a stream of its own, so that they are
// ordered after work the caller queued on s. A transfer waits for its own
// copies only (an event recorded behind them), never for work the caller
// queues on s afterwards, and leaves the asynchronous errors of s to the
// caller's own synchronization. s must belong to the Copier's context.
// NewMulti refuses it.
func WithStream(s *cuda.Stream) Option { return func(o *options) { o.stream = s } }

// WithRegistrationCache turns on the registration cache: Go slices of at
// least DefaultRegistrationMin bytes are pinned in place on their first
// copy and copied directly afterwards. limit bounds the bytes the cache
// keeps registered (0: bounded only by pinmem's budget; not negative).
// Off by default: registering a slice costs far more than copying it
// once, and pays only for slices copied again and again. The cache holds
// the slices it registered until Copier.Forget or Close; Copier.CacheStats
// reports its counters.
func WithRegistrationCache(limit int64) Option {
	return func(o *options) { o.cacheOn, o.cacheLimit = true, limit }
}

// WithRegistrationMin sets the smallest page-aligned range the registration
// cache pins (not negative). Default DefaultRegistrationMin.
func WithRegistrationMin(n int) Option { return func(o *options) { o.cacheMin = n } }

// WithStageFlags sets the pinmem flags and options the staging buffers are
// allocated with (default: no flags, on the Copier's device). WriteCombined
// is refused: device-to-host staging reads the stages with the CPU, which
// is very slow on write-combined memory; so are the pinmem options
// pinmem.Alloc would refuse (checked by New).
func WithStageFlags(f pinmem.Flags, opts ...pinmem.Option) Option {
	return func(o *options) { o.stageFlags, o.stageOpts = f, opts }
}

// WithStats turns per-transfer measurement on or off (default off). On,
// every transfer records two timing events around its copies (Stats.Device),
// reads the process's CPU time before and after (Stats.ProcessCPU), and
// the copy goroutines are locked to their OS threads and read their
// thread CPU time around every piece (Stats.CopyCPU; wall time of the
// pieces where thread CPU time is not available). Off, those fields are
// zero and a transfer makes no driver call and no system call beyond its
// copies; Bytes, StagedBytes, DirectBytes, Stages and Wall are always set.
func WithStats(on bool) Option { return func(o *options) { o.stats = on } }

func buildOptions(fn string, opts []Option) (options, error) {
	o := options{
		tune:      defaultTuning(),
		stageSize: DefaultStageSize,
		depth:     DefaultDepth,
		cacheMin:  DefaultRegistrationMin,
	}
	o.parallelism = min(DefaultParallelism, runtime.NumCPU())
	for i, f := range opts {
		if f == nil {
			return o, &pinmem.OptionError{Func: fn, Option: "Option", Value: "nil", Reason: fmt.Sprintf("option %d is nil", i)}
		}
		f(&o)
	}
	refuse := func(opt string, v any, reason string) (options, error) {
		return o, &pinmem.OptionError{Func: fn, Option: opt, Value: fmt.Sprint(v), Reason: reason}
	}
	// What pinmem.Alloc would refuse in the pinmem options of WithStageFlags.
	_, bad := pinopt.Build(o.stageOpts)
	switch {
	case o.stageSize <= 0:
		return refuse("WithStageSize", o.stageSize, "the size must be positive")
	case o.stageSize > 1<<40:
		return refuse("WithStageSize", o.stageSize, "more than 1 TiB")
	case o.depth < 1 || o.depth > 1024:
		return refuse("WithDepth", o.depth, "the depth must be 1 to 1024")
	case o.parallelism < 1 || o.parallelism > 4096:
		return refuse("WithParallelism", o.parallelism, "must be 1 to 4096")
	case o.stageFlags&pinmem.WriteCombined != 0:
		return refuse("WithStageFlags", o.stageFlags, "write-combined staging buffers are refused (device-to-host staging reads them with the CPU)")
	case bad != nil:
		return refuse("pinmem."+bad.Option, bad.Value, bad.Reason+" (in WithStageFlags)")
	case o.wait > WaitPoll:
		return refuse("WithWait", o.wait, "unknown wait mode")
	case o.cacheLimit < 0:
		return refuse("WithRegistrationCache", o.cacheLimit, "the limit must not be negative")
	case o.cacheMin < 0:
		return refuse("WithRegistrationMin", o.cacheMin, "must not be negative")
	}
	o.stageSize = (o.stageSize + 4095) &^ 4095
	return o, nil
}
