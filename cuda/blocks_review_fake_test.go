package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/testutil"
)

// Regression tests of four defects of CopyBlocks found in review: the
// staging buffer given back while DMA into it was queued, host blocks
// checked for pinning at their ends only, a staging buffer overlapping the
// list's blocks, and a kernel table reused while a kernel whose completion
// could not be fenced may still read it.

// releaseLater releases the held stream s after a pause, from another
// goroutine, and returns a flag set just before the release and a function
// that waits for the goroutine (call it before the test ends).
func releaseLater(t *testing.T, fd *fakedrv.Driver, s *cuda.Stream) (*atomic.Bool, func()) {
	t.Helper()
	var released atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond)
		released.Store(true)
		if err := fd.ReleaseStream(cudadrv.Stream(s.Handle())); err != nil {
			t.Error(err)
		}
	}()
	return &released, func() { <-done }
}

// TestFakeCopyBlocksStagedDtoHFailureWaits: when a DeviceToHost list with
// staged blocks fails after some copies into the staging buffer were
// queued, CopyBlocks waits for them before it returns (the caller may
// reuse or free the staging buffer as soon as it has returned), and the
// staged blocks that were queued are copied out, as BlockReport says.
func TestFakeCopyBlocksStagedDtoHFailureWaits(t *testing.T) {
	for _, c := range []struct {
		name     string
		strategy cuda.BlockStrategy
		op       string
		nth      int
		event    bool
		queued   int // blocks queued before the failure
	}{
		{"per-copy fails at the third block", cuda.BlockPerCopy, "cuMemcpyDtoHAsync_v2", 3, false, 2},
		{"the event's record fails after the batch", cuda.BlockDriverBatch, "cuEventRecord", 1, true, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newBlockEnv(t, fakedrv.Options{}, 4096, 8)
			bs := e.bs
			must(t, errOf(e.dev.WriteAt(e.src.Bytes(), 0)))
			staging, err := pinmem.Alloc(4*bs, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer staging.Free()
			out := make([]byte, 4*bs) // pageable: staged
			testutil.Poison(out)
			var l []cuda.BlockCopy
			for i := range 4 {
				l = append(l, cuda.BlockCopy{Host: out[i*bs : (i+1)*bs], Dev: e.dev, Off: (3 - i) * bs})
			}
			opts := []cuda.BlockOption{cuda.WithBlockStrategy(c.strategy), cuda.WithBlockStaging(staging.Bytes())}
			if c.event {
				ev, err := e.ctx.NewEvent(cuda.EventDisableTiming)
				if err != nil {
					t.Fatal(err)
				}
				defer ev.Destroy()
				opts = append(opts, cuda.WithBlockEvent(ev))
			}
			must(t, e.fd.HoldStream(cudadrv.Stream(e.s.Handle())))
			must(t, e.fd.FailOn(c.op, c.nth, cudadrv.ErrorOutOfMemory))
			released, wait := releaseLater(t, e.fd, e.s)
			rep, err := e.s.CopyBlocks(cuda.DeviceToHost, l, opts...)
			returned := released.Load()
			pending := e.fd.Pending(cudadrv.Stream(e.s.Handle()))
			wait()
			if !errors.Is(err, cuda.ErrOutOfMemory) {
				t.Fatalf("CopyBlocks = %+v, %v; want the injected ErrOutOfMemory", rep, err)
			}
			if !returned || pending != 0 {
				t.Fatalf("CopyBlocks returned with %d operations still queued on the stream, DMA into the staging buffer among them", pending)
			}
			if rep.Blocks != c.queued || rep.Staged != 4 {
				t.Fatalf("report %+v, want %d blocks queued, 4 staged", rep, c.queued)
			}
			poison := bytes.Repeat([]byte{testutil.PoisonByte}, bs)
			for i := range 4 {
				want := poison
				if i < c.queued {
					want = e.src.Bytes()[(3-i)*bs : (4-i)*bs]
				}
				testutil.CheckBytes(t, want, out[i*bs:(i+1)*bs])
			}
		})
	}
}

