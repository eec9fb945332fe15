package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// Pipeline variants of the overlap bench.
const (
	VariantPageableSync = "pageable-sync" // Go heap memory, synchronous copies and the kernel on the legacy default stream, one chunk at a time
	VariantPinned1      = "pinned-1stream"
	VariantBound        = "bound" // the floor set by the measured bidirectional bandwidth
)

// VariantPinnedN names the pinned variant on n streams ("pinned-4streams").
func VariantPinnedN(n int) string {
	if n == 1 {
		return VariantPinned1
	}
	return fmt.Sprintf("pinned-%dstreams", n)
}

// OverlapConfig configures Session.Overlap: an image-processing style
// pipeline of Chunks chunks of ChunkSize bytes, each copied to the device,
// changed by a light kernel (add_u8) and copied back. Zero fields take
// their defaults; out-of-range fields make Overlap fail with ErrInvalid.
type OverlapConfig struct {
	Chunks    int   `json:"chunks"`           // chunks (frames), up to 4096 (0: 16)
	ChunkSize int64 `json:"chunk_size_bytes"` // bytes per chunk (0: 32 MiB); Chunks*ChunkSize at most MaxSize
	Streams   int   `json:"streams"`          // streams of the overlapped variant, up to 64 (0: 4)
	Samples   int   `json:"samples"`          // timed samples per variant, up to MaxSamples (0: 5)
	// VecAddSize is the size of each vector in the vector-add scenario, at
	// most MaxSize (0: 64 MiB: two in, one out); -1 skips it.
	VecAddSize int64 `json:"vecadd_size_bytes"`
}

// Validate reports the first field of c that Overlap would refuse, as an
// error matching ErrInvalid; c is not changed. Overlap validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c OverlapConfig) Validate() error { return c.resolve() }

// Resolved returns c with its defaults filled in, as the measurement uses
// it (reports record it), or the error Validate gives.
func (c OverlapConfig) Resolved() (OverlapConfig, error) {
	err := c.resolve()
	return c, err
}

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *OverlapConfig) resolve() error {
	switch {
	case c.Chunks == 0:
		c.Chunks = 16
	case c.Chunks < 0 || c.Chunks > 4096:
		return invalid("OverlapConfig.Chunks %d: want 1 to 4096 (0: the default, 16)", c.Chunks)
	}
	switch {
	case c.ChunkSize == 0:
		c.ChunkSize = 32 << 20
	case c.ChunkSize < 0 || c.ChunkSize > MaxSize/int64(c.Chunks):
		return invalid("OverlapConfig.ChunkSize %d: want 1 to %d for %d chunks (0: the default, 32 MiB)", c.ChunkSize, MaxSize/int64(c.Chunks), c.Chunks)
	}
	switch {
	case c.Streams == 0:
		c.Streams = 4
	case c.Streams < 0 || c.Streams > 64:
		return invalid("OverlapConfig.Streams %d: want 1 to 64 (0: the default, 4)", c.Streams)
	}
	if err := checkSamples("OverlapConfig.Samples", &c.Samples, 5); err != nil {
		return err
	}
	switch {
	case c.VecAddSize == 0:
		c.VecAddSize = 64 << 20
	case c.VecAddSize < -1 || c.VecAddSize > MaxSize:
		return invalid("OverlapConfig.VecAddSize %d: want 1 to %d, or -1 to skip (0: the default, 64 MiB)", c.VecAddSize, int64(MaxSize))
	}
	return nil
}

const pipelineDelta = 3

