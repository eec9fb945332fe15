package pinmem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

// gpuEnv is a device, its primary context, a stream, two events and a
// device buffer, for GPU tests and benchmarks.
type gpuEnv struct {
	dev        *cuda.Device
	ctx        *cuda.Context
	s          *cuda.Stream
	start, end *cuda.Event
	dbuf       *cuda.DeviceBuffer
	props      cuda.Properties
}

func newGPUEnv(tb testing.TB, devBytes int) *gpuEnv {
	tb.Helper()
	testutil.RequireGPU(tb)
	g := &gpuEnv{}
	var err error
	if g.dev, err = cuda.GetDevice(0); err != nil {
		tb.Fatal(err)
	}
	if g.props, err = g.dev.Properties(); err != nil {
		tb.Fatal(err)
	}
	if g.ctx, err = g.dev.PrimaryContext(); err != nil {
		tb.Fatal(err)
	}
	if g.s, err = g.ctx.NewStream(cuda.StreamNonBlocking); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = g.s.Destroy() })
	if g.start, err = g.ctx.NewEvent(cuda.EventDefault); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = g.start.Destroy() })
	if g.end, err = g.ctx.NewEvent(cuda.EventDefault); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = g.end.Destroy() })
	if devBytes > 0 {
		if g.dbuf, err = g.ctx.Alloc(devBytes); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = g.dbuf.Free() })
	}
	base := Stats()
	tb.Cleanup(func() {
		if s := Stats(); s.Pinned != base.Pinned {
			tb.Errorf("ledger: %+v pinned at the end, %+v at the start", s.Pinned, base.Pinned)
		}
	})
	return g
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// copyTimed copies host -> device (h2d) or device -> host with one async
// copy between two events and returns the GPU time.
func (g *gpuEnv) copyTimed(tb testing.TB, host []byte, h2d bool) time.Duration {
	tb.Helper()
	must(tb, g.start.Record(g.s))
	if h2d {
		must(tb, g.s.CopyHtoD(g.dbuf, 0, host))
	} else {
		must(tb, g.s.CopyDtoH(host, g.dbuf, 0))
	}
	must(tb, g.end.Record(g.s))
	must(tb, g.end.Synchronize(context.Background()))
	d, err := g.end.Elapsed(g.start)
	must(tb, err)
	return d
}

func gbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// roundTrip sends random data from src to the device and back into dst
// (poisoned first) and checks it.
func (g *gpuEnv) roundTrip(t *testing.T, src, dst []byte, seed uint64) {
	t.Helper()
	data := testutil.RandomBytes(len(src), seed)
	copy(src, data)
	must(t, g.s.Memset(g.dbuf, 0, 0x5A, g.dbuf.Size()))
	g.copyTimed(t, src, true)
	testutil.Poison(dst)
	g.copyTimed(t, dst, false)
	testutil.CheckBytes(t, data, dst)
}

func TestGPUFlagRoundTrip(t *testing.T) {
	const size = 4<<20 + 3
	g := newGPUEnv(t, size)
	plain, err := Alloc(size, 0, WithMethod(MethodHostAlloc)) // D2H target for read-only buffers
	must(t, err)
	defer mustFree(t, plain)
	seed := uint64(1)
	for _, m := range []Method{MethodHostAlloc, MethodMmapRegister} {
		for f := Flags(0); f <= allFlags; f++ {
			if (m == MethodHostAlloc && f&ReadOnly != 0) || (m == MethodMmapRegister && f&WriteCombined != 0) || f&WriteCombined != 0 && f&ReadOnly != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", m, f), func(t *testing.T) {
				b, err := Alloc(size, f, WithMethod(m))
				if errors.Is(err, cuda.ErrNotSupported) {
					testutil.SkipFeature(t, err.Error())
				}
				must(t, err)
				defer mustFree(t, b)
				dst := b.Bytes()
				if f&ReadOnly != 0 {
					dst = plain.Bytes() // the device may not write read-only registered memory
				}
				seed++
				g.roundTrip(t, b.Bytes(), dst, seed)
			})
		}
	}
	t.Run("register/go-slice", func(t *testing.T) {
		mem := make([]byte, size)
		b, err := Register(mem, Portable)
		must(t, err)
		defer mustFree(t, b)
		g.roundTrip(t, mem, mem, 99)
	})
}

