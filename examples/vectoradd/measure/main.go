// Command measure, the vectoradd example's measurement program, re-measures a
// claim of the article pinmem grew from, on CUDA page-locked memory: that a
// vector addition (copy a and b to the GPU, add them, copy c back) spends
// about half as long copying when its host arrays are pinned (15 ms with
// pageable memory, 8 ms with pinned memory in the article).
//
// For each array size it runs the same loop three ways:
//
//   - pageable: the arrays are ordinary Go slices; every copy is a
//     synchronous DeviceBuffer.WriteAt or ReadAt, so the driver stages the bytes
//     through its own pinned buffer;
//   - pinned: the arrays live in pinmem.Alloc buffers; the same synchronous
//     copies then go straight to the copy engine (DMA);
//   - copier: the arrays are Go slices again, copied by a transfer.Copier,
//     pinmem's way of moving memory it did not allocate.
//
// Every run checks every element of c (c[i] == a[i] + b[i]); a wrong element
// is an error, not a figure. With -cref it also runs the same pageable loop
// written in C against the driver API (cref/vectoradd), so the Go figure can
// be compared with what the driver does without Go.
//
// Usage:
//
//	go run ./examples/vectoradd/measure [-sizes 16MiB,256MiB] [-reps 10] [-cref cref/bin/vectoradd]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/examples/vectoradd/kernel"
	"github.com/pinmem/pinmem/transfer"
)

// kernelPTX is the example's kernel (../kernel).
var kernelPTX = kernel.PTX

// The article's figures: the transfer time of its vector addition.
const (
	articlePageable = 15 * time.Millisecond
	articlePinned   = 8 * time.Millisecond
)

// config is what the flags select.
type config struct {
	sizes []int  // bytes per array (a, b and c each)
	reps  int    // timed runs per size and mode (after one warm-up run)
	cref  string // path of the C baseline program, or ""
}

