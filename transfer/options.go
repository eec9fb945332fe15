package transfer

import (
	"fmt"
	"runtime"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/enumtext"
	"github.com/pinmem/pinmem/internal/pinopt"
)

// Copier defaults, measured on a PCIe Gen5 x16 GPU (see the package
// documentation, "Defaults").
const (
	// DefaultStageSize is the size of one pinned staging buffer: 32 MiB.
	DefaultStageSize = 32 << 20
	// DefaultDepth is the number of staging buffers a transfer uses.
	DefaultDepth = 3
	// DefaultParallelism is the most CPU copy goroutines a Copier uses by
	// default (capped by runtime.NumCPU).
	DefaultParallelism = 12
	// DefaultRegistrationMin is the smallest page-aligned range the
	// registration cache pins; below it registering costs more than it saves.
	DefaultRegistrationMin = 1 << 20
)

// Tuning constants of the copy planner.
const (
	minChunk  = 1 << 20              // the smallest piece of a transfer cut for overlap
	tailSpin  = 2 * time.Millisecond // the longest WaitHybrid polls a transfer's last event
	tailBytes = 8 << 20              // the last piece of a long direct copy, polled under WaitHybrid
)

// tuning are the copy planner's measured constants, held per Copier so
// that the GPU benchmarks can vary them (export_test.go).
type tuning struct {
	chunkPieces int // a staged transfer below this many stages is cut into at least this many pieces
	subPieces   int // sub-pieces of a CPU copy per goroutine (of at least copypool.MinPiece)
	stagePieces int // when not 0, the pieces of a transfer through one stage (route.go's schedule otherwise)
	// stageSpin and outSpin: how long WaitHybrid polls a stage, and a
	// Pipeline chunk that is not the Run's last, before it sleeps in the
	// driver (0: at once).
	stageSpin, outSpin time.Duration
}

// defaultTuning returns the measured tuning.
func defaultTuning() tuning {
	return tuning{chunkPieces: 4, subPieces: 4, stageSpin: time.Millisecond, outSpin: 2 * time.Millisecond}
}

// options are the settings the Option functions record.
type options struct {
	tune                          tuning
	stageSize, depth, parallelism int
	stream                        *cuda.Stream
	cacheOn, stats                bool
	cacheLimit                    int64
	cacheMin                      int
	stageFlags                    pinmem.Flags
	stageOpts                     []pinmem.Option
	wait                          WaitMode
}

// Option configures a Copier or a Multi. Options only record their value;
// New and NewMulti validate them and name the option at fault.
type Option func(*options)

// WaitMode is how a transfer waits for the copy engine to finish.
type WaitMode uint8

// Wait modes.
const (
	// WaitHybrid (the default) sleeps in the driver until all but the
	// transfer's last piece has run, then polls the end; a staged
	// transfer also polls each stage it waits for a moment before it
	// sleeps.
	WaitHybrid WaitMode = iota
	// WaitSleep sleeps in the driver to the end: no CPU, the driver's
	// wake-up latency.
	WaitSleep
	// WaitPoll polls from the moment everything is queued, yielding the
	// processor between queries: the lowest latency, one busy core.
	WaitPoll
)

var waitModeNames = []string{"hybrid", "sleep", "poll"}

// String returns "hybrid", "sleep" or "poll".
func (m WaitMode) String() string {
	if int(m) < len(waitModeNames) {
		return waitModeNames[m]
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(m))
}

// MarshalText encodes the mode as String does; a value that is no mode is
// an error matching cuda.ErrInvalidValue.
func (m WaitMode) MarshalText() ([]byte, error) {
	if int(m) >= len(waitModeNames) {
		return nil, fmt.Errorf("transfer: %s is no WaitMode: %w", m, cuda.ErrInvalidValue)
	}
	return []byte(m.String()), nil
}

