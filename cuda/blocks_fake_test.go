package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// blockEnv is a device buffer and two pinned host buffers of nblk blocks
// of bs bytes, with block lists that scatter the blocks on both sides.
type blockEnv struct {
	fd       *fakedrv.Driver
	ctx      *cuda.Context
	s        *cuda.Stream
	dev      *cuda.DeviceBuffer
	src, dst *pinmem.Buffer
	bs, nblk int
	// devOf[i] is the device slot of host block i (a permutation), so
	// the copies are scattered on the device side; host blocks are taken
	// in a shuffled order too.
	devOf, order []int
}

func newBlockEnv(t testing.TB, opts fakedrv.Options, bs, nblk int) *blockEnv {
	t.Helper()
	fd := testutil.UseFake(t, opts)
	ctx := testutil.PrimaryContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	dev, err := ctx.Alloc(bs * nblk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free() })
	src, err := pinmem.Alloc(bs*nblk, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	dst, err := pinmem.Alloc(bs*nblk, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Free() })
	copy(src.Bytes(), testutil.RandomBytes(bs*nblk, uint64(bs)))
	r := rand.New(rand.NewPCG(1, 2))
	return &blockEnv{fd: fd, ctx: ctx, s: s, dev: dev, src: src, dst: dst, bs: bs, nblk: nblk,
		devOf: r.Perm(nblk), order: r.Perm(nblk)}
}

// list returns the block list between host buffer h and the device.
func (e *blockEnv) list(h []byte) []cuda.BlockCopy {
	l := make([]cuda.BlockCopy, 0, e.nblk)
	for _, i := range e.order {
		l = append(l, cuda.BlockCopy{Host: h[i*e.bs : (i+1)*e.bs], Dev: e.dev, Off: e.devOf[i] * e.bs})
	}
	return l
}

// checkDevice fails t unless device slot devOf[i] holds host block i of want.
func (e *blockEnv) checkDevice(t *testing.T, want []byte) {
	t.Helper()
	got := make([]byte, e.dev.Size())
	if _, err := e.dev.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range e.nblk {
		d := e.devOf[i]
		if !bytes.Equal(got[d*e.bs:(d+1)*e.bs], want[i*e.bs:(i+1)*e.bs]) {
			t.Fatalf("device slot %d does not hold host block %d", d, i)
		}
	}
}

func (e *blockEnv) copyCalls() int {
	return e.fd.Calls("cuMemcpyHtoDAsync_v2") + e.fd.Calls("cuMemcpyDtoHAsync_v2") +
		e.fd.Calls("cuMemcpyBatchAsync") + e.fd.Calls("cuMemcpyBatchAsync_v2")
}

