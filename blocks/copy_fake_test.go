package blocks_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// errOf returns the error of an io call (ReadAt, WriteAt).
func errOf(_ int, err error) error { return err }

// env is a KV cache on the fake: nblk blocks of bs bytes in each of two
// device buffers (out: the blocks paged out; in: the slots paged into),
// two pinned, mapped host buffers of as many blocks (src: the blocks
// paged in; dst: the slots paged out to), and two streams.
type env struct {
	fd           *fakedrv.Driver
	ctx          *cuda.Context
	s1, s2       *cuda.Stream
	out, in      *cuda.DeviceBuffer
	src, dst     *pinmem.Buffer
	bs, nblk     int
	slot, hslots []int // block i: device slot slot[i], host slot hslots[i]
}

func newEnv(t testing.TB, opts fakedrv.Options, bs, nblk int, flags pinmem.Flags) *env {
	t.Helper()
	e := &env{fd: testutil.UseFake(t, opts), bs: bs, nblk: nblk}
	e.ctx = testutil.PrimaryContext(t)
	for _, s := range []**cuda.Stream{&e.s1, &e.s2} {
		st, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		must(t, err)
		t.Cleanup(func() { st.Destroy() })
		*s = st
	}
	for _, d := range []**cuda.DeviceBuffer{&e.out, &e.in} {
		b, err := e.ctx.Alloc(bs * nblk)
		must(t, err)
		t.Cleanup(func() { b.Free() })
		*d = b
	}
	for _, h := range []**pinmem.Buffer{&e.src, &e.dst} {
		b, err := pinmem.Alloc(bs*nblk, flags)
		must(t, err)
		t.Cleanup(func() { b.Free() })
		*h = b
	}
	copy(e.src.Bytes(), testutil.RandomBytes(bs*nblk, 1))
	must(t, errOf(e.out.WriteAt(testutil.RandomBytes(bs*nblk, 2), 0)))
	r := rand.New(rand.NewPCG(3, 4))
	e.slot, e.hslots = r.Perm(nblk), r.Perm(nblk)
	return e
}

// list returns the blocks between host buffer h and device buffer d,
// scattered on both sides.
func (e *env) list(h []byte, d *cuda.DeviceBuffer) []blocks.Block {
	l := make([]blocks.Block, e.nblk)
	for i := range l {
		hs := e.hslots[i]
		l[i] = blocks.Block{Host: h[hs*e.bs : (hs+1)*e.bs], Dev: d, Off: e.slot[i] * e.bs}
	}
	return l
}

// check fails t unless every block of l holds the same bytes on both sides.
func (e *env) check(t testing.TB, l []blocks.Block) {
	t.Helper()
	got := make([]byte, e.bs)
	for i, b := range l {
		must(t, errOf(b.Dev.ReadAt(got[:len(b.Host)], int64(b.Off))))
		if !bytes.Equal(got[:len(b.Host)], b.Host) {
			t.Fatalf("block %d differs between host and device", i)
		}
	}
}

func (e *env) copyCalls() int {
	return e.fd.Calls("cuMemcpyHtoDAsync_v2") + e.fd.Calls("cuMemcpyDtoHAsync_v2") +
		e.fd.Calls("cuMemcpyBatchAsync") + e.fd.Calls("cuMemcpyBatchAsync_v2") + e.fd.Calls("cuLaunchKernel")
}

func newCopier(t testing.TB, c *cuda.Context, opts ...blocks.Option) *blocks.Copier {
	t.Helper()
	bc, err := blocks.New(c, opts...)
	must(t, err)
	t.Cleanup(func() { bc.Close(context.Background()) })
	return bc
}

// TestFakeBothWays pages blocks out on one stream and in on the other in
// one call, with each strategy on drivers with either batch-copy form and
// without one, and checks every byte, the strategy and the driver calls.
func TestFakeBothWays(t *testing.T) {
	for _, c := range []struct {
		version int
		opts    []blocks.Option
		want    blocks.Strategy
		op      string // the copy call expected
	}{
		{13000, nil, blocks.DriverBatch, "cuMemcpyBatchAsync_v2"},
		{12080, nil, blocks.DriverBatch, "cuMemcpyBatchAsync"},
		{12040, nil, blocks.PerCopy, "cuMemcpyHtoDAsync_v2"},
		{13000, []blocks.Option{blocks.WithStrategy(blocks.PerCopy)}, blocks.PerCopy, "cuMemcpyDtoHAsync_v2"},
		{13000, []blocks.Option{blocks.WithKernel(64)}, blocks.Kernel, "cuLaunchKernel"},
	} {
		t.Run(fmt.Sprintf("%d/%v", c.version, c.want), func(t *testing.T) {
			e := newEnv(t, fakedrv.Options{DriverVersion: c.version}, 4096, 64, pinmem.Mapped)
			bc := newCopier(t, e.ctx, c.opts...)
			testutil.Poison(e.dst.Bytes())
			out, in := e.list(e.dst.Bytes(), e.out), e.list(e.src.Bytes(), e.in)
			before, opBefore := e.copyCalls(), e.fd.Calls(c.op)
			rep, err := bc.Copy(context.Background(), blocks.ToHost(e.s1, out), blocks.ToDevice(e.s2, in))
			must(t, err)
			must(t, e.s1.Synchronize(context.Background()))
			must(t, e.s2.Synchronize(context.Background()))
			if rep.Strategy != c.want || rep.Blocks != 2*e.nblk || rep.Bytes != int64(2*e.nblk*e.bs) {
				t.Fatalf("report %+v, want %v for %d blocks", rep, c.want, 2*e.nblk)
			}
			calls := e.copyCalls() - before
			wantCalls := 2 // a batch call or a launch per list
			if c.want == blocks.PerCopy {
				wantCalls = 2 * e.nblk
			}
			if calls != wantCalls || rep.Calls != wantCalls || e.fd.Calls(c.op) == opBefore {
				t.Fatalf("%d copy calls (report %d, %d of %s), want %d", calls, rep.Calls, e.fd.Calls(c.op)-opBefore, c.op, wantCalls)
			}
			e.check(t, out)
			e.check(t, in)
		})
	}
}

