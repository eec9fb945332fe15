package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/testutil"
)

// gpuBlocks is a block-copy setup on the GPU: nblk slots of bs bytes on
// the device and in two pinned host buffers, with shuffles that scatter
// block i to host slot hp[i] and device slot dp[i].
type gpuBlocks struct {
	ctx      *cuda.Context
	s        *cuda.Stream
	dev      *cuda.DeviceBuffer
	src, dst []byte // pinned, nblk*maxBS each
	back     []byte // pageable, for reading the device back
	nblk     int
	hp, dp   []int
}

func newGPUBlocks(tb testing.TB, nblk, maxBS int) *gpuBlocks {
	tb.Helper()
	ctx := gpuContext(tb)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Destroy() })
	dev, err := ctx.Alloc(nblk * maxBS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Free() })
	var bufs [2][]byte
	for i := range bufs {
		// Mapped: the kernel strategy reads and writes them through their
		// device addresses; the copy engines do not care.
		b, err := pinmem.Alloc(nblk*maxBS, pinmem.Mapped)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { b.Free() })
		bufs[i] = b.Bytes()
	}
	copy(bufs[0], testutil.RandomBytes(nblk*maxBS, 42))
	r := rand.New(rand.NewPCG(3, 4))
	return &gpuBlocks{ctx: ctx, s: s, dev: dev, src: bufs[0], dst: bufs[1], back: make([]byte, nblk*maxBS),
		nblk: nblk, hp: r.Perm(nblk), dp: r.Perm(nblk)}
}

// list returns the scattered block list of bs-byte blocks on host buffer h.
func (g *gpuBlocks) list(h []byte, bs int) []cuda.BlockCopy {
	l := make([]cuda.BlockCopy, g.nblk)
	for i := range g.nblk {
		l[i] = cuda.BlockCopy{Host: h[g.hp[i]*bs : (g.hp[i]+1)*bs], Dev: g.dev, Off: g.dp[i] * bs}
	}
	return l
}

// verifyHtoD checks that device slot dp[i] holds source slot hp[i] (or,
// contiguous, that the device holds the source's first n bytes).
func (g *gpuBlocks) verifyHtoD(tb testing.TB, bs int, contiguous bool) {
	tb.Helper()
	n := g.nblk * bs
	if _, err := g.dev.ReadAt(g.back[:n], 0); err != nil {
		tb.Fatal(err)
	}
	if contiguous {
		testutil.CheckBytes(tb, g.src[:n], g.back[:n])
		return
	}
	for i := range g.nblk {
		d, h := g.dp[i], g.hp[i]
		if !bytes.Equal(g.back[d*bs:(d+1)*bs], g.src[h*bs:(h+1)*bs]) {
			tb.Fatalf("HtoD %d-byte blocks: device slot %d does not hold host slot %d", bs, d, h)
		}
	}
}

// verifyDtoH checks that destination slot hp[i] holds device slot dp[i],
// the device holding the source's bytes (loaded contiguously first).
func (g *gpuBlocks) verifyDtoH(tb testing.TB, bs int, contiguous bool) {
	tb.Helper()
	n := g.nblk * bs
	if contiguous {
		testutil.CheckBytes(tb, g.src[:n], g.dst[:n])
		return
	}
	for i := range g.nblk {
		d, h := g.dp[i], g.hp[i]
		if !bytes.Equal(g.dst[h*bs:(h+1)*bs], g.src[d*bs:(d+1)*bs]) {
			tb.Fatalf("DtoH %d-byte blocks: host slot %d does not hold device slot %d", bs, h, d)
		}
	}
}