// TestFakeCopyBlocksStagedDtoHSyncFails: when the wait for the copies into
// the staging buffer fails itself, the error says that the staging buffer
// may still be written (ErrStagingInUse) beside the driver's error, so that
// the caller does not reuse or free it until a later wait succeeds.
func TestFakeCopyBlocksStagedDtoHSyncFails(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 8)
	bs := e.bs
	staging, err := pinmem.Alloc(4*bs, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer staging.Free()
	out := make([]byte, 4*bs)
	var l []cuda.BlockCopy
	for i := range 4 {
		l = append(l, cuda.BlockCopy{Host: out[i*bs : (i+1)*bs], Dev: e.dev, Off: i * bs})
	}
	for _, c := range []struct {
		name string
		fail func()
	}{
		{"after the list was queued", func() {}},
		{"after the per-copy strategy failed part way", func() {
			must(t, e.fd.FailOn("cuMemcpyDtoHAsync_v2", 2, cudadrv.ErrorOutOfMemory))
		}},
	} {
		c.fail()
		must(t, e.fd.FailOn("cuStreamSynchronize", 1, cudadrv.ErrorLaunchFailed))
		_, err := e.s.CopyBlocks(cuda.DeviceToHost, l, cuda.WithBlockStrategy(cuda.BlockPerCopy), cuda.WithBlockStaging(staging.Bytes()))
		if !errors.Is(err, cuda.ErrStagingInUse) || !errors.Is(err, cuda.ErrLaunchFailed) {
			t.Errorf("%s: %v; want ErrStagingInUse and the driver's ErrLaunchFailed", c.name, err)
		}
		e.fd.ClearFaults()
		must(t, e.s.Synchronize(context.Background())) // the later wait that frees the staging buffer for reuse
	}
}

// pages returns n page-aligned pages of a Go slice.
func pages(n int) []byte {
	page := os.Getpagesize()
	mem := make([]byte, (n+1)*page)
	base := (page - int(hostptr.AddrOf(mem)%uintptr(page))) % page
	return mem[base : base+n*page]
}

// registerPages registers mem (page-aligned) for the test's length.
func registerPages(t *testing.T, mem []byte, flags pinmem.Flags) {
	t.Helper()
	b, err := pinmem.Register(mem, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
}

// TestFakeCopyBlocksHostGap: a host block whose two ends lie in two pinned
// registrations with a pageable page between them is not pinned memory
// all through: it is refused with ErrHostNotPinned before anything is
// queued (also when the driver reports no pinned ranges and the check
// falls back to asking page by page), and staged when a staging buffer is
// given.
func TestFakeCopyBlocksHostGap(t *testing.T) {
	e := mappedBlockEnv(t, 4096, 8)
	page := os.Getpagesize()
	mem := pages(3)
	registerPages(t, mem[:page], pinmem.Mapped)
	registerPages(t, mem[2*page:], pinmem.Mapped) // page 1 stays pageable
	copy(mem, testutil.RandomBytes(len(mem), 5))
	gap := mem[page/2 : 2*page+page/2]
	k, err := e.ctx.NewBlockKernel(8)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	list := []cuda.BlockCopy{
		{Host: e.src.Bytes()[:4096], Dev: e.dev, Off: 0},
		{Host: gap, Dev: e.dev, Off: 4096},
	}
	for _, dir := range []cuda.Direction{cuda.HostToDevice, cuda.DeviceToHost} {
		for _, opts := range [][]cuda.BlockOption{
			{cuda.WithBlockStrategy(cuda.BlockDriverBatch)},
			{cuda.WithBlockStrategy(cuda.BlockPerCopy)},
			{cuda.WithBlockKernel(k)},
		} {
			for _, noRange := range []bool{false, true} {
				if noRange {
					// The first pointer query of the list, the range of its
					// first block, fails: the check stops asking for ranges.
					must(t, e.fd.FailOn("cuPointerGetAttribute", 1, cudadrv.ErrorNotSupported))
				}
				before := e.copyCalls() + e.fd.Calls("cuLaunchKernel")
				hostBefore := bytes.Clone(mem)
				_, err := e.s.CopyBlocks(dir, list, opts...)
				e.fd.ClearFaults()
				var be *cuda.BlockError
				if !errors.Is(err, cuda.ErrHostNotPinned) || !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &be) || be.Index != 1 {
					t.Fatalf("%v, no range %v: a block over a pageable gap: %v, want ErrHostNotPinned for block 1", dir, noRange, err)
				}
				if n := e.copyCalls() + e.fd.Calls("cuLaunchKernel") - before; n != 0 {
					t.Fatalf("%v: %d copies or launches after the refusal", dir, n)
				}
				testutil.CheckBytes(t, hostBefore, mem)
			}
		}
	}
	// Staged, the block goes through the staging buffer.
	staging, err := pinmem.Alloc(2*page, pinmem.Mapped)
	if err != nil {
		t.Fatal(err)
	}
	defer staging.Free()
	want := bytes.Clone(gap)
	for _, opts := range [][]cuda.BlockOption{
		{cuda.WithBlockStrategy(cuda.BlockDriverBatch)},
		{cuda.WithBlockStrategy(cuda.BlockPerCopy)},
		{cuda.WithBlockKernel(k)},
	} {
		opts = append(opts, cuda.WithBlockStaging(staging.Bytes()))
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, list[1:], opts...)
		if err != nil || rep.Staged != 1 {
			t.Fatalf("staged HtoD over a gap: %+v, %v", rep, err)
		}
		must(t, e.s.Synchronize(context.Background()))
		testutil.Poison(gap)
		rep, err = e.s.CopyBlocks(cuda.DeviceToHost, list[1:], opts...)
		if err != nil || rep.Staged != 1 {
			t.Fatalf("staged DtoH over a gap: %+v, %v", rep, err)
		}
		must(t, e.s.Synchronize(context.Background()))
		testutil.CheckBytes(t, want, gap)
	}
}