// TestFakeTurns: lists on two streams are queued in turns, one copy of
// each at a time for PerCopy and 1024 for the driver's batch, so that a
// stream whose queue is full does not hold back the other's first copies.
func TestFakeTurns(t *testing.T) {
	const nblk = 1500
	e := newEnv(t, fakedrv.Options{}, 64, nblk, 0)
	out, in := e.list(e.dst.Bytes(), e.out), e.list(e.src.Bytes(), e.in)
	var mu sync.Mutex
	var seq []string
	e.fd.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemcpyHtoDAsync_v2" || op == "cuMemcpyDtoHAsync_v2" {
			mu.Lock()
			seq = append(seq, op)
			mu.Unlock()
		}
		return cudadrv.Success
	})
	bc := newCopier(t, e.ctx, blocks.WithStrategy(blocks.PerCopy))
	_, err := bc.Copy(context.Background(), blocks.ToHost(e.s1, out[:10]), blocks.ToDevice(e.s2, in[:4]))
	must(t, err)
	want := []string{}
	for i := range 10 {
		want = append(want, "cuMemcpyDtoHAsync_v2")
		if i < 4 {
			want = append(want, "cuMemcpyHtoDAsync_v2")
		}
	}
	if !slices.Equal(seq, want) {
		t.Fatalf("per-copy order %v, want the lists in turns %v", seq, want)
	}
	e.fd.ClearFaults()

	batch := newCopier(t, e.ctx, blocks.WithStrategy(blocks.DriverBatch))
	rep, err := batch.Copy(context.Background(), blocks.ToHost(e.s1, out), blocks.ToDevice(e.s2, in))
	must(t, err)
	if rep.Calls != 4 {
		t.Fatalf("two lists of %d blocks in %d batch calls, want 4 (1024 copies a call)", nblk, rep.Calls)
	}
	must(t, e.s1.Synchronize(context.Background()))
	must(t, e.s2.Synchronize(context.Background()))
	e.check(t, out)
	e.check(t, in)
}

// TestFakeAutoBySize: Auto takes the driver's batch up to a mean block of
// 1 MiB and one copy per block above it, and never on the legacy default
// stream (handle 0, or CU_STREAM_LEGACY), which the driver's batch
// refuses.
func TestFakeAutoBySize(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 1<<20, 2, 0)
	bc := newCopier(t, e.ctx)
	l := e.list(e.src.Bytes(), e.in)
	for _, c := range []struct {
		l    []blocks.Block
		want blocks.Strategy
	}{
		{l, blocks.DriverBatch},
		{[]blocks.Block{{Host: e.src.Bytes()[:1<<20], Dev: e.in}, {Host: e.src.Bytes()[1<<20 : 2<<20-1], Dev: e.in, Off: 1 << 20}}, blocks.DriverBatch},
		{[]blocks.Block{{Host: e.src.Bytes()[:1<<20+1], Dev: e.in}}, blocks.PerCopy},
	} {
		rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, c.l))
		if err != nil || rep.Strategy != c.want {
			t.Errorf("mean block %d: %v, %v; want %v", rep.Bytes/int64(max(1, rep.Blocks)), rep.Strategy, err, c.want)
		}
	}
	must(t, e.s1.Synchronize(context.Background()))
	for _, h := range []uintptr{0, 1} { // 1: CU_STREAM_LEGACY
		legacy := cuda.WrapStream(e.ctx, h)
		must(t, e.ctx.Do(func() error {
			rep, err := bc.Copy(context.Background(), blocks.ToDevice(legacy, l))
			if err == nil && rep.Strategy != blocks.PerCopy {
				return fmt.Errorf("auto on the legacy stream %#x chose %v", h, rep.Strategy)
			}
			if err != nil {
				return fmt.Errorf("auto on the legacy stream %#x: %w", h, err)
			}
			batch, err := blocks.New(e.ctx, blocks.WithStrategy(blocks.DriverBatch))
			if err != nil {
				return err
			}
			defer batch.Close(context.Background())
			var le *blocks.ArgError
			if _, err := batch.Copy(context.Background(), blocks.ToDevice(legacy, l)); !errors.As(err, &le) || le.Block != -1 {
				return fmt.Errorf("driver batch on the legacy stream %#x = %v, want an *ArgError of the list", h, err)
			}
			return legacy.Synchronize(context.Background())
		}))
	}
	e.check(t, l)
}

