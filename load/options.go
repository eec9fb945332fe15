package load

import (
	"fmt"
	"runtime"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/enumtext"
)

// Loader defaults. DefaultSettings derives what New uses from them and
// the machine's cores. Measured on H100 hosts (PCIe Gen5 x16, 16 cores, a
// warm 4 GiB checkpoint in 4 shards, pinmem bench load): 8 readers of 16
// MiB stages loaded 0.61 of pinned host-to-device; 16 readers of 8 MiB
// 0.71-0.87, as fast as the host read its page cache; 16 readers of 4
// MiB 0.94-0.95, where on the same host 8 MiB gave 0.71-0.80, 6 MiB 0.87
// and 2 MiB 0.79. One reader copies 5-6 GB/s out of the page cache, so a
// reader per core, up to 16, outruns PCIe.
const (
	// DefaultStageSize is the size of one pinned stage and one read: 4
	// MiB. 16 goroutines read an H100 host's page cache at 56-70 GB/s in
	// reads of 4 MiB against 44-53 in reads of 8 MiB, and the loader
	// kept pace with PCIe (0.94-0.95 of pinned). Reads of 2 MiB were
	// faster still (78 GB/s) but the load slower (0.79), with twice the
	// copies, events and waits per byte.
	DefaultStageSize = 4 << 20
	// DefaultParallelism is the most goroutines that fill stages (read the
	// files) at once by default: one per core (runtime.NumCPU), up to 16.
	// Each copies 5-6 GB/s out of the page cache; 16 of them outrun PCIe
	// Gen5 and keep an NVMe drive's queue full.
	DefaultParallelism = 16
	// DefaultStreams is the number of CUDA streams the copies are spread
	// over.
	DefaultStreams = 2
	// MaxStageSize is the largest stage WithStageSize accepts (1 GiB), so
	// that a stage is always one pinned registration (see
	// pinmem.Buffer.Segments).
	MaxStageSize = 1 << 30
	// Align is the alignment of direct I/O: file offsets, lengths and
	// memory addresses of O_DIRECT reads are multiples of it. 4096 covers
	// every logical block size of common disks.
	Align = 4096
	// DefaultWarmThreshold is the share of sampled pages that must be in
	// the page cache for ModeAuto to read through it (see WithWarmThreshold).
	DefaultWarmThreshold = 0.5
)

// Mode is how a Loader reads files.
type Mode uint8

// Read modes.
const (
	// ModeAuto samples the page cache of each file (mincore on up to 64
	// windows of the ranges to be read from it) and reads the file through
	// it (ModeBuffered) when at least the warm threshold of the sampled
	// pages are cached, with direct I/O (ModeDirect) otherwise. Where residency cannot be sampled (not
	// Linux, or mmap refused) it reads buffered.
	ModeAuto Mode = iota
	// ModeDirect reads with O_DIRECT into aligned pinned stages: the data
	// goes from the disk to pinned memory by DMA, without a page-cache copy
	// and without filling the page cache. Where the file system refuses
	// O_DIRECT (tmpfs, some FUSE and network file systems) or a read with
	// it, the load falls back to buffered reads and Stats.Fallback says why.
	ModeDirect
	// ModeBuffered reads through the page cache with ordinary pread.
	ModeBuffered
	// ModeMapped reads buffered, and Stats.Fallback says so: it used to
	// register read-only windows of the files' mappings so that the copy
	// engine read the page cache with no CPU copy, but on an H100 host
	// that ran at 10-20 GB/s at every setting, against 33-48 GB/s for
	// buffered reads (registering page-cache pages costs more than the
	// copy it saves). The constant stays so that programs naming it build.
	ModeMapped
)

var modeNames = []string{"auto", "direct", "buffered", "mapped"}

// String returns "auto", "direct", "buffered" or "mapped".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// MarshalText encodes the mode as String does; a value that is no mode is
// an error matching cuda.ErrInvalidValue.
func (m Mode) MarshalText() ([]byte, error) {
	if int(m) >= len(modeNames) {
		return nil, fmt.Errorf("load: %s is no Mode: %w", m, cuda.ErrInvalidValue)
	}
	return []byte(m.String()), nil
}

// UnmarshalText parses a name String returns, without regard to case; an
// unknown name is a *pinmem.NameError (matching cuda.ErrInvalidValue).
func (m *Mode) UnmarshalText(b []byte) error {
	i := enumtext.Index(modeNames, string(b))
	if i < 0 {
		return &pinmem.NameError{Type: "load.Mode", Name: string(b), Known: modeNames}
	}
	*m = Mode(i)
	return nil
}

// Option configures a Loader in New. Options only record their values; New
// checks them and returns a *pinmem.OptionError for the first one it
// refuses.
type Option func(*config)

type config struct {
	stageSize int
	depth     int
	depthSet  bool
	parallel  int
	streams   int
	mode      Mode
	warm      float64
	progress  func(done, total int64)
}

// Settings are the sizes of a Loader: what WithParallelism,
// WithStageSize, WithDepth and WithStreams set.
type Settings struct {
	Parallelism int // reading goroutines
	StageSize   int // bytes per pinned stage and per read
	Depth       int // pinned stages
	Streams     int // CUDA streams
}

