package cuda_test

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
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
	must(t, e.s.Synchronize())
	got := make([]byte, 3*bs)
	must(t, e.dev.CopyToHost(0, got))
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

// TestFakeCopyBlocksKernelUnfencedTable: when neither the kernel's event
// nor a stream wait could fence a launch, its table is not rewritten (nor
// freed by Close) until a wait for the context's work succeeds: the list
// that comes back to that table waits for it, or fails when the wait
// fails, and every list copies its own blocks.
func TestFakeCopyBlocksKernelUnfencedTable(t *testing.T) {
	t.Run("reuse waits", func(t *testing.T) {
		e := mappedBlockEnv(t, 4096, 24)
		k, err := e.ctx.NewBlockKernel(8)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		h := e.src.Bytes()
		l := e.list(h)
		unfenced(t, e, k, l[:8])
		if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[8:16], cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err) // the other table
		}
		released, wait := releaseLater(t, e.fd, e.s)
		_, err = e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k)) // the first table again
		returned := released.Load()
		wait()
		if err != nil {
			t.Fatal(err)
		}
		if !returned {
			t.Fatal("the third list rewrote the first list's table while the first list's kernel was still queued")
		}
		must(t, e.s.Synchronize())
		e.checkDevice(t, h)
	})
	t.Run("reuse fails while the wait fails", func(t *testing.T) {
		e := mappedBlockEnv(t, 4096, 24)
		k, err := e.ctx.NewBlockKernel(8)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		h := e.src.Bytes()
		l := e.list(h)
		unfenced(t, e, k, l[:8])
		if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[8:16], cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err)
		}
		must(t, e.fd.FailOn("cuCtxSynchronize", 1, cudadrv.ErrorLaunchFailed))
		rep, err := e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k))
		if !errors.Is(err, cuda.ErrLaunchFailed) || rep.Blocks != 0 {
			t.Fatalf("reusing the unfenced table while the wait fails: %+v, %v; want ErrLaunchFailed, nothing queued", rep, err)
		}
		must(t, e.fd.ReleaseStream(cudadrv.Stream(e.s.Handle())))
		must(t, e.s.Synchronize())
		// The first list copied its own blocks: its table was left alone.
		got := make([]byte, e.bs)
		for _, b := range l[:16] {
			must(t, e.dev.CopyToHost(b.Off, got))
			testutil.CheckBytes(t, b.Host, got)
		}
		// Now the wait succeeds and the table is used again.
		if _, err := e.s.CopyBlocks(cuda.HostToDevice, l[16:], cuda.WithBlockKernel(k)); err != nil {
			t.Fatal(err)
		}
		must(t, e.s.Synchronize())
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
		must(t, e.s.Synchronize())
		if errs := e.fd.AsyncErrors(); len(errs) != 0 {
			t.Fatalf("the queued kernel met errors: %v", errs)
		}
		e.checkDevice(t, h)
	})
}
