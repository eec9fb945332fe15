package transfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cpuclock"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/pool"
)

// GPU benchmarks and tests of the size-adaptive Copier, concurrent
// transfers and buffers over 4 GiB. Built by scripts/gpu-suite build into
// .gpu/bin/transfer.test; the commands are in each doc comment.

// EnvBench4G set to 1 adds 4 GiB transfers to BenchmarkCopierVsDriver.
const EnvBench4G = "PINMEM_BENCH_4G"

// sideBySide runs every variant once per round (rounds rounds, after one
// warm-up round), in a new random order each round (a fixed cyclic order
// would give each variant the same predecessor every round, and what one
// leaves behind, such as spinning copy goroutines or an idle copy
// engine, would bias its successor), and reports and returns each
// variant's median GB/s for n bytes, with its process CPU-seconds per GB
// (getrusage around the sample). Each sample is one untimed call (so that
// no variant inherits the state its predecessor left: a GPU idle since the
// last copy, caches another goroutine dirtied) followed by repsFor(n) timed
// calls back to back, so that a sample of a small size lasts long enough
// for the clock to resolve it and the per-call cost is averaged, as
// nvbandwidth and cref/bw time batches of copies.
func sideBySide(b *testing.B, n, rounds int, vs []variant) []float64 {
	b.Helper()
	meds, _ := sideBySideRounds(b, n, rounds, vs)
	return meds
}

// sideBySideRounds is sideBySide that also returns every sample: GB/s of
// variant k in round r at [k][r].
func sideBySideRounds(b *testing.B, n, rounds int, vs []variant) ([]float64, [][]float64) {
	b.Helper()
	return sideBySideReps(b, n, repsFor(n), rounds, vs)
}

