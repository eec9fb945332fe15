// Command measure, the writecombined example's measurement program,
// re-measures a claim of the article pinmem grew from, on CUDA page-locked
// memory: that write-combined pinned memory gives about 35% more
// host-to-device bandwidth (on PCIe 3.0 x16), but that the CPU reads it very
// slowly.
//
// Write-combined memory (pinmem.WriteCombined, cuMemHostAlloc's
// CU_MEMHOSTALLOC_WRITECOMBINED) is not cached by the CPU: writes are
// gathered in write-combining buffers and sent out in bursts, and reads go to
// memory one by one. The program allocates a default pinned buffer and a
// write-combined one of the same size, and measures for each:
//
//   - the CPU writing it (copy from a Go slice into it);
//   - copying it to the GPU (a synchronous DeviceBuffer.WriteAt; the bytes
//     are read back and compared after every copy);
//   - the CPU reading it (copy from it into a Go slice, -readsize bytes).
//
// Usage:
//
//	go run ./examples/writecombined/measure [-size 64MiB] [-readsize 4MiB] [-reps 10]
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
)

type config struct {
	size     int // bytes of each buffer, copied to the GPU
	readSize int // bytes the CPU reads back out of each buffer
	reps     int
}

func main() {
	harness.Main("writecombined", parseFlags, func(cfg config) error {
		_, err := run(context.Background(), cfg, os.Stdout)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("writecombined", stderr)
	size := fs.Int("size", 64<<20, "bytes of each pinned buffer")
	readSize := fs.Int("readsize", 4<<20, "bytes the CPU reads out of each buffer (reads of write-combined memory are slow)")
	reps := fs.Int("reps", 10, "timed runs per figure (the median is printed)")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	cfg := config{size: *size, readSize: *readSize, reps: *reps}
	switch {
	case cfg.size < 1:
		return config{}, fmt.Errorf("-size %d: want a positive byte count", cfg.size)
	case cfg.readSize < 1 || cfg.readSize > cfg.size:
		return config{}, fmt.Errorf("-readsize %d: want 1 to -size (%d)", cfg.readSize, cfg.size)
	case cfg.reps < 1:
		return config{}, fmt.Errorf("-reps %d: want at least 1", cfg.reps)
	}
	return cfg, nil
}

// Figures are one kind of pinned memory's medians, in GB/s.
type Figures struct {
	Flags          pinmem.Flags
	H2D            float64 // copy to the GPU
	CPUWrite       float64 // the CPU writing the buffer
	CPURead        float64 // the CPU reading the buffer
	H2DTime        time.Duration
	CPUWriteTime   time.Duration
	CPUReadTime    time.Duration
	Size, ReadSize int
}

// Result holds the default pinned figures and the write-combined ones.
type Result struct{ Default, WC Figures }

func run(ctx context.Context, cfg config, w io.Writer) (res Result, err error) {
	g, err := harness.OpenGPU(0)
	if err != nil {
		return res, err
	}
	gpu, name := g.Ctx, g.Name
	d, err := gpu.Alloc(cfg.size)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	// What the CPU writes into each buffer, and where copies come back to.
	src := make([]byte, cfg.size)
	for i := range src {
		src[i] = byte(i*7 + i>>11)
	}
	back := make([]byte, cfg.size)

	for _, f := range []pinmem.Flags{0, pinmem.WriteCombined} {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		fig, err := measure(d, f, src, back, cfg)
		if err != nil {
			return res, fmt.Errorf("%s: %w", kindName(f), err)
		}
		if f == 0 {
			res.Default = fig
		} else {
			res.WC = fig
		}
	}

	df, wc := res.Default, res.WC
	fmt.Fprintf(w, "writecombined: %s pinned buffers on %s, median of %d runs\n", sizeName(cfg.size), name, cfg.reps)
	fmt.Fprintf(w, "%-36s %15s %15s %9s\n", "", "default pinned", "write-combined", "WC/def")
	line := func(what string, a, b float64) {
		fmt.Fprintf(w, "%-36s %10.2f GB/s %10.2f GB/s %8.3fx\n", what, a, b, b/a)
	}
	line("copy to the GPU (H2D)", df.H2D, wc.H2D)
	line("CPU writes it (copy from Go memory)", df.CPUWrite, wc.CPUWrite)
	line(fmt.Sprintf("CPU reads %s of it (copy out)", sizeName(cfg.readSize)), df.CPURead, wc.CPURead)
	fmt.Fprintln(w, "article:  write-combined memory gives about 35% more H2D bandwidth (PCIe 3.0 x16); CPU reads of it are very slow")
	fmt.Fprintf(w, "measured: H2D %+.1f%% with write-combined; CPU reads of it at %.3gx the speed of default pinned memory\n",
		100*(wc.H2D/df.H2D-1), wc.CPURead/df.CPURead)
	return res, nil
}

// measure pins one buffer with flags f and times the three figures.
func measure(d *cuda.DeviceBuffer, f pinmem.Flags, src, back []byte, cfg config) (fig Figures, err error) {
	// Both with cuMemHostAlloc (write-combined memory can only come from
	// it), so that the flag is the only difference.
	buf, err := pinmem.Alloc(cfg.size, f, pinmem.WithMethod(pinmem.MethodHostAlloc))
	if err != nil {
		return fig, err
	}
	defer func() { err = errors.Join(err, buf.Free()) }()
	b := buf.Bytes()
	readBuf := make([]byte, cfg.readSize)

	var writes, copies, reads []time.Duration
	for rep := range cfg.reps + 1 { // rep 0 warms up
		t0 := time.Now()
		copy(b, src)
		t1 := time.Now()
		if _, err := d.WriteAt(b, 0); err != nil {
			return fig, err
		}
		t2 := time.Now()
		copy(readBuf, b[:cfg.readSize])
		t3 := time.Now()

		// Check: the CPU read what it wrote, and the GPU got the same.
		if !bytes.Equal(readBuf, src[:cfg.readSize]) {
			return fig, errors.New("the CPU read back other bytes than it wrote")
		}
		clear(back)
		if _, err := d.ReadAt(back, 0); err != nil {
			return fig, err
		}
		if !bytes.Equal(back, src) {
			i := firstDiff(back, src)
			return fig, fmt.Errorf("byte %d copied to the GPU is %#x, want %#x", i, back[i], src[i])
		}
		if rep > 0 {
			writes, copies, reads = append(writes, t1.Sub(t0)), append(copies, t2.Sub(t1)), append(reads, t3.Sub(t2))
		}
	}
	fig = Figures{Flags: f, Size: cfg.size, ReadSize: cfg.readSize,
		CPUWriteTime: median(writes), H2DTime: median(copies), CPUReadTime: median(reads)}
	fig.CPUWrite = gbps(cfg.size, fig.CPUWriteTime)
	fig.H2D = gbps(cfg.size, fig.H2DTime)
	fig.CPURead = gbps(cfg.readSize, fig.CPUReadTime)
	return fig, nil
}

func kindName(f pinmem.Flags) string {
	if f&pinmem.WriteCombined != 0 {
		return "write-combined"
	}
	return "default pinned"
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func gbps(n int, d time.Duration) float64 {
	if d <= 0 {
		d = 1 // below the clock's resolution
	}
	return float64(n) / d.Seconds() / 1e9
}

func sizeName(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