// TestGPUCopyBlocks pages 4096 (-test.short: 256) scattered 16 KiB blocks in and out with
// each strategy and checks every block; then checks the host-side rules
// on the real driver: blocks of memory registered with pinmem.Register
// are accepted, pageable ones refused (or staged when asked), and the
// driver's batch is the one of its version.
func TestGPUCopyBlocks(t *testing.T) {
	const bs = 16 << 10
	nblk := 4096
	if testing.Short() { // the sanitizer tier
		nblk = 256
	}
	g := newGPUBlocks(t, nblk, bs)
	drv, err := cudadrv.Get()
	if err != nil {
		t.Fatal(err)
	}
	v, err := cuda.DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %d: batch copy %q", v, cudadrv.BatchCopySymbolOf(drv))
	if got, want := cudadrv.BatchCopySymbolOf(drv), cudadrv.BatchCopySymbol(v); got != want {
		t.Errorf("the binding calls %q, a %d driver's cuda.h names %q", got, v, want)
	}
	// A kernel that does not load fails the kernel's subtests only.
	k, kerr := g.ctx.NewBlockKernel(nblk)
	if kerr == nil {
		defer func() { must(t, k.Close()) }()
	}
	needKernel := func(t *testing.T) {
		if kerr != nil {
			t.Fatalf("loading the block kernel (hand-written PTX): %v", kerr)
		}
	}
	strategies := []cuda.BlockStrategy{cuda.BlockAuto, cuda.BlockDriverBatch, cuda.BlockPerCopy, cuda.BlockKernelCopy}
	opt := func(st cuda.BlockStrategy) []cuda.BlockOption {
		o := []cuda.BlockOption{cuda.WithBlockStrategy(st)}
		if st == cuda.BlockKernelCopy {
			o = append(o, cuda.WithBlockKernel(k))
		}
		return o
	}
	for _, st := range strategies {
		t.Run(st.String(), func(t *testing.T) {
			if st == cuda.BlockKernelCopy {
				needKernel(t)
			}
			if err := g.dev.Memset(0); err != nil {
				t.Fatal(err)
			}
			rep, err := g.s.CopyBlocks(cuda.HostToDevice, g.list(g.src, bs), opt(st)...)
			if st == cuda.BlockDriverBatch && errors.Is(err, cuda.ErrNotSupported) {
				testutil.SkipFeature(t, "driver without cuMemcpyBatchAsync: "+err.Error())
			}
			if err != nil {
				t.Fatal(err)
			}
			must(t, g.s.Synchronize(context.Background()))
			if rep.Blocks != nblk || rep.Bytes != int64(nblk*bs) {
				t.Fatalf("report %+v", rep)
			}
			t.Logf("%v: queued by %v in %d driver calls", st, rep.Strategy, rep.Calls)
			g.verifyHtoD(t, bs, false)

			testutil.Poison(g.dst[:nblk*bs])
			must(t, errOf(g.dev.WriteAt(g.src[:nblk*bs], 0)))
			ev, err := g.ctx.NewEvent(cuda.EventDisableTiming)
			if err != nil {
				t.Fatal(err)
			}
			defer ev.Destroy()
			if _, err := g.s.CopyBlocks(cuda.DeviceToHost, g.list(g.dst, bs), append(opt(st), cuda.WithBlockEvent(ev))...); err != nil {
				t.Fatal(err)
			}
			must(t, ev.Synchronize(context.Background()))
			g.verifyDtoH(t, bs, false)
		})
	}

	t.Run("kernel odd blocks", func(t *testing.T) {
		needKernel(t)
		// The kernel's byte path: sizes and addresses not multiples of 16.
		odd := []cuda.BlockCopy{{Host: g.src[1:14], Dev: g.dev, Off: 3}, {Host: g.src[100:1123], Dev: g.dev, Off: 5000}, {Host: g.src[4096 : 4096+777], Dev: g.dev, Off: 9001}}
		must(t, g.dev.Memset(0))
		if _, err := g.s.CopyBlocks(cuda.HostToDevice, odd, cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err)
		}
		must(t, g.s.Synchronize(context.Background()))
		for _, b := range odd {
			got := make([]byte, len(b.Host))
			must(t, errOf(g.dev.ReadAt(got, int64(b.Off))))
			testutil.CheckBytes(t, b.Host, got)
		}
		back := make([]cuda.BlockCopy, len(odd))
		for i, b := range odd {
			back[i] = cuda.BlockCopy{Host: g.dst[7+2000*i : 7+2000*i+len(b.Host)], Dev: g.dev, Off: b.Off}
		}
		if _, err := g.s.CopyBlocks(cuda.DeviceToHost, back, cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err)
		}
		must(t, g.s.Synchronize(context.Background()))
		for i, b := range odd {
			testutil.CheckBytes(t, b.Host, back[i].Host)
		}
	})

	t.Run("host rules", func(t *testing.T) {
		// Go memory registered with pinmem: accepted (the driver's pointer
		// attributes know registered ranges as pinned host memory).
		mem := make([]byte, 64*bs)
		reg, err := pinmem.Register(mem, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Free()
		h := reg.Bytes()
		copy(h, testutil.RandomBytes(len(h), 5))
		var l []cuda.BlockCopy
		for i := range 64 {
			l = append(l, cuda.BlockCopy{Host: h[i*bs : (i+1)*bs], Dev: g.dev, Off: (63 - i) * bs})
		}
		if _, err := g.s.CopyBlocks(cuda.HostToDevice, l); err != nil {
			t.Fatalf("registered Go memory: %v", err)
		}
		must(t, g.s.Synchronize(context.Background()))
		back := make([]byte, bs)
		must(t, errOf(g.dev.ReadAt(back, int64(63*bs))))
		testutil.CheckBytes(t, h[:bs], back)

		// Pageable memory: refused, and staged when asked.
		pageable := testutil.RandomBytes(8*bs, 6)
		l = l[:0]
		for i := range 8 {
			l = append(l, cuda.BlockCopy{Host: pageable[i*bs : (i+1)*bs], Dev: g.dev, Off: i * bs})
		}
		if _, err := g.s.CopyBlocks(cuda.HostToDevice, l); !errors.Is(err, cuda.ErrHostNotPinned) {
			t.Fatalf("pageable blocks: %v, want ErrHostNotPinned", err)
		}
		rep, err := g.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockStaging(g.dst))
		if err != nil || rep.Staged != 8 {
			t.Fatalf("staged: %+v, %v", rep, err)
		}
		must(t, g.s.Synchronize(context.Background()))
		got := make([]byte, 8*bs)
		must(t, errOf(g.dev.ReadAt(got, 0)))
		testutil.CheckBytes(t, pageable, got)
		// A block over the end of the device buffer, and overlapping ones: refused.
		if _, err := g.s.CopyBlocks(cuda.HostToDevice, []cuda.BlockCopy{{Host: g.src[:bs], Dev: g.dev, Off: g.dev.Size() - 1}}); !errors.Is(err, cuda.ErrBlockRange) {
			t.Errorf("past the end: %v", err)
		}
		if _, err := g.s.CopyBlocks(cuda.HostToDevice, []cuda.BlockCopy{{Host: g.src[:bs], Dev: g.dev}, {Host: g.src[bs : 2*bs], Dev: g.dev, Off: 1}}); !errors.Is(err, cuda.ErrBlockOverlap) {
			t.Errorf("overlap: %v", err)
		}
	})
}

