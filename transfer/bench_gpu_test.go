package transfer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cpuclock"
	"github.com/pinmem/pinmem/internal/kernels"
)

// Benchmarks for the GPU machine. Each reports GB/s (10^9 bytes/s) and
// process CPU-seconds per GB; comparisons run side by side in one run.
//
//	go test -run '^$' -bench . -benchtime 10x ./transfer/

// touched returns an n-byte Go heap slice with every page written.
func touched(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// measure runs fn b.N times and reports GB/s and CPU-s/GB for n bytes per call.
func measure(b *testing.B, n int, fn func() error) {
	b.Helper()
	b.SetBytes(int64(n))
	if err := fn(); err != nil { // warm up
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpuclock.Process()
	t0 := time.Now()
	for range b.N {
		if err := fn(); err != nil {
			b.Fatal(err)
		}
	}
	wall := time.Since(t0)
	cpu := cpuclock.Process() - cpu0
	b.StopTimer()
	total := float64(n) * float64(b.N)
	b.ReportMetric(total/wall.Seconds()/1e9, "GB/s")
	b.ReportMetric(cpu.Seconds()/(total/1e9), "cpu-s/GB")
}

// BenchmarkGoHeap compares, for a Go heap slice, the Copier (registration
// cache off: every byte staged) with the driver's own pageable path
// (cuda.DeviceBuffer.WriteAt/ReadAt on the same slice), both directions, 256
// MiB and 1 GiB.
func BenchmarkGoHeap(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	const gib = 1 << 30
	heap := touched(gib)
	dev := gpuAlloc(b, ctx, gib)
	bg := context.Background()
	for _, n := range []int{256 << 20, gib} {
		h := heap[:n]
		d, _ := dev.Slice(0, n)
		name := fmt.Sprintf("%dMiB", n>>20)
		b.Run("H2D/"+name+"/copier", func(b *testing.B) {
			measure(b, n, func() error { _, err := c.HtoD(bg, d, h); return err })
		})
		b.Run("H2D/"+name+"/pageable", func(b *testing.B) {
			measure(b, n, func() error { _, err := d.WriteAt(h, 0); return err })
		})
		b.Run("D2H/"+name+"/copier", func(b *testing.B) {
			measure(b, n, func() error { _, err := c.DtoH(bg, h, d); return err })
		})
		b.Run("D2H/"+name+"/pageable", func(b *testing.B) {
			measure(b, n, func() error { _, err := d.ReadAt(h, 0); return err })
		})
	}
}

// BenchmarkRegCache copies one 256 MiB Go slice again and again with the
// registration cache on (registered by the warm-up copy), beside the same
// copy from a pinned buffer.
func BenchmarkRegCache(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx, WithRegistrationCache(0))
	n := 256 << 20
	heap := touched(n)
	dev := gpuAlloc(b, ctx, n)
	pinned, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pinned.Free() })
	defer c.AddPinned(pinned)()
	bg := context.Background()
	b.Run("H2D/cached", func(b *testing.B) {
		measure(b, n, func() error { _, err := c.HtoD(bg, dev, heap); return err })
	})
	b.Run("H2D/pinned", func(b *testing.B) {
		measure(b, n, func() error { _, err := c.HtoD(bg, dev, pinned.Bytes()); return err })
	})
	b.Run("D2H/cached", func(b *testing.B) {
		measure(b, n, func() error { _, err := c.DtoH(bg, heap, dev); return err })
	})
	b.Run("D2H/pinned", func(b *testing.B) {
		measure(b, n, func() error { _, err := c.DtoH(bg, pinned.Bytes(), dev); return err })
	})
}