// TestFakeCopyBlocksAcrossRegistrations: blocks of a buffer pinned as
// several adjacent registrations (pinmem registers a buffer in chunks)
// that cross from one registration into the next are copied correctly by
// every strategy: the copy engines' strategies split such a block at the
// boundary (one driver copy must not span two registrations; the driver
// refuses it), and the kernel, which reaches host memory through device
// addresses, takes it whole where the registrations map to one device
// range, so that a kernel of the list's size still serves the list.
func TestFakeCopyBlocksAcrossRegistrations(t *testing.T) {
	const chunk = 64 << 10
	t.Cleanup(testhook.SetRegChunk(chunk))
	const bs, nblk = 48 << 10, 16 // 48 KiB blocks: many cross a 64 KiB boundary
	e := newBlockEnv(t, fakedrv.Options{}, bs, nblk)
	for _, p := range []**pinmem.Buffer{&e.src, &e.dst} {
		b, err := pinmem.Alloc(bs*nblk, pinmem.Mapped, pinmem.WithMethod(pinmem.MethodMmapRegister))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		if n := len(b.Segments()); n < 3 {
			t.Fatalf("%d registrations, want several", n)
		}
		copy(b.Bytes(), (*p).Bytes())
		*p = b
	}
	// The registration boundaries inside blocks: one extra driver copy each.
	base := hostptr.AddrOf(e.src.Bytes())
	var bounds []int // offsets in the buffer where a registration starts
	for _, s := range e.src.Segments()[1:] {
		bounds = append(bounds, int(hostptr.AddrOf(s)-base))
	}
	crossings := func(b cuda.BlockCopy) int {
		lo, n := int(hostptr.AddrOf(b.Host)-base), 0
		for _, o := range bounds {
			if o > lo && o < lo+len(b.Host) {
				n++
			}
		}
		return n
	}
	cuts := 0
	for _, b := range e.list(e.src.Bytes()) {
		cuts += crossings(b)
	}
	if cuts == 0 {
		t.Fatal("no block crosses a registration boundary: the test could not fail")
	}
	k, err := e.ctx.NewBlockKernel(nblk)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, c := range []struct {
		opts  []cuda.BlockOption
		want  cuda.BlockStrategy
		calls int
	}{
		{[]cuda.BlockOption{cuda.WithBlockStrategy(cuda.BlockDriverBatch)}, cuda.BlockDriverBatch, 1},
		{[]cuda.BlockOption{cuda.WithBlockStrategy(cuda.BlockPerCopy)}, cuda.BlockPerCopy, nblk + cuts},
		{nil, cuda.BlockDriverBatch, 1},
		{[]cuda.BlockOption{cuda.WithBlockKernel(k)}, cuda.BlockKernelCopy, 1},
	} {
		must(t, e.dev.Memset(0))
		testutil.Poison(e.dst.Bytes())
		for _, dir := range []cuda.Direction{cuda.HostToDevice, cuda.DeviceToHost} {
			h := e.src.Bytes()
			if dir == cuda.DeviceToHost {
				h = e.dst.Bytes()
			}
			rep, err := e.s.CopyBlocks(dir, e.list(h), c.opts...)
			if err != nil {
				t.Fatalf("%v %v: %v", c.want, dir, err)
			}
			if rep.Strategy != c.want || rep.Blocks != nblk || rep.Bytes != int64(bs*nblk) || rep.Calls != c.calls {
				t.Fatalf("%v %v: report %+v, want %d blocks in %d calls", c.want, dir, rep, nblk, c.calls)
			}
			must(t, e.s.Synchronize(context.Background()))
		}
		e.checkDevice(t, e.src.Bytes())
		testutil.CheckBytes(t, e.src.Bytes(), e.dst.Bytes())
	}
	// The per-copy strategy failing at the second part of a split block:
	// that block is not counted as queued, the ones before it are.
	var whole, split []cuda.BlockCopy
	for _, b := range e.list(e.src.Bytes()) {
		if crossings(b) == 0 {
			whole = append(whole, b)
		} else {
			split = append(split, b)
		}
	}
	l := []cuda.BlockCopy{whole[0], whole[1], split[0]}
	must(t, e.fd.FailOn("cuMemcpyHtoDAsync_v2", 4, cudadrv.ErrorOutOfMemory))
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockStrategy(cuda.BlockPerCopy))
	if !errors.Is(err, cuda.ErrOutOfMemory) || rep.Blocks != 2 || rep.Bytes != int64(2*bs) || rep.Calls != 4 {
		t.Fatalf("per-copy failing at the split block's second part: %+v, %v; want 2 blocks queued, 4 calls", rep, err)
	}
	must(t, e.s.Synchronize(context.Background()))
}