// UnmarshalText parses a name String returns, without regard to case; an
// unknown name is a *pinmem.NameError (matching cuda.ErrInvalidValue).
func (m *WaitMode) UnmarshalText(b []byte) error {
	i := enumtext.Index(waitModeNames, string(b))
	if i < 0 {
		return &pinmem.NameError{Type: "transfer.WaitMode", Name: string(b), Known: waitModeNames}
	}
	*m = WaitMode(i)
	return nil
}

// WithWait sets how transfers wait for the copy engine (default
// WaitHybrid).
func WithWait(m WaitMode) Option { return func(o *options) { o.wait = m } }

// WithStageSize sets the size of each pinned staging buffer (rounded up to
// 4 KiB; positive). Default DefaultStageSize.
func WithStageSize(n int) Option { return func(o *options) { o.stageSize = n } }

// WithDepth sets the number of staging buffers a transfer borrows from
// the staging engine, its ring (1 to 1024; 2 or more for any overlap),
// pinned by the first transfer that needs them. Default DefaultDepth.
func WithDepth(n int) Option { return func(o *options) { o.depth = n } }

// WithParallelism sets the number of goroutines that copy between Go
// memory and a stage (1 to 4096; 1: the transfer's own goroutine only).
// Default DefaultParallelism, at most runtime.NumCPU().
func WithParallelism(n int) Option { return func(o *options) { o.parallelism = n } }

// WithStream makes the Copier issue its copies on s (borrowed: never
// destroyed), ordered after work the caller queued on s, instead of on
// streams of its own. The asynchronous errors of s are left to the
// caller's own synchronization. s must belong to the Copier's context.
// NewMulti refuses it.
func WithStream(s *cuda.Stream) Option { return func(o *options) { o.stream = s } }

// WithRegistrationCache turns on the registration cache (see the package
// documentation) for slices of at least WithRegistrationMin bytes. limit
// bounds the bytes it keeps registered (0: only pinmem's budget; not
// negative). Registering costs far more than one copy: it pays only for
// slices copied again and again. The cache holds what it registered until
// Copier.Forget or Close.
func WithRegistrationCache(limit int64) Option {
	return func(o *options) { o.cacheOn, o.cacheLimit = true, limit }
}

// WithRegistrationMin sets the smallest page-aligned range the registration
// cache pins (not negative). Default DefaultRegistrationMin.
func WithRegistrationMin(n int) Option { return func(o *options) { o.cacheMin = n } }

// WithStageFlags sets the pinmem flags and options the staging buffers
// are allocated with (default: no flags, on the Copier's device).
// WriteCombined is refused (device-to-host staging reads the stages with
// the CPU), as are options pinmem.Alloc would refuse.
func WithStageFlags(f pinmem.Flags, opts ...pinmem.Option) Option {
	return func(o *options) { o.stageFlags, o.stageOpts = f, opts }
}

// WithStats turns the measurement of Stats.Device, CopyCPU and
// ProcessCPU on or off (default off; see the package documentation).
func WithStats(on bool) Option { return func(o *options) { o.stats = on } }

// buildOptions applies opts to the defaults and validates them for fn.
func buildOptions(fn string, opts []Option) (options, error) {
	o := options{tune: defaultTuning(), stageSize: DefaultStageSize, depth: DefaultDepth,
		parallelism: min(DefaultParallelism, runtime.NumCPU()), cacheMin: DefaultRegistrationMin}
	for i, f := range opts {
		if f == nil {
			return o, &pinmem.OptionError{Func: fn, Option: "Option", Value: "nil", Reason: fmt.Sprintf("option %d is nil", i)}
		}
		f(&o)
	}
	refuse := func(opt string, v any, reason string) (options, error) {
		return o, &pinmem.OptionError{Func: fn, Option: opt, Value: fmt.Sprint(v), Reason: reason}
	}
	_, bad := pinopt.Build(o.stageOpts) // what pinmem.Alloc would refuse
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