// BenchmarkPinnedDirect compares the Copier's direct path from a pinned
// buffer with a bare async copy on a stream plus cuStreamSynchronize (the
// cuda package, the closest Go twin of the C reference), 256 MiB and 1 GiB,
// each direction. Each round times four variants back to back in a
// rotating order: the Copier as configured by default (WaitHybrid: sleeps
// in the driver and polls the last tailBytes), the Copier with WaitSleep
// (sleeps to the end), with WaitPoll (polls the whole copy, as the driver's
// spin scheduling does), and the bare stream copy. It reports the median GB/s of each
// and the Copier's medians over the stream's.
func BenchmarkPinnedDirect(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	sleeper := gpuCopier(b, ctx, WithWait(WaitSleep))
	poller := gpuCopier(b, ctx, WithWait(WaitPoll))
	const gib = 1 << 30
	pinned, err := pinmem.Alloc(gib, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pinned.Free() })
	defer c.AddPinned(pinned)()
	defer sleeper.AddPinned(pinned)()
	defer poller.AddPinned(pinned)()
	dev := gpuAlloc(b, ctx, gib)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy() })
	bg := context.Background()
	for _, n := range []int{256 << 20, gib} {
		h := pinned.Bytes()[:n]
		d, _ := dev.Slice(0, n)
		name := fmt.Sprintf("%dMiB", n>>20)
		b.Run("H2D/"+name, func(b *testing.B) {
			interleave(b, n, []variant{
				{"copier", func() error { _, err := c.HtoD(bg, d, h); return err }},
				{"copier-sleep", func() error { _, err := sleeper.HtoD(bg, d, h); return err }},
				{"copier-poll", func() error { _, err := poller.HtoD(bg, d, h); return err }},
				{"stream", func() error {
					if err := s.CopyHtoD(d, 0, h); err != nil {
						return err
					}
					return s.Synchronize(context.Background())
				}},
			})
		})
		b.Run("D2H/"+name, func(b *testing.B) {
			interleave(b, n, []variant{
				{"copier", func() error { _, err := c.DtoH(bg, h, d); return err }},
				{"copier-sleep", func() error { _, err := sleeper.DtoH(bg, h, d); return err }},
				{"copier-poll", func() error { _, err := poller.DtoH(bg, h, d); return err }},
				{"stream", func() error {
					if err := s.CopyDtoH(h, d, 0); err != nil {
						return err
					}
					return s.Synchronize(context.Background())
				}},
			})
		})
	}
}

// variant is one of the ways interleave times.
type variant struct {
	name string
	fn   func() error
}

// interleave runs every variant once per round (b.N rounds, after one
// warm-up round), in a new random order each round (see sideBySide), and reports each variant's
// median GB/s for n bytes, its spread ((max-min)/median, in %) and, for each
// variant before the last, its median over the last variant's (the
// reference).
func interleave(b *testing.B, n int, vs []variant) {
	b.Helper()
	for _, v := range vs {
		if err := v.fn(); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(n) * int64(len(vs)))
	gbps := make([][]float64, len(vs))
	b.ResetTimer()
	order := rand.New(rand.NewPCG(uint64(n), 0x1ea7))
	for range b.N {
		for _, k := range order.Perm(len(vs)) {
			t0 := time.Now()
			if err := vs[k].fn(); err != nil {
				b.Fatal(err)
			}
			gbps[k] = append(gbps[k], float64(n)/time.Since(t0).Seconds()/1e9)
		}
	}
	b.StopTimer()
	ref := median(gbps[len(vs)-1])
	for k, v := range vs {
		m := median(gbps[k])
		b.ReportMetric(m, v.name+"-GB/s")
		if m > 0 {
			b.ReportMetric((slices.Max(gbps[k])-slices.Min(gbps[k]))/m*100, v.name+"-spread-%")
		}
		if k < len(vs)-1 && ref > 0 {
			b.ReportMetric(m/ref, v.name+"/"+vs[len(vs)-1].name)
		}
	}
}

// BenchmarkPipeline runs 16 chunks of 32 MiB through H2D, add_u8 and D2H:
// from pinned memory with 1 and 4 streams (the C reference: 20.4 and
// 12.6 ms; bound about 10.6 ms), with 4 streams again from a Copier that
// never polls (WaitSleep), and from Go memory with 4 streams.
// The reference pipeline's shape: 16 chunks of 32 MiB.
const pipeChunk, pipeChunks = 32 << 20, 16

// pipelineFixture returns a Copier, the add_u8 Work of the reference pipeline
// and two pinned buffers of pipeChunk*pipeChunks bytes known to the
// Copier, all released when b ends.
func pipelineFixture(b *testing.B) (*cuda.Context, *Copier, func(*cuda.Stream, Chunk) error, []*pinmem.Buffer) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	f := gpuKernel(b, ctx, kernels.KernelAdd)
	props, err := ctx.Device().Properties()
	if err != nil {
		b.Fatal(err)
	}
	var bufs []*pinmem.Buffer
	for range 2 {
		pb, err := pinmem.Alloc(pipeChunk*pipeChunks, 0, pinmem.WithDevice(ctx.Device()))
		if err != nil {
			b.Fatal(err)
		}
		remove := c.AddPinned(pb)
		b.Cleanup(func() { remove(); pb.Free() })
		bufs = append(bufs, pb)
	}
	work := LaunchWork(f, cuda.D1(props.Multiprocessors*4), cuda.D1(256), func(ch Chunk) []any {
		return []any{ch.Dev.Ptr(), uint64(ch.Len), uint8(1)}
	})
	return ctx, c, work, bufs
}

