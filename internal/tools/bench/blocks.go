package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostspan"
)

// Kinds of the blocks bench (Session.Blocks): the strategies of
// blocks.Copier, and one contiguous copy of the same bytes (both ways at
// once for DirBidir: the bidirectional pinned bound), the upper bound they
// are measured against.
const (
	BlockKindContiguous = "contiguous"   // all the blocks' bytes, contiguous on both sides, one copy per registration of the host buffer (each way for bidir)
	BlockKindBatch      = "driver-batch" // blocks.DriverBatch: the driver's cuMemcpyBatchAsync
	BlockKindPerCopy    = "per-copy"     // blocks.PerCopy: one cuMemcpyAsync per block
	BlockKindKernel     = "kernel"       // blocks.Kernel: pinmem's gather/scatter kernel
	BlockKindAuto       = "auto"         // blocks.Auto; the note says which strategy it chose
)

// AllBlockKinds returns every kind of the blocks bench, in report order
// (the contiguous bound first).
func AllBlockKinds() []string {
	return []string{BlockKindContiguous, BlockKindBatch, BlockKindPerCopy, BlockKindKernel, BlockKindAuto}
}

// AllBlockDirs returns the directions of the blocks bench: a list of
// blocks one way, or a page-out and a page-in at once on two streams
// (DirBidir; the figure is the bytes of both over the time of both).
func AllBlockDirs() []string { return []string{DirH2D, DirD2H, DirBidir} }

var blockKindAliases = map[string]string{
	"contiguous": BlockKindContiguous, "contig": BlockKindContiguous,
	"driver-batch": BlockKindBatch, "batch": BlockKindBatch,
	"per-copy": BlockKindPerCopy, "percopy": BlockKindPerCopy,
	"kernel": BlockKindKernel,
	"auto":   BlockKindAuto,
}

var blockDirAliases = map[string]string{
	"h2d": DirH2D, "htod": DirH2D,
	"d2h": DirD2H, "dtoh": DirD2H,
	"bidir": DirBidir, "both": DirBidir,
}

// ParseBlockKinds parses a comma-separated list of blocks-bench kinds
// (contiguous, driver-batch, per-copy, kernel, auto, or "all"; batch,
// percopy and contig are accepted too), in report order.
func ParseBlockKinds(s string) ([]string, error) {
	return parseList(s, "block strategy", blockKindAliases, AllBlockKinds())
}

// ParseBlockDirs parses a comma-separated list of the blocks bench's
// directions (h2d, d2h, bidir, or "all"; both is accepted too).
func ParseBlockDirs(s string) ([]string, error) {
	return parseList(s, "direction", blockDirAliases, AllBlockDirs())
}

// Defaults and bounds of BlocksConfig.
const (
	DefaultBlocks   = 4096    // blocks per list: a KV cache's pages of one long request
	MaxBlocks       = 1 << 20 // most blocks per list
	DefaultBlockGap = 4096    // bytes between two host slots
	MaxBlockSize    = 1 << 30 // largest block, and largest gap
)

// DefaultBlockSizes are the blocks bench's default block sizes: the pages
// of a KV cache, from the 16 KiB pages of one layer to the 2 MB blocks of
// one request across layers that offloading connectors move today.
var DefaultBlockSizes = []int64{16 << 10, 256 << 10, 2 << 20}

// BlocksTiming is how the blocks bench times a sample, as its report's
// metadata says.
const BlocksTiming = "host wall clock from the call that queues the list to the end of the stream's synchronize, one list per sample: the CPU cost of queuing the blocks is part of it"

// BlocksConfig configures Session.Blocks. Zero fields take their
// defaults; out-of-range fields make Blocks fail with ErrInvalid.
type BlocksConfig struct {
	Sizes   []int64  `json:"sizes_bytes"` // bytes per block, 1 to MaxBlockSize (empty: DefaultBlockSizes)
	Blocks  int      `json:"blocks"`      // blocks per list, 1 to MaxBlocks (0: DefaultBlocks)
	Dirs    []string `json:"dirs"`        // AllBlockDirs (empty: all)
	Kinds   []string `json:"kinds"`       // AllBlockKinds (empty: every kind)
	Samples int      `json:"samples"`     // timed samples per measurement, up to MaxSamples (0: 5)
	Warmup  int      `json:"warmup"`      // untimed samples first, up to 100 (0: 1; -1: none)
	// Gap is how many bytes of the host allocation are left unused
	// between two host slots, so that the host blocks are not one run of
	// memory even in address order (0: DefaultBlockGap; -1: none; at most
	// MaxBlockSize).
	Gap int64 `json:"gap_bytes"`
}