// straddle returns a block of n bytes whose first half is the end of a
// pinned registration and whose second half is not pinned.
func straddle(t *testing.T, n int) []byte {
	t.Helper()
	mem := make([]byte, 1<<20)
	reg, err := pinmem.Register(mem[:1<<19], 0)
	must(t, err)
	t.Cleanup(func() { reg.Free() })
	end := len(reg.Bytes())
	return mem[end-n/2 : end-n/2+n]
}

// pages returns n page-aligned pages of a Go slice.
func pages(n int) []byte {
	page := os.Getpagesize()
	mem := make([]byte, (n+1)*page)
	base := (page - int(hostptr.AddrOf(mem)%uintptr(page))) % page
	return mem[base : base+n*page]
}

// TestFakeRefused: every bad call is refused with an *ArgError that
// matches cuda.ErrInvalidValue and names the list and block at fault (a
// freed device buffer and a destroyed stream with one that matches
// cuda.ErrInvalidHandle too), before any copy is queued: the driver sees
// no copy and no byte changes.
func TestFakeRefused(t *testing.T) {
	e := newEnv(t, fakedrv.Options{DeviceCount: 2}, 4096, 16, 0)
	bs := e.bs
	other, err := cuda.GetDevice(1)
	must(t, err)
	octx, err := other.PrimaryContext()
	must(t, err)
	odev, err := octx.Alloc(bs)
	must(t, err)
	defer odev.Free()
	ostream, err := octx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer ostream.Destroy()
	freed, err := e.ctx.Alloc(bs)
	must(t, err)
	must(t, freed.Free())
	dead, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	must(t, dead.Destroy())
	page := os.Getpagesize()
	gapMem := pages(3)
	for _, r := range [][]byte{gapMem[:page], gapMem[2*page:]} { // page 1 stays pageable
		b, err := pinmem.Register(r, 0)
		must(t, err)
		defer b.Free()
	}
	unpinned := make([]byte, 3*bs)
	h, d := e.src.Bytes(), e.dst.Bytes()
	blk := func(h []byte, i, off int) blocks.Block {
		return blocks.Block{Host: h[i*bs : (i+1)*bs], Dev: e.in, Off: off * bs}
	}
	to := func(l ...blocks.Block) []blocks.Block { return l }
	cases := []struct {
		name        string
		lists       []blocks.List
		list, block int   // the ArgError's
		reason      error // matched too, when not nil
	}{
		{"device destinations overlap", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blk(h, 1, 1), blocks.Block{Host: h[2*bs : 3*bs], Dev: e.in, Off: bs / 2}))}, 0, 2, nil},
		{"same device slot twice", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 3, 3), blk(h, 4, 4), blk(h, 5, 3)))}, 0, 2, nil},
		{"host destinations overlap", []blocks.List{blocks.ToHost(e.s1, to(blk(d, 0, 0), blocks.Block{Host: d[bs/2 : bs/2+bs], Dev: e.in, Off: 5 * bs}))}, 0, 1, nil},
		{"page-out writes what page-in reads", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0))), blocks.ToHost(e.s2, to(blk(h, 0, 1)))}, 1, 0, nil},
		{"page-in writes what page-out reads", []blocks.List{blocks.ToHost(e.s1, to(blk(d, 0, 2), blk(d, 1, 3))), blocks.ToDevice(e.s2, to(blk(h, 5, 3)))}, 1, 0, nil},
		{"past the buffer's end", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blocks.Block{Host: h[bs : 2*bs], Dev: e.in, Off: e.in.Size() - bs + 1}))}, 0, 1, nil},
		{"negative offset", []blocks.List{blocks.ToHost(e.s1, to(blocks.Block{Host: d[:bs], Dev: e.in, Off: -1}))}, 0, 0, nil},
		{"unpinned host source", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blk(h, 1, 1), blk(unpinned, 0, 7)))}, 0, 2, nil},
		{"unpinned host destination", []blocks.List{blocks.ToHost(e.s1, to(blk(unpinned, 1, 0), blk(d, 1, 1)))}, 0, 0, nil},
		{"block straddles the pinned end", []blocks.List{blocks.ToDevice(e.s1, to(blocks.Block{Host: straddle(t, 4*bs), Dev: e.in}))}, 0, 0, nil},
		{"block over a pageable page", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blocks.Block{Host: gapMem[page/2 : 2*page+page/2], Dev: e.in, Off: 4 * bs}))}, 0, 1, nil},
		{"device block of another device", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blocks.Block{Host: h[bs : 2*bs], Dev: odev}))}, 0, 1, nil},
		{"stream of another device", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0))), blocks.ToHost(ostream, to(blk(d, 0, 1)))}, 1, -1, nil},
		{"nil stream", []blocks.List{blocks.ToDevice(nil, to(blk(h, 0, 0)))}, 0, -1, nil},
		{"nil device buffer", []blocks.List{blocks.ToDevice(e.s1, to(blk(h, 0, 0), blocks.Block{Host: h[bs : 2*bs]}))}, 0, 1, nil},
		{"zero device buffer", []blocks.List{blocks.ToDevice(e.s1, to(blocks.Block{Host: h[:bs], Dev: &cuda.DeviceBuffer{}}))}, 0, 0, nil},
		{"freed device buffer", []blocks.List{blocks.ToHost(e.s1, to(blk(d, 0, 0), blocks.Block{Host: d[bs : 2*bs], Dev: freed}))}, 0, 1, cuda.ErrInvalidHandle},
		{"destroyed stream", []blocks.List{blocks.ToHost(e.s1, to(blk(d, 0, 0))), blocks.ToHost(dead, to(blk(d, 1, 1)))}, 1, -1, cuda.ErrInvalidHandle},
	}
	devBefore := make([]byte, e.in.Size())
	must(t, errOf(e.in.ReadAt(devBefore, 0)))
	hostBefore, dstBefore := bytes.Clone(h), bytes.Clone(d)
	for _, strategy := range []blocks.Strategy{blocks.Auto, blocks.DriverBatch, blocks.PerCopy} {
		bc := newCopier(t, e.ctx, blocks.WithStrategy(strategy))
		for _, c := range cases {
			before := e.copyCalls()
			rep, err := bc.Copy(context.Background(), c.lists...)
			le, ok := err.(*blocks.ArgError) // the one error, not wrapped
			switch {
			case !ok || !errors.Is(err, cuda.ErrInvalidValue):
				t.Errorf("%v %s: %v, want an *ArgError matching ErrInvalidValue", strategy, c.name, err)
			case c.reason != nil && !errors.Is(err, c.reason):
				t.Errorf("%v %s: %v, want an *ArgError matching %v too", strategy, c.name, err, c.reason)
			case le.List != c.list || le.Block != c.block:
				t.Errorf("%v %s: %v names list %d block %d, want list %d block %d", strategy, c.name, err, le.List, le.Block, c.list, c.block)
			}
			if n := e.copyCalls() - before; n != 0 || rep.Blocks != 0 {
				t.Errorf("%v %s: %d copy calls, %d blocks reported after a refusal", strategy, c.name, n, rep.Blocks)
			}
		}
	}
	devAfter := make([]byte, e.in.Size())
	must(t, errOf(e.in.ReadAt(devAfter, 0)))
	testutil.CheckBytes(t, devBefore, devAfter)
	testutil.CheckBytes(t, hostBefore, h)
	testutil.CheckBytes(t, dstBefore, d)

	// Reads may overlap reads: one host block paged into two slots.
	bc := newCopier(t, e.ctx)
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, to(blk(h, 0, 0))), blocks.ToDevice(e.s2, to(blk(h, 0, 1)))); err != nil {
		t.Errorf("one source paged into two slots: %v", err)
	}
	// An empty call, or only empty blocks, queues nothing and succeeds.
	if rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, to(blocks.Block{Dev: e.in}))); err != nil || rep.Blocks != 0 {
		t.Errorf("empty blocks: %+v, %v", rep, err)
	}
	if rep, err := bc.Copy(context.Background()); err != nil || rep.Blocks != 0 {
		t.Errorf("no lists: %+v, %v", rep, err)
	}
	// A context that has ended queues nothing.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := e.copyCalls()
	if _, err := bc.Copy(cctx, blocks.ToDevice(e.s1, to(blk(h, 0, 0)))); !errors.Is(err, context.Canceled) || e.copyCalls() != before {
		t.Errorf("cancelled context: %v, %d copy calls", err, e.copyCalls()-before)
	}
	must(t, e.s1.Synchronize(context.Background()))
	must(t, e.s2.Synchronize(context.Background()))
}