// Overlap runs the pipeline with pageable memory and synchronous copies,
// with pinned memory on one stream, and with pinned memory on several
// streams round-robin, reporting ms and FPS (chunks per second), and the
// bound the measured bidirectional bandwidth sets; then the vector-add
// scenario (see VecAddSize). ctx is checked before each sample (see
// Session).
func (s *Session) Overlap(ctx context.Context, cfg OverlapConfig) ([]Result, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	o := &overlapRun{s: s, ctx: ctx, cfg: cfg, cs: int(cfg.ChunkSize), total: int(cfg.ChunkSize) * cfg.Chunks}
	if err := o.bound(); err != nil {
		return o.out, err
	}
	in := randomBytes(o.total, 11)
	o.want = append([]byte(nil), in...)
	if s.kernErr == nil {
		kernels.AddBytes(o.want, pipelineDelta)
	} else {
		o.note = "copies only, no kernel (kernels unavailable: " + s.kernErr.Error() + ")"
	}
	dev, err := s.Ctx.Alloc(o.total)
	if err != nil {
		return o.out, err
	}
	defer dev.Free()
	o.dev = dev
	streams := make([]*cuda.Stream, cfg.Streams)
	for i := range streams {
		if streams[i], err = s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
			return o.out, err
		}
		defer streams[i].Destroy()
	}
	if err := o.pageable(in); err != nil {
		return o.out, err
	}
	if err := o.pinned(in, streams); err != nil {
		return o.out, err
	}
	if cfg.VecAddSize > 0 {
		rs, err := s.vecAdd(ctx, int(cfg.VecAddSize), cfg.Samples)
		o.emit(rs...)
		if err != nil {
			return o.out, err
		}
	}
	return o.out, nil
}

// overlapRun is one run of Overlap: total bytes in chunks of cs, the
// device memory they pass through and the output they should come back as.
type overlapRun struct {
	s         *Session
	ctx       context.Context
	cfg       OverlapConfig
	cs, total int
	want      []byte
	dev       *cuda.DeviceBuffer
	note      string // every measured row's, when there is no kernel
	out       []Result
}

// emit adds rows, each also a progress line.
func (o *overlapRun) emit(rs ...Result) {
	for _, r := range rs {
		o.s.progress(r)
	}
	o.out = append(o.out, rs...)
}

// bound measures the bidirectional bandwidth and adds the bound it sets:
// each direction moves total bytes; with copies in both directions
// overlapped, each runs at the bidirectional per-direction rate.
func (o *overlapRun) bound() error {
	bw, err := o.s.Bandwidth(o.ctx, BandwidthConfig{Kinds: []string{KindPinned}, Sizes: []int64{o.cfg.ChunkSize},
		Dirs: []string{DirBidir}, Samples: o.cfg.Samples, MinBytes: int64(o.total)})
	o.out = append(o.out, bw...)
	if err != nil {
		return err
	}
	if len(bw) == 1 && !bw[0].Skipped && bw[0].Median > 0 {
		perDir := bw[0].Median / 2
		ms := float64(o.total) / (perDir * 1e9) * 1e3
		b := Result{Bench: "overlap", Kind: VariantBound, Dir: "pipeline", Size: int64(o.total), Unit: Ms,
			Median: ms, Min: ms, Max: ms, Timing: TimingComputed,
			Note: fmt.Sprintf("computed, not measured: %s each way at the bidirectional %s GB/s per direction measured just before", FormatSize(int64(o.total)), formatValue(perDir))}
		o.emit(b, fpsOf(b, o.cfg.Chunks))
	}
	return nil
}

// kernel queues the pipeline's kernel on the chunk at off, unless there
// are no kernels.
func (o *overlapRun) kernel(st *cuda.Stream, off int) error {
	if o.s.kernErr != nil {
		return nil
	}
	grid, block := o.s.grid()
	return o.s.fns[kernels.KernelAdd].Launch(st, grid, block, 0, o.dev.Ptr().Add(off), uint64(o.cs), uint8(pipelineDelta))
}

// samples runs run once to warm up and then cfg.Samples times, hout
// poisoned before each run; it returns the timed runs' milliseconds and
// whether the first timed run's output, hout, was the wanted one.
func (o *overlapRun) samples(hout []byte, run func() (time.Duration, error)) (ms []float64, verified bool, err error) {
	for i := range o.cfg.Samples + 1 {
		if err := o.ctx.Err(); err != nil {
			return nil, false, err
		}
		poison(hout, poisonHost)
		d, err := run()
		if err != nil {
			return nil, false, err
		}
		if i == 1 {
			verified = firstDiff(hout, o.want) < 0
		}
		if i > 0 {
			ms = append(ms, Millis(d))
		}
	}
	return ms, verified, nil
}