// Validate reports the first field of c that Blocks would refuse, as an
// error matching ErrInvalid; c is not changed. Calling it first finds the
// error before any GPU work (the CLI checks its flags this way).
func (c BlocksConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c BlocksConfig) Resolved() (BlocksConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *BlocksConfig) resolve() error {
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultBlockSizes
	}
	for _, n := range c.Sizes {
		if n < 1 || n > MaxBlockSize {
			return invalid("BlocksConfig.Sizes: block size %d: want 1 byte to %s", n, FormatSize(MaxBlockSize))
		}
	}
	switch {
	case c.Blocks == 0:
		c.Blocks = DefaultBlocks
	case c.Blocks < 0 || c.Blocks > MaxBlocks:
		return invalid("BlocksConfig.Blocks %d: want 1 to %d (0: the default, %d)", c.Blocks, MaxBlocks, DefaultBlocks)
	}
	if err := checkNames("BlocksConfig.Dirs", &c.Dirs, AllBlockDirs()); err != nil {
		return err
	}
	if err := checkNames("BlocksConfig.Kinds", &c.Kinds, AllBlockKinds()); err != nil {
		return err
	}
	if err := checkSamples("BlocksConfig.Samples", &c.Samples, 5); err != nil {
		return err
	}
	if err := checkWarmup("BlocksConfig.Warmup", &c.Warmup); err != nil {
		return err
	}
	switch {
	case c.Gap == 0:
		c.Gap = DefaultBlockGap
	case c.Gap == -1:
		c.Gap = 0
	case c.Gap < -1 || c.Gap > MaxBlockSize:
		return invalid("BlocksConfig.Gap %d: want 1 to %d (0: the default, %d; -1: none)", c.Gap, int64(MaxBlockSize), DefaultBlockGap)
	}
	if n := int64(c.regions()) * int64(c.Blocks) * (c.maxSize() + c.Gap); n > MaxSize {
		return invalid("BlocksConfig: %d blocks of up to %s with gaps of %s need %d bytes of host memory, more than %s", c.Blocks, FormatSize(c.maxSize()), FormatSize(c.Gap), n, FormatSize(MaxSize))
	}
	return nil
}

// regions is how many sets of slots the run needs on each side: two for
// DirBidir (one each way), else one.
func (c *BlocksConfig) regions() int {
	if contains(c.Dirs, DirBidir) {
		return 2
	}
	return 1
}

func (c *BlocksConfig) maxSize() int64 {
	m := int64(0)
	for _, n := range c.Sizes {
		m = max(m, n)
	}
	return m
}

// Blocks measures block copies as a KV cache pages its blocks in and
// out: for each block size and direction, a list of cfg.Blocks blocks
// scattered on both sides (host slots of one pinned, mapped allocation,
// taken in shuffled order with cfg.Gap bytes between slots; device slots
// of one device allocation, shuffled) copied by each blocks.Copier
// strategy, beside one contiguous copy of the same bytes. DirBidir pages
// one list out and another in at once on two streams, beside one
// contiguous copy each way at once (the bidirectional pinned bound). Each
// sample is one call, timed with the wall clock (BlocksTiming); every
// block of every sample is checked. A strategy the driver or device lacks
// gives skipped results with the reason; the error return is for failures
// that end the run (device memory, the driver, ctx; see Session).
func (s *Session) Blocks(ctx context.Context, cfg BlocksConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	w := &blockWork{s: s, ctx: ctx, cfg: cfg}
	defer w.close()
	if err := w.setup(); err != nil {
		return nil, err
	}
	var out []Result
	emit := func(r Result) {
		s.progress(r)
		out = append(out, r)
	}
	for _, bs := range cfg.Sizes {
		for _, dir := range cfg.Dirs {
			if w.hostErr != nil {
				for _, k := range cfg.Kinds {
					emit(skipped("blocks", k, dir, bs, GBps, w.hostErr.Error()))
				}
				continue
			}
			if err := w.prepareData(int(bs), dir); err != nil {
				return out, err
			}
			var strategies []Result // this size and direction's strategy rows, for auto's note
			for _, k := range cfg.Kinds {
				r, err := w.measure(k, int(bs), dir)
				if err == nil && k == BlockKindAuto {
					r.Note = joinNotes([]string{bestNote(r, strategies), r.Note})
				}
				if k != BlockKindContiguous && k != BlockKindAuto {
					strategies = append(strategies, r)
				}
				if err != nil && !isFatal(err) {
					why := "error: " + err.Error()
					if errors.Is(err, cuda.ErrNotSupported) {
						why = "not supported by this driver or device: " + err.Error()
					}
					r, err = skipped("blocks", k, dir, bs, GBps, why), nil
				}
				if err != nil {
					if r.Samples > 0 {
						emit(r)
					}
					return out, err
				}
				emit(r)
			}
		}
	}
	return out, nil
}