// sideBySideReps is sideBySideRounds with reps timed calls per sample.
func sideBySideReps(b *testing.B, n, reps, rounds int, vs []variant) ([]float64, [][]float64) {
	b.Helper()
	for _, v := range vs {
		if err := v.fn(); err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	gbps := make([][]float64, len(vs))
	cpu := make([][]float64, len(vs))
	order := rand.New(rand.NewPCG(uint64(n), 0x51de))
	for range rounds {
		for _, k := range order.Perm(len(vs)) {
			if err := vs[k].fn(); err != nil {
				b.Fatalf("%s: %v", vs[k].name, err)
			}
			c0 := cpuclock.Process()
			t0 := time.Now()
			for range reps {
				if err := vs[k].fn(); err != nil {
					b.Fatalf("%s: %v", vs[k].name, err)
				}
			}
			el := time.Since(t0).Seconds()
			gb := float64(n) * float64(reps) / 1e9
			gbps[k] = append(gbps[k], gb/el)
			cpu[k] = append(cpu[k], (cpuclock.Process()-c0).Seconds()/gb)
		}
	}
	meds := make([]float64, len(vs))
	for k, v := range vs {
		meds[k] = median(gbps[k])
		b.ReportMetric(meds[k], v.name+"-GB/s")
		b.ReportMetric(slices.Min(gbps[k]), v.name+"-min-GB/s")
		b.ReportMetric(slices.Max(gbps[k]), v.name+"-max-GB/s")
		b.ReportMetric(median(cpu[k]), v.name+"-CPU-s/GB")
	}
	return meds, gbps
}

// pairedRatio is the median over the rounds of a[r]/b[r]: samples of one
// round ran side by side, so their ratio leaves out the drift of the
// host from one round to the next.
func pairedRatio(a, b []float64) float64 {
	var rs []float64
	for r := range min(len(a), len(b)) {
		if b[r] > 0 {
			rs = append(rs, a[r]/b[r])
		}
	}
	return median(rs)
}

// repsFor is the number of back-to-back calls in one sample of n bytes:
// at least 8 MiB moved per sample, one call from 8 MiB up.
func repsFor(n int) int { return max(1, (8<<20)/n) }

// roundsFor is the number of interleaved samples for n bytes: about 1 GiB
// moved per variant, between 5 and 25 samples.
func roundsFor(n int) int { return max(5, min(25, (1<<30)/n)) }

// BenchmarkCopierVsDriver compares, side by side with interleaved samples,
// the Copier (default options) moving a Go heap slice with the driver's own pageable copy of
// the same slice (DeviceBuffer.WriteAt/ReadAt), the Copier with
// a context that can end (copier-ctx: as pinmem bench's, whose context
// ends on an interrupt, and a service's request) and the forced staged
// path, at 4 KiB to 1 GiB (4 GiB with PINMEM_BENCH_4G=1), both
// directions. It reports the medians (GB/s), copier/driver,
// copier-ctx/driver, staged/driver, the paired ratios (the median of the
// rounds' ratios) of copier and copier-ctx to the driver, and the host
// bound: a parallel Go copy between the heap and pinned memory (the
// Copier's goroutines) and a stream copy of as many bytes between other
// pinned memory and the device, started together and timed until both
// end (both), as a staged copy runs them; each alone too (memcpy, dma). The thresholds are
// right when copier/driver is at least about 1 everywhere and copier
// approaches hostbound at large sizes.
//
// It times as pinmem bench times its copier rows (internal/tools/bench
// copierPaired, PairedTiming): every sample runs each variant in a random
// order, one untimed call and then the same number of timed calls back
// to back as bench's default (64 MiB a sample, at most 64 calls:
// benchReps), by the wall clock; copier-ctx/driver-paired here is the
// figure bench's copier row gives against pageable-sync at the same size
// (pinmem bench --kinds copier,pageable-sync --dirs h2d,d2h --sizes
// 4KiB,16KiB,64KiB,1MiB,4MiB,16MiB,64MiB,256MiB,1GiB), and
// copier/hostbound-paired its ratio to the staged-bound row. Under 30 s
// (under 60 s with 4 GiB):
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'CopierVsDriver' -test.benchtime 1x
func BenchmarkCopierVsDriver(b *testing.B) {
	ctx := gpuCtx(b)
	sizes := []int{4 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}
	if os.Getenv(EnvBench4G) == "1" {
		sizes = append(sizes, 4<<30)
	}
	benchCopierVsDriver(b, ctx, sizes)
}

// benchReps is the timed calls per sample of pinmem bench's default
// (BandwidthConfig's MinBytes 64 MiB and MaxReps 64): ceil(64 MiB / n),
// at most 64.
func benchReps(n int) int { return min(64, max(1, (64<<20+n-1)/n)) }

func benchCopierVsDriver(b *testing.B, ctx *cuda.Context, sizes []int) {
	c := gpuCopier(b, ctx)
	staged := gpuCopier(b, ctx)
	maxN := sizes[len(sizes)-1]
	heap := touched(maxN)
	dev := gpuAlloc(b, ctx, maxN)
	pinned := gpuPinned(b, ctx, maxN)
	other := gpuPinned(b, ctx, maxN) // the copy engine's side of the bound
	s, cpu := boundTools(b, ctx)
	bg := context.Background()
	both := func(n int, memcpy func(), htod bool) func() error {
		d, _ := dev.Slice(0, n)
		return func() error {
			done := make(chan error, 1)
			go func() { done <- streamCopies(s, d, other, n, htod) }()
			memcpy()
			return <-done
		}
	}
	// A context that can end, as a service's request has: the driver's
	// copy then runs on a goroutine of its own (see Copier.HtoD).
	cctx, cancel := context.WithCancel(bg)
	b.Cleanup(cancel)
	for _, n := range sizes {
		h := heap[:n]
		p := pinned.Bytes()[:n]
		d, _ := dev.Slice(0, n)
		name := sizeName(n)
		// Small transfers vary most from one sample to the next and cost
		// little: more rounds.
		rounds := roundsFor(n)
		if n <= 1<<20 {
			rounds = 51
		}
		b.Run("H2D/"+name, func(b *testing.B) {
			b.SetBytes(int64(n))
			m, g := sideBySideReps(b, n, benchReps(n), rounds*b.N, []variant{
				{"copier", func() error { _, err := c.HtoD(bg, d, h); return err }},
				{"copier-ctx", func() error { _, err := c.HtoD(cctx, d, h); return err }},
				{"driver", func() error { _, err := d.WriteAt(h, 0); return err }},
				{"staged", func() error { _, err := staged.HtoD(bg, d, h); return err }},
				{"memcpy", func() error { cpu.copy(p, h); return nil }},
				{"dma", func() error { return streamCopies(s, d, pinned, n, true) }},
				{"both", both(n, func() { cpu.copy(p, h) }, true)},
			})
			reportBound(b, m, g)
		})
		b.Run("D2H/"+name, func(b *testing.B) {
			b.SetBytes(int64(n))
			m, g := sideBySideReps(b, n, benchReps(n), rounds*b.N, []variant{
				{"copier", func() error { _, err := c.DtoH(bg, h, d); return err }},
				{"copier-ctx", func() error { _, err := c.DtoH(cctx, h, d); return err }},
				{"driver", func() error { _, err := d.ReadAt(h, 0); return err }},
				{"staged", func() error { _, err := staged.DtoH(bg, h, d); return err }},
				{"memcpy", func() error { cpu.copy(h, p); return nil }},
				{"dma", func() error { return streamCopies(s, d, pinned, n, false) }},
				{"both", both(n, func() { cpu.copy(h, p) }, false)},
			})
			reportBound(b, m, g)
		})
	}
}

// reportBound reports copier/driver, copier-ctx/driver, staged/driver
// and the host bound (both) from sideBySide's medians (copier,
// copier-ctx, driver, staged, memcpy, dma, both), and the paired ratios
// (pairedRatio) of the copier and copier-ctx to the driver and of the
// copier to the round's host bound from the samples g.
func reportBound(b *testing.B, m []float64, g [][]float64) {
	copier, copierCtx, driver, staged, memcpy, dma, bound := m[0], m[1], m[2], m[3], m[4], m[5], m[6]
	b.ReportMetric(pairedRatio(g[0], g[2]), "copier/driver-paired")
	b.ReportMetric(pairedRatio(g[1], g[2]), "copier-ctx/driver-paired")
	b.ReportMetric(pairedRatio(g[0], g[6]), "copier/hostbound-paired")
	if driver > 0 {
		b.ReportMetric(copier/driver, "copier/driver")
		b.ReportMetric(copierCtx/driver, "copier-ctx/driver")
		b.ReportMetric(staged/driver, "staged/driver")
	}
	b.ReportMetric(bound, "hostbound-GB/s")
	b.ReportMetric(memcpy, "memcpy-GB/s")
	b.ReportMetric(dma, "dma-GB/s")
	if bound > 0 {
		b.ReportMetric(copier/bound, "copier/hostbound")
	}
}

// streamCopies copies the first n bytes of buf to or from dev on s, one
// copy per registration, and waits.
func streamCopies(s *cuda.Stream, dev *cuda.DeviceBuffer, buf *pinmem.Buffer, n int, htod bool) error {
	off := 0
	for _, seg := range buf.Segments() {
		if off >= n {
			break
		}
		seg = seg[:min(len(seg), n-off)]
		var err error
		if htod {
			err = s.CopyHtoD(dev, off, seg)
		} else {
			err = s.CopyDtoH(seg, dev, off)
		}
		if err != nil {
			return err
		}
		off += len(seg)
	}
	return s.Synchronize(context.Background())
}

func sizeName(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkCopierConcurrent runs 1, 2, 4, 8 and 16 goroutines at once,
// each moving its own 64 MiB (or 24 MiB, which one stage holds, or
// 1 MiB) Go slice to the device and back twice, through one shared Copier or one Copier each, and reports the
// aggregate GB/s (both directions counted) and the peak of the process's
// pinned bytes over those pinned before the sub-benchmark (the Copiers'
// staging included; their creation is not timed), and fails unless every
// byte came back. The goroutines' directions interleave, so copies both
// ways run at once. About 20 s:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'CopierConcurrent' -test.benchtime 3x
func BenchmarkCopierConcurrent(b *testing.B) {
	ctx := gpuCtx(b)
	for _, n := range []int{64 << 20, 24 << 20, 1 << 20} {
		for _, g := range []int{1, 2, 4, 8, 16} {
			for _, mode := range []string{"shared", "each"} {
				b.Run(fmt.Sprintf("%s/g=%d/%s", sizeName(n), g, mode), func(b *testing.B) {
					benchConcurrent(b, ctx, n, g, strings.HasPrefix(mode, "shared"))
				})
			}
		}
	}
}

func benchConcurrent(b *testing.B, ctx *cuda.Context, n, g int, shared bool) {
	b.SetBytes(int64(2 * concurrentRounds * g * n))
	gbps, peak := runConcurrent(b, ctx, n, g, shared, b.N)
	b.ReportMetric(gbps, "aggregate-GB/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-pinned-MiB")
}

// concurrentRounds is how many round trips each goroutine of
// runConcurrent makes per iteration.
const concurrentRounds = 2

// runConcurrent runs iters times (after one untimed warm-up iteration) g
// goroutines that each copy their own n bytes to the device and back
// concurrentRounds times, through one shared Copier or one each, checks
// every byte after each iteration (the destinations are cleared before it,
// outside the timing), and returns the aggregate GB/s
// and the peak of the bytes pinned over those pinned before (the
// Copiers' staging included).
func runConcurrent(tb testing.TB, ctx *cuda.Context, n, g int, shared bool, iters int) (gbps float64, peak int64) {
	base := pinmem.Stats().Pinned.Bytes
	var peakA atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(500 * time.Microsecond)
		defer t.Stop()
		for {
			if p := pinmem.Stats().Pinned.Bytes - base; p > peakA.Load() {
				peakA.Store(p)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	defer func() { close(stop); sampler.Wait() }()
	cps := make([]*Copier, g)
	for i := range cps {
		if shared && i > 0 {
			cps[i] = cps[0]
			continue
		}
		cps[i] = gpuCopier(tb, ctx)
	}
	srcs := make([][]byte, g)
	dsts := make([][]byte, g)
	devs := make([]*cuda.DeviceBuffer, g)
	for i := range srcs {
		srcs[i] = touched(n)
		for k := 0; k < n; k += 4096 {
			srcs[i][k] = byte(i + 1) // differs per goroutine
		}
		dsts[i] = make([]byte, n)
		devs[i] = gpuAlloc(tb, ctx, n)
	}
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
	var wall time.Duration
	for it := range iters + 1 { // iteration 0 warms up, untimed
		for i := range g {
			clear(dsts[i]) // untimed, so that the check below sees this iteration's copies
		}
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, g)
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				bg := context.Background()
				for range concurrentRounds {
					if _, err := cps[i].HtoD(bg, devs[i], srcs[i]); err != nil {
						errs[i] = err
						return
					}
					if _, err := cps[i].DtoH(bg, dsts[i], devs[i]); err != nil {
						errs[i] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		if it > 0 {
			wall += time.Since(t0)
		}
		if err := errors.Join(errs...); err != nil {
			tb.Fatal(err)
		}
		for i := range g {
			if j := firstDiff(srcs[i], dsts[i]); j >= 0 {
				tb.Fatalf("goroutine %d: byte %d differs after the round trip", i, j)
			}
		}
	}
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
	}
	return float64(2*concurrentRounds*g*n*iters) / wall.Seconds() / 1e9, peakA.Load()
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	const step = 1 << 20
	for off := 0; off < len(a); off += step {
		end := min(off+step, len(a))
		if string(a[off:end]) != string(b[off:end]) {
			for i := off; i < end; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	return -1
}

// hugeSize is the buffer size of TestGPUHugeBuffers: more than one 4 GiB
// registration.
const hugeSize = 4<<30 + 64<<20

// memAvailable returns /proc/meminfo's MemAvailable in bytes (0 if unknown).
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// fillPattern writes a position-dependent pattern (plus delta in every
// byte) into p in parallel; checkPattern finds the first byte that
// differs from it, or -1. The pattern never repeats at segment or chunk
// boundaries, so a piece copied to the wrong offset is caught.
func fillPattern(p []byte, seed uint64, delta byte) { patternOp(p, seed, delta, false) }

func checkPattern(p []byte, seed uint64, delta byte) int { return patternOp(p, seed, delta, true) }

func patternOp(p []byte, seed uint64, delta byte, check bool) int {
	const piece = 64 << 20
	add := uint64(delta) * 0x0101010101010101
	var first atomic.Int64
	first.Store(-1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.NumCPU())
	for off := 0; off < len(p); off += piece {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			end := min(off+piece, len(p))
			words := unsafe.Slice((*uint64)(unsafe.Pointer(&p[off])), (end-off)/8)
			for i := range words {
				k := uint64(off/8 + i)
				v := (k*0x9E3779B97F4A7C15 ^ seed) &^ 0x8080808080808080 // no byte carries into the next under +delta
				v += add
				if !check {
					words[i] = v
				} else if words[i] != v {
					for j := 0; j < 8; j++ {
						if byte(words[i]>>(8*j)) != byte(v>>(8*j)) {
							at := int64(off + 8*i + j)
							for {
								old := first.Load()
								if old >= 0 && old <= at || first.CompareAndSwap(old, at) {
									break
								}
							}
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	return int(first.Load())
}

// TestGPUHugeBuffers copies 4 GiB + 64 MiB of pinned memory (two
// registrations) both ways, from a pinmem.Alloc buffer (recognised
// without AddPinned, and with it), a Go slice in the registration cache
// and a pool block, through the Copier and through a Pipeline (whose work
// adds 1 to every byte), and checks every byte. It skips unless the host
// has about 10 GiB available (one case at a time). About 30 s on an H200
// host:
//
//	PINMEM_REQUIRE_GPU=1 .gpu/bin/transfer.test -test.run 'GPUHugeBuffers' -test.v
func TestGPUHugeBuffers(t *testing.T) {
	ctx := gpuCtx(t)
	if testing.Short() {
		t.Skip("-short: 4 GiB buffers")
	}
	if avail := memAvailable(); avail < 2*hugeSize+2<<30 {
		t.Skipf("%d bytes of host memory available, the test needs about %d", avail, 2*hugeSize+2<<30)
	}
	if b := pinmem.Budget(); b > 0 && b < hugeSize+1<<30 {
		t.Skipf("pinmem budget %d bytes, the test pins %d", b, hugeSize+1<<30)
	}
	testHugeBuffers(t, ctx, hugeSize, gpuKernel(t, ctx, kernels.KernelAdd), 48<<20)
}

// testHugeBuffers is TestGPUHugeBuffers for buffers of size bytes, with f
// the add_u8 kernel and Pipeline chunks of chunk bytes.
func testHugeBuffers(t *testing.T, ctx *cuda.Context, size int, f *cuda.Function, chunk int, pinOpts ...pinmem.Option) {
	dev := gpuAlloc(t, ctx, size)
	run := func(t *testing.T, c *Copier, host []byte, wantSegs bool) {
		t.Helper()
		bg := context.Background()
		fillPattern(host, 1, 0)
		st, err := c.HtoD(bg, dev, host)
		if err != nil {
			t.Fatalf("HtoD: %v", err)
		}
		if st.DirectBytes < int64(len(host))-int64(2*pageSize) {
			t.Errorf("HtoD not direct: %v", st)
		}
		fillPattern(host, 2, 0) // anything but the data on the device
		if st, err = c.DtoH(bg, host, dev); err != nil {
			t.Fatalf("DtoH: %v", err)
		}
		if i := checkPattern(host, 1, 0); i >= 0 {
			t.Fatalf("after the round trip through the Copier, byte %d differs (%v)", i, st)
		}
		p, err := c.NewPipeline(WithChunkSize(chunk), WithStreams(4), WithInFlight(6),
			WithWork(func(s *cuda.Stream, ch Chunk) error {
				return f.Launch(s, cuda.D1(132*4), cuda.D1(256), 0, ch.Dev.Ptr(), uint64(ch.Len), uint8(1))
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(bg)
		pst, err := p.Run(bg, host, host)
		if err != nil {
			t.Fatalf("Pipeline: %v", err)
		}
		if wantSegs && (pst.StagedIn || pst.StagedOut) {
			t.Errorf("Pipeline staged pinned memory: %+v", pst)
		}
		if i := checkPattern(host, 1, 1); i >= 0 {
			t.Fatalf("after the Pipeline, byte %d differs", i)
		}
	}
	t.Run("Alloc", func(t *testing.T) {
		b, err := pinmem.Alloc(size, 0, pinmem.WithDevice(ctx.Device()))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		if n := len(b.Segments()); n < 2 {
			t.Fatalf("%d segments: the buffer does not test a copy across registrations", n)
		}
		run(t, gpuCopier(t, ctx), b.Bytes(), true)
		c := gpuCopier(t, ctx)
		defer c.AddPinned(b)()
		run(t, c, b.Bytes(), true)
	})
	t.Run("RegCache", func(t *testing.T) {
		host := make([]byte, size)
		c := gpuCopier(t, ctx, WithRegistrationCache(0))
		run(t, c, host, true)
		if cs := c.Cache().Stats(); cs.Bytes < int64(size)-int64(2*pageSize) {
			t.Errorf("cache %+v", cs)
		}
		c.Cache().Forget(host)
	})
	t.Run("pool", func(t *testing.T) {
		pl, err := pool.New(pool.WithFlags(0, append([]pinmem.Option{pinmem.WithDevice(ctx.Device())}, pinOpts...)...))
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close(context.Background())
		blk, err := pl.Get(context.Background(), size)
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Put(blk)
		if n := len(blk.Segments()); n < 2 {
			t.Fatalf("%d segments", n)
		}
		run(t, gpuCopier(t, ctx), blk.Bytes(), true)
	})
}

// BenchmarkStagingKnobs compares, side by side, transfers of 16 MiB to
// 1 GiB from a Go slice staged through the ring (forceStaged), cut into at least 4 pieces (the default)
// or 8 (chunkPieces), waiting for a stage asleep in the driver at once or
// polling it for up to 1 ms first (stageSpin), the CPU's copy of a piece
// in one share per goroutine or 4 sub-pieces each (subPieces), with the host bound of
// BenchmarkCopierVsDriver beside them (memcpy, dma), to choose the
// defaults. It reports each variant over the round's host bound
// (pairedRatio). Under 30 s:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'StagingKnobs' -test.benchtime 1x
func BenchmarkStagingKnobs(b *testing.B) {
	ctx := gpuCtx(b)
	staged := gpuCopier(b, ctx)
	const maxN = 1 << 30
	heap := touched(maxN)
	dev := gpuAlloc(b, ctx, maxN)
	pinned := gpuPinned(b, ctx, maxN)
	s, cpu := boundTools(b, ctx)
	for _, n := range []int{16 << 20, 64 << 20, 256 << 20, 1 << 30} {
		h := heap[:n]
		p := pinned.Bytes()[:n]
		d, _ := dev.Slice(0, n)
		for _, dir := range []string{"H2D", "D2H"} {
			htod := dir == "H2D"
			b.Run(dir+"/"+sizeName(n), func(b *testing.B) {
				b.SetBytes(int64(n))
				var vs []variant
				for _, sub := range []int{1, 4} {
					for _, k := range []struct {
						pieces int
						spin   time.Duration
					}{{4, 0}, {4, time.Millisecond}, {8, time.Millisecond}} {
						vs = append(vs, variant{fmt.Sprintf("p%d-stagespin%dus-sub%d", k.pieces, k.spin.Microseconds(), sub), func() error {
							staged.tune().chunkPieces, staged.tune().subPieces = k.pieces, sub
							staged.tune().stageSpin = k.spin
							var err error
							if htod {
								_, err = staged.htod(context.Background(), d, h, forceStaged)
							} else {
								_, err = staged.dtoh(context.Background(), h, d, forceStaged)
							}
							return err
						}})
					}
				}
				knobs := len(vs)
				vs = append(vs,
					variant{"memcpy", func() error {
						if htod {
							cpu.copy(p, h)
						} else {
							cpu.copy(h, p)
						}
						return nil
					}},
					variant{"dma", func() error { return streamCopies(s, d, pinned, n, htod) }})
				_, g := sideBySideRounds(b, n, roundsFor(n)*b.N, vs)
				bounds := make([]float64, len(g[knobs]))
				for r := range bounds {
					bounds[r] = min(g[knobs][r], g[knobs+1][r])
				}
				for k := range knobs {
					b.ReportMetric(pairedRatio(g[k], bounds), vs[k].name+"/hostbound")
				}
			})
		}
	}
}

// BenchmarkFileToDevice moves a file in the page cache (1 GiB; 4 GiB with
// PINMEM_BENCH_4G=1, in the test's temporary folder) to the device and
// back, side by side with interleaved samples: Copier.HtoDFrom on the
// *os.File (parallel ReadAt into the stages), HtoDFrom on a reader that
// is only an io.Reader (one Read after another), the host's parallel
// read of the same file into pinned memory (12 goroutines, the rate the
// Copier's reading is bounded by) and the host's own reading of the plain
// io.Reader into pinned memory (the bound of the io.Reader path, which
// cannot read in parallel); then DtoHTo into a second file against
// the host's parallel write of pinned memory into it. It reports
// copier/hostread, copier-stream/hostread-stream and copier/hostwrite, and checks the bytes of both
// files once. Under 60 s (1 GiB):
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'FileToDevice' -test.benchtime 1x
func BenchmarkFileToDevice(b *testing.B) {
	ctx := gpuCtx(b)
	n := 1 << 30
	if os.Getenv(EnvBench4G) == "1" {
		n = 4 << 30
	}
	c := gpuCopier(b, ctx)
	dev := gpuAlloc(b, ctx, n)
	pinned, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pinned.Free() })
	dir := b.TempDir()
	src := touched(n)
	inPath, outPath := dir+"/in", dir+"/out"
	if err := os.WriteFile(inPath, src, 0o600); err != nil {
		b.Fatal(err)
	}
	in, err := os.Open(inPath)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close() })
	out, err := os.OpenFile(outPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { out.Close() })
	bg := context.Background()
	hostIO := func(f *os.File, write bool) error {
		const parts = 12
		size := (n/parts + 4095) &^ 4095
		errs := make([]error, parts)
		var wg sync.WaitGroup
		for i := range parts {
			lo := min(i*size, n)
			hi := min(lo+size, n)
			wg.Go(func() {
				if write {
					_, errs[i] = f.WriteAt(pinned.Bytes()[lo:hi], int64(lo))
				} else {
					_, errs[i] = f.ReadAt(pinned.Bytes()[lo:hi], int64(lo))
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	rewind := func(f *os.File) error { _, err := f.Seek(0, io.SeekStart); return err }
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(n))
		m := sideBySide(b, n, roundsFor(n)*b.N, []variant{
			{"copier", func() error {
				if err := rewind(in); err != nil {
					return err
				}
				st, err := c.HtoDFrom(bg, dev, in)
				if err == nil && st.Bytes != int64(n) {
					err = fmt.Errorf("read %d bytes, want %d", st.Bytes, n)
				}
				return err
			}},
			{"copier-stream", func() error {
				if err := rewind(in); err != nil {
					return err
				}
				_, err := c.HtoDFrom(bg, dev, struct{ io.Reader }{in})
				return err
			}},
			{"hostread", func() error { return hostIO(in, false) }},
			{"hostread-stream", func() error {
				// The host's own read of the plain io.Reader: one Read
				// after another into pinned memory, as fast as that reader
				// can go.
				if err := rewind(in); err != nil {
					return err
				}
				_, err := io.ReadFull(struct{ io.Reader }{in}, pinned.Bytes()[:n])
				return err
			}},
		})
		if m[2] > 0 {
			b.ReportMetric(m[0]/m[2], "copier/hostread")
			b.ReportMetric(m[1]/m[2], "copier-stream/hostread")
		}
		if m[3] > 0 {
			b.ReportMetric(m[1]/m[3], "copier-stream/hostread-stream")
		}
	})
	back := make([]byte, n)
	if _, err := c.DtoH(bg, back, dev); err != nil {
		b.Fatal(err)
	}
	if i := firstDiff(src, back); i >= 0 {
		b.Fatalf("byte %d of the file differs on the device", i)
	}
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(n))
		m := sideBySide(b, n, roundsFor(n)*b.N, []variant{
			{"copier", func() error {
				if err := rewind(out); err != nil {
					return err
				}
				_, err := c.DtoHTo(bg, out, dev)
				return err
			}},
			{"hostwrite", func() error { return hostIO(out, true) }},
		})
		if m[1] > 0 {
			b.ReportMetric(m[0]/m[1], "copier/hostwrite")
		}
	})
	if err := rewind(out); err != nil {
		b.Fatal(err)
	}
	if _, err := c.DtoHTo(bg, out, dev); err != nil {
		b.Fatal(err)
	}
	got, err := os.ReadFile(outPath)
	if err != nil {
		b.Fatal(err)
	}
	if i := firstDiff(src, got); i >= 0 || len(got) != n {
		b.Fatalf("written file: %d bytes, first difference at %d", len(got), i)
	}
}

// BenchmarkPipelineKnobs runs rings of 8 and 32 RGBA frames (1080p and
// 4K) from Go memory through a Pipeline with 4 streams and no work (each
// frame staged in, copied to the device and back, staged out), one Run per
// ring, with its output goroutines polling a chunk for 200 us or 2 ms
// before they sleep (outSpin) and the CPU's copies in one share per
// goroutine or 4 sub-pieces each (subPieces), and once with a kernel
// (add_u8) on every frame, side by side with the staged bound of
// examples/imagepipeline: one Copier staging the ring in while another
// stages a device ring out. It reports each variant over the round's
// bound (pairedRatio) and checks the bytes. Under 30 s:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'PipelineKnobs' -test.benchtime 1x
func BenchmarkPipelineKnobs(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	cps := [2]*Copier{gpuCopier(b, ctx), gpuCopier(b, ctx)}
	f := gpuKernel(b, ctx, kernels.KernelAdd)
	props, err := ctx.Device().Properties()
	if err != nil {
		b.Fatal(err)
	}
	add := LaunchWork(f, cuda.D1(props.Multiprocessors*4), cuda.D1(256), func(ch Chunk) []any {
		return []any{ch.Dev.Ptr(), uint64(ch.Len), uint8(1)}
	})
	for _, res := range []struct {
		name string
		w, h int
	}{{"1080p", 1920, 1080}, {"4K", 3840, 2160}} {
		frame := res.w * res.h * 4
		p, err := c.NewPipeline(WithChunkSize(frame), WithStreams(4), WithPinStages(true))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close(context.Background()) })
		pw, err := c.NewPipeline(WithChunkSize(frame), WithStreams(4), WithPinStages(true), WithWork(add))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pw.Close(context.Background()) })
		for _, ring := range []int{8, 32} {
			n := ring * frame
			in, out := touched(n), make([]byte, n)
			devs := [2]*cuda.DeviceBuffer{gpuAlloc(b, ctx, n), gpuAlloc(b, ctx, n)}
			b.Run(fmt.Sprintf("%s/ring%d", res.name, ring), func(b *testing.B) {
				b.SetBytes(int64(n))
				var vs []variant
				for _, sub := range []int{1, 4} {
					for _, spin := range []time.Duration{200 * time.Microsecond, 2 * time.Millisecond} {
						vs = append(vs, variant{fmt.Sprintf("outspin%dus-sub%d", spin.Microseconds(), sub), func() error {
							c.tune().outSpin, c.tune().subPieces = spin, sub
							_, err := p.Run(context.Background(), in, out)
							return err
						}})
					}
				}
				vs = append(vs, variant{"add-outspin2000us-sub4", func() error {
					*c.tune() = defaultTuning()
					_, err := pw.Run(context.Background(), in, out)
					return err
				}})
				knobs := len(vs)
				vs = append(vs, variant{"staged-bound", func() error {
					var errs [2]error
					var wg sync.WaitGroup
					wg.Go(func() { _, errs[0] = cps[0].HtoD(context.Background(), devs[0], in) })
					wg.Go(func() { _, errs[1] = cps[1].DtoH(context.Background(), out, devs[1]) })
					wg.Wait()
					return errors.Join(errs[:]...)
				}})
				_, g := sideBySideRounds(b, n, 15*b.N, vs)
				for k := range knobs {
					b.ReportMetric(pairedRatio(g[k], g[knobs]), vs[k].name+"/bound")
				}
				clear(out)
				if _, err := p.Run(context.Background(), in, out); err != nil {
					b.Fatal(err)
				}
				if !bytes.Equal(in, out) {
					b.Fatal("pipeline output differs from its input")
				}
				if _, err := pw.Run(context.Background(), in, out); err != nil {
					b.Fatal(err)
				}
				for i := range in {
					if out[i] != in[i]+1 {
						b.Fatalf("add pipeline: byte %d is %d, want %d", i, out[i], in[i]+1)
					}
				}
			})
		}
	}
}

// BenchmarkHostBoundOverlap asks whether the host bound of
// BenchmarkCopierVsDriver (the smaller of a parallel Go copy into pinned
// memory and the pinned DMA, each measured alone) can be reached when the
// two run at once, as they do in a staged transfer: side by side with
// interleaved samples, at 64 and 256 MiB host to device, it times the Go
// copy alone (memcpy: heap into pinned buffer A), the DMA alone (pinned
// buffer B to the device), both started together and timed until both
// end (overlap, the bytes of one), and the Copier. It reports
// overlap/hostbound and copier/overlap (paired). About 20 s:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'HostBoundOverlap' -test.benchtime 1x
func BenchmarkHostBoundOverlap(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	const maxN = 256 << 20
	heap := touched(maxN)
	dev := gpuAlloc(b, ctx, maxN)
	pins := [2]*pinmem.Buffer{gpuPinned(b, ctx, maxN), gpuPinned(b, ctx, maxN)}
	s, cpu := boundTools(b, ctx)
	bg := context.Background()
	for _, n := range []int{64 << 20, 256 << 20} {
		h, a := heap[:n], pins[0].Bytes()[:n]
		d, _ := dev.Slice(0, n)
		b.Run("H2D/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			overlap := func() error {
				done := make(chan error, 1)
				go func() { done <- streamCopies(s, d, pins[1], n, true) }()
				cpu.copy(a, h)
				return <-done
			}
			m, g := sideBySideRounds(b, n, 15*b.N, []variant{
				{"memcpy", func() error { cpu.copy(a, h); return nil }},
				{"dma", func() error { return streamCopies(s, d, pins[1], n, true) }},
				{"overlap", overlap},
				{"copier", func() error { _, err := c.HtoD(bg, d, h); return err }},
			})
			bounds := make([]float64, len(g[0]))
			for r := range bounds {
				bounds[r] = min(g[0][r], g[1][r])
			}
			b.ReportMetric(pairedRatio(g[2], bounds), "overlap/hostbound-paired")
			b.ReportMetric(pairedRatio(g[3], g[2]), "copier/overlap-paired")
			b.ReportMetric(pairedRatio(g[3], bounds), "copier/hostbound-paired")
			b.ReportMetric(min(m[0], m[1]), "hostbound-GB/s")
		})
	}
}