// TestFakeCopyBlocksRoundTrip pages scattered blocks in and out with each
// strategy on drivers with either batch-copy form and without one, and
// checks every byte, the strategy chosen, and the driver calls made.
func TestFakeCopyBlocksRoundTrip(t *testing.T) {
	for _, c := range []struct {
		version  int
		strategy cuda.BlockStrategy
		want     cuda.BlockStrategy
		op       string // the copy call expected
	}{
		{13000, cuda.BlockAuto, cuda.BlockDriverBatch, "cuMemcpyBatchAsync_v2"},
		{13000, cuda.BlockDriverBatch, cuda.BlockDriverBatch, "cuMemcpyBatchAsync_v2"},
		{13000, cuda.BlockPerCopy, cuda.BlockPerCopy, ""},
		{12080, cuda.BlockAuto, cuda.BlockDriverBatch, "cuMemcpyBatchAsync"},
		{12040, cuda.BlockAuto, cuda.BlockPerCopy, ""},
	} {
		t.Run(fmt.Sprintf("%d/%v", c.version, c.strategy), func(t *testing.T) {
			e := newBlockEnv(t, fakedrv.Options{DriverVersion: c.version}, 4096, 64)
			for _, dir := range []cuda.Direction{cuda.HostToDevice, cuda.DeviceToHost} {
				h := e.src.Bytes()
				if dir == cuda.DeviceToHost {
					h = e.dst.Bytes()
					testutil.Poison(h)
				}
				before := e.copyCalls()
				batchBefore := e.fd.Calls(c.op)
				rep, err := e.s.CopyBlocks(dir, e.list(h), cuda.WithBlockStrategy(c.strategy))
				if err != nil {
					t.Fatalf("%v: %v", dir, err)
				}
				if err := e.s.Synchronize(context.Background()); err != nil {
					t.Fatal(err)
				}
				if rep.Strategy != c.want || rep.Blocks != e.nblk || rep.Bytes != int64(e.nblk*e.bs) {
					t.Fatalf("%v: report %+v, want %v for %d blocks", dir, rep, c.want, e.nblk)
				}
				calls := e.copyCalls() - before
				if c.want == cuda.BlockDriverBatch {
					if calls != 1 || rep.Calls != 1 || e.fd.Calls(c.op)-batchBefore != 1 {
						t.Fatalf("%v: %d copy calls (report %d, %s %d), want one %s", dir, calls, rep.Calls, c.op, e.fd.Calls(c.op)-batchBefore, c.op)
					}
				} else if calls != e.nblk || rep.Calls != e.nblk {
					t.Fatalf("%v: %d copy calls (report %d), want one per block (%d)", dir, calls, rep.Calls, e.nblk)
				}
			}
			e.checkDevice(t, e.src.Bytes())
			testutil.CheckBytes(t, e.src.Bytes(), e.dst.Bytes())
		})
	}
}

// TestFakeCopyBlocksAutoBySize: BlockAuto takes the driver's batch up to
// the batch limit (mean block size) and one copy per block above it.
func TestFakeCopyBlocksAutoBySize(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 8)
	for _, c := range []struct {
		max  int
		want cuda.BlockStrategy
	}{{4096, cuda.BlockDriverBatch}, {4095, cuda.BlockPerCopy}, {0, cuda.BlockPerCopy}} {
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockBatchMax(c.max))
		if err != nil || rep.Strategy != c.want {
			t.Errorf("batch max %d: %v, %v; want %v", c.max, rep.Strategy, err, c.want)
		}
	}
	if cuda.DefaultBlockBatchMax < 256<<10 {
		t.Errorf("DefaultBlockBatchMax = %d: the 16-256 KiB KV blocks would not take the batch", cuda.DefaultBlockBatchMax)
	}
	// The legacy default stream cannot take the driver's batch.
	legacy := cuda.WrapStream(e.ctx, 0)
	err := e.ctx.Do(func() error {
		rep, err := legacy.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()))
		if err == nil && rep.Strategy != cuda.BlockPerCopy {
			return fmt.Errorf("auto on the legacy stream chose %v", rep.Strategy)
		}
		if err != nil {
			return err
		}
		if _, err := legacy.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockStrategy(cuda.BlockDriverBatch)); !errors.Is(err, cuda.ErrInvalidValue) {
			return fmt.Errorf("driver batch on the legacy stream = %v, want ErrInvalidValue", err)
		}
		return legacy.Synchronize(context.Background())
	})
	if err != nil {
		t.Fatal(err)
	}
	e.checkDevice(t, e.src.Bytes())
}