// TestFakeNew: New's refusals, and Close.
func TestFakeNew(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 2, 0)
	for _, tc := range []struct {
		name          string
		opts          []blocks.Option
		option, value string
	}{
		{"nil option", []blocks.Option{blocks.WithKernel(8), nil}, "Option", "nil"},
		{"strategy 9", []blocks.Option{blocks.WithStrategy(9)}, "WithStrategy", "Strategy(9)"},
		{"kernel strategy only", []blocks.Option{blocks.WithStrategy(blocks.Kernel)}, "WithStrategy", "kernel"},
		{"kernel of 0 blocks", []blocks.Option{blocks.WithStrategy(blocks.Kernel), blocks.WithKernel(0)}, "WithStrategy", "kernel"},
		{"kernel of -1 blocks", []blocks.Option{blocks.WithKernel(-1)}, "WithKernel", "-1"},
		{"kernel of 1<<26+1 blocks", []blocks.Option{blocks.WithKernel(1<<26 + 1)}, "WithKernel", "67108865"},
	} {
		bc, err := blocks.New(e.ctx, tc.opts...)
		var oe *pinmem.OptionError
		if bc != nil || !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &oe) || oe.Func != "blocks.New" || oe.Option != tc.option || oe.Value != tc.value || oe.Reason == "" {
			t.Errorf("%s: %v (%#v), want a *pinmem.OptionError of blocks.New for %s(%s)", tc.name, err, oe, tc.option, tc.value)
		}
	}
	var ae *blocks.ArgError
	if _, err := blocks.New(nil, nil); !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &ae) || ae.List != -1 {
		t.Errorf("nil context: %v, want an *ArgError of no list", err)
	}
	bc, err := blocks.New(e.ctx)
	must(t, err)
	//lint:ignore SA1012 a nil context is refused
	if _, err := bc.Copy(nil, blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in))); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Copy with a nil context.Context: %v", err)
	}
	must(t, bc.Close(context.Background()))
	if err := bc.Close(context.Background()); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in))); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("Copy after Close: %v", err)
	}
}

