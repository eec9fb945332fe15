package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/copypool"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/transfer"
)

// BandwidthConfig configures Session.Bandwidth. Zero fields take their
// defaults; out-of-range fields make Bandwidth fail with ErrInvalid.
type BandwidthConfig struct {
	Kinds   []string `json:"kinds"`       // host memory kinds (AllKinds; empty: every kind)
	Sizes   []int64  `json:"sizes_bytes"` // bytes per copy, 1 to MaxSize (empty: DefaultSizes)
	Dirs    []string `json:"dirs"`        // directions (AllDirs; empty: every direction)
	Samples int      `json:"samples"`     // timed samples per measurement, up to MaxSamples (0: 5)
	Warmup  int      `json:"warmup"`      // untimed samples first, up to 100 (0: 1; -1: none)
	// MinBytes is the least a sample moves in each direction: small copies
	// are repeated up to MaxReps times per sample (0: 64 MiB and 64;
	// MinBytes at most MaxSize, MaxReps at most 1<<20).
	MinBytes int64 `json:"min_bytes"`
	MaxReps  int   `json:"max_reps"`
}

// DefaultSizes are the bandwidth bench's default copy sizes.
var DefaultSizes = []int64{64 << 10, 1 << 20, 16 << 20, 256 << 20}

// Validate reports the first field of c that Bandwidth would refuse, as an
// error matching ErrInvalid; c is not changed. Bandwidth validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c BandwidthConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c BandwidthConfig) Resolved() (BandwidthConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *BandwidthConfig) resolve() error {
	if err := checkNames("BandwidthConfig.Kinds", &c.Kinds, AllKinds()); err != nil {
		return err
	}
	if err := checkSizes("BandwidthConfig.Sizes", &c.Sizes, DefaultSizes); err != nil {
		return err
	}
	if err := checkNames("BandwidthConfig.Dirs", &c.Dirs, AllDirs()); err != nil {
		return err
	}
	if err := checkSamples("BandwidthConfig.Samples", &c.Samples, 5); err != nil {
		return err
	}
	if err := checkWarmup("BandwidthConfig.Warmup", &c.Warmup); err != nil {
		return err
	}
	switch {
	case c.MinBytes == 0:
		c.MinBytes = 64 << 20
	case c.MinBytes < 0 || c.MinBytes > MaxSize:
		return invalid("BandwidthConfig.MinBytes %d: want 1 to %d (0: the default, 64 MiB)", c.MinBytes, int64(MaxSize))
	}
	switch {
	case c.MaxReps == 0:
		c.MaxReps = 64
	case c.MaxReps < 0 || c.MaxReps > 1<<20:
		return invalid("BandwidthConfig.MaxReps %d: want 1 to %d (0: the default, 64)", c.MaxReps, 1<<20)
	}
	return nil
}

// reps returns how many copies of size bytes one sample makes.
func (c *BandwidthConfig) reps(size int64) int {
	r := (c.MinBytes + size - 1) / size
	return int(min(max(r, 1), int64(c.MaxReps)))
}

// Bandwidth measures copies between host memory of each kind and device
// memory, for every size and direction. A kind that cannot be allocated or
// measured gives skipped results with the reason; the error return is for
// failures that end the run (device memory, the driver, ctx; see Session).
func (s *Session) Bandwidth(ctx context.Context, cfg BandwidthConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	maxSize := int64(0)
	for _, n := range cfg.Sizes {
		maxSize = max(maxSize, n)
	}
	w := &bwWork{s: s, ctx: ctx, cfg: cfg, n: int(maxSize)}
	defer w.close()
	if err := w.setup(); err != nil {
		return nil, err
	}
	var out []Result
	for _, kind := range cfg.Kinds {
		rs, err := w.kind(kind)
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// bwWork holds what every kind's measurement shares: two device buffers
// and two streams (lane A copies host to device, lane B device to host in
// the bidirectional test), the expected data and a scratch buffer.
type bwWork struct {
	s          *Session
	ctx        context.Context
	cfg        BandwidthConfig
	n          int
	devA, devB *cuda.DeviceBuffer
	outA       *cuda.DeviceBuffer // read_sum_u32 accumulators (2 x 8 bytes)
	stA, stB   *cuda.Stream
	expA, expB []byte
	scratch    []byte
	// The staged bound's pinned memory (two buffers: the CPU copies into
	// one while the copy engine reads the other, as in a Copier's ring)
	// and copy pool (boundMem), and the bound rows of the kind being
	// measured.
	pinned [2]*pinmem.Buffer
	pool   *copypool.Pool
	bounds []Result
}

func (w *bwWork) setup() error {
	var err error
	if w.devA, err = w.s.Ctx.Alloc(w.n); err != nil {
		return fmt.Errorf("bench: device buffer of %s: %w", FormatSize(int64(w.n)), err)
	}
	if w.devB, err = w.s.Ctx.Alloc(w.n); err != nil {
		return fmt.Errorf("bench: device buffer of %s: %w", FormatSize(int64(w.n)), err)
	}
	if w.outA, err = w.s.Ctx.Alloc(256); err != nil {
		return err
	}
	if w.stA, err = w.s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		return err
	}
	if w.stB, err = w.s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		return err
	}
	w.expA = randomBytes(w.n, 1)
	w.expB = randomBytes(w.n, 2)
	w.scratch = make([]byte, w.n)
	return nil
}