// TestFakeCopyBlocksRefused: every bad list is refused with its typed
// error, before any copy is queued: the driver sees no copy call and no
// byte changes on either side.
func TestFakeCopyBlocksRefused(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{DeviceCount: 2}, 4096, 16)
	bs := e.bs
	other, err := cuda.GetDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	octx, err := other.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	odev, err := octx.Alloc(bs)
	if err != nil {
		t.Fatal(err)
	}
	defer odev.Free()
	freed, err := e.ctx.Alloc(bs)
	if err != nil {
		t.Fatal(err)
	}
	if err := freed.Free(); err != nil {
		t.Fatal(err)
	}
	unpinned := make([]byte, 3*bs)
	h := e.src.Bytes()
	ok := func(i int) cuda.BlockCopy { return cuda.BlockCopy{Host: h[i*bs : (i+1)*bs], Dev: e.dev, Off: i * bs} }
	cases := []struct {
		name   string
		dir    cuda.Direction
		blocks []cuda.BlockCopy
		reason error
		index  int
	}{
		{"device blocks overlap", cuda.HostToDevice, []cuda.BlockCopy{ok(0), ok(1), {Host: h[2*bs : 3*bs], Dev: e.dev, Off: bs / 2}}, cuda.ErrBlockOverlap, 2},
		{"same device block twice", cuda.HostToDevice, []cuda.BlockCopy{ok(3), ok(4), {Host: h[5*bs : 6*bs], Dev: e.dev, Off: 3 * bs}}, cuda.ErrBlockOverlap, 2},
		{"host blocks overlap", cuda.DeviceToHost, []cuda.BlockCopy{ok(0), {Host: h[bs/2 : bs/2+bs], Dev: e.dev, Off: 5 * bs}}, cuda.ErrBlockOverlap, 1},
		{"past the buffer's end", cuda.HostToDevice, []cuda.BlockCopy{ok(0), {Host: h[bs : 2*bs], Dev: e.dev, Off: e.dev.Size() - bs + 1}}, cuda.ErrBlockRange, 1},
		{"negative offset", cuda.DeviceToHost, []cuda.BlockCopy{{Host: h[:bs], Dev: e.dev, Off: -1}}, cuda.ErrBlockRange, 0},
		{"unpinned host block", cuda.HostToDevice, []cuda.BlockCopy{ok(0), ok(1), {Host: unpinned[:bs], Dev: e.dev, Off: 7 * bs}}, cuda.ErrHostNotPinned, 2},
		{"unpinned host destination", cuda.DeviceToHost, []cuda.BlockCopy{{Host: unpinned[bs : 2*bs], Dev: e.dev, Off: 0}, ok(1)}, cuda.ErrHostNotPinned, 0},
		{"block straddles the pinned end", cuda.HostToDevice, []cuda.BlockCopy{{Host: straddle(t, 4*bs), Dev: e.dev, Off: 0}}, cuda.ErrHostNotPinned, 0},
		{"device block of another device", cuda.HostToDevice, []cuda.BlockCopy{ok(0), {Host: h[bs : 2*bs], Dev: odev, Off: 0}}, cuda.ErrBlockContext, 1},
		{"freed device buffer", cuda.DeviceToHost, []cuda.BlockCopy{ok(0), {Host: h[bs : 2*bs], Dev: freed, Off: 0}}, cuda.ErrInvalidHandle, 1},
		{"nil device buffer", cuda.HostToDevice, []cuda.BlockCopy{{Host: h[:bs]}}, cuda.ErrInvalidValue, 0},
	}
	devBefore := make([]byte, e.dev.Size())
	if _, err := e.dev.ReadAt(devBefore, 0); err != nil {
		t.Fatal(err)
	}
	hostBefore := bytes.Clone(h)
	for _, strategy := range []cuda.BlockStrategy{cuda.BlockAuto, cuda.BlockDriverBatch, cuda.BlockPerCopy} {
		for _, c := range cases {
			before := e.copyCalls()
			rep, err := e.s.CopyBlocks(c.dir, c.blocks, cuda.WithBlockStrategy(strategy))
			if !errors.Is(err, c.reason) {
				t.Errorf("%v %s: %v, want %v", strategy, c.name, err, c.reason)
				continue
			}
			if !errors.Is(c.reason, cuda.ErrInvalidHandle) && !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%v %s: %v does not match ErrInvalidValue", strategy, c.name, err)
			}
			var be *cuda.BlockError
			if errors.As(err, &be) && be.Index != c.index {
				t.Errorf("%v %s: BlockError names block %d, want %d (%v)", strategy, c.name, be.Index, c.index, err)
			} else if !errors.As(err, &be) && c.reason != cuda.ErrInvalidValue {
				t.Errorf("%v %s: %v is not a *BlockError", strategy, c.name, err)
			}
			if n := e.copyCalls() - before; n != 0 || rep.Blocks != 0 {
				t.Errorf("%v %s: %d copy calls, %d blocks reported after a refusal", strategy, c.name, n, rep.Blocks)
			}
		}
	}
	if err := e.s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	devAfter := make([]byte, e.dev.Size())
	if _, err := e.dev.ReadAt(devAfter, 0); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, devBefore, devAfter)
	testutil.CheckBytes(t, hostBefore, h)

	// Bad arguments of the call itself.
	if _, err := e.s.CopyBlocks(0, e.list(h)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("direction 0: %v", err)
	}
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(h), cuda.WithBlockStrategy(9)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("strategy 9: %v", err)
	}
	oev, err := octx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer oev.Destroy()
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(h), cuda.WithBlockEvent(oev)); !errors.Is(err, cuda.ErrBlockContext) {
		t.Errorf("event of another context: %v", err)
	}
	var nilStream *cuda.Stream
	if _, err := nilStream.CopyBlocks(cuda.HostToDevice, e.list(h)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("nil stream: %v", err)
	}
	// An empty list (or only empty blocks) queues nothing and succeeds.
	if rep, err := e.s.CopyBlocks(cuda.HostToDevice, []cuda.BlockCopy{{Dev: e.dev}}); err != nil || rep.Blocks != 0 {
		t.Errorf("empty blocks: %+v, %v", rep, err)
	}
}