// loadKernels loads the embedded PTX. A placeholder or unloadable PTX fails
// the test: a GPU run must show the kernels work.
func loadKernels(t *testing.T, ctx *cuda.Context) *cuda.Module {
	t.Helper()
	if err := kernels.Check(); err != nil {
		t.Fatalf("embedded PTX unusable (regenerate it with scripts/compile-kernels): %v", err)
	}
	mod, err := ctx.LoadModule(kernels.Image())
	if err != nil {
		t.Fatalf("loading the kernels (driver too old for the PTX?): %v", err)
	}
	t.Cleanup(func() { _ = mod.Destroy() })
	return mod
}

// A kernel writes a mapped buffer through its device pointer, another
// kernel reads it and writes a second mapped buffer; the host sees both.
func TestGPUMappedKernel(t *testing.T) {
	g := newGPUEnv(t, 0)
	if !g.props.CanMapHostMemory {
		testutil.SkipFeature(t, "device cannot map host memory")
	}
	mod := loadKernels(t, g.ctx)
	fill, err := mod.Function(kernels.KernelFill)
	must(t, err)
	cp, err := mod.Function(kernels.KernelCopy)
	must(t, err)
	const size = 8 << 20
	mk := map[string]func() (*Buffer, error){
		"hostalloc": func() (*Buffer, error) { return Alloc(size, Mapped, WithMethod(MethodHostAlloc)) },
		"mmap":      func() (*Buffer, error) { return Alloc(size, Mapped|Portable, WithMethod(MethodMmapRegister)) },
		"go-slice":  func() (*Buffer, error) { return Register(make([]byte, size), Mapped) },
	}
	for name, newBuf := range mk {
		t.Run(name, func(t *testing.T) {
			a, err := newBuf()
			must(t, err)
			defer mustFree(t, a)
			b, err := Alloc(size, Mapped, WithMethod(MethodHostAlloc))
			must(t, err)
			defer mustFree(t, b)
			testutil.Poison(a.Bytes())
			testutil.Poison(b.Bytes())
			pa, err := a.DevicePtr()
			must(t, err)
			pb, err := b.DevicePtr()
			must(t, err)
			const seed = 0xC0FFEE
			words := uint64(size / 4)
			must(t, fill.Launch(g.s, cuda.D1(264), cuda.D1(256), 0, pa, words, uint32(seed)))
			must(t, cp.Launch(g.s, cuda.D1(264), cuda.D1(256), 0, pb, pa, uint64(size)))
			must(t, g.s.Synchronize(context.Background()))
			for _, x := range []*Buffer{a, b} {
				w, err := View[uint32](x)
				must(t, err)
				if i := kernels.VerifyPattern(w, seed, 0); i >= 0 {
					t.Fatalf("word %d of %v = %#x, want %#x", i, x, w[i], kernels.Pattern(seed, uint64(i)))
				}
			}
			t.Logf("%s: device pointer %#x for host %p", name, pa, &a.Bytes()[0])
		})
	}
}

// Registered mmap'd memory and a registered Go slice copy at pinned speed:
// compared in one run with cuMemHostAlloc memory and with the same Go
// slice unregistered (the driver's pageable path). With -short the speeds
// are logged, not checked.
func TestGPURegisteredSpeed(t *testing.T) {
	const size = 256 << 20
	g := newGPUEnv(t, size)
	best := func(host []byte, h2d bool) float64 {
		var r float64
		for range 5 {
			r = max(r, gbps(len(host), g.copyTimed(t, host, h2d)))
		}
		return r
	}
	ha, err := Alloc(size, 0, WithMethod(MethodHostAlloc))
	must(t, err)
	defer mustFree(t, ha)
	mm, err := Alloc(size, 0, WithMethod(MethodMmapRegister))
	must(t, err)
	defer mustFree(t, mm)
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = byte(i)
	}
	pageH2D, pageD2H := best(mem, true), best(mem, false)
	gr, err := Register(mem, 0)
	must(t, err)
	defer mustFree(t, gr)
	g.roundTrip(t, mm.Bytes(), mm.Bytes(), 5)
	g.roundTrip(t, mem, mem, 6)
	ref := [2]float64{best(ha.Bytes(), true), best(ha.Bytes(), false)}
	t.Logf("pageable Go slice: H2D %.1f GB/s, D2H %.1f GB/s", pageH2D, pageD2H)
	t.Logf("cuMemHostAlloc:    H2D %.1f GB/s, D2H %.1f GB/s", ref[0], ref[1])
	for _, c := range []struct {
		name string
		mem  []byte
	}{{"mmap-register", mm.Bytes()}, {"go-register", mem}} {
		h, d := best(c.mem, true), best(c.mem, false)
		t.Logf("%-18s H2D %.1f GB/s (%.2fx hostalloc, %.1fx pageable), D2H %.1f GB/s (%.2fx hostalloc, %.1fx pageable)",
			c.name+":", h, h/ref[0], h/pageH2D, d, d/ref[1], d/pageD2H)
		if h < 0.9*ref[0] || d < 0.9*ref[1] {
			if testing.Short() {
				// -short is how the sanitize tier runs, beside the soak in
				// scripts/gpu-reliability: speed is not measured there.
				t.Logf("%s copies below 90%% of cuMemHostAlloc memory (not checked with -short)", c.name)
				continue
			}
			t.Errorf("%s copies below 90%% of cuMemHostAlloc memory", c.name)
		}
	}
}

