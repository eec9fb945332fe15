package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/copypool"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func gpuCtx(t testing.TB) *cuda.Context { return testutil.GPUContext(t) }

func gpuCopier(t testing.TB, ctx *cuda.Context, opts ...Option) *Copier {
	t.Helper()
	c, err := New(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func gpuAlloc(t testing.TB, ctx *cuda.Context, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return b
}

// gpuPinned allocates n bytes of pinned memory for ctx's device, freed
// at the end of the test.
func gpuPinned(t testing.TB, ctx *cuda.Context, n int) *pinmem.Buffer {
	t.Helper()
	p, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Free() })
	return p
}

// boundTools returns what the host bound of a staged transfer is measured
// with: a stream for the pinned DMA and a pool of Go copy goroutines as
// many as a Copier's (DefaultParallelism, at most the CPUs), both closed
// at the end of the test.
func boundTools(t testing.TB, ctx *cuda.Context) (*cuda.Stream, hostCopier) {
	t.Helper()
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	n := min(DefaultParallelism, runtime.NumCPU())
	cpu := hostCopier{copypool.New(n-1, false), n}
	t.Cleanup(cpu.Close)
	return s, cpu
}

// hostCopier copies as a default Copier's CPU copies do.
type hostCopier struct {
	*copypool.Pool
	n int
}

func (h hostCopier) copy(dst, src []byte) { h.Copy(h.n, defaultTuning().subPieces, dst, src) }

func gpuKernel(t testing.TB, ctx *cuda.Context, name string) *cuda.Function {
	t.Helper()
	if err := kernels.Check(); err != nil {
		t.Fatalf("embedded kernels unusable: %v", err)
	}
	mod, err := ctx.LoadModule(kernels.Image())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mod.Destroy() })
	f, err := mod.Function(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestGPUCopies checks both directions separately against the driver's own
// synchronous copies, with random data and poisoned destinations, for sizes
// from 1 byte to 1 GiB, odd sizes, sizes not a multiple of the stage, and
// unaligned host offsets.
func TestGPUCopies(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	const gib = 1 << 30
	dev := gpuAlloc(t, ctx, gib+64)
	stage := c.StageSize()
	sizes := []int{1, 7, 4095, 4096, 65537, 1<<20 - 1, 1 << 20, stage - 1, stage, stage + 1, 3*stage + 12345, 256 << 20, gib}
	if testing.Short() {
		sizes = sizes[:10]
	}
	pool := testutil.RandomBytes(gib+64, 99)
	for _, n := range sizes {
		for _, off := range []int{0, 3} {
			if n == gib && off != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%d+%d", n, off), func(t *testing.T) {
				src := pool[off : off+n]
				view, _ := dev.Slice(0, n+64)
				if err := view.Memset(testutil.PoisonByte); err != nil {
					t.Fatal(err)
				}
				d, _ := dev.Slice(0, n)
				st, err := c.HtoD(context.Background(), d, src)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, n+64)
				if _, err := view.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				testutil.CheckBytes(t, src, got[:n])
				for i := n; i < n+64; i++ {
					if got[i] != testutil.PoisonByte {
						t.Fatalf("HtoD wrote past the end at %d", i)
					}
				}
				t.Logf("%v", st)
				// Device to host, from a device buffer written by the driver.
				out := make([]byte, off+n+64)
				testutil.Poison(out)
				st, err = c.DtoH(context.Background(), out[off:off+n], d)
				if err != nil {
					t.Fatal(err)
				}
				testutil.CheckBytes(t, src, out[off:off+n])
				for i, b := range append(append([]byte{}, out[:off]...), out[off+n:]...) {
					if b != testutil.PoisonByte {
						t.Fatalf("DtoH wrote outside its destination (byte %d)", i)
					}
				}
				t.Logf("%v", st)
			})
		}
	}
}

func TestGPUReaderWriter(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	n := 100<<20 + 12345
	src := testutil.RandomBytes(n, 5)
	dev := gpuAlloc(t, ctx, n+4096)
	if err := dev.Memset(testutil.PoisonByte); err != nil {
		t.Fatal(err)
	}
	st, err := c.HtoDFrom(context.Background(), dev, bytes.NewReader(src))
	if err != nil || st.Bytes != int64(n) {
		t.Fatalf("ReadFrom: %+v, %v", st, err)
	}
	got := make([]byte, n+4096)
	if _, err := dev.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, got[:n])
	if got[n] != testutil.PoisonByte {
		t.Fatal("ReadFrom wrote past the data")
	}
	view, _ := dev.Slice(0, n)
	var out bytes.Buffer
	if st, err = c.DtoHTo(context.Background(), &out, view); err != nil || st.Bytes != int64(n) {
		t.Fatalf("WriteTo: %+v, %v", st, err)
	}
	testutil.CheckBytes(t, src, out.Bytes())
}