func (w *bwWork) close() {
	if w.pool != nil {
		w.pool.Close()
	}
	for _, p := range w.pinned {
		if p != nil {
			_ = p.Free()
		}
	}
	for _, st := range []*cuda.Stream{w.stA, w.stB} {
		if st != nil {
			_ = st.Synchronize(context.Background())
			_ = st.Destroy()
		}
	}
	for _, b := range []*cuda.DeviceBuffer{w.devA, w.devB, w.outA} {
		if b != nil {
			_ = b.Free()
		}
	}
}

func (w *bwWork) hasDir(d string) bool {
	for _, x := range w.cfg.Dirs {
		if x == d {
			return true
		}
	}
	return false
}

// kind measures one host memory kind at every size and direction.
func (w *bwWork) kind(kind string) ([]Result, error) {
	if kind == KindMapped && w.s.kernErr != nil {
		return w.skipAll(kind, "kernels unavailable: "+w.s.kernErr.Error()), nil
	}
	var copier *transfer.Copier
	if kind == KindCopier {
		cp, err := transfer.New(w.s.Ctx)
		if err != nil {
			return w.skipAll(kind, "transfer.New: "+err.Error()), nil
		}
		defer cp.Close(context.Background())
		copier = cp
	}
	hA, err := w.s.allocHost(kind, w.n)
	if err != nil {
		return w.skipAll(kind, fmt.Sprintf("allocating %s: %v", FormatSize(int64(w.n)), err)), nil
	}
	defer hA.free()
	var hB *hostMem
	if w.hasDir(DirBidir) {
		if hB, err = w.s.allocHost(kind, w.n); err != nil {
			hB = nil
		}
		defer hB.free()
	}
	var out []Result
	for _, n := range w.cfg.Sizes {
		for _, d := range w.cfg.Dirs {
			r, err := w.one(kind, copier, hA, hB, d, n)
			if err != nil {
				if isFatal(err) {
					if r.Samples > 0 {
						w.s.progress(r)
						out = append(out, r)
					}
					return out, err
				}
				r = skipped("bw", kind, d, n, GBps, "error: "+err.Error())
			}
			w.s.progress(r)
			out = append(out, r)
		}
	}
	// The computed bounds follow the kind's measured rows.
	for _, b := range w.bounds {
		w.s.progress(b)
		out = append(out, b)
	}
	w.bounds = nil
	return out, nil
}

// skipAll returns, and reports as progress, a skipped result with reason
// why for every size and direction of kind.
func (w *bwWork) skipAll(kind, why string) []Result {
	var out []Result
	for _, n := range w.cfg.Sizes {
		for _, d := range w.cfg.Dirs {
			r := skipped("bw", kind, d, n, GBps, why)
			w.s.progress(r)
			out = append(out, r)
		}
	}
	return out
}