// TestFakeFaults: driver failures come back typed; an asynchronous fault
// surfaces at the stream's synchronize; a copy queued before a failure
// runs, and the same lists can be copied again.
func TestFakeFaults(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 16, 0)
	bc := newCopier(t, e.ctx)
	per := newCopier(t, e.ctx, blocks.WithStrategy(blocks.PerCopy))
	l := e.list(e.src.Bytes(), e.in)

	must(t, e.fd.FailOn("cuMemcpyBatchAsync_v2", 1, cudadrv.ErrorOutOfMemory))
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("failing batch: %v", err)
	}
	must(t, e.fd.FailOn("cuMemcpyHtoDAsync_v2", 5, cudadrv.ErrorOutOfMemory))
	if _, err := per.Copy(context.Background(), blocks.ToDevice(e.s1, l)); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("per-copy failing at the fifth block: %v", err)
	}
	// A failing pointer query that decides (the memory type) is the error.
	must(t, e.fd.FailOn("cuPointerGetAttribute", 3, cudadrv.ErrorOutOfMemory))
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("failing memory-type query: %v", err)
	}
	// A failing range query only costs more queries.
	must(t, e.fd.FailOn("cuPointerGetAttribute", 1, cudadrv.ErrorNotSupported))
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); err != nil {
		t.Errorf("failing range query: %v", err)
	}
	e.fd.ClearFaults()
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)

	must(t, e.fd.FailAsync("cuMemcpyBatchAsync_v2", 1, cudadrv.ErrorIllegalAddress))
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); err != nil {
		t.Fatalf("queuing a batch that faults later: %v", err)
	}
	if err := e.s1.Synchronize(context.Background()); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Errorf("Synchronize after an asynchronous fault = %v, want ErrLaunchFailed", err)
	}
}

// TestFakeNoBatchDriver: on a driver older than 12.8 the driver's batch
// is ErrNotSupported, with nothing queued.
func TestFakeNoBatchDriver(t *testing.T) {
	e := newEnv(t, fakedrv.Options{DriverVersion: 12040}, 4096, 4, 0)
	bc := newCopier(t, e.ctx, blocks.WithStrategy(blocks.DriverBatch))
	before := e.copyCalls()
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in))); !errors.Is(err, cuda.ErrNotSupported) || e.copyCalls() != before {
		t.Errorf("driver batch on 12.4: %v, want ErrNotSupported", err)
	}
}

// TestFakeQueuedNotRun: the copies are queued, not run, while the stream
// is held, and run when it is released.
func TestFakeQueuedNotRun(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 32, pinmem.Mapped)
	for _, opts := range [][]blocks.Option{{blocks.WithStrategy(blocks.DriverBatch)}, {blocks.WithStrategy(blocks.PerCopy)}, {blocks.WithKernel(32)}} {
		bc := newCopier(t, e.ctx, opts...)
		must(t, e.in.Memset(0))
		l := e.list(e.src.Bytes(), e.in)
		must(t, e.fd.HoldStream(cudadrv.Stream(e.s1.Handle())))
		if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, e.in.Size())
		must(t, errOf(e.in.ReadAt(got, 0)))
		if !bytes.Equal(got, make([]byte, len(got))) {
			t.Fatal("a block landed while the stream was held")
		}
		must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s1.Handle())))
		must(t, e.s1.Synchronize(context.Background()))
		e.check(t, l)
	}
}

