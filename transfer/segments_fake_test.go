package transfer

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/pool"
)

// segChunk is the registration chunk of the segment tests: buffers of a
// MiB are several registrations, as buffers over 4 GiB are on a GPU.
const segChunk = 256 << 10

// smallSegments makes pinmem register memory in segChunk pieces for the test.
func smallSegments(t *testing.T) {
	t.Helper()
	t.Cleanup(testhook.SetRegChunk(segChunk))
}

// checkMultiSegment fails unless host is several registrations and the
// fake driver refuses one copy across them as the real driver does
// (CUDA_ERROR_INVALID_VALUE): otherwise the tests below could not fail.
func checkMultiSegment(t *testing.T, e fakeEnv, host []byte, segs [][]byte) {
	t.Helper()
	if len(segs) < 3 {
		t.Fatalf("%d segments, want at least 3", len(segs))
	}
	s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	dev := e.devbuf(t, len(host))
	if err := s.CopyHtoD(dev, 0, host); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("one copy across %d registrations: %v, want an error matching cuda.ErrInvalidValue", len(segs), err)
	}
}

// roundTripDirect copies host (pinned) to the device and back through c
// and checks the bytes and that nothing was staged.
func roundTripDirect(t *testing.T, e fakeEnv, c *Copier, host []byte) {
	t.Helper()
	copy(host, testutil.RandomBytes(len(host), uint64(len(host))))
	want := append([]byte(nil), host...)
	dev := e.devbuf(t, len(host))
	up, err := c.HtoD(context.Background(), dev, host)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, want, e.deviceBytes(t, dev))
	testutil.Poison(host)
	down, err := c.DtoH(context.Background(), host, dev)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, want, host)
	for _, st := range []Stats{up, down} {
		if st.DirectBytes != int64(len(host)) || st.StagedBytes != 0 {
			t.Errorf("%s not copied directly: %v", st.Direction, st)
		}
	}
}