// one measures kind in direction dir at n bytes by the method the kind
// needs (copier is the Copier of KindCopier; hB is nil when the second
// host buffer could not be allocated), or returns it skipped when it
// cannot be measured.
func (w *bwWork) one(kind string, copier *transfer.Copier, hA, hB *hostMem, dir string, n int64) (Result, error) {
	switch {
	case dir == DirBidir && hB == nil:
		return skipped("bw", kind, dir, n, GBps, "second host buffer could not be allocated"), nil
	case kind == KindMapped && n%4 != 0:
		return skipped("bw", kind, dir, n, GBps, "mapped kernels need a multiple of 4 bytes"), nil
	case kind == KindCopier:
		return w.copier(kind, copier, hA, hB, dir, int(n))
	case kind == KindPageableSync:
		return w.pageableSync(hA, hB, dir, int(n))
	case kind == KindPageable && dir == DirBidir:
		return w.pageableBidir(hA, hB, int(n))
	}
	return w.measure(kind, hA, hB, dir, int(n))
}

// isFatal reports whether err ends the run: the caller's context is done,
// a kernel fault or launch failure left the CUDA context unusable (they are
// sticky), or the driver is gone.
func isFatal(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, cuda.ErrLaunchFailed) || errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice)
}

// stoppedNote says that a measurement has fewer samples than asked for.
func stoppedNote(done, want int) string {
	return fmt.Sprintf("stopped after %d of %d samples", done, want)
}

// bwPlan is one measurement's work: lanes, preparation and verification.
type bwPlan struct {
	lanes   []lane
	bytes   []int64 // bytes each lane moves per rep
	prepare func() error
	verify  func(reps int) error
	hold    bool
	note    string
}