// A buffer registered in several chunks (the chunk size forced down to 32
// MiB) is copied per segment at pinned speed; one copy whose host range
// spans two segments is refused by the driver with a typed error
// (CUDA_ERROR_INVALID_VALUE, matching cuda.ErrInvalidValue, on driver 580), and
// the stream still works afterwards. This is the contract Buffer.Segments
// documents. Under -test.short (the sanitize tier, under compute-sanitizer
// memcheck) the per-segment copies are checked byte for byte, but neither
// their speed nor the refusal (see there).
func TestGPUCopySpanningChunks(t *testing.T) {
	const size = 128 << 20
	const seg = 32 << 20
	g := newGPUEnv(t, size)
	setChunk(t, seg)
	b, err := Alloc(size, 0, WithMethod(MethodMmapRegister))
	must(t, err)
	defer mustFree(t, b)
	segs := b.Segments()
	if n := len(b.s.chunks); n != 4 || len(segs) != 4 {
		t.Fatalf("%d chunks, %d segments, want 4", n, len(segs))
	}
	off := 0
	for i, sg := range segs {
		if len(sg) != seg || cap(sg) != seg || &sg[0] != &b.Bytes()[off] {
			t.Fatalf("segment %d: %d bytes (cap %d) at offset %d, want %d bytes at %d", i, len(sg), cap(sg), off, seg, i*seg)
		}
		off += len(sg)
	}
	one, err := Alloc(size, 0, WithMethod(MethodHostAlloc))
	must(t, err)
	defer mustFree(t, one)
	if n := len(one.Segments()); n != 1 {
		t.Fatalf("cuMemHostAlloc buffer: %d segments, want 1", n)
	}

	// Per segment: correct, and at pinned speed.
	perSegment := func(h2d bool) time.Duration {
		t.Helper()
		must(t, g.start.Record(g.s))
		off := 0
		for _, sg := range segs {
			if h2d {
				must(t, g.s.CopyHtoD(g.dbuf, off, sg))
			} else {
				must(t, g.s.CopyDtoH(sg, g.dbuf, off))
			}
			off += len(sg)
		}
		must(t, g.end.Record(g.s))
		must(t, g.end.Synchronize(context.Background()))
		d, err := g.end.Elapsed(g.start)
		must(t, err)
		return d
	}
	data := testutil.RandomBytes(size, 7)
	check := func() {
		t.Helper()
		copy(b.Bytes(), data)
		must(t, g.s.Memset(g.dbuf, 0, 0x5A, g.dbuf.Size()))
		perSegment(true)
		testutil.Poison(b.Bytes())
		perSegment(false)
		testutil.CheckBytes(t, data, b.Bytes())
	}
	check()
	if testing.Short() {
		// The sanitize tier runs under compute-sanitizer memcheck, which
		// instruments every copy: speed is not measured there (as in
		// TestGPURegisteredSpeed). Nor is the deliberately invalid copy
		// below issued: memcheck checks the memory ranges of copy API calls
		// itself, so a copy made on purpose past its pinned range is the
		// tool's finding, counted in its ERROR SUMMARY, not the driver's
		// refusal this test expects (under it the test failed while it
		// passes on the driver alone). The refusal is the driver's
		// behaviour; the quick and full tiers, without the sanitizer,
		// check it.
		t.Log("-test.short (the sanitize tier): per-segment copies checked; their speed and the driver's refusal of a copy spanning two segments are not")
		return
	}
	var segmented, single [2]float64
	for range 5 {
		for i, h2d := range []bool{true, false} {
			segmented[i] = max(segmented[i], gbps(size, perSegment(h2d)))
			single[i] = max(single[i], gbps(size, g.copyTimed(t, one.Bytes(), h2d)))
		}
	}
	t.Logf("copy per segment (4 registrations): H2D %.1f GB/s, D2H %.1f GB/s; one cuMemHostAlloc range: H2D %.1f, D2H %.1f",
		segmented[0], segmented[1], single[0], single[1])
	if segmented[0] < 0.9*single[0] || segmented[1] < 0.9*single[1] {
		t.Errorf("copies per segment are below 90%% of cuMemHostAlloc speed")
	}

	// One copy spanning the boundary between segments 1 and 2: refused,
	// with a typed error, before anything is copied.
	span := b.Bytes()[2*seg-(1<<20) : 2*seg+(1<<20)]
	for _, h2d := range []bool{true, false} {
		var err error
		if h2d {
			err = g.s.CopyHtoD(g.dbuf, 0, span)
		} else {
			err = g.s.CopyDtoH(span, g.dbuf, 0)
		}
		if err == nil {
			err = g.s.Synchronize(context.Background())
		}
		dir := map[bool]string{true: "H2D", false: "D2H"}[h2d]
		var ce *cuda.Error
		switch {
		case err == nil && !h2d:
			// Only the H2D refusal was measured (driver 580); the contract
			// (never span) holds either way.
			t.Logf("%s copy spanning two segments: accepted by this driver", dir)
		case err == nil:
			t.Errorf("%s copy spanning two segments succeeded: this driver accepts it (driver 580 refuses it); Buffer.Segments' doc must say so", dir)
		case !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &ce):
			t.Errorf("%s copy spanning two segments: %v (%T), want a *cuda.Error matching cuda.ErrInvalidValue", dir, err, err)
		default:
			t.Logf("%s copy spanning two segments: %v (code %d)", dir, err, int32(ce.Code))
		}
	}
	// The refusal is not sticky: the stream and the context still work.
	check()
}