// TestFakeCopyBlocksStagingOverlap: a staging buffer that overlaps a host
// block of the list (a block staged through it would overwrite the
// block's bytes, or DMA into it would land in the block) is refused with
// ErrStagingOverlap before anything is written or queued.
func TestFakeCopyBlocksStagingOverlap(t *testing.T) {
	e := newBlockEnv(t, fakedrv.Options{}, 4096, 8)
	bs := e.bs
	h := e.src.Bytes()
	pageable := testutil.RandomBytes(2*bs, 11)
	list := []cuda.BlockCopy{
		{Host: pageable[:bs], Dev: e.dev, Off: 0},
		{Host: h[bs : 2*bs], Dev: e.dev, Off: bs},
		{Host: pageable[bs:], Dev: e.dev, Off: 2 * bs},
	}
	for _, c := range []struct {
		name    string
		dir     cuda.Direction
		staging []byte
	}{
		{"HtoD, the stage over a pinned source", cuda.HostToDevice, h[:2*bs]},
		{"HtoD, the stage ends inside a pinned source", cuda.HostToDevice, h[bs/2 : bs/2+2*bs]},
		{"DtoH, the stage over a pinned destination", cuda.DeviceToHost, h[bs/2 : bs/2+2*bs]},
	} {
		before := e.copyCalls()
		hostBefore, pageBefore := bytes.Clone(h), bytes.Clone(pageable)
		for _, strategy := range []cuda.BlockStrategy{cuda.BlockDriverBatch, cuda.BlockPerCopy} {
			_, err := e.s.CopyBlocks(c.dir, list, cuda.WithBlockStaging(c.staging), cuda.WithBlockStrategy(strategy))
			var be *cuda.BlockError
			if !errors.Is(err, cuda.ErrStagingOverlap) || !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &be) || be.Index != 1 {
				t.Errorf("%s, %v: %v; want ErrStagingOverlap naming block 1", c.name, strategy, err)
			}
		}
		if n := e.copyCalls() - before; n != 0 {
			t.Errorf("%s: %d copy calls after the refusal", c.name, n)
		}
		testutil.CheckBytes(t, hostBefore, h)
		testutil.CheckBytes(t, pageBefore, pageable)
	}
	// A stage that only touches a block (ends where it starts) is fine.
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, list, cuda.WithBlockStaging(h[2*bs:4*bs]))
	if err != nil || rep.Staged != 2 {
		t.Fatalf("a stage beside the blocks: %+v, %v", rep, err)
	}
	must(t, e.s.Synchronize(context.Background()))
	got := make([]byte, 3*bs)
	must(t, errOf(e.dev.ReadAt(got, 0)))
	testutil.CheckBytes(t, pageable[:bs], got[:bs])
	testutil.CheckBytes(t, h[bs:2*bs], got[bs:2*bs])
	testutil.CheckBytes(t, pageable[bs:], got[2*bs:])
}

// unfenced queues the first list of l on e.s (held) with k, with the
// record of the kernel's event and the stream wait that stands in for it
// both failing: the table the launch reads is then in use for as long as
// the stream is held, and nothing says when it is done.
func unfenced(t *testing.T, e *blockEnv, k *cuda.BlockKernel, l []cuda.BlockCopy) {
	t.Helper()
	must(t, e.fd.HoldStream(cudadrv.Stream(e.s.Handle())))
	must(t, e.fd.FailOn("cuEventRecord", 1, cudadrv.ErrorLaunchFailed))
	must(t, e.fd.FailOn("cuStreamSynchronize", 1, cudadrv.ErrorLaunchFailed))
	rep, err := e.s.CopyBlocks(cuda.HostToDevice, l, cuda.WithBlockKernel(k))
	if !errors.Is(err, cuda.ErrLaunchFailed) || rep.Blocks != len(l) {
		t.Fatalf("launch with its fence failing: %+v, %v; want ErrLaunchFailed with the launch queued", rep, err)
	}
	e.fd.ClearFaults()
}