func BenchmarkPipeline(b *testing.B) {
	ctx, c, work, bufs := pipelineFixture(b)
	n := pipeChunk * pipeChunks
	heapIn, heapOut := touched(n), touched(n)
	sleeper := gpuCopier(b, ctx, WithWait(WaitSleep))
	for _, pb := range bufs {
		defer sleeper.AddPinned(pb)()
	}
	for _, tc := range []struct {
		name    string
		c       *Copier
		streams int
		in, out []byte
	}{
		{"pinned/streams1", c, 1, bufs[0].Bytes(), bufs[1].Bytes()},
		{"pinned/streams4", c, 4, bufs[0].Bytes(), bufs[1].Bytes()},
		{"pinned/streams4/sleep", sleeper, 4, bufs[0].Bytes(), bufs[1].Bytes()},
		{"gomem/streams4", c, 4, heapIn, heapOut},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := newTestPipeline(tc.c, pipelineCfg{ChunkSize: pipeChunk, Streams: tc.streams, InFlight: pipeChunks, Work: work})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			run := func() error { _, err := p.Run(context.Background(), tc.in, tc.out); return err }
			if err := run(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			t0 := time.Now()
			for range b.N {
				if err := run(); err != nil {
					b.Fatal(err)
				}
			}
			ms := time.Since(t0).Seconds() * 1000 / float64(b.N)
			b.ReportMetric(ms, "ms/run")
			b.ReportMetric(10.6/ms*100, "%of-bound")
		})
	}
}

// BenchmarkPipelineVsC interleaves rounds of the Go pipeline (pinned, 4
// streams, median wall time of 5 runs after a warm-up) with rounds of the
// C reference (cref/overlap --no-spin --streams 4 --runs 5, its median; its
// path in PINMEM_CREF_OVERLAP, running the PTX of internal/kernels), so that host noise
// hits both alike. It reports both medians over the rounds and Go/C. Each
// b.N iteration is a whole set of rounds: run it with -test.benchtime=1x.
func BenchmarkPipelineVsC(b *testing.B) {
	prog := os.Getenv("PINMEM_CREF_OVERLAP")
	if prog == "" {
		b.Skip("PINMEM_CREF_OVERLAP not set (the GPU suite's full tier sets it)")
	}
	_, c, work, bufs := pipelineFixture(b)
	p, err := newTestPipeline(c, pipelineCfg{ChunkSize: pipeChunk, Streams: 4, InFlight: pipeChunks, Work: work})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	in, out := bufs[0].Bytes(), bufs[1].Bytes()
	goRound := func() (float64, error) {
		var ms []float64
		for i := -1; i < 5; i++ {
			t0 := time.Now()
			if _, err := p.Run(context.Background(), in, out); err != nil {
				return 0, err
			}
			if i >= 0 {
				ms = append(ms, float64(time.Since(t0).Microseconds())/1e3)
			}
		}
		return median(ms), nil
	}
	cRound := func() (float64, error) {
		cmd := exec.Command(filepath.Clean(prog), filepath.Join("..", "internal", "kernels", "pinmem.ptx"),
			"--runs", "5", "--streams", "4", "--no-spin", "--no-baseline",
			"--chunks", strconv.Itoa(pipeChunks), "--chunk-size", strconv.Itoa(pipeChunk))
		outb, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", cmd, err)
		}
		for _, line := range strings.Split(string(outb), "\n") {
			var rec struct {
				Kind    string  `json:"kind"`
				Streams int     `json:"streams"`
				Median  float64 `json:"median"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Kind == "pinned" && rec.Streams == 4 && rec.Median > 0 {
				return rec.Median, nil
			}
		}
		return 0, fmt.Errorf("%s printed no pinned 4-stream result:\n%s", cmd, outb)
	}
	var goMs, cMs []float64
	for range b.N {
		for range 8 {
			g, err := goRound()
			if err != nil {
				b.Fatal(err)
			}
			cm, err := cRound()
			if err != nil {
				b.Fatal(err)
			}
			goMs, cMs = append(goMs, g), append(cMs, cm)
		}
	}
	b.ReportMetric(median(goMs), "go-ms/run")
	b.ReportMetric(median(cMs), "c-ms/run")
	b.ReportMetric(median(goMs)/median(cMs), "go/c")
	b.ReportMetric((slices.Max(goMs)-slices.Min(goMs))/median(goMs)*100, "go-spread-%")
	b.ReportMetric((slices.Max(cMs)-slices.Min(cMs))/median(cMs)*100, "c-spread-%")
}

// median returns the median of v (the upper one of an even count; zero
// when v is empty), leaving v as it is.
func median[T cmp.Ordered](v []T) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
