package transfer

import (
	"fmt"
	"runtime"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// Defaults, from the measurements in ANCHORS.md (see the package comment).
const (
	// DefaultStageSize is the size of one pinned staging buffer: 32 MiB.
	// Pinned copies reach full PCIe speed from 16 MiB, and a staged copy
	// was best with 16-64 MiB stages.
	DefaultStageSize = 32 << 20
	// DefaultDepth is the number of staging buffers in the ring: the CPU
	// fills one while the copy engine drains another, with one spare to
	// absorb jitter.
	DefaultDepth = 3
	// DefaultParallelism is the most CPU copy goroutines a Copier uses by
	// default: Go copy into pinned memory peaked at 12 goroutines
	// (43.8 GB/s), 16 was slower (36.4 GB/s).
	DefaultParallelism = 12
	// MinPiece is the smallest share of a stage given to one copy
	// goroutine; smaller copies use fewer goroutines.
	MinPiece = 256 << 10
	// MinChunk is the smallest piece a transfer is split into when it is
	// smaller than a few stages, so that CPU copies and DMA still overlap.
	MinChunk = 1 << 20
	// TailSpin bounds how long a WaitHybrid transfer polls its last event
	// before it sleeps in the driver after all.
	TailSpin = 2 * time.Millisecond
	// TailBytes is the size of the last piece of a long direct copy under
	// WaitHybrid: the transfer sleeps in the driver until the rest has run
	// and polls only while this piece runs (about 150 us at 55 GB/s).
	TailBytes = 8 << 20
	// DefaultRegistrationMin is the smallest page-aligned range the
	// registration cache pins; below it registering costs more than it saves.
	DefaultRegistrationMin = 1 << 20
)

type options struct {
	stageSize   int
	depth       int
	parallelism int
	stream      *cuda.Stream
	cacheOn     bool
	cacheLimit  int64
	cacheMin    int
	stageFlags  pinmem.Flags
	stageOpts   []pinmem.Option
	threadCPU   bool
	wait        WaitMode
}

// Option configures a Copier.
type Option func(*options)

// WaitMode is how a transfer waits for the copy engine to finish.
type WaitMode uint8

// Wait modes.
const (
	// WaitHybrid (the default) sleeps in the driver (a blocking-sync event:
	// no CPU) until all but the transfer's last piece has run, then polls
	// the end (at most TailSpin) so that the driver's wake-up latency does
	// not land on it.
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
	switch m {
	case WaitHybrid:
		return "hybrid"
	case WaitSleep:
		return "sleep"
	case WaitPoll:
		return "poll"
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(m))
}

// WithWait sets how transfers wait for the copy engine (default
// WaitHybrid). The figures behind the choice are in docs/PERF.md.
func WithWait(m WaitMode) Option { return func(o *options) { o.wait = m } }

// WithStageSize sets the size of each pinned staging buffer (rounded up to
// 4 KiB). Default DefaultStageSize.
func WithStageSize(n int) Option { return func(o *options) { o.stageSize = n } }

// WithDepth sets the number of staging buffers in the ring (at least 2 for
// any overlap). Default DefaultDepth.
func WithDepth(n int) Option { return func(o *options) { o.depth = n } }

// WithParallelism sets the number of goroutines that copy between Go memory
// and a stage (1 means the transfer's own goroutine only). Default:
// DefaultParallelism, at most runtime.NumCPU().
func WithParallelism(n int) Option { return func(o *options) { o.parallelism = n } }

// WithStream makes the Copier issue its copies on s (borrowed: the Copier
// never destroys it) instead of a stream of its own, so that they are
// ordered after work the caller queued on s.
func WithStream(s *cuda.Stream) Option { return func(o *options) { o.stream = s } }

// WithRegistrationCache turns on the registration cache: Go slices of at
// least DefaultRegistrationMin bytes are pinned in place on their first
// copy and copied directly afterwards. limit bounds the bytes the cache
// keeps registered (0: bounded only by pinmem's budget). Off by default:
// registering costs about 50 ms per GiB and pays only for slices copied
// more than once.
func WithRegistrationCache(limit int64) Option {
	return func(o *options) { o.cacheOn, o.cacheLimit = true, limit }
}

// WithRegistrationMin sets the smallest page-aligned range the registration
// cache pins. Default DefaultRegistrationMin.
func WithRegistrationMin(n int) Option { return func(o *options) { o.cacheMin = n } }

// WithStageFlags sets the pinmem flags and options the staging buffers are
// allocated with (default: no flags, on the Copier's device). WriteCombined
// is refused: device-to-host staging reads the stages with the CPU, which
// is very slow on write-combined memory.
func WithStageFlags(f pinmem.Flags, opts ...pinmem.Option) Option {
	return func(o *options) { o.stageFlags, o.stageOpts = f, opts }
}

// WithThreadCPU turns measuring the copy goroutines' thread CPU time
// (two getrusage calls per piece) on or off. Default on.
func WithThreadCPU(on bool) Option { return func(o *options) { o.threadCPU = on } }

func buildOptions(opts []Option) (options, error) {
	o := options{
		stageSize: DefaultStageSize,
		depth:     DefaultDepth,
		cacheMin:  DefaultRegistrationMin,
		threadCPU: true,
	}
	o.parallelism = min(DefaultParallelism, runtime.NumCPU())
	for _, f := range opts {
		f(&o)
	}
	if o.stageSize <= 0 {
		return o, fmt.Errorf("transfer: stage size %d: %w", o.stageSize, cuda.ErrInvalidValue)
	}
	o.stageSize = (o.stageSize + 4095) &^ 4095
	if o.depth < 1 {
		return o, fmt.Errorf("transfer: ring depth %d: %w", o.depth, cuda.ErrInvalidValue)
	}
	if o.parallelism < 1 {
		return o, fmt.Errorf("transfer: parallelism %d: %w", o.parallelism, cuda.ErrInvalidValue)
	}
	if o.stageFlags&pinmem.WriteCombined != 0 {
		return o, fmt.Errorf("transfer: write-combined staging buffers (device-to-host staging reads them with the CPU): %w", cuda.ErrInvalidValue)
	}
	if o.wait > WaitPoll {
		return o, fmt.Errorf("transfer: %v: %w", o.wait, cuda.ErrInvalidValue)
	}
	if o.cacheLimit < 0 || o.cacheMin < 0 {
		return o, fmt.Errorf("transfer: registration cache limit %d, minimum %d: %w", o.cacheLimit, o.cacheMin, cuda.ErrInvalidValue)
	}
	return o, nil
}