// cancelReader cancels a context once it has handed out limit bytes.
type cancelReader struct {
	r      io.Reader
	limit  int
	read   int
	cancel func()
}

func (r *cancelReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.read += n
	if r.read >= r.limit {
		r.cancel()
	}
	return n, err
}

// TestGPUCancelHalfway cancels copies half-way: the error matches
// context.Canceled, what was copied is intact (every destination byte is
// either the source's or still the poison), and the Copier goes on working.
func TestGPUCancelHalfway(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	n := 512 << 20
	src := testutil.RandomBytes(n, 8)
	dev := gpuAlloc(t, ctx, n)
	check := func(got []byte) int {
		copied := 0
		for i := range got {
			switch got[i] {
			case src[i]:
				copied++
			case testutil.PoisonByte:
			default:
				t.Fatalf("byte %d is neither the source nor the poison", i)
			}
		}
		return copied
	}
	t.Run("reader", func(t *testing.T) {
		if err := dev.Memset(testutil.PoisonByte); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := c.HtoDFrom(cctx, dev, &cancelReader{r: bytes.NewReader(src), limit: 3 * c.StageSize(), cancel: cancel})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ReadFrom cancelled half-way: %+v, %v", st, err)
		}
		got := make([]byte, n)
		if _, err := dev.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if k := check(got); k >= n-1<<20 {
			t.Fatalf("cancelled ReadFrom copied %d of %d bytes", k, n)
		}
	})
	for _, dir := range []Direction{HostToDevice, DeviceToHost} {
		t.Run(dir.String(), func(t *testing.T) {
			host := make([]byte, n)
			testutil.Poison(host)
			if dir == HostToDevice {
				if err := dev.Memset(testutil.PoisonByte); err != nil {
					t.Fatal(err)
				}
			} else if _, err := dev.WriteAt(src, 0); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(context.Background())
			var tr *Op
			if dir == HostToDevice {
				tr = c.HtoDAsync(cctx, dev, src)
			} else {
				tr = c.DtoHAsync(cctx, host, dev)
			}
			time.Sleep(2 * time.Millisecond)
			cancel()
			_, err := tr.Wait(context.Background())
			if err == nil {
				// Never pass by skipping on a GPU run: a transfer that beat
				// the cancellation proves nothing, so it fails there.
				if testutil.GPURequired() {
					t.Fatal("the transfer finished before the cancellation: make the transfer larger")
				}
				t.Skip("the transfer finished before the cancellation (machine too fast for this test)")
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled transfer: %v", err)
			}
			got := host
			if dir == HostToDevice {
				got = make([]byte, n)
				if _, err := dev.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s cancelled after %d of %d bytes", dir, check(got), n)
		})
	}
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
}

func TestGPUPinnedAndCache(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx, WithRegistrationCache(0))
	n := 256 << 20
	dev := gpuAlloc(t, ctx, n)
	buf, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	defer c.AddPinned(buf)()
	copy(buf.Bytes(), testutil.RandomBytes(n, 11))
	st, err := c.HtoD(context.Background(), dev, buf.Bytes())
	if err != nil || st.DirectBytes != int64(n) {
		t.Fatalf("pinned HtoD: %+v, %v", st, err)
	}
	t.Logf("pinned: %v", st)
	heap := testutil.RandomBytes(n, 12)
	for i := range 3 {
		st, err := c.HtoD(context.Background(), dev, heap)
		if err != nil {
			t.Fatal(err)
		}
		if st.DirectBytes < int64(n-2*int(pageSize)) {
			t.Fatalf("copy %d of a cached slice: %+v", i, st)
		}
		t.Logf("cached copy %d: %v", i, st)
	}
	out := make([]byte, n)
	if _, err := c.DtoH(context.Background(), out, dev); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, heap, out)
	t.Logf("cache: %+v", c.Cache().Stats())
}

