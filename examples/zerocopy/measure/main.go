// Command measure, the zerocopy example's measurement program, re-measures a
// claim of the article pinmem grew from, on CUDA page-locked memory: that
// zero-copy memory (pinned host memory mapped into the GPU's address space,
// which a kernel reads directly over the bus) speeds up a batch-32 ResNet-50
// inference when the input is read only once.
//
// The input is what a ResNet-50 takes: 32 images of 224x224 pixels, 3
// float32 channels each (HWC), about 18 MiB. A kernel (kernel.cu) normalises
// it with ImageNet's per-channel mean and standard deviation, two ways:
//
//   - zero-copy: the kernel reads the mapped pinned buffer itself;
//   - copy + kernel: the same pinned buffer is first copied to device
//     memory, and the kernel reads that.
//
// Each is timed with events on one stream, from the start of the work to
// the normalised batch in device memory, with the kernel sweeping its input
// 1, 2, 4 and 8 times: a kernel that reads its input more than once pays for
// the bus on every sweep with zero-copy, and once with a copy. The program
// prints the latency of each, the winner and the crossover, and checks every
// output value against the CPU's after every run.
//
// Usage:
//
//	go run ./examples/zerocopy/measure [-batch 32] [-passes 1,2,4,8] [-reps 20]
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/examples/zerocopy/kernel"
)

// kernelPTX is the example's kernel (../kernel).
var kernelPTX = kernel.PTX

// The input of a ResNet-50: 224x224 RGB.
const (
	imageSide = 224
	channels  = kernel.Channels
)

type config struct {
	batch  int
	passes []int
	reps   int
}