// The host's own figures rise and fall: Shmem for cuMemHostAlloc,
// MemAvailable for registered memory (which Shmem does not show); Mlocked
// does not move at all.
func TestGPUHostFigures(t *testing.T) {
	newGPUEnv(t, 0)
	const size = 1 << 30
	const tol = 256 << 20
	read := func() *sysinfo.Meminfo {
		m, err := sysinfo.Reader{}.Meminfo()
		must(t, err)
		return m
	}
	delta := func(a, b uint64) int64 { return int64(b) - int64(a) }
	for _, c := range []struct {
		m     Method
		field string
		get   func(*sysinfo.Meminfo) uint64
		sign  int64 // +1: rises by size, -1: drops by size
	}{
		{MethodHostAlloc, "Shmem", func(m *sysinfo.Meminfo) uint64 { return m.Shmem }, +1},
		{MethodMmapRegister, "MemAvailable", func(m *sysinfo.Meminfo) uint64 { return m.MemAvailable }, -1},
	} {
		t.Run(c.m.String(), func(t *testing.T) {
			m0 := read()
			b, err := Alloc(size, 0, WithMethod(c.m))
			must(t, err)
			m1 := read()
			must(t, b.Free())
			m2 := read()
			up, back := delta(c.get(m0), c.get(m1)), delta(c.get(m1), c.get(m2))
			t.Logf("%s: %+d bytes after pinning %d, %+d after Free; Mlocked %+d / %+d; Shmem %+d / %+d; MemAvailable %+d / %+d",
				c.field, up, size, back, delta(m0.Mlocked, m1.Mlocked), delta(m1.Mlocked, m2.Mlocked),
				delta(m0.Shmem, m1.Shmem), delta(m1.Shmem, m2.Shmem), delta(m0.MemAvailable, m1.MemAvailable), delta(m1.MemAvailable, m2.MemAvailable))
			if d := c.sign*up - size; d < -tol || d > tol {
				t.Errorf("%s moved by %d while pinning %d (tolerance %d)", c.field, up, size, tol)
			}
			if d := -c.sign*back - size; d < -tol || d > tol {
				t.Errorf("%s moved by %d after Free of %d (tolerance %d)", c.field, back, size, tol)
			}
		})
	}
}