// straddle returns a block of n bytes whose first half is the end of a
// pinned buffer and whose second half is not pinned: a Go slice with a
// registered prefix. The buffer is released when the test ends.
func straddle(t *testing.T, n int) []byte {
	t.Helper()
	mem := make([]byte, 1<<20)
	// Register the page-aligned part up to the middle of mem.
	reg, err := pinmem.Register(mem[:1<<19], 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Free() })
	b := reg.Bytes()
	end := len(b)
	return mem[end-n/2 : end-n/2+n]
}

// TestFakeCopyBlocksStaging: unpinned host blocks go through a pinned
// staging buffer when one is given, in both directions; a staging buffer
// too small or not pinned is refused before anything is queued.
func TestFakeCopyBlocksStaging(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 16)
	bs := e.bs
	pageable := testutil.RandomBytes(4*bs, 99)
	staging, err := pinmem.Alloc(4*bs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer staging.Free()
	h := e.src.Bytes()
	// Blocks 0-3 from pageable memory, 4-7 pinned, all to device slots 8-15.
	var list []cuda.BlockCopy
	for i := range 4 {
		list = append(list, cuda.BlockCopy{Host: pageable[i*bs : (i+1)*bs], Dev: e.dev, Off: (8 + i) * bs})
		list = append(list, cuda.BlockCopy{Host: h[(4+i)*bs : (5+i)*bs], Dev: e.dev, Off: (12 + i) * bs})
	}
	for _, strategy := range []cuda.BlockStrategy{cuda.BlockDriverBatch, cuda.BlockPerCopy} {
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, list, cuda.WithBlockStaging(staging.Bytes()), cuda.WithBlockStrategy(strategy))
		if err != nil || rep.Staged != 4 || rep.Blocks != 8 {
			t.Fatalf("%v: staged HtoD: %+v, %v", strategy, rep, err)
		}
		if err := e.s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 8*bs)
		if _, err := e.dev.ReadAt(got, int64(8*bs)); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, pageable, got[:4*bs])
		testutil.CheckBytes(t, h[4*bs:8*bs], got[4*bs:])

		// Back out into fresh pageable memory: CopyBlocks returns with the bytes in place.
		out := make([]byte, 4*bs)
		testutil.Poison(out)
		back := []cuda.BlockCopy{}
		for i := range 4 {
			back = append(back, cuda.BlockCopy{Host: out[i*bs : (i+1)*bs], Dev: e.dev, Off: (8 + i) * bs})
		}
		rep, err = e.s.CopyBlocks(cuda.DeviceToHost, back, cuda.WithBlockStaging(staging.Bytes()), cuda.WithBlockStrategy(strategy))
		if err != nil || rep.Staged != 4 {
			t.Fatalf("%v: staged DtoH: %+v, %v", strategy, rep, err)
		}
		testutil.CheckBytes(t, pageable, out)
	}
	before := e.copyCalls()
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, list, cuda.WithBlockStaging(staging.Bytes()[:3*bs])); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("staging too small: %v", err)
	}
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, list, cuda.WithBlockStaging(make([]byte, 4*bs))); !errors.Is(err, cuda.ErrHostNotPinned) {
		t.Errorf("unpinned staging: %v", err)
	}
	if n := e.copyCalls() - before; n != 0 {
		t.Errorf("%d copy calls after refusals", n)
	}
}

