// Command measure, the imagepipeline example's measurement program,
// re-measures a claim of the article pinmem grew from, on CUDA page-locked
// memory: that an image-processing pipeline went from 120 to 210 frames per
// second by using pinned memory and several streams.
//
// Each frame is an RGBA image (1080p and 4K by default). It goes to the GPU,
// a 3x3 box blur runs on it (kernel.cu), and the blurred frame comes back.
// Four ways of running the same frames are timed in one run:
//
//   - naive: the frames are ordinary Go memory, allocated once; each frame
//     is copied in synchronously, blurred, waited for and copied out
//     synchronously before the next one starts;
//   - pinned, one stream: the frames live in pinned memory (pinmem.Alloc)
//     and every copy and kernel is queued on one stream, so the copies run
//     at DMA speed but never overlap each other;
//   - pinned, N streams: the same, with frame i on stream i mod N, so that
//     one frame's copy in overlaps another's copy out (the GPU has separate
//     copy engines for the two directions);
//   - Go frames through transfer.Pipeline: the frames are Go memory again,
//     and pinmem's Pipeline stages them through pinned buffers over N
//     streams.
//
// Beside the frame rates it prints the bound the copies set: a frame's bytes
// in and out at the rate measured with both directions copying at once, and
// the share of that bound each mode reaches; for Go frames through the
// Pipeline also the share of the staged bound: Go frames staged in and out
// at once by two transfer.Copiers, CPU copies included.
//
// The frames of a run cycle through a ring of -ring input and output frames
// (a capture ring, allocated once); the inputs are not refilled during a run.
// After every run each output frame of the ring is compared, byte for byte,
// with the blur computed on the CPU (blurRef): a wrong pixel is an error, not
// a figure. With -cref it also runs the naive and the N-stream loops written
// in C against the driver API (cref/imagepipeline), on the same kernel.ptx.
//
// With -json the table goes to standard error and standard output gets one
// JSON line per figure, a result row of pinmem's result files
// (docs/results/result.schema.json): every mode, the two bounds and the C
// baseline's rows, as `pinmem bench all --imagepipeline BIN` reads them.
//
// Usage:
//
//	go run ./examples/imagepipeline/measure [-res 1080p,4k] [-frames 240] [-ring 8] [-streams 4] [-reps 3] [-device 0] [-cref cref/bin/imagepipeline] [-json]
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/imagepipeline/kernel"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/transfer"
)

// kernelPTX is the example's kernel (../kernel).
var kernelPTX = kernel.PTX

// The article's figures, in frames per second.
const (
	articleBefore = 120.0
	articleAfter  = 210.0
)

// sources is how many distinct input frames the ring holds (slot j holds
// source j mod sources): few enough that their CPU blurs are quick to
// compute, more than one so that a frame delivered to the wrong slot shows.
const sources = 2

// Resolution is a frame size in pixels.
type Resolution struct {
	Name          string
	Width, Height int
}

// Bytes is the size of an RGBA frame.
func (r Resolution) Bytes() int { return r.Width * r.Height * 4 }

var resolutions = map[string]Resolution{
	"720p":  {"720p", 1280, 720},
	"1080p": {"1080p", 1920, 1080},
	"4k":    {"4K", 3840, 2160},
}

type config struct {
	res     []Resolution
	frames  int // frames per timed run
	ring    int // frames in the input and output rings, a multiple of streams
	streams int
	reps    int
	device  int
	cref    string
	// jsonOut, when not nil, receives the figures as result rows, one
	// JSON line each (resultRow), as each resolution finishes.
	jsonOut io.Writer
}