// TestFakePinnedQueries: blocks carved from one pinned buffer cost a
// bounded number of pointer queries, not a few per block.
func TestFakePinnedQueries(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 256, 0)
	bc := newCopier(t, e.ctx)
	before := e.fd.Calls("cuPointerGetAttribute")
	must(t, func() error {
		_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in)))
		return err
	}())
	if n := e.fd.Calls("cuPointerGetAttribute") - before; n > 3 {
		t.Errorf("%d pointer queries for 256 blocks of one pinned buffer, want at most 3", n)
	}
}

// TestFakeKernel: the kernel (as the Copier's strategy) copies blocks whose size or addresses are
// not multiples of 16 (the byte path), refuses host memory that is not
// mapped and lists longer than its tables, and reads no table a queued
// launch still reads: with four tables, the fifth list waits, bounded by
// ctx, for the first list's launch.
func TestFakeKernel(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 40, pinmem.Mapped)
	bc := newCopier(t, e.ctx, blocks.WithStrategy(blocks.Kernel), blocks.WithKernel(8))
	src := e.src.Bytes()
	odd := []blocks.Block{{Host: src[1:14], Dev: e.in, Off: 3}, {Host: src[100:113], Dev: e.in, Off: 1000}}
	_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, odd))
	must(t, err)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, odd)

	unmapped, err := pinmem.Alloc(4096, 0)
	must(t, err)
	defer unmapped.Free()
	before := e.copyCalls()
	var le *blocks.ArgError
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, []blocks.Block{{Host: unmapped.Bytes(), Dev: e.in}})); !errors.As(err, &le) || le.Block != 0 {
		t.Errorf("unmapped host block: %v, want an *ArgError for block 0", err)
	}
	l := e.list(src, e.in)
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l[:9])); !errors.As(err, &le) || le.Block != -1 {
		t.Errorf("9 blocks for tables of 8: %v, want an *ArgError of the list", err)
	}
	if n := e.copyCalls() - before; n != 0 {
		t.Errorf("%d launches after refusals", n)
	}

	// Lists 0-3 take the four tables, list 0 held on s1; list 4 comes back
	// to list 0's table.
	must(t, e.fd.HoldStream(cudadrv.Stream(e.s1.Handle())))
	for i := range 4 {
		s := e.s2
		if i == 0 {
			s = e.s1
		}
		_, err := bc.Copy(context.Background(), blocks.ToDevice(s, l[8*i:8*i+8]))
		must(t, err)
	}
	launches := e.fd.Calls("cuLaunchKernel")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = bc.Copy(ctx, blocks.ToDevice(e.s2, l[32:]))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || e.fd.Calls("cuLaunchKernel") != launches {
		t.Fatalf("the fifth list while the first list's launch is held: %v, %d launches; want the deadline and none", err, e.fd.Calls("cuLaunchKernel")-launches)
	}
	// Close waits for the held launch too, bounded by its ctx.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = bc.Close(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close while a launch is held: %v, want the deadline", err)
	}
	must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s1.Handle())))
	must(t, e.s1.Synchronize(context.Background()))
	must(t, e.s2.Synchronize(context.Background()))
	e.check(t, l[:32]) // every list copied its own blocks
	must(t, bc.Close(context.Background()))
}

// TestFakeKernelUnfenced: when the record of a launch's event fails, its
// table is neither rewritten nor freed until a wait for the context's
// work succeeds.
func TestFakeKernelUnfenced(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 40, pinmem.Mapped)
	bc, err := blocks.New(e.ctx, blocks.WithKernel(8))
	must(t, err)
	l := e.list(e.src.Bytes(), e.in)
	must(t, e.fd.HoldStream(cudadrv.Stream(e.s1.Handle())))
	must(t, e.fd.FailOn("cuEventRecord", 1, cudadrv.ErrorLaunchFailed))
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l[:8])); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("launch whose record fails: %v", err)
	}
	e.fd.ClearFaults()
	for i := 1; i < 4; i++ {
		_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s2, l[8*i:8*i+8]))
		must(t, err)
	}
	must(t, e.s2.Synchronize(context.Background()))
	// The unfenced table again: the wait for the context fails, nothing is launched.
	must(t, e.fd.FailOn("cuCtxSynchronize", 1, cudadrv.ErrorLaunchFailed))
	launches := e.fd.Calls("cuLaunchKernel")
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(e.s2, l[32:])); !errors.Is(err, cuda.ErrLaunchFailed) || e.fd.Calls("cuLaunchKernel") != launches {
		t.Fatalf("reusing the unfenced table while the wait fails: %v", err)
	}
	allocs := e.fd.Live().HostAllocs
	must(t, e.fd.FailOn("cuCtxSynchronize", 1, cudadrv.ErrorLaunchFailed))
	if err := bc.Close(context.Background()); !errors.Is(err, cuda.ErrLaunchFailed) || e.fd.Live().HostAllocs != allocs {
		t.Fatalf("Close with an unfenced table whose wait fails: %v, %d tables freed", err, allocs-e.fd.Live().HostAllocs)
	}
	e.fd.ClearFaults()
	must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s1.Handle())))
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l[:32])
	must(t, bc.Close(context.Background()))
	if n := e.fd.Live().HostAllocs; n != allocs-4 {
		t.Fatalf("%d pinned allocations after Close, want the 4 tables freed (%d)", n, allocs-4)
	}
}