func TestGPUBadInput(t *testing.T) {
	g := newGPUEnv(t, 0)
	prev := SetBudget(64 << 20)
	defer SetBudget(prev)
	b, err := Alloc(1<<20, 0)
	must(t, err)
	mem := make([]byte, 4<<20)
	r, err := Register(mem, 0)
	must(t, err)
	f, err := Alloc(4096, 0)
	must(t, err)
	must(t, f.Free())
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"size 0", func() error { _, err := Alloc(0, 0); return err }, cuda.ErrInvalidValue},
		{"negative", func() error { _, err := Alloc(-4096, 0); return err }, cuda.ErrInvalidValue},
		{"absurd", func() error { _, err := Alloc(1<<50, 0); return err }, cuda.ErrInvalidValue},
		{"over budget", func() error { _, err := Alloc(128<<20, 0); return err }, ErrBudget},
		{"contradicting flags", func() error { _, err := Alloc(4096, WriteCombined|ReadOnly); return err }, cuda.ErrInvalidValue},
		{"unmapped device pointer", func() error { _, err := b.DevicePtr(); return err }, ErrNotMapped},
		{"double free", f.Free, ErrFreed},
		{"register twice", func() error { _, err := Register(mem, 0); return err }, cuda.ErrAlreadyRegistered},
		{"register overlapping", func() error { _, err := Register(mem[1<<20:], Portable); return err }, cuda.ErrAlreadyRegistered},
		{"use after free", func() error { _, err := View[byte](f); return err }, ErrFreed},
	}
	if !g.props.ReadOnlyHostRegisterSupported {
		cases = append(cases, struct {
			name string
			call func() error
			want error
		}{"read-only unsupported", func() error { _, err := Alloc(8<<20, ReadOnly); return err }, cuda.ErrNotSupported})
	}
	if !g.props.CanMapHostMemory {
		cases = append(cases, struct {
			name string
			call func() error
			want error
		}{"mapped unsupported", func() error { _, err := Alloc(4096, Mapped); return err }, cuda.ErrNotSupported})
	}
	for _, c := range cases {
		if err := c.call(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	must(t, r.Free())
	must(t, b.Free())
	if n, bytes := track.Count(track.HostAlloc); n != 0 {
		t.Errorf("%d host allocations (%d bytes) left", n, bytes)
	}
	if n, bytes := track.Count(track.Registration); n != 0 {
		t.Errorf("%d registrations (%d bytes) left", n, bytes)
	}
}

// Portable memory works from a second context; a control buffer without
// the flag is compared, and what the driver reports is logged for both.
func TestGPUPortable(t *testing.T) {
	g := newGPUEnv(t, 0)
	ctx2, err := cuda.NewContext(g.dev, cuda.MapHost)
	must(t, err)
	defer func() { must(t, ctx2.Destroy()) }()
	const size = 64 << 20
	s2, err := ctx2.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s2.Destroy()
	e0, err := ctx2.NewEvent(cuda.EventDefault)
	must(t, err)
	defer e0.Destroy()
	e1, err := ctx2.NewEvent(cuda.EventDefault)
	must(t, err)
	defer e1.Destroy()
	d2, err := ctx2.Alloc(size)
	must(t, err)
	defer d2.Free()
	for _, m := range []Method{MethodHostAlloc, MethodMmapRegister} {
		for _, f := range []Flags{Portable, 0} {
			t.Run(fmt.Sprintf("%s/%s", m, f), func(t *testing.T) {
				b, err := Alloc(size, f, WithMethod(m))
				must(t, err)
				defer mustFree(t, b)
				data := testutil.RandomBytes(size, uint64(f)+10)
				copy(b.Bytes(), data)
				must(t, e0.Record(s2))
				must(t, s2.CopyHtoD(d2, 0, b.Bytes()))
				must(t, e1.Record(s2))
				must(t, e1.Synchronize(context.Background()))
				h2d, err := e1.Elapsed(e0)
				must(t, err)
				testutil.Poison(b.Bytes())
				must(t, s2.CopyDtoH(b.Bytes(), d2, 0))
				must(t, s2.Synchronize(context.Background()))
				testutil.CheckBytes(t, data, b.Bytes())
				in1, err1 := queryPointer(b, g.ctx)
				in2, err2 := queryPointer(b, ctx2)
				t.Logf("H2D from the second context: %.1f GB/s", gbps(size, h2d))
				t.Logf("primary context: %+v (%v)", in1, err1)
				t.Logf("second context:  %+v (%v)", in2, err2)
			})
		}
	}
	if g.props.UnifiedAddressing {
		t.Logf("the device uses unified addressing: every page-locked allocation is portable and mapped " +
			"whatever the flags, so the control buffer without Portable works from the second context as well; " +
			"this test cannot tell the flag's effect apart here and only shows that both work and what the driver reports")
	}
}