// TestFakeCopyBlocksFaults: driver failures come back typed. The batch
// queues nothing; the per-copy strategy reports how many blocks it queued
// before the failing one; an asynchronous fault surfaces at Synchronize.
func TestFakeCopyBlocksFaults(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 16)
	l := e.list(e.src.Bytes())

	must(t, e.fd.FailOn("cuMemcpyBatchAsync_v2", 1, cudadrv.ErrorOutOfMemory))
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, l)
	var ce *cuda.Error
	if !errors.Is(err, cuda.ErrOutOfMemory) || !errors.As(err, &ce) || ce.Op != "cuMemcpyBatchAsync_v2" || rep.Blocks != 0 {
		t.Errorf("failing batch: %+v, %v", rep, err)
	}

	must(t, e.fd.FailOn("cuMemcpyHtoDAsync_v2", 5, cudadrv.ErrorOutOfMemory))
	rep, err = e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockStrategy(cuda.BlockPerCopy))
	if !errors.Is(err, cuda.ErrOutOfMemory) || rep.Blocks != 4 || rep.Bytes != int64(4*e.bs) {
		t.Errorf("per-copy failing at the fifth block: %+v, %v; want 4 queued", rep, err)
	}

	// A fault the batch's copies meet when they run, reported by Synchronize.
	if err := e.s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	must(t, e.fd.FailAsync("cuMemcpyBatchAsync_v2", 1, cudadrv.ErrorIllegalAddress))
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, l); err != nil {
		t.Fatalf("queuing a batch that faults later: %v", err)
	}
	if err := e.s.Synchronize(context.Background()); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Errorf("Synchronize after an asynchronous fault = %v, want ErrLaunchFailed", err)
	}
}

// TestFakeCopyBlocksNoBatchDriver: on a driver older than 12.8 an explicit
// driver batch is ErrNotSupported, and nothing is queued.
func TestFakeCopyBlocksNoBatchDriver(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{DriverVersion: 12040}, 4096, 4)
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockStrategy(cuda.BlockDriverBatch))
	if !errors.Is(err, cuda.ErrNotSupported) || rep.Blocks != 0 {
		t.Errorf("driver batch on 12.4: %+v, %v; want ErrNotSupported", rep, err)
	}
}