// TestFakeSegmentsCopier: the Copier recognises multi-registration buffers
// of every origin without AddPinned and splits its direct copies at
// their boundaries, for whole buffers and for ranges that start and end
// inside segments.
func TestFakeSegmentsCopier(t *testing.T) {
	smallSegments(t)
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	const n = 1<<20 + 12345

	t.Run("Alloc", func(t *testing.T) {
		b, err := pinmem.Alloc(n, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		checkMultiSegment(t, e, b.Bytes(), b.Segments())
		roundTripDirect(t, e, c, b.Bytes())
		roundTripDirect(t, e, c, b.Bytes()[segChunk-1:3*segChunk+1])
	})
	t.Run("AddPinned", func(t *testing.T) {
		b, err := pinmem.Alloc(n, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		defer c.AddPinned(b)()
		roundTripDirect(t, e, c, b.Bytes()[7:])
	})
	t.Run("Register", func(t *testing.T) {
		mem := make([]byte, n)
		b, err := pinmem.Register(mem, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		checkMultiSegment(t, e, mem, b.Segments())
		roundTripDirect(t, e, c, mem)
	})
	t.Run("pool", func(t *testing.T) {
		p, err := pool.New(pool.WithFlags(0, pinmem.WithMethod(pinmem.MethodMmapRegister)))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		blk, err := p.Get(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Put(blk)
		checkMultiSegment(t, e, blk.Bytes(), blk.Segments())
		roundTripDirect(t, e, c, blk.Bytes())
	})
	t.Run("two buffers", func(t *testing.T) {
		// A slice over two adjacent registrations of a Go array.
		mem := make([]byte, 2*n+2*int(pageSize))
		base := int((pageSize - addr(mem)%pageSize) % pageSize)
		half := (n + int(pageSize) - 1) &^ (int(pageSize) - 1)
		a, err := pinmem.Register(mem[base:base+half], 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Free()
		b, err := pinmem.Register(mem[base+half:base+2*half], 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		roundTripDirect(t, e, c, mem[base+100:base+2*half-100])
	})
}

// TestFakeSegmentsRegCache: the registration cache's registrations of
// large slices are several registrations too; copies through the cache
// are split at their boundaries.
func TestFakeSegmentsRegCache(t *testing.T) {
	smallSegments(t)
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, WithRegistrationCache(0))
	mem := make([]byte, 2<<20+int(pageSize))
	base := int((pageSize - addr(mem)%pageSize) % pageSize)
	host := mem[base : base+2<<20]
	for i := 0; i < 2; i++ { // a miss, then a hit
		roundTripDirect(t, e, c, host)
	}
	if cs := c.Cache().Stats(); cs.Registrations != 1 || cs.Hits == 0 || cs.Bytes != 2<<20 {
		t.Fatalf("cache %+v", cs)
	}
	// The cache's own registration is held by the cache, not found by
	// lookup; it is the same either way for the copy.
	b, ok := pinmem.Lookup(host)
	if !ok || len(b.Segments()) < 3 {
		t.Fatalf("Lookup of the cached slice: %v %v", b, ok)
	}
	checkMultiSegment(t, e, host, b.Segments())
	c.Cache().Forget(host)
}

// TestFakeSegmentsPipeline: a Pipeline whose input and output are
// multi-registration buffers copies them directly, splitting the chunks
// that cross a registration boundary.
func TestFakeSegmentsPipeline(t *testing.T) {
	smallSegments(t)
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	const n = 1<<20 + 4321
	in, err := pinmem.Alloc(n, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Free()
	out, err := pinmem.Alloc(n, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	checkMultiSegment(t, e, out.Bytes(), out.Segments())
	copy(in.Bytes(), testutil.RandomBytes(n, 9))
	testutil.Poison(out.Bytes())
	// 100 KiB chunks: many of them cross a 256 KiB boundary.
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 100 << 10, Streams: 2, InFlight: 3})
	st, err := p.Run(context.Background(), in.Bytes(), out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if st.StagedIn || st.StagedOut {
		t.Fatalf("pinned input or output staged: %+v", st)
	}
	testutil.CheckBytes(t, in.Bytes(), out.Bytes())
	// A Go slice cached by the registration cache, in place.
	cc := e.copier(t, WithRegistrationCache(0))
	mem := make([]byte, 1<<20+int(pageSize))
	base := int((pageSize - addr(mem)%pageSize) % pageSize)
	host := mem[base : base+1<<20]
	copy(host, testutil.RandomBytes(len(host), 10))
	want := append([]byte(nil), host...)
	pc := e.pipeline(t, cc, pipelineCfg{ChunkSize: 100 << 10})
	if st, err = pc.Run(context.Background(), host, host); err != nil {
		t.Fatal(err)
	}
	if st.StagedIn || st.StagedOut {
		t.Fatalf("cached slice staged: %+v", st)
	}
	testutil.CheckBytes(t, want, host)
}

// TestFakeGPUSuiteLogic runs the bodies of TestGPUHugeBuffers,
// BenchmarkCopierVsDriver and BenchmarkCopierConcurrent on the fake
// driver at small sizes (registrations of segChunk bytes), so that the
// GPU runs test what they claim to.
func TestFakeGPUSuiteLogic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the GPU suite's benchmarks once (seconds); not under -short")
	}
	smallSegments(t)
	e := useFake(t, fakedrv.Options{})
	t.Run("huge buffers", func(t *testing.T) {
		testHugeBuffers(t, e.ctx, 1<<20+64<<10, e.addKernel(t), 100<<10, pinmem.WithMethod(pinmem.MethodMmapRegister))
	})
	// One iteration (-test.benchtime 1x, as the GPU runs use).
	bt := flag.Lookup("test.benchtime")
	old := bt.Value.String()
	if err := bt.Value.Set("1x"); err != nil {
		t.Fatal(err)
	}
	defer bt.Value.Set(old)
	var failed bool
	r := testing.Benchmark(func(b *testing.B) {
		defer func() { failed = b.Failed() }()
		benchCopierVsDriver(b, e.ctx, []int{4 << 10, 1 << 20})
	})
	if failed || r.N == 0 {
		t.Fatalf("benchCopierVsDriver failed: %v", r)
	}
	for _, shared := range []bool{true, false} {
		// A subtest each, so that the Copiers of one are closed (and
		// their engine with them) before the next counts its peak.
		t.Run(fmt.Sprintf("concurrent/shared=%v", shared), func(t *testing.T) {
			gbps, peak := runConcurrent(t, e.ctx, 1<<20, 4, shared, 1)
			if gbps <= 0 || peak <= 0 {
				t.Errorf("runConcurrent(shared %v): %v GB/s, peak %d pinned bytes", shared, gbps, peak)
			}
		})
	}
}

// TestFakeSegmentsStages: staging buffers larger than a registration (as
// stages over 4 GiB are) are filled and drained one registration at a
// time, by the Copier's ring, HtoDFrom and DtoHTo, a Pipeline's stages
// and Multi.Broadcast's shared ring.
func TestFakeSegmentsStages(t *testing.T) {
	smallSegments(t)
	e := useMultiFake(t, 2, 3<<20)
	opts := []Option{WithStageSize(1 << 20)}
	c := e.copier(t, opts...)
	if err := c.eng.fill(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if segs := len(c.eng.ring.all[0].buf.Segments()); segs < 3 {
		t.Fatalf("stages of %d registrations, want several", segs)
	}
	src := testutil.RandomBytes(3<<20-5, 21)
	dev := e.bufs[0]
	check := func(what string, want []byte) {
		t.Helper()
		testutil.CheckBytes(t, want, e.deviceBytes(t, dev)[:len(want)])
	}
	if st, err := c.HtoD(context.Background(), dev, src); err != nil || st.StagedBytes != int64(len(src)) {
		t.Fatalf("HtoD: %v %v", st, err)
	}
	check("HtoD", src)
	dst := make([]byte, len(src))
	if _, err := c.DtoH(context.Background(), dst, dev); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, dst)
	src2 := testutil.RandomBytes(len(src), 22)
	if _, err := c.HtoDFrom(context.Background(), dev, bytes.NewReader(src2)); err != nil {
		t.Fatal(err)
	}
	check("HtoDFrom", src2)
	var w bytes.Buffer
	if _, err := c.DtoHTo(context.Background(), &w, dev); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src2, w.Bytes()[:len(src2)])
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 1 << 20, Streams: 2})
	out := make([]byte, len(src))
	if st, err := p.Run(context.Background(), src, out); err != nil || !st.StagedIn || !st.StagedOut {
		t.Fatalf("Pipeline: %+v %v", st, err)
	}
	testutil.CheckBytes(t, src, out)
	m := e.multi(t, e.ctxs, opts...)
	if st, err := m.Broadcast(context.Background(), e.bufs, src2[:2<<20+3]); err != nil || !st.Staged {
		t.Fatalf("Broadcast: %+v %v", st, err)
	}
	for _, b := range e.bufs {
		testutil.CheckBytes(t, src2[:2<<20+3], e.deviceBytes(t, b)[:2<<20+3])
	}
}