// TestFakeAcrossRegistrations: blocks of a buffer pinned as several
// adjacent registrations that cross from one into the next are copied by
// every strategy: the copy engines' strategies split such a block at the
// boundary (the driver refuses one copy across two registrations), the
// kernel takes it whole where the registrations map to one device range.
func TestFakeAcrossRegistrations(t *testing.T) {
	const chunk = 64 << 10
	t.Cleanup(testhook.SetRegChunk(chunk))
	const bs, nblk = 48 << 10, 16 // many 48 KiB blocks cross a 64 KiB boundary
	e := newEnv(t, fakedrv.Options{}, bs, nblk, 0)
	b, err := pinmem.Alloc(bs*nblk, pinmem.Mapped, pinmem.WithMethod(pinmem.MethodMmapRegister))
	must(t, err)
	defer b.Free()
	if len(b.Segments()) < 3 {
		t.Fatalf("%d registrations, want several", len(b.Segments()))
	}
	copy(b.Bytes(), e.src.Bytes())
	base := hostptr.AddrOf(b.Bytes())
	l := e.list(b.Bytes(), e.in)
	cuts := 0
	for _, s := range b.Segments()[1:] {
		o := int(hostptr.AddrOf(s) - base)
		for _, blk := range l {
			if lo := int(hostptr.AddrOf(blk.Host) - base); o > lo && o < lo+bs {
				cuts++
			}
		}
	}
	if cuts == 0 {
		t.Fatal("no block crosses a registration boundary: the test could not fail")
	}
	for _, c := range []struct {
		opts  []blocks.Option
		want  blocks.Strategy
		calls int
	}{
		{[]blocks.Option{blocks.WithStrategy(blocks.DriverBatch)}, blocks.DriverBatch, 1},
		{[]blocks.Option{blocks.WithStrategy(blocks.PerCopy)}, blocks.PerCopy, nblk + cuts},
		// Tables of nblk descriptors: only blocks taken whole fit.
		{[]blocks.Option{blocks.WithKernel(nblk)}, blocks.Kernel, 1},
	} {
		bc := newCopier(t, e.ctx, c.opts...)
		must(t, e.in.Memset(0))
		rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
		must(t, err)
		if rep.Strategy != c.want || rep.Blocks != nblk || rep.Calls != c.calls {
			t.Fatalf("report %+v, want %v: %d blocks in %d calls", rep, c.want, nblk, c.calls)
		}
		must(t, e.s1.Synchronize(context.Background()))
		e.check(t, l)
	}
}

// TestFakeKernelTurn: a call waiting for another's use of the kernel, or
// Close waiting for it, gives up when its own context ends, not when the
// other call's does.
func TestFakeKernelTurn(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 8, pinmem.Mapped)
	bc := newCopier(t, e.ctx, blocks.WithKernel(8))
	l := e.list(e.src.Bytes(), e.in)[:1]
	s1 := cudadrv.Stream(e.s1.Handle())
	must(t, e.fd.HoldStream(s1))
	for range 4 { // every table read by a held launch
		_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
		must(t, err)
	}
	// The fifth call holds the kernel while it waits for the first launch.
	first := make(chan error, 1)
	go func() {
		_, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
		first <- err
	}()
	waitBlocked(t, e.fd, s1)
	for name, call := range map[string]func(ctx context.Context) error{
		"Copy": func(ctx context.Context) error {
			_, err := bc.Copy(ctx, blocks.ToDevice(e.s2, l))
			return err
		},
		"Close": bc.Close,
	} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- call(ctx) }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("%s while another call holds the kernel, its context cancelled: %v", name, err)
		}
	}
	must(t, e.fd.ReleaseStream(s1))
	must(t, <-first)
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)
}

