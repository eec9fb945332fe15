package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// waitBlocked is d.WaitBlocked with a bound that only a broken test
// reaches.
func waitBlocked(t *testing.T, d *cudatest.Driver, s *cuda.Stream) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op, err := d.WaitBlocked(ctx, s)
	if err != nil {
		t.Fatalf("WaitBlocked: %v", err)
	}
	return op
}

// TestHoldStream: held work waits, queries say not ready, WaitBlocked
// sees a call blocked on it, and releasing runs it.
func TestHoldStream(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, buf := newStream(t, ctx, 0), deviceBuf(t, ctx, 16)
	if err := d.HoldStream(s); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(buf, 0, 3, 16); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Query(); done || err != nil {
		t.Errorf("Query of a held stream = %v, %v; want not done", done, err)
	}
	if n := d.Live().PendingOps; n != 1 {
		t.Errorf("PendingOps = %d, want 1", n)
	}
	if err := d.Leaks(); !errors.Is(err, cudatest.ErrLeak) || !strings.Contains(err.Error(), "queued operation") {
		t.Errorf("Leaks with held work: %v", err)
	}
	// A wait that can end polls the stream; WaitBlocked sees the query.
	pctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polled := make(chan error, 1)
	go func() { polled <- s.Synchronize(pctx) }()
	if op := waitBlocked(t, d, s); op != "cuStreamQuery" {
		t.Errorf("WaitBlocked during a Synchronize that polls = %q, want cuStreamQuery", op)
	}
	cancel()
	if err := <-polled; !errors.Is(err, context.Canceled) {
		t.Errorf("Synchronize of a held stream, its context cancelled: %v", err)
	}
	// A wait that cannot end waits in the driver.
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize(context.Background()) }()
	if op := waitBlocked(t, d, s); op != "cuStreamSynchronize" {
		t.Errorf("WaitBlocked during a Synchronize that cannot end = %q, want cuStreamSynchronize", op)
	}
	select {
	case err := <-synced:
		t.Fatalf("Synchronize of a held stream returned %v", err)
	default:
	}
	if err := d.ReleaseStream(s); err != nil {
		t.Fatal(err)
	}
	if err := <-synced; err != nil {
		t.Fatalf("Synchronize released by another goroutine: %v", err)
	}
	got := make([]byte, 16)
	if _, err := buf.ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{3}, 16)) {
		t.Errorf("after release: %v, %v", got, err)
	}
	if err := d.HoldStream(nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("HoldStream(nil) = %v", err)
	}
	if err := d.HoldStream(cuda.WrapStream(ctx, 0xdead0)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("HoldStream of an unknown stream = %v", err)
	}
	if _, err := d.WaitBlocked(context.Background(), cuda.WrapStream(ctx, 0xdead0)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("WaitBlocked on an unknown stream = %v", err)
	}
}

// TestWaitBlockedEnds: WaitBlocked returns ctx's error when nothing waits.
func TestWaitBlockedEnds(t *testing.T) {
	d := cudatest.Install(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if op, err := d.WaitBlocked(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitBlocked with nothing blocked and ctx cancelled = %q, %v; want context.Canceled", op, err)
	}
}

// TestWaitBlockedClosed: WaitBlocked on a closed Driver, or one closed
// while it waits, returns at once instead of waiting for ctx, and the
// other methods that act on the fake refuse a closed Driver instead of
// doing nothing.
func TestWaitBlockedClosed(t *testing.T) {
	d := cudatest.Install(t)
	s, err := primary(t).NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := d.WaitBlocked(context.Background(), nil)
		waiting <- err
	}()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("WaitBlocked while the Driver closes: %v, want an error matching ErrInvalidValue", err)
	}
	for name, err := range map[string]error{
		"WaitBlocked":    func() error { _, err := d.WaitBlocked(context.Background(), nil); return err }(),
		"FailOn":         d.FailOn(cudatest.AnyAlloc, cudatest.Once(), cuda.ResultOutOfMemory),
		"FailAsync":      d.FailAsync(cudatest.AnyHtoD, cudatest.Once(), cuda.ResultLaunchFailed),
		"RegisterKernel": d.RegisterKernel("k", 0, nil),
		"HoldStream":     d.HoldStream(s),
	} {
		if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s of a closed Driver: %v, want an error matching ErrInvalidValue", name, err)
		}
	}
}