func main() {
	harness.Main("imagepipeline", parseFlags, func(cfg config) error {
		text := io.Writer(os.Stdout)
		if cfg.jsonOut != nil {
			text = os.Stderr
		}
		_, err := run(context.Background(), cfg, text)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("imagepipeline", stderr)
	res := fs.String("res", "1080p,4k", "comma-separated resolutions: 720p, 1080p, 4k or WIDTHxHEIGHT")
	frames := fs.Int("frames", 240, "frames per timed run (at least -ring)")
	ring := fs.Int("ring", 8, "frames in the input and output rings (a multiple of -streams)")
	streams := fs.Int("streams", 4, "streams of the N-stream modes")
	reps := fs.Int("reps", 3, "timed runs per mode (the median frame rate is printed)")
	device := fs.Int("device", 0, "GPU ordinal")
	cref := fs.String("cref", "", "path of cref/bin/imagepipeline: also run the naive and N-stream loops written in C")
	asJSON := fs.Bool("json", false, "print the figures as JSON lines of pinmem's result rows on standard output, the table on standard error")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	cfg := config{frames: *frames, ring: *ring, streams: *streams, reps: *reps, device: *device, cref: *cref}
	if *asJSON {
		cfg.jsonOut = os.Stdout
	}
	for _, name := range strings.Split(*res, ",") {
		r, ok := resolutions[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			var w, h int
			if n, err := fmt.Sscanf(name, "%dx%d", &w, &h); err != nil || n != 2 || w < 1 || h < 1 || fmt.Sprintf("%dx%d", w, h) != name {
				return config{}, fmt.Errorf("-res: unknown resolution %q", name)
			}
			r = Resolution{name, w, h}
		}
		cfg.res = append(cfg.res, r)
	}
	switch {
	case cfg.streams < 1 || cfg.streams > 64:
		return config{}, fmt.Errorf("-streams %d: want 1 to 64", cfg.streams)
	case cfg.ring < 1 || cfg.ring%cfg.streams != 0:
		return config{}, fmt.Errorf("-ring %d: want a positive multiple of -streams (%d)", cfg.ring, cfg.streams)
	case cfg.frames < cfg.ring:
		return config{}, fmt.Errorf("-frames %d: want at least -ring (%d), so that every output frame is written", cfg.frames, cfg.ring)
	case cfg.reps < 1:
		return config{}, fmt.Errorf("-reps %d: want at least 1", cfg.reps)
	case cfg.device < 0:
		return config{}, fmt.Errorf("-device %d: want 0 or more", cfg.device)
	}
	return cfg, nil
}

// Mode names, in the order they run.
const (
	ModeNaive    = "naive"
	ModePinned1  = "pinned-1"
	ModePinnedN  = "pinned-n"
	ModePipeline = "pipeline"
)

// Row is one mode's median frame rate at one resolution, with the
// slowest and fastest of its Samples timed runs.
type Row struct {
	Res      Resolution
	Mode     string
	FPS      float64
	Min, Max float64
	Samples  int
	// StagedShare, for the Pipeline from Go memory, is the median over the
	// timed runs of the run's frame rate over the staged bound measured
	// just before it (the two side by side, so that drift of the host
	// between the bound and the Pipeline does not move the ratio).
	StagedShare float64
}

// Bound is the frame rate the copies allow at one resolution: BidirGBps is
// the measured rate of pinned copies with both directions running at once,
// in GB/s of both directions' bytes, and FPS that rate over a frame's bytes
// in and out.
type Bound struct {
	Res       Resolution
	BidirGBps float64 // pinned copies, both directions at once
	FPS       float64 // a frame's bytes in and out at BidirGBps
	// StagedGBps is the rate of Go memory staged by two transfer.Copiers
	// at once, one copying frames in and one copying them out: the CPU's
	// share of staging included, the bound of Go frames through a
	// Pipeline. StagedFPS is a frame's bytes in and out at that rate.
	StagedGBps float64
	StagedFPS  float64
}

// Result is what run measured.
type Result struct {
	Rows   []Row
	Bounds []Bound
	C      []CRow // with -cref
}

func (r Result) row(res Resolution, mode string) Row {
	for _, x := range r.Rows {
		if x.Res == res && x.Mode == mode {
			return x
		}
	}
	return Row{}
}

// run measures every resolution and mode and prints the table.
func run(ctx context.Context, cfg config, w io.Writer) (res Result, err error) {
	g, err := harness.OpenGPU(cfg.device)
	if err != nil {
		return res, err
	}
	gpu, name, props := g.Ctx, g.Name, g.Props
	mod, blur, err := g.Kernel(kernelPTX, "blur3x3_rgba")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()

	fmt.Fprintf(w, "imagepipeline: 3x3 box blur of RGBA frames on %s, %d frames a run through a ring of %d, %d streams, median of %d runs\n",
		name, cfg.frames, cfg.ring, cfg.streams, cfg.reps)
	for _, r := range cfg.res {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		p := &pipe{ctx: ctx, cfg: cfg, res: r, gpu: gpu, blur: blur, grid: cuda.D1(8 * max(props.Multiprocessors, 1)), block: cuda.D1(256)}
		rows, bound, err := p.measure(ctx)
		if cerr := p.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", r.Name, err)
		}
		res.Rows = append(res.Rows, rows...)
		res.Bounds = append(res.Bounds, bound)
		if cfg.jsonOut != nil {
			if err := writeRows(cfg.jsonOut, resolutionRows(cfg, rows, bound)); err != nil {
				return res, err
			}
		}
		fmt.Fprintf(w, "%s (%dx%d, %.1f MiB a frame): pinned copies both ways at once run at %.1f GB/s: at most %.0f FPS\n",
			r.Name, r.Width, r.Height, float64(r.Bytes())/(1<<20), bound.BidirGBps, bound.FPS)
		fmt.Fprintf(w, "  Go frames staged both ways at once by two Copiers run at %.1f GB/s: at most %.0f FPS from Go memory\n",
			bound.StagedGBps, bound.StagedFPS)
		fmt.Fprintf(w, "  %-44s %9s %9s %11s\n", "mode", "FPS", "speed-up", "% of bound")
		naive := rows[0].FPS
		for _, x := range rows {
			extra := ""
			if x.Mode == ModePipeline && bound.StagedFPS > 0 {
				extra = fmt.Sprintf("  (%.1f%% of the staged bound; %.1f%% of it measured beside each run)", 100*x.FPS/bound.StagedFPS, 100*x.StagedShare)
			}
			fmt.Fprintf(w, "  %-44s %9.1f %8.2fx %10.1f%%%s\n", modeName(x.Mode, cfg.streams), x.FPS, x.FPS/naive, 100*x.FPS/bound.FPS, extra)
		}
	}
	fmt.Fprintf(w, "article:  pinned memory and streams took a pipeline from %.0f to %.0f FPS (%.2fx)\n",
		articleBefore, articleAfter, articleAfter/articleBefore)
	for i, r := range cfg.res {
		nv, pn := res.row(r, ModeNaive), res.row(r, ModePinnedN)
		fmt.Fprintf(w, "measured: %s: naive %.1f -> pinned, %d streams %.1f FPS (%.2fx), %.1f%% of the copy bound\n",
			r.Name, nv.FPS, cfg.streams, pn.FPS, pn.FPS/nv.FPS, 100*pn.FPS/res.Bounds[i].FPS)
	}
	if cfg.cref != "" {
		if res.C, err = compareWithC(ctx, cfg, res, w); err != nil {
			return res, err
		}
		if cfg.jsonOut != nil {
			if err := writeRows(cfg.jsonOut, cRows(cfg, res.C)); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

func modeName(mode string, streams int) string {
	switch mode {
	case ModeNaive:
		return "naive: Go frames, synchronous, one at a time"
	case ModePinned1:
		return "pinned frames, one stream"
	case ModePinnedN:
		return fmt.Sprintf("pinned frames, %d streams", streams)
	default:
		return fmt.Sprintf("Go frames, transfer.Pipeline, %d streams", streams)
	}
}

// pipe holds the memory of one resolution's runs.
type pipe struct {
	ctx         context.Context // bounds the Copier's and the Pipeline's Close
	cfg         config
	res         Resolution
	gpu         *cuda.Context
	blur        *cuda.Function
	grid, block cuda.Dim3

	refs          [sources][]byte // the CPU blur of each source frame
	goIn, goOut   []byte          // the Go rings, ring frames each
	pinIn, pinOut *pinmem.Buffer  // the pinned rings
	naiveStream   *cuda.Stream    // StreamBlocking, for the naive mode
	streams       []*cuda.Stream
	devIn, devOut []*cuda.DeviceBuffer // one frame each, per stream
	staged        *stager              // the staged bound's Copiers and device rings
	cleanup       []func() error
}

func (p *pipe) close() error {
	var err error
	for i := len(p.cleanup) - 1; i >= 0; i-- {
		err = errors.Join(err, p.cleanup[i]())
	}
	p.cleanup = nil
	return err
}

// frame returns frame i of a ring.
func (p *pipe) frame(ring []byte, i int) []byte {
	n := p.res.Bytes()
	i %= p.cfg.ring
	return ring[i*n : (i+1)*n]
}

// setup allocates the rings and device frames and fills the inputs.
func (p *pipe) setup() error {
	n := p.res.Bytes()
	src := make([][]byte, sources)
	for k := range src {
		src[k] = make([]byte, n)
		fillRandom(src[k], uint64(k+1))
		p.refs[k] = make([]byte, n)
		kernel.Blur(p.refs[k], src[k], p.res.Width, p.res.Height)
	}
	// Pinned rings: one pinned buffer each, split into frames.
	var err error
	if p.pinIn, err = pinmem.Alloc(n*p.cfg.ring, 0); err != nil {
		return err
	}
	p.cleanup = append(p.cleanup, p.pinIn.Free)
	if p.pinOut, err = pinmem.Alloc(n*p.cfg.ring, 0); err != nil {
		return err
	}
	p.cleanup = append(p.cleanup, p.pinOut.Free)
	// Go rings: allocated once, like a capture ring.
	p.goIn, p.goOut = make([]byte, n*p.cfg.ring), make([]byte, n*p.cfg.ring)
	for j := range p.cfg.ring {
		copy(p.frame(p.goIn, j), src[j%sources])
		copy(p.frame(p.pinIn.Bytes(), j), src[j%sources])
	}
	// The naive mode's stream synchronizes with the synchronous copies
	// (StreamBlocking): a synchronous copy from pageable memory may return
	// before its bytes reach the device, and only such a stream orders the
	// kernel after them.
	if p.naiveStream, err = p.gpu.NewStream(cuda.StreamBlocking); err != nil {
		return err
	}
	p.cleanup = append(p.cleanup, p.naiveStream.Destroy)
	for range p.cfg.streams {
		s, err := p.gpu.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		p.cleanup = append(p.cleanup, s.Destroy)
		p.streams = append(p.streams, s)
		for _, dst := range []*[]*cuda.DeviceBuffer{&p.devIn, &p.devOut} {
			d, err := p.gpu.Alloc(n)
			if err != nil {
				return err
			}
			p.cleanup = append(p.cleanup, d.Free)
			*dst = append(*dst, d)
		}
	}
	return nil
}

// measure times every mode and the copy bound.
func (p *pipe) measure(ctx context.Context) ([]Row, Bound, error) {
	if err := p.setup(); err != nil {
		return nil, Bound{}, err
	}
	bound, err := p.bound()
	if err != nil {
		return nil, Bound{}, err
	}
	pl, err := p.newPipeline()
	if err != nil {
		return nil, Bound{}, err
	}
	var rows []Row
	for _, mode := range []string{ModeNaive, ModePinned1, ModePinnedN, ModePipeline} {
		row, err := p.measureMode(ctx, pl, mode)
		if err != nil {
			return nil, Bound{}, err
		}
		rows = append(rows, row)
	}
	return rows, bound, nil
}

// measureMode times one mode: a warm-up run of one ring's frames, then
// p.cfg.reps timed runs of p.cfg.frames, each run's output checked. For
// the Pipeline it measures the staged bound again before each timed run
// and reports the run's share of it.
func (p *pipe) measureMode(ctx context.Context, pl *transfer.Pipeline, mode string) (Row, error) {
	in, out := p.pinIn.Bytes(), p.pinOut.Bytes()
	if mode == ModeNaive || mode == ModePipeline {
		in, out = p.goIn, p.goOut
	}
	var fps, shares []float64
	for rep := range p.cfg.reps + 1 {
		clear(out) // a frame that never arrived cannot pass the check
		frames := p.cfg.frames
		if rep == 0 {
			frames = p.cfg.ring // warm-up: first launch, first pipeline run
		}
		var staged float64
		if mode == ModePipeline && rep > 0 {
			var err error
			if staged, err = p.warmStagedRate(); err != nil {
				return Row{}, fmt.Errorf("staged bound: %w", err)
			}
			clear(out)
		}
		start := time.Now()
		if err := p.runFrames(ctx, pl, mode, in, out, frames); err != nil {
			return Row{}, fmt.Errorf("%s: %w", mode, err)
		}
		elapsed := time.Since(start)
		if err := p.check(out); err != nil {
			return Row{}, fmt.Errorf("%s: %w", mode, err)
		}
		if rep > 0 {
			fps = append(fps, float64(frames)/elapsed.Seconds())
			if staged > 0 {
				shares = append(shares, fps[len(fps)-1]*float64(2*p.res.Bytes())/staged)
			}
		}
	}
	row := Row{Res: p.res, Mode: mode, FPS: median(fps), Min: slices.Min(fps), Max: slices.Max(fps), Samples: len(fps)}
	if len(shares) > 0 {
		row.StagedShare = median(shares)
	}
	return row, nil
}

// warmStagedRate measures the staged bound just before a timed Pipeline
// run, after an untimed measurement (as the bound has), so that both
// start with the staging engine and its goroutines warm.
func (p *pipe) warmStagedRate() (float64, error) {
	var staged float64
	for range 2 {
		var err error
		if staged, err = p.staged.rate(); err != nil {
			return 0, err
		}
	}
	return staged, nil
}

// runFrames processes frames frames from in to out in mode: in and out
// are the rings the mode works on, and pl is the Pipeline of ModePipeline.
func (p *pipe) runFrames(ctx context.Context, pl *transfer.Pipeline, mode string, in, out []byte, frames int) error {
	switch mode {
	case ModeNaive:
		return p.naive(in, out, frames)
	case ModePinned1:
		return p.async(in, out, frames, 1)
	case ModePinnedN:
		return p.async(in, out, frames, p.cfg.streams)
	default:
		// One Run per pass over the ring (the last one maybe
		// partial): Run returns when its frames are out.
		for f := 0; f < frames; f += p.cfg.ring {
			n := min(frames-f, p.cfg.ring) * p.res.Bytes()
			if _, err := pl.Run(ctx, in[:n], out[:n]); err != nil {
				return err
			}
		}
		return nil
	}
}

// naive is the article's starting point: one frame at a time, every copy
// synchronous. DeviceBuffer.WriteAt and ReadAt return when the bytes are in
// place; from Go memory the driver copies them through its own pinned
// buffer.
func (p *pipe) naive(in, out []byte, frames int) error {
	s, dIn, dOut := p.naiveStream, p.devIn[0], p.devOut[0]
	for f := range frames {
		if _, err := dIn.WriteAt(p.frame(in, f), 0); err != nil {
			return err
		}
		if err := p.launch(s, dIn, dOut); err != nil {
			return err
		}
		if err := s.Synchronize(context.Background()); err != nil {
			return err
		}
		if _, err := dOut.ReadAt(p.frame(out, f), 0); err != nil {
			return err
		}
	}
	return nil
}

// async queues every frame's copy in, blur and copy out, frame f on stream
// f mod streams with that stream's device frames, then waits for all of
// them. Stream.CopyHtoD and CopyDtoH return at once; from pinned memory the
// copy engines run them while the CPU queues the next frames. Output frame
// f and f+ring share a buffer, and so do device frames f and f+streams: as
// ring is a multiple of streams, both pairs are on the same stream, which
// runs them in order.
func (p *pipe) async(in, out []byte, frames, streams int) error {
	for f := range frames {
		k := f % streams
		s, dIn, dOut := p.streams[k], p.devIn[k], p.devOut[k]
		if err := s.CopyHtoD(dIn, 0, p.frame(in, f)); err != nil {
			return err
		}
		if err := p.launch(s, dIn, dOut); err != nil {
			return err
		}
		if err := s.CopyDtoH(p.frame(out, f), dOut, 0); err != nil {
			return err
		}
	}
	var err error
	for _, s := range p.streams[:streams] {
		err = errors.Join(err, s.Synchronize(context.Background()))
	}
	return err
}

func (p *pipe) launch(s *cuda.Stream, in, out *cuda.DeviceBuffer) error {
	return p.blur.Launch(s, p.grid, p.block, 0, in.Ptr(), out.Ptr(), uint32(p.res.Width), uint32(p.res.Height))
}

// newPipeline makes the transfer.Pipeline of the last mode: one chunk is
// one frame. The Pipeline gives the work one device buffer per chunk, and
// a blur cannot run in place, so the work blurs into a scratch frame of its
// stream and copies the result back into the chunk's buffer, from where the
// Pipeline copies it out.
func (p *pipe) newPipeline() (*transfer.Pipeline, error) {
	cp, err := transfer.New(p.gpu)
	if err != nil {
		return nil, err
	}
	p.cleanup = append(p.cleanup, func() error { return cp.Close(p.ctx) })
	var mu sync.Mutex
	scratch := map[*cuda.Stream]*cuda.DeviceBuffer{}
	p.cleanup = append(p.cleanup, func() error {
		var err error
		for _, d := range scratch {
			err = errors.Join(err, d.Free())
		}
		return err
	})
	work := func(s *cuda.Stream, ch transfer.Chunk) error {
		mu.Lock()
		tmp, ok := scratch[s]
		if !ok {
			var err error
			if tmp, err = p.gpu.Alloc(p.res.Bytes()); err != nil {
				mu.Unlock()
				return err
			}
			scratch[s] = tmp
		}
		mu.Unlock()
		if err := p.launch(s, ch.Dev, tmp); err != nil {
			return err
		}
		return s.CopyDtoD(ch.Dev, 0, tmp, 0, ch.Len)
	}
	pl, err := cp.NewPipeline(
		transfer.WithChunkSize(p.res.Bytes()),
		transfer.WithStreams(p.cfg.streams),
		transfer.WithWork(work),
		transfer.WithPinStages(true), // pin the staging buffers now, not in the first Run
	)
	if err != nil {
		return nil, err
	}
	p.cleanup = append(p.cleanup, func() error { return pl.Close(p.ctx) })
	return pl, nil
}

// bound measures pinned copies with both directions at once: frame-sized
// copies in on one stream and out on another, 2*ring of each, median of
// reps runs. Its frame rate is that rate over a frame's bytes in and out.
func (p *pipe) bound() (Bound, error) {
	if len(p.streams) < 2 {
		s, err := p.gpu.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			return Bound{}, err
		}
		p.cleanup = append(p.cleanup, s.Destroy)
		p.streams = append(p.streams, s) // used by bound only: modes use streams[:cfg.streams]
	}
	up, down := p.streams[0], p.streams[1]
	n, count := p.res.Bytes(), 2*p.cfg.ring
	var rates []float64
	for rep := range p.cfg.reps + 1 {
		start := time.Now()
		for i := range count {
			if err := up.CopyHtoD(p.devIn[0], 0, p.frame(p.pinIn.Bytes(), i)); err != nil {
				return Bound{}, err
			}
			if err := down.CopyDtoH(p.frame(p.pinOut.Bytes(), i), p.devOut[0], 0); err != nil {
				return Bound{}, err
			}
		}
		if err := errors.Join(up.Synchronize(context.Background()), down.Synchronize(context.Background())); err != nil {
			return Bound{}, err
		}
		if rep > 0 {
			rates = append(rates, float64(2*count*n)/time.Since(start).Seconds())
		}
	}
	rate := median(rates)
	if p.staged == nil {
		st, err := p.newStager()
		if err != nil {
			return Bound{}, err
		}
		p.staged = st
	}
	staged, err := p.stagedBound()
	if err != nil {
		return Bound{}, err
	}
	return Bound{Res: p.res, BidirGBps: rate / 1e9, FPS: rate / float64(2*n),
		StagedGBps: staged / 1e9, StagedFPS: staged / float64(2*n)}, nil
}

// stager measures Go memory staged both ways at once: one Copier copies
// the Go input ring in, whole, while another copies a device ring out
// into the Go output ring, twice each, staging every byte (the Pipeline
// stages Go memory too). Whole rings make large transfers, which the
// Copier stages at its best rate.
type stager struct {
	p    *pipe
	cps  [2]*transfer.Copier
	devs [2]*cuda.DeviceBuffer
}

// newStager makes the two Copiers and device rings; p.close releases them.
func (p *pipe) newStager() (*stager, error) {
	st := &stager{p: p}
	for i := range st.cps {
		cp, err := transfer.New(p.gpu)
		if err != nil {
			return nil, err
		}
		p.cleanup = append(p.cleanup, func() error { return cp.Close(p.ctx) })
		st.cps[i] = cp
	}
	for i := range st.devs {
		d, err := p.gpu.Alloc(len(p.goIn))
		if err != nil {
			return nil, err
		}
		p.cleanup = append(p.cleanup, d.Free)
		st.devs[i] = d
	}
	return st, nil
}

// rate runs one measurement and returns bytes per second, both
// directions counted.
func (st *stager) rate() (float64, error) {
	const passes = 2
	p := st.p
	var errs [2]error
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		for range passes {
			if _, err := st.cps[0].HtoD(p.ctx, st.devs[0], p.goIn); err != nil {
				errs[0] = err
				return
			}
		}
	})
	wg.Go(func() {
		for range passes {
			if _, err := st.cps[1].DtoH(p.ctx, p.goOut, st.devs[1]); err != nil {
				errs[1] = err
				return
			}
		}
	})
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return 0, err
	}
	return float64(2*passes*len(p.goIn)) / time.Since(start).Seconds(), nil
}

// stagedBound is the median of reps measurements of p.staged after one
// untimed.
func (p *pipe) stagedBound() (float64, error) {
	var rates []float64
	for rep := range p.cfg.reps + 1 {
		r, err := p.staged.rate()
		if err != nil {
			return 0, err
		}
		if rep > 0 {
			rates = append(rates, r)
		}
	}
	return median(rates), nil
}

// check compares every output frame of the ring with the CPU's blur of the
// input frame it came from.
func (p *pipe) check(out []byte) error {
	for j := range p.cfg.ring {
		got, want := p.frame(out, j), p.refs[j%sources]
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && got[i] == want[i] {
				i++
			}
			px := i / 4
			return fmt.Errorf("output frame %d, pixel (%d, %d), channel %d: got %d, want %d",
				j, px%p.res.Width, px/p.res.Width, i%4, got[i], want[i])
		}
	}
	return nil
}

func fillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
