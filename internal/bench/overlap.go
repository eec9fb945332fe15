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
	cs := int(cfg.ChunkSize)
	total := cs * cfg.Chunks
	var out []Result
	emit := func(rs ...Result) {
		for _, r := range rs {
			s.progress(r)
		}
		out = append(out, rs...)
	}

	// The bound: each direction moves total bytes; with copies in both
	// directions overlapped, each runs at the bidirectional per-direction rate.
	bw, err := s.Bandwidth(ctx, BandwidthConfig{Kinds: []string{KindPinned}, Sizes: []int64{cfg.ChunkSize},
		Dirs: []string{DirBidir}, Samples: cfg.Samples, MinBytes: int64(total)})
	if err != nil {
		return bw, err
	}
	out = append(out, bw...)
	if len(bw) == 1 && !bw[0].Skipped && bw[0].Median > 0 {
		perDir := bw[0].Median / 2
		ms := float64(total) / (perDir * 1e9) * 1e3
		b := Result{Bench: "overlap", Kind: VariantBound, Dir: "pipeline", Size: int64(total), Unit: Ms,
			Median: ms, Min: ms, Max: ms, Timing: TimingComputed,
			Note: fmt.Sprintf("computed, not measured: %s each way at the bidirectional %s GB/s per direction measured just before", FormatSize(int64(total)), formatValue(perDir))}
		emit(b, fpsOf(b, cfg.Chunks))
	}

	in := randomBytes(total, 11)
	want := append([]byte(nil), in...)
	noKernel := s.kernErr != nil
	if !noKernel {
		kernels.AddBytes(want, pipelineDelta)
	}
	dev, err := s.Ctx.Alloc(total)
	if err != nil {
		return out, err
	}
	defer dev.Free()
	streams := make([]*cuda.Stream, cfg.Streams)
	for i := range streams {
		if streams[i], err = s.Ctx.NewStream(cuda.StreamNonBlocking); err != nil {
			return out, err
		}
		defer streams[i].Destroy()
	}
	// The pageable variant is the baseline: synchronous copies and the
	// kernel all on the legacy default stream. The kernel must not run
	// on one of the non-blocking streams above: cuMemcpyHtoD from pageable
	// memory returns once the source is in the driver's staging buffers,
	// before the last DMA to the device has landed, and only work on the
	// legacy stream (or a blocking stream) is ordered after that DMA.
	legacy := cuda.WrapStream(s.Ctx, 0)
	grid, block := s.grid()
	kernel := func(st *cuda.Stream, off int) error {
		if noKernel {
			return nil
		}
		return s.fns[kernels.KernelAdd].Launch(st, grid, block, 0, dev.Ptr().Add(off), uint64(cs), uint8(pipelineDelta))
	}
	note := ""
	if noKernel {
		note = "copies only, no kernel (kernels unavailable: " + s.kernErr.Error() + ")"
	}

	// pageable, synchronous, one (the legacy default) stream.
	{
		hin, hout := make([]byte, total), make([]byte, total)
		copy(hin, in)
		r := Result{Bench: "overlap", Kind: VariantPageableSync, Dir: "pipeline", Size: int64(total), Unit: Ms, Timing: TimingWall}
		var vals []float64
		for i := range cfg.Samples + 1 { // the first run warms up
			if err := ctx.Err(); err != nil {
				return out, err
			}
			poison(hout, poisonHost)
			start := time.Now()
			for c := range cfg.Chunks {
				off := c * cs
				if _, err := dev.WriteAt(hin[off:off+cs], int64(off)); err != nil {
					return out, err
				}
				// On the legacy stream, after the H2D's DMA; the
				// synchronous D2H (same stream) waits for the kernel.
				if err := kernel(legacy, off); err != nil {
					return out, err
				}
				if _, err := dev.ReadAt(hout[off:off+cs], int64(off)); err != nil {
					return out, err
				}
			}
			d := time.Since(start)
			if i == 1 {
				r.Verified = firstDiff(hout, want) < 0
			}
			if i > 0 {
				vals = append(vals, Millis(d))
			}
		}
		r.fill(vals)
		r.Note = joinNotes([]string{verifyNote(r.Verified), note})
		emit(r, fpsOf(r, cfg.Chunks))
	}

	// pinned, on 1 and on cfg.Streams streams.
	hin, err := pinmem.Alloc(total, 0, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return out, err
	}
	defer hin.Free()
	hout, err := pinmem.Alloc(total, 0, pinmem.WithDevice(s.Dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return out, err
	}
	defer hout.Free()
	copy(hin.Bytes(), in)
	counts := []int{1}
	if cfg.Streams > 1 {
		counts = append(counts, cfg.Streams)
	}
	for _, k := range counts {
		r := Result{Bench: "overlap", Kind: VariantPinnedN(k), Dir: "pipeline", Size: int64(total), Unit: Ms}
		lanes := make([]lane, k)
		for j := range lanes {
			lanes[j] = lane{s: streams[j], op: func(st *cuda.Stream, rep int) error {
				c := rep*k + j
				if c >= cfg.Chunks {
					return nil
				}
				off := c * cs
				if err := st.CopyHtoD(dev, off, hin.Bytes()[off:off+cs]); err != nil {
					return err
				}
				if err := kernel(st, off); err != nil {
					return err
				}
				return st.CopyDtoH(hout.Bytes()[off:off+cs], dev, off)
			}}
		}
		reps := (cfg.Chunks + k - 1) / k
		var vals []float64
		tnote := ""
		for i := range cfg.Samples + 1 {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			poison(hout.Bytes(), poisonHost)
			t, err := s.timeLanes(lanes, reps, true)
			if err != nil {
				return out, err
			}
			r.Timing = t.method
			if t.note != "" {
				tnote = t.note
			}
			if i == 1 {
				r.Verified = firstDiff(hout.Bytes(), want) < 0
			}
			if i > 0 {
				vals = append(vals, Millis(t.span))
			}
		}
		r.fill(vals)
		r.Note = joinNotes([]string{verifyNote(r.Verified), tnote, note})
		emit(r, fpsOf(r, cfg.Chunks))
	}
	if cfg.VecAddSize > 0 {
		rs, err := s.vecAdd(ctx, int(cfg.VecAddSize), cfg.Samples)
		emit(rs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
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