// blockWork is what every measurement of the blocks bench shares: the
// device allocation and the pinned host allocation the slots lie in (one
// region of slots per side, two with DirBidir), two streams, a copier per
// kind, the data the blocks carry and the shuffles.
type blockWork struct {
	s   *Session
	ctx context.Context
	cfg BlocksConfig

	dev     *cuda.DeviceBuffer // regions x Blocks slots of the largest size
	st, st2 *cuda.Stream       // st2: the page-in of DirBidir
	host    *pinmem.Buffer     // regions x Blocks slots of the largest size plus the gap
	h       []byte
	cuts    []int // offsets in h where one registration of host ends and the next begins
	maxBS   int
	// hostErr says why there is no host allocation: every result is
	// skipped with it.
	hostErr error
	copiers map[string]*blocks.Copier // by kind
	kErr    error                     // why the kernel strategy cannot run
	exp     []byte                    // the bytes the blocks carry (HtoD), or the device holds in device order (DtoH)
	scratch []byte                    // the device read back
	hp, dp  []int                     // block i: host slot hp[i], device slot dp[i]
	lists   []blocks.List             // the sample's lists
}

func (w *blockWork) setup() error {
	n, regions := w.cfg.Blocks, w.cfg.regions()
	w.maxBS = int(w.cfg.maxSize())
	var err error
	if w.dev, err = w.s.Ctx.Alloc(regions * n * w.maxBS); err != nil {
		return fmt.Errorf("bench: device buffer of %s: %w", FormatSize(int64(regions*n*w.maxBS)), err)
	}
	for _, st := range []**cuda.Stream{&w.st, &w.st2} {
		if *st, err = w.s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
			return err
		}
	}
	size := regions * n * (w.maxBS + int(w.cfg.Gap))
	// Mapped, so that the kernel strategy reaches the slots through their
	// device addresses; the copy engines do not care.
	w.host, err = pinmem.Alloc(size, pinmem.Mapped, pinmem.WithDevice(w.s.Dev))
	if err != nil {
		w.kErr = fmt.Errorf("host memory could not be mapped: %w", err)
		if w.host, err = pinmem.Alloc(size, 0, pinmem.WithDevice(w.s.Dev)); err != nil {
			w.hostErr = fmt.Errorf("allocating %s of pinned host memory: %w", FormatSize(int64(size)), err)
			return nil
		}
	}
	w.h = w.host.Bytes()
	w.cuts = hostspan.Cuts(w.host)
	w.copiers = map[string]*blocks.Copier{}
	// Auto is set up as package blocks' docs recommend: with a kernel
	// (WithKernel) over mapped host blocks, so that it can take the kernel
	// for small blocks; where the kernel cannot run, without it.
	for kind, opts := range map[string][]blocks.Option{
		BlockKindAuto:    {blocks.WithKernel(n)},
		BlockKindBatch:   {blocks.WithStrategy(blocks.DriverBatch)},
		BlockKindPerCopy: {blocks.WithStrategy(blocks.PerCopy)},
		BlockKindKernel:  {blocks.WithStrategy(blocks.Kernel), blocks.WithKernel(n)},
	} {
		if !contains(w.cfg.Kinds, kind) || (kind == BlockKindKernel && w.kErr != nil) {
			continue
		}
		if kind == BlockKindAuto && w.kErr != nil {
			opts = nil
		}
		c, err := blocks.New(w.s.Ctx, opts...)
		if err != nil && kind == BlockKindAuto && opts != nil {
			c, err = blocks.New(w.s.Ctx) // the kernel does not load: Auto without it
		}
		if err != nil && kind == BlockKindKernel {
			w.kErr = fmt.Errorf("block kernel: %w", err)
			continue
		}
		if err != nil {
			return err
		}
		w.copiers[kind] = c
	}
	w.exp = randomBytes(n*w.maxBS, 0xb10c)
	w.scratch = make([]byte, n*w.maxBS)
	r := rand.New(rand.NewPCG(0xb10c, 5))
	w.hp, w.dp = r.Perm(n), r.Perm(n)
	return nil
}