// afterUnfencedList queues 24 blocks' list in three lists of 8 on a kernel
// of two tables: the first list's launch unfenced, the second on the other
// table; the third list, left to the caller, comes back to the first
// table. The kernel is closed at the end of the test.
func afterUnfencedList(t *testing.T) (*blockEnv, *cuda.BlockKernel, []byte, []cuda.BlockCopy) {
	t.Helper()
	e := mappedBlockEnv(t, 4096, 24)
	k, err := e.ctx.NewBlockKernel(8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	h := e.src.Bytes()
	l := e.list(h)
	unfenced(t, e, k, l[:8])
	if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[8:16], cuda.WithBlockKernel(k)); err != nil {
		t.Fatal(err) // the other table
	}
	return e, k, h, l
}

// TestFakeCopyBlocksKernelUnfencedTable: when neither the kernel's event
// nor a stream wait could fence a launch, its table is not rewritten (nor
// freed by Close) until a wait for the context's work succeeds: the list
// that comes back to that table waits for it, or fails when the wait
// fails, and every list copies its own blocks.
func TestFakeCopyBlocksKernelUnfencedTable(t *testing.T) {
	t.Run("reuse waits", func(t *testing.T) {
		e, k, h, l := afterUnfencedList(t)
		released, wait := releaseLater(t, e.fd, e.s)
		_, err := e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k)) // the first table again
		returned := released.Load()
		wait()
		if err != nil {
			t.Fatal(err)
		}
		if !returned {
			t.Fatal("the third list rewrote the first list's table while the first list's kernel was still queued")
		}
		must(t, e.s.Synchronize(context.Background()))
		e.checkDevice(t, h)
	})
	t.Run("reuse fails while the wait fails", func(t *testing.T) {
		e, k, h, l := afterUnfencedList(t)
		must(t, e.fd.FailOn("cuCtxSynchronize", 1, cudadrv.ErrorLaunchFailed))
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k))
		if !errors.Is(err, cuda.ErrLaunchFailed) || rep.Blocks != 0 {
			t.Fatalf("reusing the unfenced table while the wait fails: %+v, %v; want ErrLaunchFailed, nothing queued", rep, err)
		}
		must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s.Handle())))
		must(t, e.s.Synchronize(context.Background()))
		// The first list copied its own blocks: its table was left alone.
		got := make([]byte, e.bs)
		for _, b := range l[:16] {
			must(t, errOf(e.dev.ReadAt(got, int64(b.Off))))
			testutil.CheckBytes(t, b.Host, got)
		}
		// Now the wait succeeds and the table is used again.
		if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err)
		}
		must(t, e.s.Synchronize(context.Background()))
		e.checkDevice(t, h)
	})
	t.Run("Close keeps the table", func(t *testing.T) {
		e := mappedBlockEnv(t, 4096, 8)
		k, err := e.ctx.NewBlockKernel(8)
		if err != nil {
			t.Fatal(err)
		}
		h := e.src.Bytes()
		unfenced(t, e, k, e.list(h))
		allocs := e.fd.Live().HostAllocs
		must(t, e.fd.FailOn("cuCtxSynchronize", 1, cudadrv.ErrorLaunchFailed))
		if err := k.Close(); !errors.Is(err, cuda.ErrLaunchFailed) {
			t.Fatalf("Close with an unfenced launch whose wait fails: %v, want ErrLaunchFailed", err)
		}
		if n := e.fd.Live().HostAllocs; n != allocs {
			t.Fatalf("Close freed %d pinned allocations (the tables) a queued kernel may read", allocs-n)
		}
		released, wait := releaseLater(t, e.fd, e.s)
		err = k.Close()
		returned := released.Load()
		wait()
		if err != nil {
			t.Fatal(err)
		}
		if !returned {
			t.Fatal("Close freed the tables while a kernel reading one was still queued")
		}
		must(t, e.s.Synchronize(context.Background()))
		if errs := e.fd.AsyncErrors(); len(errs) != 0 {
			t.Fatalf("the queued kernel met errors: %v", errs)
		}
		e.checkDevice(t, h)
	})
}