// TestGPUCopyBlocksAcrossRegistrations checks on the real driver what the
// fake models: blocks of a Mapped buffer pinned as several registrations
// (64 KiB chunks here, as buffers over 4 GiB are) that cross a boundary
// are copied right by every strategy (the copy engines' strategies split
// them; the kernel takes them whole through the one device range pinmem
// maps the chunks to), and a block whose ends are pinned with a pageable
// page between them is refused with ErrHostNotPinned.
func TestGPUCopyBlocksAcrossRegistrations(t *testing.T) {
	const chunk, bs, nblk = 64 << 10, 48 << 10, 64
	t.Cleanup(testhook.SetRegChunk(chunk))
	ctx := gpuContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	dev, err := ctx.Alloc(nblk * bs)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	var bufs [2]*pinmem.Buffer
	for i := range bufs {
		if bufs[i], err = pinmem.Alloc(nblk*bs, pinmem.Mapped, pinmem.WithMethod(pinmem.MethodMmapRegister)); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Free()
		if n := len(bufs[i].Segments()); n < 3 {
			t.Fatalf("%d registrations, want several", n)
		}
	}
	src, dst := bufs[0].Bytes(), bufs[1].Bytes()
	copy(src, testutil.RandomBytes(len(src), 77))
	r := rand.New(rand.NewPCG(5, 6))
	hp, dp := r.Perm(nblk), r.Perm(nblk)
	list := func(h []byte) []cuda.BlockCopy {
		l := make([]cuda.BlockCopy, nblk)
		for i := range nblk {
			l[i] = cuda.BlockCopy{Host: h[hp[i]*bs : (hp[i]+1)*bs], Dev: dev, Off: dp[i] * bs}
		}
		return l
	}
	k, err := ctx.NewBlockKernel(nblk)
	if err != nil {
		t.Fatalf("loading the block kernel: %v", err)
	}
	defer func() { must(t, k.Close()) }()
	back := make([]byte, nblk*bs)
	for _, opts := range [][]cuda.BlockOption{
		{cuda.WithBlockStrategy(cuda.BlockDriverBatch)},
		{cuda.WithBlockStrategy(cuda.BlockPerCopy)},
		{cuda.WithBlockKernel(k)},
	} {
		must(t, dev.Memset(0))
		testutil.Poison(dst)
		rep, err := s.CopyBlocks(cuda.HostToDevice, list(src), opts...)
		if errors.Is(err, cuda.ErrNotSupported) {
			testutil.SkipFeature(t, "driver without cuMemcpyBatchAsync: "+err.Error())
		}
		if err != nil {
			t.Fatal(err)
		}
		must(t, s.Synchronize(context.Background()))
		t.Logf("%v: %d blocks in %d driver calls", rep.Strategy, rep.Blocks, rep.Calls)
		must(t, errOf(dev.ReadAt(back, 0)))
		for i := range nblk {
			if !bytes.Equal(back[dp[i]*bs:(dp[i]+1)*bs], src[hp[i]*bs:(hp[i]+1)*bs]) {
				t.Fatalf("%v HtoD: device slot %d does not hold host slot %d", rep.Strategy, dp[i], hp[i])
			}
		}
		if _, err := s.CopyBlocks(cuda.DeviceToHost, list(dst), opts...); err != nil {
			t.Fatal(err)
		}
		must(t, s.Synchronize(context.Background()))
		testutil.CheckBytes(t, src, dst)
	}

	// Two registrations with a pageable page between them.
	page := os.Getpagesize()
	raw := make([]byte, 4*page)
	mem := raw[(page-int(hostptr.AddrOf(raw)%uintptr(page)))%page:][:3*page]
	for _, part := range [][]byte{mem[:page], mem[2*page:]} {
		b, err := pinmem.Register(part, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
	}
	gap := []cuda.BlockCopy{{Host: mem[page/2 : 2*page+page/2], Dev: dev}}
	if _, err := s.CopyBlocks(cuda.HostToDevice, gap, cuda.WithBlockStrategy(cuda.BlockPerCopy)); !errors.Is(err, cuda.ErrHostNotPinned) {
		t.Errorf("a block over a pageable gap: %v, want ErrHostNotPinned", err)
	}
}

// blockBenchSizes are the block sizes of BenchmarkGPUBlocks and cref/blocks.
var blockBenchSizes = []int{16 << 10, 64 << 10, 256 << 10}

// BenchmarkGPUBlocks copies 4096 blocks of 16, 64 and 256 KiB, scattered
// on both sides, each way, with each strategy, beside one contiguous copy
// of the same bytes, all on one stream and interleaved within each
// iteration. Metrics per size and direction: GB/s (1e9 bytes/s, from the
// first call to the end of the stream's synchronisation) of each
// strategy ("batch-GB/s", "percopy-GB/s", "kernel-GB/s", "contig-GB/s"), each strategy's
// share of the contiguous rate, and the CPU time to queue the list
// ("batch-issue-us", ...). The first iteration verifies
// every block of every strategy. With PINMEM_CREF_BLOCKS naming
// cref/blocks (built by cref/build), the C program runs in the same
// benchmark and its one-copy-per-block loop and batch are reported
// ("c-loop-GB/s", "c-batch-GB/s") with the ratios "batch/c-loop" (pinmem's
// batch over C's plain loop) and "percopy/c-loop". Run it with
// -test.benchtime=10x: about 20 s on an H200, most of it C's samples and
// the verification of 1 GiB per strategy.
func BenchmarkGPUBlocks(b *testing.B) {
	const nblk = 4096
	g := newGPUBlocks(b, nblk, slices.Max(blockBenchSizes))
	var cref map[string]float64 // "<kind>/<size>/<dir>" -> GB/s
	if prog := os.Getenv("PINMEM_CREF_BLOCKS"); prog != "" {
		cref = map[string]float64{}
		for _, r := range testutil.RunCref(b, prog, "--blocks", fmt.Sprint(nblk), "--samples", "7") {
			cref[fmt.Sprintf("%s/%d/%s", r.Kind, r.Size, r.Dir)] = r.Median
		}
	}
	type run struct {
		name     string
		strategy cuda.BlockStrategy
		contig   bool
	}
	runs := []run{{"batch", cuda.BlockDriverBatch, false}, {"percopy", cuda.BlockPerCopy, false}, {"kernel", cuda.BlockKernelCopy, false}, {"contig", 0, true}}
	k, err := g.ctx.NewBlockKernel(nblk)
	if err != nil {
		// The other strategies are still measured; the failure is reported.
		b.Errorf("loading the block kernel (hand-written PTX): %v", err)
		runs = slices.DeleteFunc(runs, func(r run) bool { return r.strategy == cuda.BlockKernelCopy })
	} else {
		b.Cleanup(func() { k.Close() })
	}
	for _, bs := range blockBenchSizes {
		for _, dir := range []cuda.Direction{cuda.HostToDevice, cuda.DeviceToHost} {
			b.Run(fmt.Sprintf("%dKiB/%v", bs>>10, dir), func(b *testing.B) {
				n := nblk * bs
				host := g.src
				if dir == cuda.DeviceToHost {
					host = g.dst
					must(b, errOf(g.dev.WriteAt(g.src[:n], 0)))
				}
				list := g.list(host, bs)
				gbps := map[string][]float64{}
				issue := map[string][]float64{}
				for i := 0; i < b.N; i++ {
					for _, r := range runs {
						verify := i == 0
						if verify {
							if dir == cuda.HostToDevice {
								must(b, g.dev.Memset(0))
							} else {
								testutil.Poison(g.dst[:n])
							}
						}
						must(b, g.s.Synchronize(context.Background()))
						t0 := time.Now()
						var err error
						switch {
						case r.contig && dir == cuda.HostToDevice:
							err = g.s.CopyHtoD(g.dev, 0, host[:n])
						case r.contig:
							err = g.s.CopyDtoH(host[:n], g.dev, 0)
						default:
							opts := []cuda.BlockOption{cuda.WithBlockStrategy(r.strategy)}
							if r.strategy == cuda.BlockKernelCopy {
								opts = append(opts, cuda.WithBlockKernel(k))
							}
							_, err = g.s.CopyBlocks(dir, list, opts...)
						}
						t1 := time.Now()
						testutil.SkipIfNotSupported(b, err)
						must(b, g.s.Synchronize(context.Background()))
						t2 := time.Now()
						gbps[r.name] = append(gbps[r.name], float64(n)/float64(t2.Sub(t0).Nanoseconds()))
						issue[r.name] = append(issue[r.name], float64(t1.Sub(t0).Nanoseconds())/1e3)
						if verify {
							if dir == cuda.HostToDevice {
								g.verifyHtoD(b, bs, r.contig)
							} else {
								g.verifyDtoH(b, bs, r.contig)
							}
						}
					}
				}
				b.ReportMetric(0, "ns/op")
				contig := median(gbps["contig"])
				for _, r := range runs {
					m := median(gbps[r.name])
					b.ReportMetric(m, r.name+"-GB/s")
					if !r.contig {
						b.ReportMetric(m/contig, r.name+"/contig")
						b.ReportMetric(median(issue[r.name]), r.name+"-issue-us")
					}
				}
				if cref != nil {
					cdir := map[cuda.Direction]string{cuda.HostToDevice: "h2d", cuda.DeviceToHost: "d2h"}[dir]
					loop := cref[fmt.Sprintf("loop/%d/%s", bs, cdir)]
					if loop == 0 {
						b.Fatalf("PINMEM_CREF_BLOCKS printed no loop result for %d bytes %s", bs, cdir)
					}
					b.ReportMetric(loop, "c-loop-GB/s")
					if cb := cref[fmt.Sprintf("batch/%d/%s", bs, cdir)]; cb > 0 {
						b.ReportMetric(cb, "c-batch-GB/s")
					}
					b.ReportMetric(median(gbps["batch"])/loop, "batch/c-loop")
					b.ReportMetric(median(gbps["percopy"])/loop, "percopy/c-loop")
				}
			})
		}
	}
}