func TestGPUPipeline(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	f := gpuKernel(t, ctx, kernels.KernelAdd)
	const chunk, chunks, delta = 32 << 20, 16, 7
	n := chunks*chunk - 12345
	src := testutil.RandomBytes(n, 13)
	want := added(src, delta)
	pinIn, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer pinIn.Free()
	pinOut, err := pinmem.Alloc(n, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer pinOut.Free()
	defer c.AddPinned(pinIn)()
	defer c.AddPinned(pinOut)()
	for _, streams := range []int{1, 4} {
		for _, pinned := range []bool{true, false} {
			for _, ordered := range []bool{true, false} {
				t.Run(fmt.Sprintf("streams%d/pinned=%v/ordered=%v", streams, pinned, ordered), func(t *testing.T) {
					// Go memory: pin the stages up front, or the Run's
					// figure includes pinning InFlight x 32 MiB.
					p, err := newTestPipeline(c, pipelineCfg{ChunkSize: chunk, Streams: streams, Ordered: ordered, PinStages: !pinned,
						Work: LaunchWork(f, cuda.D1(132*4), cuda.D1(256), func(ch Chunk) []any {
							return []any{ch.Dev.Ptr(), uint64(ch.Len), uint8(delta)}
						})})
					if err != nil {
						t.Fatal(err)
					}
					defer p.Close(context.Background())
					in, out := src, make([]byte, n)
					if pinned {
						in, out = pinIn.Bytes(), pinOut.Bytes()
						copy(in, src)
					}
					testutil.Poison(out)
					st, err := p.Run(context.Background(), in, out)
					if err != nil {
						t.Fatal(err)
					}
					testutil.CheckBytes(t, want, out)
					if st.Setup > 0 {
						t.Errorf("the Run pinned its stages (%v) despite PinStages", st.Setup)
					}
					t.Logf("%+v: %.1f GB/s", st, st.GBps())
				})
			}
		}
	}
}

// TestGPUPipelineLaunchError: a launch the driver refuses (too many
// threads per block) stops the Pipeline with a ChunkError.
func TestGPUPipelineLaunchError(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	f := gpuKernel(t, ctx, kernels.KernelAdd)
	p, err := newTestPipeline(c, pipelineCfg{ChunkSize: 1 << 20, Streams: 2,
		Work: func(s *cuda.Stream, ch Chunk) error {
			block := 256
			if ch.Index == 3 {
				block = 4096
			}
			return f.Launch(s, cuda.D1(4), cuda.D1(block), 0, ch.Dev.Ptr(), uint64(ch.Len), uint8(1))
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	in := testutil.RandomBytes(10<<20, 14)
	_, err = p.Run(context.Background(), in, make([]byte, len(in)))
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Chunk != 3 || ce.Stage != "work" || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("Run with a bad launch: %v", err)
	}
}

func TestGPUZeroCopy(t *testing.T) {
	ctx := gpuCtx(t)
	c := gpuCopier(t, ctx)
	f := gpuKernel(t, ctx, kernels.KernelAdd)
	n := 64<<20 + 5
	b, err := pinmem.Alloc(n, pinmem.Mapped, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		testutil.SkipIfNotSupported(t, err)
	}
	defer b.Free()
	src := testutil.RandomBytes(n, 15)
	copy(b.Bytes(), src)
	err = c.RunMapped(context.Background(), nil, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
		return f.Launch(s, cuda.D1(132*4), cuda.D1(256), 0, p, uint64(n), uint8(9))
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, added(src, 9), b.Bytes())
	plain, err := pinmem.Alloc(4096, 0, pinmem.WithDevice(ctx.Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Free()
	err = c.RunMapped(context.Background(), nil, plain, func(*cuda.Stream, cuda.DevicePtr, int) error { return nil })
	if !errors.Is(err, pinmem.ErrNotMapped) {
		t.Fatalf("RunMapped on an unmapped buffer: %v", err)
	}
}

// TestGPUPinsOnUse is TestFakeEnginePinsOnUse on the real driver
// (checkPinsOnUse: nothing pinned by New, one 1 MiB stage after 4 KiB
// round trips, one ring beside it after 256 MiB), and Close gives every
// byte back. pinmem.Stats counts what pinmem pinned in this process, and
// no test here runs beside another.
func TestGPUPinsOnUse(t *testing.T) {
	ctx := gpuCtx(t)
	c, pinned := checkPinsOnUse(t, func() *Copier {
		c, err := New(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}, func(n int) *cuda.DeviceBuffer { return gpuAlloc(t, ctx, n) }, true)
	t.Logf("after 4 KiB and 256 MiB round trips: %d bytes pinned", pinned())
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := pinned(); p != 0 {
		t.Errorf("after Close: %d bytes still pinned, want 0", p)
	}
}