// TestFakeCopyBlocksOneCompletion: the copies are queued, not run, while
// the stream is held; the event of WithBlockEvent completes only when all
// of them have run.
func TestFakeCopyBlocksOneCompletion(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 32)
	ev, err := e.ctx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	for _, strategy := range []cuda.BlockStrategy{cuda.BlockDriverBatch, cuda.BlockPerCopy} {
		if err := e.dev.Memset(0); err != nil {
			t.Fatal(err)
		}
		must(t, e.fd.HoldStream(cudadrv.Stream(e.s.Handle())))
		if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockStrategy(strategy), cuda.WithBlockEvent(ev)); err != nil {
			t.Fatal(err)
		}
		if done, err := ev.Query(); err != nil || done {
			t.Fatalf("%v: event done=%v (%v) while the stream is held", strategy, done, err)
		}
		got := make([]byte, e.bs)
		if _, err := e.dev.ReadAt(got, int64(e.devOf[0]*e.bs)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, e.bs)) {
			t.Fatalf("%v: a block landed while the stream was held", strategy)
		}
		must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s.Handle())))
		if err := ev.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.checkDevice(t, e.src.Bytes())
	}
}

// TestFakeCopyBlocksPinnedQueries: blocks carved from one pinned buffer
// cost a bounded number of pointer queries, not a few per block.
func TestFakeCopyBlocksPinnedQueries(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 256)
	before := e.fd.Calls("cuPointerGetAttribute")
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes())); err != nil {
		t.Fatal(err)
	}
	if n := e.fd.Calls("cuPointerGetAttribute") - before; n > 3 {
		t.Errorf("%d pointer queries for 256 blocks of one pinned buffer, want at most 3", n)
	}
}

// mappedBlockEnv is newBlockEnv with Mapped host buffers, for the kernel strategy.
func mappedBlockEnv(t *testing.T, bs, nblk int) *blockEnv {
	t.Helper()
	e := newBlockEnv(t, fakedrv.Options{}, bs, nblk)
	for _, p := range []**pinmem.Buffer{&e.src, &e.dst} {
		b, err := pinmem.Alloc(bs*nblk, pinmem.Mapped)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		copy(b.Bytes(), (*p).Bytes())
		*p = b
	}
	return e
}

// TestFakeCopyBlocksKernel: the kernel strategy moves every block both
// ways with one table upload and one launch per list, including blocks
// whose size or addresses are not multiples of 16 (the byte path).
func TestFakeCopyBlocksKernel(t *testing.T) {
	e := mappedBlockEnv(t, 4096, 64)
	k, err := e.ctx.NewBlockKernel(e.nblk)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	launches := e.fd.Calls("cuLaunchKernel")
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockKernel(k))
	if err != nil || rep.Strategy != cuda.BlockKernelCopy || rep.Blocks != e.nblk || rep.Calls != 1 {
		t.Fatalf("kernel HtoD: %+v, %v", rep, err)
	}
	testutil.Poison(e.dst.Bytes())
	rep, err = e.s.CopyBlocks(cuda.DeviceToHost, e.list(e.dst.Bytes()), cuda.WithBlockKernel(k), cuda.WithBlockStrategy(cuda.BlockKernelCopy))
	if err != nil || rep.Calls != 1 || rep.Blocks != e.nblk {
		t.Fatalf("kernel DtoH: %+v, %v", rep, err)
	}
	must(t, e.s.Synchronize(context.Background()))
	e.checkDevice(t, e.src.Bytes())
	testutil.CheckBytes(t, e.src.Bytes(), e.dst.Bytes())
	if n := e.fd.Calls("cuLaunchKernel") - launches; n != 2 {
		t.Errorf("%d launches for two lists, want 2", n)
	}
	if n := e.copyCalls(); n != 0 {
		t.Errorf("%d driver copies beside the kernel (the table is read in place)", n)
	}

	// Odd sizes and offsets: 13-byte blocks at odd places.
	src := e.src.Bytes()
	odd := []cuda.BlockCopy{{Host: src[1:14], Dev: e.dev, Off: 3}, {Host: src[100:113], Dev: e.dev, Off: 1000}}
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, odd, cuda.WithBlockKernel(k)); err != nil {
		t.Fatal(err)
	}
	must(t, e.s.Synchronize(context.Background()))
	got := make([]byte, 13)
	must(t, errOf(e.dev.ReadAt(got, 1000)))
	testutil.CheckBytes(t, src[100:113], got)
}