func (w *blockWork) close() {
	for _, st := range []*cuda.Stream{w.st, w.st2} {
		if st != nil {
			_ = st.Synchronize(context.Background())
		}
	}
	for _, c := range w.copiers {
		_ = c.Close(context.Background())
	}
	for _, st := range []*cuda.Stream{w.st, w.st2} {
		if st != nil {
			_ = st.Destroy()
		}
	}
	if w.host != nil {
		_ = w.host.Free()
	}
	if w.dev != nil {
		_ = w.dev.Free()
	}
}

// hostBase returns the offset of host region r.
func (w *blockWork) hostBase(r int) int { return r * w.cfg.Blocks * (w.maxBS + int(w.cfg.Gap)) }

// slot returns host slot j of bs-byte blocks in region r.
func (w *blockWork) slot(r, j, bs int) []byte {
	off := w.hostBase(r) + j*(bs+int(w.cfg.Gap))
	return w.h[off : off+bs]
}

// devOff returns the offset of device slot j of bs-byte blocks in region r.
func (w *blockWork) devOff(r, j, bs int) int { return r*w.cfg.Blocks*w.maxBS + j*bs }

// half is one direction of a sample and the region of slots it uses.
type half struct {
	dir    string
	region int
}

// halves returns the one-way directions a sample in dir moves: DirBidir
// pages in through region 0 and out through region 1.
func halves(dir string) []half {
	if dir == DirBidir {
		return []half{{DirH2D, 0}, {DirD2H, 1}}
	}
	return []half{{dir, 0}}
}

// prepareData builds the lists of bs-byte blocks and puts the data where
// the copies read it: HtoD, block i's bytes (exp's i-th) in its host slot;
// DtoH, exp on the device, device slot d holding exp's d-th bs bytes.
func (w *blockWork) prepareData(bs int, dir string) error {
	n := w.cfg.Blocks
	w.lists = w.lists[:0]
	for _, hf := range halves(dir) {
		l := make([]blocks.Block, n)
		for i := range n {
			l[i] = blocks.Block{Host: w.slot(hf.region, w.hp[i], bs), Dev: w.dev, Off: w.devOff(hf.region, w.dp[i], bs)}
		}
		if hf.dir == DirH2D {
			w.lists = append(w.lists, blocks.ToDevice(w.st2, l))
			for i := range n {
				copy(w.slot(hf.region, w.hp[i], bs), w.exp[i*bs:(i+1)*bs])
			}
			continue
		}
		w.lists = append(w.lists, blocks.ToHost(w.st, l))
		if _, err := w.dev.WriteAt(w.exp[:n*bs], int64(w.devOff(hf.region, 0, bs))); err != nil {
			return err
		}
	}
	return nil
}

// poisonDest fills what a sample in direction dir writes (the device
// slots, or the whole host region of the slots) with poison, so that a
// block the copy missed shows.
func (w *blockWork) poisonDest(bs int, dir string) error {
	n := w.cfg.Blocks
	for _, hf := range halves(dir) {
		if hf.dir == DirH2D {
			d, err := w.dev.Slice(w.devOff(hf.region, 0, bs), n*bs)
			if err != nil {
				return err
			}
			if err := memsetPrefix(d, poisonDevice, n*bs); err != nil {
				return err
			}
			continue
		}
		off := w.hostBase(hf.region)
		poison(w.h[off:off+n*(bs+int(w.cfg.Gap))], poisonHost)
	}
	return nil
}