func main() {
	harness.Main("vectoradd", parseFlags, func(cfg config) error {
		_, err := run(context.Background(), cfg, os.Stdout)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("vectoradd", stderr)
	sizes := fs.String("sizes", "16MiB,256MiB", "comma-separated bytes per array (KiB, MiB, GiB suffixes)")
	reps := fs.Int("reps", 10, "timed runs per size and mode (the median is printed)")
	cref := fs.String("cref", "", "path of cref/bin/vectoradd: also run the pageable loop written in C")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	cfg := config{reps: *reps, cref: *cref}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			return config{}, fmt.Errorf("-sizes: %w", err)
		}
		if n%4 != 0 {
			return config{}, fmt.Errorf("-sizes: %d bytes is not a whole number of float32", n)
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	if cfg.reps < 1 {
		return config{}, fmt.Errorf("-reps %d: want at least 1", cfg.reps)
	}
	return cfg, nil
}

// parseSize reads a byte count such as 4096, 16MiB or 1GiB.
func parseSize(s string) (int, error) {
	s = strings.TrimSpace(s)
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n <= 0 || fmt.Sprint(n) != s {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// Row is the median time of one size and mode: the two copies in, the
// kernel, the copy out, and all of it.
type Row struct {
	Size                    int
	Mode                    string // "pageable", "pinned" or "copier"
	CopyIn, Kernel, CopyOut time.Duration
	Total                   time.Duration
}

// Transfer is the time spent copying, the figure the article compares.
func (r Row) Transfer() time.Duration { return r.CopyIn + r.CopyOut }

// Result is what run measured: the Go rows and, with -cref, the C rows.
type Result struct {
	Rows []Row
	C    []CRow
}

// run measures every size and mode, prints the table and the article's claim
// beside what it measured, and returns the figures.
func run(ctx context.Context, cfg config, w io.Writer) (res Result, err error) {
	// Device 0 and its primary context: the context every CUDA library in the
	// process shares. Without a driver or a GPU this is where it fails, with
	// an error matching cuda.ErrNoDriver or cuda.ErrNoDevice.
	g, err := harness.OpenGPU(0)
	if err != nil {
		return res, err
	}
	gpu, name, props := g.Ctx, g.Name, g.Props
	mod, add, err := g.Kernel(kernelPTX, "vector_add")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()

	// A stream to launch the kernel on. StreamBlocking streams synchronize
	// with the synchronous copies, like the C baseline's stream.
	s, err := gpu.NewStream(cuda.StreamBlocking)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()

	// A Copier for the third mode. It pins its staging buffers once, in its
	// first copy (the warm-up run).
	cp, err := transfer.New(gpu)
	if err != nil {
		return res, err
	}
	// Close waits for the Copier's work, bounded by its context.
	defer func() { err = errors.Join(err, cp.Close(ctx)) }()

	fmt.Fprintf(w, "vectoradd: c = a + b on %s, float32 arrays, median of %d runs after a warm-up run\n", name, cfg.reps)
	fmt.Fprintf(w, "%-9s %-28s %9s %9s %9s %9s %9s\n", "size", "host memory", "copy in", "kernel", "copy out", "transfer", "total")
	for _, size := range cfg.sizes {
		for _, mode := range []string{"pageable", "pinned", "copier"} {
			r, err := measure(ctx, gpu, s, cp, add, props.Multiprocessors, size, mode, cfg.reps)
			if err != nil {
				return res, fmt.Errorf("%s, %s: %w", mib(size), mode, err)
			}
			res.Rows = append(res.Rows, r)
			fmt.Fprintf(w, "%-9s %-28s %9s %9s %9s %9s %9s\n", mib(size), modeName[mode],
				ms(r.CopyIn), ms(r.Kernel), ms(r.CopyOut), ms(r.Transfer()), ms(r.Total))
		}
	}

	fmt.Fprintf(w, "article:  pinned memory about halves the transfer: %s -> %s (%.1fx)\n",
		ms(articlePageable), ms(articlePinned), ratio(articlePageable, articlePinned))
	for _, size := range cfg.sizes {
		pg, pn := find(res.Rows, size, "pageable"), find(res.Rows, size, "pinned")
		fmt.Fprintf(w, "measured: %s: pageable %s -> pinned %s (%.1fx)\n",
			mib(size), ms(pg.Transfer()), ms(pn.Transfer()), ratio(pg.Transfer(), pn.Transfer()))
	}
	if cfg.cref != "" {
		if res.C, err = compareWithC(ctx, cfg, res.Rows, w); err != nil {
			return res, err
		}
	}
	return res, nil
}

var modeName = map[string]string{
	"pageable": "pageable Go memory",
	"pinned":   "pinned (pinmem.Alloc)",
	"copier":   "Go memory, transfer.Copier",
}

// measure runs the vector addition reps+1 times for one size and mode and
// returns the medians of the timed runs.
func measure(ctx context.Context, gpu *cuda.Context, s *cuda.Stream, cp *transfer.Copier, add *cuda.Function,
	sms, size int, mode string, reps int) (r Row, err error) {
	n := size / 4
	// Host arrays: Go slices, or views of pinned buffers.
	var a, b, c []float32
	if mode == "pinned" {
		var bufs [3]*pinmem.Buffer
		for i := range bufs {
			if bufs[i], err = pinmem.Alloc(size, 0); err != nil {
				return r, err
			}
			defer func() { err = errors.Join(err, bufs[i].Free()) }()
		}
		// View gives typed access to pinned memory (no Go pointers inside).
		if a, err = pinmem.View[float32](bufs[0]); err != nil {
			return r, err
		}
		if b, err = pinmem.View[float32](bufs[1]); err != nil {
			return r, err
		}
		if c, err = pinmem.View[float32](bufs[2]); err != nil {
			return r, err
		}
	} else {
		a, b, c = make([]float32, n), make([]float32, n), make([]float32, n)
	}
	fillInputs(a, b)

	// Device arrays.
	var d [3]*cuda.DeviceBuffer
	for i := range d {
		if d[i], err = gpu.Alloc(size); err != nil {
			return r, err
		}
		defer func() { err = errors.Join(err, d[i].Free()) }()
	}

	// The copies of one mode. Synchronous: each returns when its bytes are
	// in place.
	copyIn := func() error {
		if mode == "copier" {
			if _, err := cp.HtoD(ctx, d[0], transfer.AsBytes(a)); err != nil {
				return err
			}
			_, err := cp.HtoD(ctx, d[1], transfer.AsBytes(b))
			return err
		}
		if _, err := d[0].WriteAt(transfer.AsBytes(a), 0); err != nil {
			return err
		}
		_, err := d[1].WriteAt(transfer.AsBytes(b), 0)
		return err
	}
	copyOut := func() error {
		if mode == "copier" {
			_, err := cp.DtoH(ctx, transfer.AsBytes(c), d[2])
			return err
		}
		_, err := d[2].ReadAt(transfer.AsBytes(c), 0)
		return err
	}
	grid, block := cuda.D1(4*max(sms, 1)), cuda.D1(256)

	var in, kern, out, total []time.Duration
	for rep := range reps + 1 {
		poison(c) // a stale or missing result cannot pass the check
		t0 := time.Now()
		if err := copyIn(); err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := add.Launch(s, grid, block, 0, d[0].Ptr(), d[1].Ptr(), d[2].Ptr(), uint64(n)); err != nil {
			return r, err
		}
		if err := s.Synchronize(context.Background()); err != nil {
			return r, err
		}
		t2 := time.Now()
		if err := copyOut(); err != nil {
			return r, err
		}
		t3 := time.Now()
		if err := check(a, b, c); err != nil {
			return r, err
		}
		if rep == 0 {
			continue // the warm-up run: first touches, the kernel's first launch
		}
		in, kern, out, total = append(in, t1.Sub(t0)), append(kern, t2.Sub(t1)), append(out, t3.Sub(t2)), append(total, t3.Sub(t0))
	}
	return Row{Size: size, Mode: mode, CopyIn: median(in), Kernel: median(kern), CopyOut: median(out), Total: median(total)}, nil
}

// fillInputs gives a and b values whose float32 sums are exact, so that the
// device's result can be compared bit for bit.
func fillInputs(a, b []float32) {
	for i := range a {
		a[i] = float32(i % 4096)
		b[i] = float32((i*7)%4096) * 0.5
	}
}

func poison(c []float32) {
	nan := float32(math.NaN())
	for i := range c {
		c[i] = nan
	}
}

// check returns an error naming the first element of c that is not a + b.
func check(a, b, c []float32) error {
	for i := range c {
		if c[i] != a[i]+b[i] {
			return fmt.Errorf("c[%d] = %v, want %v + %v = %v", i, c[i], a[i], b[i], a[i]+b[i])
		}
	}
	return nil
}

func find(rows []Row, size int, mode string) Row {
	for _, r := range rows {
		if r.Size == size && r.Mode == mode {
			return r
		}
	}
	return Row{}
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func mib(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