// TestFakeCopyBlocksKernelRefused: the kernel strategy's own refusals,
// before anything is queued.
func TestFakeCopyBlocksKernelRefused(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{DeviceCount: 2}, 4096, 8) // flags-0 buffers: not mapped on the fake
	k, err := e.ctx.NewBlockKernel(4)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	before := e.copyCalls() + e.fd.Calls("cuLaunchKernel")
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes())[:4], cuda.WithBlockKernel(k)); !errors.Is(err, cuda.ErrHostNotMapped) || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("unmapped host blocks: %v, want ErrHostNotMapped", err)
	}
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockStrategy(cuda.BlockKernelCopy)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("kernel strategy without a kernel: %v", err)
	}
	other, err := cuda.GetDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	octx, err := other.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	ok2, err := octx.NewBlockKernel(4)
	if err != nil {
		t.Fatal(err)
	}
	defer ok2.Close()
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockKernel(ok2)); !errors.Is(err, cuda.ErrBlockContext) {
		t.Errorf("kernel of another context: %v", err)
	}
	if n := e.copyCalls() + e.fd.Calls("cuLaunchKernel") - before; n != 0 {
		t.Errorf("%d driver copies or launches after refusals", n)
	}
	// Mapped, but more blocks than the kernel's table holds.
	m, err := pinmem.Alloc(8*4096, pinmem.Mapped)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(m.Bytes()), cuda.WithBlockKernel(k)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("8 blocks for a kernel of 4: %v", err)
	}
	if _, err := cuda.WrapStream(e.ctx, 0).CopyBlocks(cuda.HostToDevice, nil, cuda.WithBlockKernel(nil), cuda.WithBlockStrategy(cuda.BlockKernelCopy)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("nil kernel: %v", err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(m.Bytes())[:2], cuda.WithBlockKernel(k)); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("closed kernel: %v", err)
	}
	if _, err := e.ctx.NewBlockKernel(0); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("NewBlockKernel(0): %v", err)
	}
}

// TestFakeCopyBlocksKernelTableReuse: the kernel's two tables are used
// in turn; the third list, which reuses the first list's table, waits
// for the first list's kernel (held back on its stream) before it
// rewrites the table, so every list copies its own blocks.
func TestFakeCopyBlocksKernelTableReuse(t *testing.T) {
	e := mappedBlockEnv(t, 4096, 24)
	s2, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Destroy()
	k, err := e.ctx.NewBlockKernel(8)
	if err != nil {
		t.Fatal(err)
	}
	h := e.src.Bytes()
	l := e.list(h)
	must(t, e.fd.HoldStream(cudadrv.Stream(e.s.Handle())))
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[:8], cuda.WithBlockKernel(k)); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.CopyBlocks(cuda.HostToDevice, l[8:16], cuda.WithBlockKernel(k)); err != nil {
		t.Fatal(err)
	}
	var released atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		released.Store(true)
		if err := e.fd.ReleaseStream(cudadrv.Stream(e.s.Handle())); err != nil {
			t.Error(err)
		}
	}()
	if _, err := s2.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k)); err != nil {
		t.Fatal(err)
	}
	if !released.Load() {
		t.Errorf("the third list rewrote the first list's table while its kernel was held")
	}
	must(t, s2.Synchronize(context.Background()))
	must(t, e.s.Synchronize(context.Background()))
	e.checkDevice(t, h)
	// Close waits for the last launches.
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeCopyBlocksKernelFaults: a failing upload or launch is typed and
// reports nothing queued.
func TestFakeCopyBlocksKernelFaults(t *testing.T) {
	e := mappedBlockEnv(t, 4096, 8)
	k, err := e.ctx.NewBlockKernel(8)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, c := range []struct {
		op     string
		nth    int
		blocks int // queued anyway
	}{
		{"cuLaunchKernel", 1, 0},
		{"cuEventRecord", 1, 8},
		// The pointer queries: range start, range size, memory type,
		// device pointer. The third decides: its failure is the error.
		{"cuPointerGetAttribute", 3, 0},
		{"cuPointerGetAttribute", 4, 0},
	} {
		must(t, e.fd.FailOn(c.op, c.nth, cudadrv.ErrorOutOfMemory))
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockKernel(k))
		var ce *cuda.Error
		if !errors.Is(err, cuda.ErrOutOfMemory) || !errors.As(err, &ce) || ce.Op != c.op || rep.Blocks != c.blocks {
			t.Errorf("%s failing (call %d): %+v, %v; want %d blocks queued", c.op, c.nth, rep, err, c.blocks)
		}
		e.fd.ClearFaults()
	}
	// A failing range query only costs more queries: the list still goes.
	must(t, e.fd.FailOn("cuPointerGetAttribute", 1, cudadrv.ErrorNotSupported))
	if rep, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockKernel(k)); err != nil || rep.Blocks != 8 {
		t.Errorf("with a failing range query: %+v, %v", rep, err)
	}
	e.fd.ClearFaults()
	must(t, e.s.Synchronize(context.Background()))
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockKernel(k)); err != nil {
		t.Fatalf("after the faults: %v", err)
	}
	must(t, e.s.Synchronize(context.Background()))
	e.checkDevice(t, e.src.Bytes())
}