// verify checks every block of the sample just run.
func (w *blockWork) verify(kind string, bs int, dir string) error {
	n, total := w.cfg.Blocks, w.cfg.Blocks*bs
	for _, hf := range halves(dir) {
		r := hf.region
		if hf.dir == DirH2D {
			if _, err := w.dev.ReadAt(w.scratch[:total], int64(w.devOff(r, 0, bs))); err != nil {
				return err
			}
		}
		if kind == BlockKindContiguous {
			h := w.h[w.hostBase(r):][:total] // the region's first bytes, which the contiguous copy moves
			got, want := h, w.exp[:total]
			if hf.dir == DirH2D {
				got, want = w.scratch[:total], h
			}
			if i := firstDiff(got, want); i >= 0 {
				return fmt.Errorf("%s: byte %d is %#x after the contiguous copy, want %#x", hf.dir, i, got[i], want[i])
			}
			continue
		}
		for i := range n {
			d := w.dp[i]
			got, want := w.scratch[d*bs:(d+1)*bs], w.exp[i*bs:(i+1)*bs]
			if hf.dir == DirD2H {
				got, want = w.slot(r, w.hp[i], bs), w.exp[d*bs:(d+1)*bs]
			}
			if j := firstDiff(got, want); j >= 0 {
				return fmt.Errorf("%s block %d (host slot %d, device slot %d): byte %d is %#x, want %#x", hf.dir, i, w.hp[i], d, j, got[j], want[j])
			}
		}
	}
	return nil
}

// contiguous queues the copy of n bytes in direction dir through region
// r, contiguous on both sides, on the stream the lists of dir use: one
// driver copy per registration of the host buffer it spans (pinmem pins a
// large buffer as several, and the driver refuses one copy across two;
// see pinmem.Buffer.Segments). It returns the driver calls it made.
func (w *blockWork) contiguous(dir string, r, n int) (calls int, err error) {
	base, off := w.hostBase(r), w.devOff(r, 0, 0)
	err = hostspan.EachPiece(w.cuts, base, base+n, func(lo, hi int) error {
		calls++
		if dir == DirH2D {
			return w.st2.CopyHtoD(w.dev, off+lo-base, w.h[lo:hi])
		}
		return w.st.CopyDtoH(w.h[lo:hi], w.dev, off+lo-base)
	})
	return calls, err
}

// sync waits for both streams.
func (w *blockWork) sync() error {
	return errors.Join(w.st.Synchronize(context.Background()), w.st2.Synchronize(context.Background()))
}

// run queues one sample of kind and waits for it; it returns how long
// queuing took, the copier's report (for the contiguous copy, one call a
// direction) and the whole time.
func (w *blockWork) run(kind string, bs int, dir string) (queued, total time.Duration, rep blocks.Report, err error) {
	if err := w.sync(); err != nil {
		return 0, 0, rep, err
	}
	t0 := time.Now()
	if kind == BlockKindContiguous {
		n := w.cfg.Blocks * bs
		for _, hf := range halves(dir) {
			calls, cerr := w.contiguous(hf.dir, hf.region, n)
			if err = cerr; err != nil {
				break
			}
			rep.Blocks, rep.Bytes, rep.Calls = rep.Blocks+1, rep.Bytes+int64(n), rep.Calls+calls
		}
	} else {
		rep, err = w.copiers[kind].Copy(w.ctx, w.lists...)
	}
	queued = time.Since(t0)
	if err != nil {
		return queued, 0, rep, errors.Join(err, w.sync())
	}
	if err := w.sync(); err != nil {
		return queued, 0, rep, err
	}
	return queued, time.Since(t0), rep, nil
}