func main() {
	harness.Main("zerocopy", parseFlags, func(cfg config) error {
		_, err := run(context.Background(), cfg, os.Stdout)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("zerocopy", stderr)
	batch := fs.Int("batch", 32, "images in the batch")
	passes := fs.String("passes", "1,2,4,8", "comma-separated numbers of times the kernel reads its input")
	reps := fs.Int("reps", 20, "timed runs per cell (the median is printed)")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	cfg := config{batch: *batch, reps: *reps}
	for _, s := range strings.Split(*passes, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p < 1 || p > 1024 {
			return config{}, fmt.Errorf("-passes: %q is not a count from 1 to 1024", s)
		}
		cfg.passes = append(cfg.passes, p)
	}
	if cfg.batch < 1 || cfg.batch > 4096 {
		return config{}, fmt.Errorf("-batch %d: want 1 to 4096", cfg.batch)
	}
	if cfg.reps < 1 {
		return config{}, fmt.Errorf("-reps %d: want at least 1", cfg.reps)
	}
	return cfg, nil
}

// Row is one number of passes: the median latency of each way.
type Row struct {
	Passes   int
	ZeroCopy time.Duration // the kernel reading mapped host memory
	Explicit time.Duration // the copy to device memory, then the kernel
}

// Winner names the faster way.
func (r Row) Winner() string {
	if r.ZeroCopy < r.Explicit {
		return "zero-copy"
	}
	return "copy + kernel"
}

func run(ctx context.Context, cfg config, w io.Writer) (rows []Row, err error) {
	g, err := harness.OpenGPU(0)
	if err != nil {
		return nil, err
	}
	if !g.Props.CanMapHostMemory {
		return nil, fmt.Errorf("%s cannot map host memory: %w", g.Name, cuda.ErrNotSupported)
	}
	mod, normalize, err := g.Kernel(kernelPTX, "normalize_hwc")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()
	b := &batch{n: cfg.batch * imageSide * imageSide * channels, normalize: normalize}
	b.size = 4 * b.n
	b.grid, b.block = cuda.D1(8*max(g.Props.Multiprocessors, 1)), cuda.D1(256)
	defer func() { err = errors.Join(err, b.close()) }()
	if err := b.alloc(g.Ctx); err != nil {
		return nil, err
	}

	// Warm up both ways (the kernel's first launch, the mapping's first use).
	for _, explicit := range []bool{false, true} {
		if _, err := b.once(explicit, 1); err != nil {
			return nil, err
		}
	}
	for _, p := range cfg.passes {
		row, err := b.row(ctx, p, cfg.reps)
		if err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	printRows(w, cfg, g.Name, b.size, rows)
	return rows, nil
}

// batch is the input batch, in pinned host memory mapped into the
// device's address space, the device memory of the copy and of the
// kernel's output, and the stream and events that time each way.
type batch struct {
	n, size     int // float32 values, bytes
	normalize   *cuda.Function
	grid, block cuda.Dim3
	host        *pinmem.Buffer
	mapped      cuda.DevicePtr // the address a kernel reads host at
	want        []float32      // the CPU's output
	got         []byte
	dIn, dOut   *cuda.DeviceBuffer
	s           *cuda.Stream
	start, end  *cuda.Event
}

// alloc makes the batch's memory, stream and events and fills the input.
func (b *batch) alloc(gpu *cuda.Context) error {
	var err error
	if b.host, err = pinmem.Alloc(b.size, pinmem.Mapped); err != nil {
		return err
	}
	if b.mapped, err = b.host.DevicePtr(); err != nil {
		return err
	}
	in, err := pinmem.View[float32](b.host)
	if err != nil {
		return err
	}
	for i := range in {
		in[i] = float32((i*31)%256) / 255 // pixel values in [0, 1]
	}
	b.want = make([]float32, b.n)
	kernel.Normalize(b.want, in)
	b.got = make([]byte, b.size)
	// Device memory: the copy's destination, and the kernel's output.
	if b.dIn, err = gpu.Alloc(b.size); err != nil {
		return err
	}
	if b.dOut, err = gpu.Alloc(b.size); err != nil {
		return err
	}
	if b.s, err = gpu.NewStream(cuda.StreamNonBlocking); err != nil {
		return err
	}
	if b.start, err = gpu.NewEvent(cuda.EventDefault); err != nil {
		return err
	}
	b.end, err = gpu.NewEvent(cuda.EventDefault)
	return err
}

// close releases what alloc made, the last made first.
func (b *batch) close() error {
	var errs []error
	for _, e := range []*cuda.Event{b.end, b.start} {
		if e != nil {
			errs = append(errs, e.Destroy())
		}
	}
	if b.s != nil {
		errs = append(errs, b.s.Destroy())
	}
	for _, d := range []*cuda.DeviceBuffer{b.dOut, b.dIn} {
		if d != nil {
			errs = append(errs, d.Free())
		}
	}
	if b.host != nil {
		errs = append(errs, b.host.Free())
	}
	return errors.Join(errs...)
}

// once runs one way once, the kernel sweeping its input passes times, and
// returns the time between its events; the output is checked.
func (b *batch) once(explicit bool, passes int) (time.Duration, error) {
	s := b.s
	// NaN everywhere first, so that an output the kernel did not write
	// cannot pass the check.
	if err := s.Memset(b.dOut, 0, 0xFF, b.size); err != nil {
		return 0, err
	}
	if err := b.start.Record(s); err != nil {
		return 0, err
	}
	src := b.mapped
	if explicit {
		// From pinned memory this copy is asynchronous: the copy engine
		// runs it in stream order, before the kernel.
		if err := s.CopyHtoD(b.dIn, 0, b.host.Bytes()); err != nil {
			return 0, err
		}
		src = b.dIn.Ptr()
	}
	if err := b.normalize.Launch(s, b.grid, b.block, 0, src, b.dOut.Ptr(), uint64(b.n), uint32(passes)); err != nil {
		return 0, err
	}
	if err := b.end.Record(s); err != nil {
		return 0, err
	}
	if err := b.end.Synchronize(context.Background()); err != nil {
		return 0, err
	}
	d, err := b.end.Elapsed(b.start)
	if err != nil {
		return 0, err
	}
	if _, err := b.dOut.ReadAt(b.got, 0); err != nil {
		return 0, err
	}
	return d, check(b.got, b.want)
}

// row times both ways reps times each, the kernel sweeping its input
// passes times: the medians.
func (b *batch) row(ctx context.Context, passes, reps int) (Row, error) {
	var zc, ex []time.Duration
	for range reps {
		if err := ctx.Err(); err != nil {
			return Row{}, err
		}
		d, err := b.once(false, passes)
		if err != nil {
			return Row{}, fmt.Errorf("zero-copy, %d passes: %w", passes, err)
		}
		zc = append(zc, d)
		if d, err = b.once(true, passes); err != nil {
			return Row{}, fmt.Errorf("copy + kernel, %d passes: %w", passes, err)
		}
		ex = append(ex, d)
	}
	return Row{Passes: passes, ZeroCopy: median(zc), Explicit: median(ex)}, nil
}

// printRows prints the table of rows and the summary.
func printRows(w io.Writer, cfg config, name string, size int, rows []Row) {
	fmt.Fprintf(w, "zerocopy: normalise %d images of %dx%dx%d float32 (%.1f MiB) on %s, median of %d runs timed with events\n",
		cfg.batch, imageSide, imageSide, channels, float64(size)/(1<<20), name, cfg.reps)
	fmt.Fprintf(w, "%-8s %24s %24s %15s\n", "reads", "zero-copy (mapped)", "copy + kernel", "winner")
	for _, r := range rows {
		fmt.Fprintf(w, "%-8d %12s (%5.1f GB/s) %12s (%5.1f GB/s) %15s\n", r.Passes,
			ms(r.ZeroCopy), gbps(size, r.ZeroCopy), ms(r.Explicit), gbps(size, r.Explicit), r.Winner())
	}
	fmt.Fprintln(w, "(GB/s: the batch's bytes over the latency)")
	fmt.Fprintln(w, "article:  zero-copy speeds up a batch-32 ResNet-50 inference when the input is read once")
	fmt.Fprintf(w, "measured: %s\n", summary(rows))
}

// summary says who wins a single read and where the copy starts to win.
func summary(rows []Row) string {
	var parts []string
	for _, r := range rows {
		if r.Passes == 1 {
			parts = append(parts, fmt.Sprintf("read once, zero-copy %s vs copy + kernel %s: %s wins by %.2fx",
				ms(r.ZeroCopy), ms(r.Explicit), r.Winner(), float64(max(r.ZeroCopy, r.Explicit))/float64(max(min(r.ZeroCopy, r.Explicit), 1))))
		}
	}
	cross := "zero-copy wins at every number of reads measured"
	for _, r := range rows {
		if r.Explicit <= r.ZeroCopy {
			cross = fmt.Sprintf("the copy wins from %d reads on", r.Passes)
			break
		}
	}
	return strings.Join(append(parts, cross), "; ")
}

// check compares the kernel's output, as bytes, with the CPU's result. The
// kernel does the same float32 subtraction and division, so the values agree
// to the last bit or two.
func check(got []byte, want []float32) error {
	for i, wv := range want {
		g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
		if !(math.Abs(float64(g-wv)) <= 1e-6*math.Max(1, math.Abs(float64(wv)))) {
			return fmt.Errorf("output %d (image %d, channel %d) = %v, want %v", i, i/(imageSide*imageSide*channels), i%channels, g, wv)
		}
	}
	return nil
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func gbps(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}