// pageable measures the baseline: pageable memory, synchronous copies and
// the kernel all on the legacy default stream. The kernel must not run on
// a non-blocking stream: cuMemcpyHtoD from pageable memory returns once
// the source is in the driver's staging buffers, before the last DMA to
// the device has landed, and only work on the legacy stream (or a
// blocking stream) is ordered after that DMA.
func (o *overlapRun) pageable(in []byte) error {
	legacy := cuda.WrapStream(o.s.Ctx, 0)
	hin, hout := make([]byte, o.total), make([]byte, o.total)
	copy(hin, in)
	r := Result{Bench: "overlap", Kind: VariantPageableSync, Dir: "pipeline", Size: int64(o.total), Unit: Ms, Timing: TimingWall}
	vals, verified, err := o.samples(hout, func() (time.Duration, error) {
		start := time.Now()
		for c := range o.cfg.Chunks {
			off := c * o.cs
			if _, err := o.dev.WriteAt(hin[off:off+o.cs], int64(off)); err != nil {
				return 0, err
			}
			// On the legacy stream, after the H2D's DMA; the
			// synchronous D2H (same stream) waits for the kernel.
			if err := o.kernel(legacy, off); err != nil {
				return 0, err
			}
			if _, err := o.dev.ReadAt(hout[off:off+o.cs], int64(off)); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	})
	if err != nil {
		return err
	}
	r.Verified = verified
	r.fill(vals)
	r.Note = joinNotes([]string{verifyNote(r.Verified), o.note})
	o.emit(r, fpsOf(r, o.cfg.Chunks))
	return nil
}

// pinned measures pinned memory with asynchronous copies, chunks dealt
// round-robin to one stream and then to every stream of streams.
func (o *overlapRun) pinned(in []byte, streams []*cuda.Stream) error {
	hin, err := pinmem.Alloc(o.total, 0, pinmem.WithDevice(o.s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return err
	}
	defer hin.Free()
	hout, err := pinmem.Alloc(o.total, 0, pinmem.WithDevice(o.s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return err
	}
	defer hout.Free()
	copy(hin.Bytes(), in)
	counts := []int{1}
	if o.cfg.Streams > 1 {
		counts = append(counts, o.cfg.Streams)
	}
	for _, k := range counts {
		if err := o.pinnedOn(streams[:k], hin.Bytes(), hout.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

// pinnedOn measures the pipeline on streams, chunk c on stream c mod
// len(streams), from the pinned hin to the pinned hout.
func (o *overlapRun) pinnedOn(streams []*cuda.Stream, hin, hout []byte) error {
	k, cs := len(streams), o.cs
	r := Result{Bench: "overlap", Kind: VariantPinnedN(k), Dir: "pipeline", Size: int64(o.total), Unit: Ms}
	lanes := make([]lane, k)
	for j := range lanes {
		lanes[j] = lane{s: streams[j], op: func(st *cuda.Stream, rep int) error {
			c := rep*k + j
			if c >= o.cfg.Chunks {
				return nil
			}
			off := c * cs
			if err := st.CopyHtoD(o.dev, off, hin[off:off+cs]); err != nil {
				return err
			}
			if err := o.kernel(st, off); err != nil {
				return err
			}
			return st.CopyDtoH(hout[off:off+cs], o.dev, off)
		}}
	}
	reps := (o.cfg.Chunks + k - 1) / k
	tnote := ""
	vals, verified, err := o.samples(hout, func() (time.Duration, error) {
		t, err := o.s.timeLanes(lanes, reps, true)
		if err != nil {
			return 0, err
		}
		r.Timing = t.method
		if t.note != "" {
			tnote = t.note
		}
		return t.span, nil
	})
	if err != nil {
		return err
	}
	r.Verified = verified
	r.fill(vals)
	r.Note = joinNotes([]string{verifyNote(r.Verified), tnote, o.note})
	o.emit(r, fpsOf(r, o.cfg.Chunks))
	return nil
}

func verifyNote(ok bool) string {
	if ok {
		return ""
	}
	return verifyFailedMark + ": output differs from input + delta"
}

// fpsOf converts a pipeline time in ms into frames (chunks) per second.
func fpsOf(r Result, chunks int) Result {
	f := r
	f.Unit = FPS
	conv := func(ms float64) float64 {
		if ms <= 0 {
			return 0
		}
		return float64(chunks) / (ms / 1e3)
	}
	f.Median, f.Min, f.Max = conv(r.Median), conv(r.Max), conv(r.Min)
	f.Note = fmt.Sprintf("%d chunks of %s as frames", chunks, FormatSize(r.Size/int64(max(chunks, 1))))
	return f
}