// TestFakeCopyBlocksKernelStaging: with the kernel, pageable blocks go
// through a staging buffer that must itself be mapped.
func TestFakeCopyBlocksKernelStaging(t *testing.T) {
	e := mappedBlockEnv(t, 4096, 8)
	k, err := e.ctx.NewBlockKernel(8)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	pageable := testutil.RandomBytes(4*e.bs, 7)
	var l []cuda.BlockCopy
	for i := range 4 {
		l = append(l, cuda.BlockCopy{Host: pageable[i*e.bs : (i+1)*e.bs], Dev: e.dev, Off: (7 - i) * e.bs})
	}
	unmapped, err := pinmem.Alloc(4*e.bs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapped.Free()
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockKernel(k), cuda.WithBlockStaging(unmapped.Bytes())); !errors.Is(err, cuda.ErrHostNotMapped) {
		t.Errorf("unmapped staging with the kernel: %v, want ErrHostNotMapped", err)
	}
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockKernel(k), cuda.WithBlockStaging(e.dst.Bytes()))
	if err != nil || rep.Staged != 4 || rep.Strategy != cuda.BlockKernelCopy {
		t.Fatalf("mapped staging with the kernel: %+v, %v", rep, err)
	}
	must(t, e.s.Synchronize(context.Background()))
	for i := range 4 {
		got := make([]byte, e.bs)
		must(t, errOf(e.dev.ReadAt(got, int64((7-i)*e.bs))))
		testutil.CheckBytes(t, pageable[i*e.bs:(i+1)*e.bs], got)
	}
	out := make([]byte, 4*e.bs)
	for i := range l {
		l[i].Host = out[i*e.bs : (i+1)*e.bs]
	}
	if _, err := e.s.CopyBlocks(cuda.DeviceToHost, l, cuda.WithBlockKernel(k), cuda.WithBlockStaging(e.dst.Bytes())); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, pageable, out)
}

// TestFakeCopyBlocksNilOption: a nil option is refused before anything is
// queued, as every other options list in pinmem refuses one.
func TestFakeCopyBlocksNilOption(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 8)
	before := e.copyCalls()
	_, err := e.s.CopyBlocks(cuda.HostToDevice, e.list(e.src.Bytes()), cuda.WithBlockBatchMax(1<<20), nil)
	if !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("nil option: %v, want ErrInvalidValue", err)
	}
	if n := e.copyCalls() - before; n != 0 {
		t.Fatalf("%d copy calls after a refused list, want 0", n)
	}
}