// DefaultSettings returns what New uses for the sizes no option sets, on
// this machine: DefaultParallelism readers at most, one per core
// (runtime.NumCPU), DefaultStageSize, twice as many stages as readers and
// DefaultStreams. It is the one place these defaults are decided; an
// option a caller gives replaces its value.
func DefaultSettings() Settings { return settingsFor(runtime.NumCPU()) }

// settingsFor is DefaultSettings on a machine of cores cores.
func settingsFor(cores int) Settings {
	p := max(1, min(DefaultParallelism, cores))
	return Settings{Parallelism: p, StageSize: DefaultStageSize, Depth: 2 * p, Streams: DefaultStreams}
}

func defaults() config {
	d := DefaultSettings()
	return config{
		stageSize: d.StageSize,
		parallel:  d.Parallelism,
		streams:   d.Streams,
		warm:      DefaultWarmThreshold,
	}
}

// check validates the options as New sees them and fills in the defaults
// that depend on others.
func (c *config) check() error {
	switch {
	case c.stageSize < Align || c.stageSize > MaxStageSize || c.stageSize%Align != 0:
		return optionError("WithStageSize", fmt.Sprint(c.stageSize), fmt.Sprintf("want a multiple of %d from %d to %d", Align, Align, MaxStageSize))
	case c.parallel < 1 || c.parallel > 256:
		return optionError("WithParallelism", fmt.Sprint(c.parallel), "want 1 to 256")
	case c.depthSet && (c.depth < 1 || c.depth > 1024):
		return optionError("WithDepth", fmt.Sprint(c.depth), "want 1 to 1024")
	case c.streams < 1 || c.streams > 64:
		return optionError("WithStreams", fmt.Sprint(c.streams), "want 1 to 64")
	case c.mode > ModeMapped:
		return optionError("WithMode", fmt.Sprint(uint8(c.mode)), "unknown mode")
	case !(c.warm >= 0 && c.warm <= 1): // NaN fails too
		return optionError("WithWarmThreshold", fmt.Sprint(c.warm), "want a fraction from 0 to 1")
	}
	if !c.depthSet {
		c.depth = 2 * c.parallel
	}
	if int64(c.depth)*int64(c.stageSize) > 64<<30 {
		return optionError("WithDepth", fmt.Sprint(c.depth), fmt.Sprintf("%d stages of %d bytes exceed 64 GiB of pinned memory", c.depth, c.stageSize))
	}
	return nil
}

// WithStageSize sets the size of each pinned stage: a multiple of Align
// from Align to MaxStageSize. Default DefaultStageSize. One pread fills at
// most one stage and one copy drains it.
func WithStageSize(n int) Option { return func(c *config) { c.stageSize = n } }

// WithDepth sets how many pinned stages the Loader holds, its ring of
// staging buffers (1 to 1024), as transfer.WithDepth does for a Copier:
// its pinned memory is at most the depth times the stage size, each
// stage pinned by the first read that takes it and charged to pinmem's
// budget until Close. Default twice the
// parallelism, so that every reading goroutine has a stage to fill while
// another's copy runs.
func WithDepth(n int) Option { return func(c *config) { c.depth, c.depthSet = n, true } }

// WithParallelism sets how many goroutines fill stages at once, reading
// the files in parallel (1 to 256): the CPU side of a load, as
// transfer.WithParallelism sets the goroutines that fill a Copier's stages
// from Go memory. Default: one per core, at most DefaultParallelism
// (DefaultSettings).
func WithParallelism(n int) Option { return func(c *config) { c.parallel = n } }

// WithStreams sets how many CUDA streams the host-to-device copies are
// spread over (1 to 64). Default DefaultStreams.
func WithStreams(n int) Option { return func(c *config) { c.streams = n } }

// WithMode sets how files are read (default ModeAuto).
func WithMode(m Mode) Option { return func(c *config) { c.mode = m } }

// WithWarmThreshold sets the share of sampled pages (0 to 1) that must be
// in the page cache for ModeAuto to read buffered. 0 always reads buffered
// and 1 reads buffered only when every sampled page is cached. Default
// DefaultWarmThreshold.
func WithWarmThreshold(f float64) Option { return func(c *config) { c.warm = f } }

// WithProgress sets a function called as data lands in device memory with
// the bytes delivered so far and in all (the sum of the ranges' lengths).
// Calls of one load never overlap and done never decreases; the last call
// has done == total unless the load failed. It runs on a loader goroutine:
// it must return quickly and must not call the Loader. A panic in it stops
// the load and is raised again by the load on its caller's goroutine. nil,
// the default, reports nothing.
func WithProgress(p func(done, total int64)) Option {
	return func(c *config) { c.progress = p }
}

// optionError is the *pinmem.OptionError of load.New for option opt.
func optionError(opt, value, reason string) *pinmem.OptionError {
	return &pinmem.OptionError{Func: "load.New", Option: opt, Value: value, Reason: reason}
}