// TestFakeCloseEndedContext: Close with a context that has ended
// releases a Copier whose kernel has nothing to wait for, every time:
// one that never launched, and one whose launches have all finished
// (their tables pinned, then freed).
func TestFakeCloseEndedContext(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 1, pinmem.Mapped)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := e.list(e.src.Bytes(), e.in)
	allocs := e.fd.Live().HostAllocs
	for i := range 20 {
		bc, err := blocks.New(e.ctx, blocks.WithKernel(1))
		must(t, err)
		if i%2 == 1 {
			rep, err := bc.Copy(context.Background(), blocks.ToDevice(e.s1, l))
			must(t, err)
			must(t, e.s1.Synchronize(context.Background()))
			if rep.Strategy != blocks.Kernel {
				t.Fatalf("Copy %d: %v, want the kernel", i, rep.Strategy)
			}
		}
		if err := bc.Close(ctx); err != nil {
			t.Fatalf("Close %d with an ended context and nothing to wait for (launched: %v): %v", i, i%2 == 1, err)
		}
		if n := e.fd.Live().HostAllocs; n != allocs {
			t.Fatalf("Close %d: %d pinned allocations left, want %d", i, n, allocs)
		}
	}
	e.check(t, l)
}

// TestFakeZeroCopier: a nil or zero Copier refuses calls with an
// *ArgError instead of panicking.
func TestFakeZeroCopier(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 1, 0)
	l := blocks.ToDevice(e.s1, e.list(e.src.Bytes(), e.in))
	for name, bc := range map[string]*blocks.Copier{"nil": nil, "zero": {}} {
		var ae *blocks.ArgError
		if _, err := bc.Copy(context.Background(), l); !errors.As(err, &ae) || !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Copy of a %s Copier: %v, want an *ArgError", name, err)
		}
		if err := bc.Close(context.Background()); !errors.As(err, &ae) {
			t.Errorf("Close of a %s Copier: %v, want an *ArgError", name, err)
		}
	}
}

// waitBlocked waits until a call waits for held work on s, with a bound
// that only a broken test reaches.
func waitBlocked(t *testing.T, fd *fakedrv.Driver, s cudadrv.Stream) {
	t.Helper()
	limit := time.After(time.Minute)
	for seen := -1; ; {
		changed := fd.Changed()
		op, polls, err := fd.Blocked(s, false, seen)
		must(t, err)
		if op != "" {
			return
		}
		seen = polls
		select {
		case <-changed:
		case <-limit:
			t.Fatal("no call blocked on the held stream within a minute")
		}
	}
}

// TestFakeBorrowed: a stream and a device buffer borrowed through another
// wrapper of the copier's context (cuda.WrapContext of its handle, as code
// that takes handles from another library makes) are the copier's.
func TestFakeBorrowed(t *testing.T) {
	e := newEnv(t, fakedrv.Options{}, 4096, 4, 0)
	bc := newCopier(t, e.ctx)
	w := cuda.WrapContext(e.ctx.Device(), e.ctx.Handle())
	in := cuda.WrapDevicePtr(w, e.in.Ptr(), e.in.Size())
	l := e.list(e.src.Bytes(), in)
	if _, err := bc.Copy(context.Background(), blocks.ToDevice(cuda.WrapStream(w, e.s1.Handle()), l)); err != nil {
		t.Fatalf("a borrowed stream and buffer of the copier's context: %v", err)
	}
	must(t, e.s1.Synchronize(context.Background()))
	e.check(t, l)
}

// TestFakeAutoWithKernel: a Copier with a kernel takes it under Auto for
// small blocks in mapped host memory, and the copy engines for large
// blocks, for host blocks that are not mapped and for lists longer than
// its tables; every byte of every call is checked.
func TestFakeAutoWithKernel(t *testing.T) {
	for _, c := range []struct {
		name  string
		bs    int
		flags pinmem.Flags
		cap   int
		want  blocks.Strategy
	}{
		{"16KiB mapped", 16 << 10, pinmem.Mapped, 64, blocks.Kernel},
		{"16KiB not mapped", 16 << 10, 0, 64, blocks.DriverBatch},
		{"256KiB mapped", 256 << 10, pinmem.Mapped, 64, blocks.DriverBatch},
		{"2MiB mapped", 2 << 20, pinmem.Mapped, 64, blocks.PerCopy},
		{"more blocks than the tables hold", 16 << 10, pinmem.Mapped, 3, blocks.DriverBatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, fakedrv.Options{DriverVersion: 13000}, c.bs, 4, c.flags)
			bc := newCopier(t, e.ctx, blocks.WithKernel(c.cap))
			testutil.Poison(e.dst.Bytes())
			out, in := e.list(e.dst.Bytes(), e.out), e.list(e.src.Bytes(), e.in)
			launches := e.fd.Calls("cuLaunchKernel")
			rep, err := bc.Copy(context.Background(), blocks.ToHost(e.s1, out), blocks.ToDevice(e.s2, in))
			must(t, err)
			must(t, e.s1.Synchronize(context.Background()))
			must(t, e.s2.Synchronize(context.Background()))
			if rep.Strategy != c.want || rep.Blocks != 8 {
				t.Fatalf("report %+v, want %v for 8 blocks", rep, c.want)
			}
			if n := e.fd.Calls("cuLaunchKernel") - launches; (n == 2) != (c.want == blocks.Kernel) {
				t.Fatalf("%d launches for %v", n, c.want)
			}
			e.check(t, out)
			e.check(t, in)
		})
	}
}