// measure runs the samples of one (kind, block size, direction).
func (w *blockWork) measure(kind string, bs int, dir string) (Result, error) {
	n := w.cfg.Blocks
	total := int64(n) * int64(bs) * int64(len(halves(dir)))
	r := Result{Bench: "blocks", Kind: kind, Dir: dir, Size: int64(bs), Unit: GBps, Timing: TimingWall}
	rowStart := time.Now()
	if kind == BlockKindKernel && w.kErr != nil {
		return skipped("blocks", kind, dir, int64(bs), GBps, "kernel strategy unavailable: "+w.kErr.Error()), nil
	}
	for range w.cfg.Warmup {
		if err := w.ctx.Err(); err != nil {
			return r, err
		}
		if _, _, _, err := w.run(kind, bs, dir); err != nil {
			return r, err
		}
	}
	var rates, queuing []float64
	var notes []string
	var rep blocks.Report
	chose := map[blocks.Strategy]bool{}
	var stopErr error
	r.Verified = true
	for i := range w.cfg.Samples {
		if stopErr = w.ctx.Err(); stopErr != nil {
			notes = append(notes, stoppedNote(i, w.cfg.Samples))
			break
		}
		if note, ok := w.s.budgetSpent(i, w.cfg.Samples, rowStart); ok {
			notes = append(notes, note)
			break
		}
		if err := w.poisonDest(bs, dir); err != nil {
			return r, err
		}
		q, d, rp, err := w.run(kind, bs, dir)
		if err != nil {
			return r, err
		}
		rep = rp
		chose[rp.Strategy] = true
		rates = append(rates, Rate(total, d))
		queuing = append(queuing, float64(q.Nanoseconds())/1e3)
		if err := w.verify(kind, bs, dir); err != nil {
			r.Verified = false
			notes = append(notes, fmt.Sprintf("%s: sample %d: %v", verifyFailedMark, i+1, err))
			break // the figures are not to be trusted: no more samples
		}
	}
	r.fill(rates)
	r.Verified = r.Verified && r.Samples > 0
	if kind == BlockKindAuto {
		if names := chosenStrategies(chose); len(names) > 0 {
			notes = append(notes, "chose "+strings.Join(names, " and "))
		}
	}
	what := blocksWhat(kind, dir, n, bs, total)
	calls := "1 driver call"
	if rep.Calls != 1 {
		calls = fmt.Sprintf("%d driver calls", rep.Calls)
	}
	notes = append(notes, what, fmt.Sprintf("%s, queued in %s us (median)", calls, formatValue(Summarize(queuing).Median)))
	r.Note = joinNotes(notes)
	return r, stopErr
}

// chosenStrategies returns the names of the strategies in chose, in the
// order batch, per-copy, kernel: those auto picked in a row's samples.
func chosenStrategies(chose map[blocks.Strategy]bool) []string {
	var names []string
	for _, st := range []blocks.Strategy{blocks.DriverBatch, blocks.PerCopy, blocks.Kernel} {
		if chose[st] {
			names = append(names, st.String())
		}
	}
	return names
}

// blocksWhat describes, for measure's note, what one sample of kind in
// direction dir moves: n blocks of bs bytes, total bytes in all.
func blocksWhat(kind, dir string, n, bs int, total int64) string {
	what := fmt.Sprintf("%d blocks of %s, %s in all", n, FormatSize(int64(bs)), FormatSize(total))
	if dir == DirBidir {
		what = fmt.Sprintf("%d blocks of %s out and %d in at once on two streams, %s in all", n, FormatSize(int64(bs)), n, FormatSize(total))
	}
	if kind == BlockKindContiguous {
		what = fmt.Sprintf("%s contiguous on both sides, one copy per registration of the host buffer", FormatSize(int64(n)*int64(bs)))
		if dir == DirBidir {
			what = fmt.Sprintf("%s each way at once on two streams, contiguous on both sides, one copy per registration of the host buffer (the bidirectional pinned bound)", FormatSize(int64(n)*int64(bs)))
		}
	}
	return what
}

// bestNote says how auto's row compares with the best strategy measured
// for the same size and direction in the same run (the target: at least
// 0.9 of it), or "" when none was measured.
func bestNote(auto Result, strategies []Result) string {
	var best Result
	for _, r := range strategies {
		if !r.Skipped && r.Samples > 0 && !r.Failed() && r.Median > best.Median {
			best = r
		}
	}
	ratio, ok := Ratio(auto, best)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%.2f of the best strategy in this run, %s (%s %s)", ratio, best.Kind, formatValue(best.Median), best.Unit)
}