// plan makes the work of one (kind, direction, size) measurement: for h2d
// and d2h one lane on stream A, for bidir lane A host to device and lane
// B device to host at once, on stream B.
func (w *bwWork) plan(kind string, hA, hB *hostMem, dir string, n int) bwPlan {
	p := bwPlan{hold: kind != KindPageable}
	var preps []func() error
	var vers []func(int) error
	add := func(l lane, st *cuda.Stream, prep func() error, ver func(int) error) {
		l.s = st
		p.lanes = append(p.lanes, l)
		p.bytes = append(p.bytes, int64(n))
		preps = append(preps, prep)
		vers = append(vers, ver)
	}
	switch dir {
	case DirH2D:
		l, pr, v := w.h2dLane(kind, n, hA, w.devA, w.expA, w.outA)
		add(l, w.stA, pr, v)
	case DirD2H:
		l, pr, v := w.d2hLane(kind, n, hA, w.devA, w.expA)
		add(l, w.stA, pr, v)
	case DirBidir:
		l, pr, v := w.h2dLane(kind, n, hA, w.devA, w.expA, w.outA)
		add(l, w.stA, pr, v)
		l, pr, v = w.d2hLane(kind, n, hB, w.devB, w.expB)
		add(l, w.stB, pr, v)
	}
	p.prepare = func() error {
		for _, f := range preps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
	p.verify = func(reps int) error {
		for _, f := range vers {
			if err := f(reps); err != nil {
				return err
			}
		}
		return nil
	}
	switch kind {
	case KindPageable:
		p.note = "driver's pageable path blocks the host: not held by spin-wait"
	case KindMapped:
		switch dir {
		case DirH2D:
			p.note = "kernel read_sum_u32 reads host memory through its device pointer"
		case DirD2H:
			p.note = "kernel fill_u32 writes host memory through its device pointer"
		default:
			p.note = "read_sum_u32 and fill_u32 at once on two streams"
		}
	}
	return p
}

// h2dLane returns the lane that moves the first n bytes of h to the
// device, with its preparation and its verification after reps units:
// for KindMapped the kernel read_sum_u32 reads h through its device
// pointer into the accumulator out, and the sum is checked; otherwise a
// copy into dev, whose bytes are checked against exp.
func (w *bwWork) h2dLane(kind string, n int, h *hostMem, dev *cuda.DeviceBuffer, exp []byte, out *cuda.DeviceBuffer) (lane, func() error, func(int) error) {
	if kind == KindMapped {
		grid, block := w.s.grid()
		op := func(st *cuda.Stream, _ int) error {
			return w.s.fns[kernels.KernelReadSum].Launch(st, grid, block, 0, h.dptr, uint64(n/4), out.Ptr())
		}
		prep := func() error {
			copy(h.b[:n], exp[:n])
			return memsetPrefix(out, 0, 8)
		}
		ver := func(reps int) error {
			var got [8]byte
			if _, err := out.ReadAt(got[:], 0); err != nil {
				return err
			}
			want := uint64(reps) * sumWords(exp[:n])
			if g := binary.LittleEndian.Uint64(got[:]); g != want {
				return fmt.Errorf("read_sum_u32 of mapped memory gave %#x, want %#x", g, want)
			}
			return nil
		}
		return lane{op: op}, prep, ver
	}
	op := func(st *cuda.Stream, _ int) error { return st.CopyHtoD(dev, 0, h.b[:n]) }
	prep := func() error {
		copy(h.b[:n], exp[:n])
		return memsetPrefix(dev, poisonDevice, n)
	}
	ver := func(int) error {
		if _, err := dev.ReadAt(w.scratch[:n], 0); err != nil {
			return err
		}
		if i := firstDiff(w.scratch[:n], exp[:n]); i >= 0 {
			return fmt.Errorf("device byte %d is %#x after the copy, want %#x", i, w.scratch[i], exp[i])
		}
		return nil
	}
	return lane{op: op}, prep, ver
}

// d2hLane returns the lane that moves n bytes from the device into the
// first n bytes of h, with its preparation and its verification: for
// KindMapped the kernel fill_u32 writes a pattern into h through its
// device pointer; otherwise a copy from dev, filled with exp first. The
// host bytes are checked either way.
func (w *bwWork) d2hLane(kind string, n int, h *hostMem, dev *cuda.DeviceBuffer, exp []byte) (lane, func() error, func(int) error) {
	if kind == KindMapped {
		const seed = 0x5eed
		grid, block := w.s.grid()
		op := func(st *cuda.Stream, _ int) error {
			return w.s.fns[kernels.KernelFill].Launch(st, grid, block, 0, h.dptr, uint64(n/4), uint32(seed))
		}
		prep := func() error { poison(h.b[:n], poisonHost); return nil }
		ver := func(int) error {
			for i := 0; i < n/4; i++ {
				if g, want := binary.LittleEndian.Uint32(h.b[4*i:]), kernels.Pattern(seed, uint64(i)); g != want {
					return fmt.Errorf("mapped word %d is %#x after fill_u32, want %#x", i, g, want)
				}
			}
			return nil
		}
		return lane{op: op}, prep, ver
	}
	op := func(st *cuda.Stream, _ int) error { return st.CopyDtoH(h.b[:n], dev, 0) }
	prep := func() error {
		poison(h.b[:n], poisonHost)
		_, err := dev.WriteAt(exp[:n], 0)
		return err
	}
	ver := func(int) error {
		if i := firstDiff(h.b[:n], exp[:n]); i >= 0 {
			return fmt.Errorf("host byte %d is %#x after the copy, want %#x", i, h.b[i], exp[i])
		}
		return nil
	}
	return lane{op: op}, prep, ver
}

// measure runs one (kind, direction, size) measurement with the device's
// copy engines (or the zero-copy kernels for mapped memory).
func (w *bwWork) measure(kind string, hA, hB *hostMem, dir string, n int) (Result, error) {
	r := Result{Bench: "bw", Kind: kind, Dir: dir, Size: int64(n), Unit: GBps}
	rowStart := time.Now()
	p := w.plan(kind, hA, hB, dir, n)
	reps := w.cfg.reps(int64(n))
	if err := p.prepare(); err != nil {
		return r, err
	}
	for range w.cfg.Warmup {
		if err := w.ctx.Err(); err != nil {
			return r, err
		}
		if _, err := w.s.timeLanes(p.lanes, reps, p.hold); err != nil {
			return r, err
		}
	}
	if err := p.prepare(); err != nil {
		return r, err
	}
	var total []float64
	perLane := make([][]float64, len(p.lanes))
	var notes []string
	var stopErr error
	for i := range w.cfg.Samples {
		if stopErr = w.ctx.Err(); stopErr != nil {
			notes = append(notes, stoppedNote(i, w.cfg.Samples))
			break
		}
		if note, ok := w.s.budgetSpent(i, w.cfg.Samples, rowStart); ok {
			notes = append(notes, note)
			break
		}
		t, err := w.s.timeLanes(p.lanes, reps, p.hold)
		if err != nil {
			return r, err
		}
		r.Timing = t.method
		if t.note != "" && len(notes) == 0 {
			notes = append(notes, t.note)
		}
		if i == 0 {
			if err := p.verify(reps); err != nil {
				notes = append(notes, verifyFailedMark+": "+err.Error())
			} else {
				r.Verified = true
			}
		}
		var moved int64
		for j, b := range p.bytes {
			moved += b * int64(reps)
			perLane[j] = append(perLane[j], Rate(b*int64(reps), t.perLane[j]))
		}
		total = append(total, Rate(moved, t.span))
	}
	r.fill(total)
	if dir == DirBidir && len(perLane) == 2 {
		notes = append(notes, fmt.Sprintf("h2d %s + d2h %s GB/s", formatValue(Summarize(perLane[0]).Median), formatValue(Summarize(perLane[1]).Median)))
	}
	if p.note != "" {
		notes = append(notes, p.note)
	}
	if reps > 1 {
		notes = append(notes, fmt.Sprintf("%d copies per sample", reps))
	}
	r.Note = joinNotes(notes)
	return r, stopErr
}

func joinNotes(notes []string) string {
	s := ""
	for _, n := range notes {
		if n == "" {
			continue
		}
		if s != "" {
			s += "; "
		}
		s += n
	}
	return s
}

// dirOps are the two directions of a wall-clock measurement: each moves
// one copy of the measured size and returns when its data is in place.
type dirOps struct {
	h2d, d2h func() error
}

// wall measures with the host's wall clock: reps copies per sample in
// each direction of dir, and for bidir both directions at once, each on a
// goroutine of its own. The copies of one direction run one after
// another; a sample ends when the last copy has finished.
func (w *bwWork) wall(kind, dir string, hA, hB *hostMem, n int, ops dirOps) (Result, error) {
	r := Result{Bench: "bw", Kind: kind, Dir: dir, Size: int64(n), Unit: GBps, Timing: TimingWall}
	rowStart := time.Now()
	reps := w.cfg.reps(int64(n))
	repeat := func(op func() error) error {
		for range reps {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	}
	sample := func() (time.Duration, error) {
		start := time.Now()
		var err error
		switch dir {
		case DirH2D:
			err = repeat(ops.h2d)
		case DirD2H:
			err = repeat(ops.d2h)
		default:
			errc := make(chan error, 1)
			go func() { errc <- repeat(ops.d2h) }()
			err = errors.Join(repeat(ops.h2d), <-errc)
		}
		return time.Since(start), err
	}
	p := w.plan(KindPageable, hA, hB, dir, n) // for prepare and verify
	if err := p.prepare(); err != nil {
		return r, err
	}
	for range w.cfg.Warmup {
		if err := w.ctx.Err(); err != nil {
			return r, err
		}
		if _, err := sample(); err != nil {
			return r, err
		}
	}
	if err := p.prepare(); err != nil {
		return r, err
	}
	mult := int64(1)
	if dir == DirBidir {
		mult = 2
	}
	var vals []float64
	var notes []string
	var stopErr error
	for i := range w.cfg.Samples {
		if stopErr = w.ctx.Err(); stopErr != nil {
			notes = append(notes, stoppedNote(i, w.cfg.Samples))
			break
		}
		if note, ok := w.s.budgetSpent(i, w.cfg.Samples, rowStart); ok {
			notes = append(notes, note)
			break
		}
		d, err := sample()
		if err != nil {
			return r, err
		}
		if i == 0 {
			if err := p.verify(reps); err != nil {
				notes = append(notes, verifyFailedMark+": "+err.Error())
			} else {
				r.Verified = true
			}
		}
		vals = append(vals, Rate(mult*int64(n)*int64(reps), d))
	}
	r.fill(vals)
	if dir == DirBidir {
		notes = append(notes, "both directions at once, one goroutine each; the figure is the sum")
	}
	if reps > 1 {
		notes = append(notes, fmt.Sprintf("%d copies per sample", reps))
	}
	r.Note = joinNotes(notes)
	return r, stopErr
}

// pageableSync measures the driver's synchronous pageable copy
// (cuMemcpyHtoD, cuMemcpyDtoH) of Go heap memory by the wall clock, as the
// copier kinds are timed.
func (w *bwWork) pageableSync(hA, hB *hostMem, dir string, n int) (Result, error) {
	ops := dirOps{
		h2d: func() error { _, err := w.devA.WriteAt(hA.b[:n], 0); return err },
		d2h: func() error { _, err := w.devA.ReadAt(hA.b[:n], 0); return err },
	}
	if dir == DirBidir {
		ops.d2h = func() error { _, err := w.devB.ReadAt(hB.b[:n], 0); return err }
	}
	r, err := w.wall(KindPageableSync, dir, hA, hB, n, ops)
	r.Note = joinNotes([]string{r.Note, "the driver's synchronous pageable copy"})
	return r, err
}

// pageableBidir measures the pageable kind in both directions at once.
// The driver's pageable copy holds the calling thread until its data is
// staged, so two streams fed from one thread would copy one direction
// after the other: each direction is queued by a goroutine of its own on
// its own stream, and the sample ends when both streams are done.
func (w *bwWork) pageableBidir(hA, hB *hostMem, n int) (Result, error) {
	ops := dirOps{
		h2d: func() error {
			return errors.Join(w.stA.CopyHtoD(w.devA, 0, hA.b[:n]), w.stA.Synchronize(w.ctx))
		},
		d2h: func() error {
			return errors.Join(w.stB.CopyDtoH(hB.b[:n], w.devB, 0), w.stB.Synchronize(w.ctx))
		},
	}
	r, err := w.wall(KindPageable, DirBidir, hA, hB, n, ops)
	r.Note = joinNotes([]string{r.Note, "the driver's asynchronous pageable copy, each copy waited for"})
	return r, err
}

// copier measures a Copier by the wall clock, one way paired with the
// driver's synchronous copy (copierPaired); the row's Path is the path
// the Copier's Stats report for this size (the last sample's, in each
// direction). In both directions at once, two goroutines share the one
// Copier, as a program's goroutines do.
func (w *bwWork) copier(kind string, cp *transfer.Copier, hA, hB *hostMem, dir string, n int) (Result, error) {
	ctx := w.ctx
	devA, err := w.devA.Slice(0, n)
	if err != nil {
		return Result{Bench: "bw", Kind: kind, Dir: dir, Size: int64(n), Unit: GBps}, err
	}
	devB, err := w.devB.Slice(0, n)
	if err != nil {
		return Result{Bench: "bw", Kind: kind, Dir: dir, Size: int64(n), Unit: GBps}, err
	}
	var last [2]transfer.Stats // written by one goroutine each
	ops := dirOps{
		h2d: func() (err error) {
			last[0], err = cp.HtoD(ctx, devA, hA.b[:n])
			return err
		},
		d2h: func() (err error) {
			last[1], err = cp.DtoH(ctx, hA.b[:n], devA)
			return err
		},
	}
	if dir == DirBidir {
		ops.d2h = func() (err error) {
			last[1], err = cp.DtoH(ctx, hB.b[:n], devB)
			return err
		}
	}
	var r Result
	if dir == DirBidir {
		r, err = w.wall(kind, dir, hA, hB, n, ops)
	} else {
		r, err = w.copierPaired(kind, hA, dir, n, ops)
	}
	var paths []string
	for _, st := range last {
		if st.Bytes > 0 {
			if p := copierPath(st); !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	r.Path = strings.Join(paths, " / ")
	what := "a default transfer.Copier"
	r.Note = joinNotes([]string{r.Note, fmt.Sprintf("Go slice moved by %s (%s stages x %d, %d goroutines)",
		what, FormatSize(transfer.DefaultStageSize), transfer.DefaultDepth, min(transfer.DefaultParallelism, runtime.NumCPU()))})
	return r, err
}

// copierPath names the path a Copier's transfer took, from its Stats.
func copierPath(st transfer.Stats) string {
	var parts []string
	for _, p := range []struct {
		name  string
		bytes int64
	}{{"staged", st.StagedBytes}, {"direct", st.DirectBytes}} {
		switch {
		case p.bytes == st.Bytes:
			return p.name
		case p.bytes > 0:
			parts = append(parts, fmt.Sprintf("%s %d%%", p.name, p.bytes*100/st.Bytes))
		}
	}
	return strings.Join(parts, " + ")
}