// TestReleaseOrder: released work runs stream by stream in creation order,
// each stream's work in queue order.
func TestReleaseOrder(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	var order []string
	fn := kernelFunc(t, d, ctx, "mark", 1, func(k *cudatest.Kernel) error {
		order = append(order, string(rune('a'+k.Arg(0))))
		return nil
	})
	var streams []*cuda.Stream
	for range 3 {
		streams = append(streams, newStream(t, ctx, cuda.StreamNonBlocking))
	}
	d.HoldAll()
	// Queued newest stream first: the order of release is the streams'.
	for i := 2; i >= 0; i-- {
		for j := range 2 {
			if err := fn.Launch(streams[i], cuda.D1(1), cuda.D1(1), 0, uint64(2*i+j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.ReleaseAll()
	if got := strings.Join(order, ""); got != "abcdef" {
		t.Errorf("released work ran in the order %q, want %q (stream by stream in creation order)", got, "abcdef")
	}
}

// TestHoldPipelineStream: Streams names the streams a Pipeline made, one
// of them can be held alone, and the Run waits for it until released.
func TestHoldPipelineStream(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	c := newCopier(t, ctx)
	before := len(d.Streams())
	pl := newPipeline(t, c, transfer.WithChunkSize(32<<10), transfer.WithStreams(2))
	own := d.Streams()[before:]
	if len(own) != 2 {
		t.Fatalf("the Pipeline made %d streams, want 2", len(own))
	}
	if err := d.HoldStream(own[1]); err != nil {
		t.Fatal(err)
	}
	in := pattern(256<<10, 9)
	out := make([]byte, len(in))
	ran := make(chan error, 1)
	go func() {
		_, err := pl.Run(context.Background(), in, out)
		ran <- err
	}()
	waitBlocked(t, d, own[1])
	select {
	case err := <-ran:
		t.Fatalf("Run returned %v while one of its streams was held", err)
	default:
	}
	if err := d.ReleaseStream(own[1]); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run after the release: %v", err)
	}
	if !bytes.Equal(in, out) {
		t.Error("the Pipeline's round trip changed the bytes")
	}
}

// TestHoldAll: a Copier's transfer on a busy GPU waits until the work is
// released; on a hung one it gives up when its context ends.
func TestHoldAll(t *testing.T) {
	d := cudatest.Install(t, cudatest.WithWaitTimeout(0)) // wait as long as a GPU would
	ctx := primary(t)
	c := newCopier(t, ctx)
	dst, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	in := pattern(1<<20, 3)

	d.HoldAll()
	tr := c.HtoDAsync(context.Background(), dst, in)
	waitBlocked(t, d, nil)
	select {
	case <-tr.Done():
		t.Fatal("a transfer finished while the GPU was held")
	default:
	}
	d.ReleaseAll()
	if _, err := tr.Wait(context.Background()); err != nil {
		t.Fatalf("the transfer after ReleaseAll: %v", err)
	}
	out := make([]byte, len(in))
	if _, err := c.DtoH(context.Background(), out, dst); err != nil || !bytes.Equal(in, out) {
		t.Fatalf("round trip after the hold: %v", err)
	}

	d.HoldAll()
	tctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		if _, err := d.WaitBlocked(tctx, nil); err != nil {
			t.Errorf("WaitBlocked: %v", err)
		}
	}()
	if _, err := c.HtoD(tctx, dst, in); !errors.Is(err, context.Canceled) {
		t.Errorf("HtoD on a hung GPU, its context cancelled: %v, want context.Canceled", err)
	}
	d.ReleaseAll()
	if _, err := c.HtoD(context.Background(), dst, in); err != nil {
		t.Fatalf("HtoD once the GPU is released: %v", err)
	}
}

// TestWaitTimeout: a synchronizing call on held work fails with
// CUDA_ERROR_LAUNCH_TIMEOUT once the wait timeout has passed.
func TestWaitTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	d := cudatest.Install(t, cudatest.WithWaitTimeout(timeout))
	ctx := primary(t)
	s := newStream(t, ctx, 0)
	d.HoldAll()
	defer d.ReleaseAll()
	ev, err := ctx.NewEvent(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	if err := ev.Record(s); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Synchronize(context.Background())
	if !isCode(err, cuda.ResultLaunchTimeout) || time.Since(start) < timeout {
		t.Errorf("Synchronize of held work: %v after %v, want CUDA_ERROR_LAUNCH_TIMEOUT after at least %v", err, time.Since(start), timeout)
	}
}
