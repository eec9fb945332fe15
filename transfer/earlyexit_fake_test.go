package transfer

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// The tests of this file check the rules every early exit keeps (a
// deadline, a cancellation, a panicking callback, a failed enqueue): a
// caller's pageable memory is never touched after the call returns, a
// retry is never overwritten by an attempt that timed out, pinned memory
// is free again once Fence returns, and no wait outlives the caller's ctx.

// quickFake is a fake whose synchronizing calls give up on held work
// after 3 s, so that a wait with no bound shows as a slow failure, not a
// hang.
func quickFake(t *testing.T) fakeEnv {
	return useFake(t, fakedrv.Options{WaitTimeout: 3 * time.Second})
}

// hold keeps the work queued on s from running until the returned
// function is called (also at the end of the test).
func (e fakeEnv) hold(t *testing.T, s *cuda.Stream) (release func()) {
	t.Helper()
	h := cudadrv.Stream(0)
	if s != nil {
		h = cudadrv.Stream(s.Handle())
	}
	if err := e.d.HoldStream(h); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			if err := e.d.ReleaseStream(h); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(release)
	return release
}

// pause stops every stream until the returned function is called (also at
// the end of the test).
func (e fakeEnv) pause(t *testing.T) (resume func()) {
	e.d.Pause()
	done := false
	resume = func() {
		if !done {
			done = true
			e.d.Resume()
		}
	}
	t.Cleanup(resume)
	return resume
}

// closeCopier closes c, waiting up to 10 s for its copies in flight.
func closeCopier(t *testing.T, c *Copier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("Close: %v", err)
	}
}

// waitCalls waits until the fake has seen more than n calls of op.
func (e fakeEnv) waitCalls(t *testing.T, op string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.d.Calls(op) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("no call of %s", op)
		}
		runtime.Gosched()
	}
}

func pinnedBuf(t *testing.T, n int, f pinmem.Flags) *pinmem.Buffer {
	t.Helper()
	b, err := pinmem.Alloc(n, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// A DtoH that meets a busy engine and times out never writes its
// destination afterwards.
func TestEarlyExitDtoHNeverWritesAfterReturn(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t, WithDepth(1))
	busyDev, dev := e.devbuf(t, 4096), e.devbuf(t, 4096)
	resume := e.pause(t)
	// A transfer that waits for the held device keeps the engine's stage.
	busy := make(chan error, 1)
	go func() {
		_, err := c.DtoH(context.Background(), make([]byte, 4096), busyDev)
		busy <- err
	}()
	e.waitCalls(t, "cuMemcpyDtoHAsync_v2", 0)
	dst := make([]byte, 4096)
	testutil.Poison(dst)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := c.DtoH(ctx, dst, dev)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DtoH on a held device: %v, want a deadline error", err)
	}
	resume()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	closeCopier(t, c)
	for i, b := range dst {
		if b != testutil.PoisonByte {
			t.Fatalf("byte %d of the destination written after DtoH returned", i)
		}
	}
}

// A HtoD retried after a timeout is never overwritten by the attempt that
// timed out, also when no event could be recorded behind the attempt (its
// drain then watches its stream): the retry's lane is released first, and
// the retry still runs after the attempt's copy.
func TestEarlyExitRetryNotOverwritten(t *testing.T) {
	for _, noEvent := range []bool{false, true} {
		t.Run(map[bool]string{false: "event", true: "no-event"}[noEvent], func(t *testing.T) {
			e := quickFake(t)
			c := e.copier(t)
			const n = 128 << 10
			dev := e.devbuf(t, n)
			releaseDefault := e.hold(t, nil)
			streams := copierStreams(c)
			releaseFirst, releaseSecond := e.hold(t, streams[0]), e.hold(t, streams[1])
			old, fresh := testutil.RandomBytes(n, 1), testutil.RandomBytes(n, 2)
			// The one-stage HtoD records the lane's end event once before
			// it waits; the second record, behind the abandoned copy, fails.
			if noEvent {
				if err := e.d.FailOn("cuEventRecord", 2, cudadrv.ErrorLaunchFailed); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			_, err := c.HtoD(ctx, dev, old)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("HtoD on a held device: %v, want a deadline error", err)
			}
			e.d.ClearFaults()
			retry := make(chan error, 1)
			go func() {
				_, err := c.HtoD(context.Background(), dev, fresh)
				retry <- err
			}()
			releaseSecond()
			time.Sleep(50 * time.Millisecond)
			releaseFirst()
			if err := <-retry; err != nil {
				t.Fatalf("retry: %v", err)
			}
			releaseDefault()
			closeCopier(t, c)
			if !bytes.Equal(e.deviceBytes(t, dev), fresh) {
				t.Fatal("the device holds other bytes than the retry's: the attempt that timed out overwrote it")
			}
		})
	}
}

// After a DtoH into pinned memory times out, Fence says when the
// destination is no longer written.
func TestEarlyExitFencePinned(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t)
	const n = 64 << 10
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 3)
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	dst := pinnedBuf(t, n, 0)
	testutil.Poison(dst.Bytes())
	resume := e.pause(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := c.DtoH(ctx, dst.Bytes(), dev)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DtoH on a held device: %v, want a deadline error", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	err = c.Fence(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fence with the copy still queued: %v, want a deadline error", err)
	}
	resume()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Fence(ctx); err != nil {
		t.Fatalf("Fence after the device ran: %v", err)
	}
	testutil.CheckBytes(t, src, dst.Bytes())
}

// A Pipeline whose Done callback panics keeps the staging buffers of its
// chunks in flight until their copies ran: another Pipeline's output is
// never overwritten by them. The panic reaches Run's caller.
func TestEarlyExitPipelinePanicKeepsStages(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t, smallRing()...)
	const chunk = 64 << 10
	dev := e.devbuf(t, chunk)
	_ = dev
	work := func(s *cuda.Stream, ch Chunk) error { return s.Memset(ch.Dev, 0, 0xee, ch.Len) }
	p2 := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 1, InFlight: 2, PinStages: true})
	p1 := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: 2, Work: work,
		Done: func(ch Chunk) error { panic("done callback") }})
	release1 := e.hold(t, pipelineStreams(p1)[1])
	in1 := testutil.RandomBytes(2*chunk, 4)
	func() {
		defer func() {
			if r := recover(); r != "done callback" {
				t.Errorf("Run with a panicking Done callback: recovered %v, want the callback's panic", r)
			}
		}()
		_, err := p1.Run(context.Background(), in1, make([]byte, len(in1)))
		t.Errorf("Run with a panicking Done callback returned (%v)", err)
	}()
	in2 := testutil.RandomBytes(2*chunk, 5)
	out2 := make([]byte, len(in2))
	release2 := e.hold(t, pipelineStreams(p2)[0])
	run2 := make(chan error, 1)
	records := e.d.Calls("cuEventRecord")
	go func() {
		_, err := p2.Run(context.Background(), in2, out2)
		run2 <- err
	}()
	// Both chunks of the second Run are queued (an event behind each).
	e.waitCalls(t, "cuEventRecord", records+1)
	release1()
	release2()
	if err := <-run2; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out2, in2) {
		t.Fatal("the second Pipeline's output is not its input: the first one's chunk in flight wrote its stage")
	}
}

// After a Broadcast abandoned at its deadline, a Scatter to the same
// device memory runs after the Broadcast's copies.
func TestEarlyExitBroadcastThenScatter(t *testing.T) {
	e := useMultiFake(t, 1, 256<<10)
	m := e.multi(t, e.ctxs)
	dev := e.bufs[0]
	old, fresh := testutil.RandomBytes(dev.Size(), 6), testutil.RandomBytes(dev.Size(), 7)
	release := e.hold(t, multiStreams(m)[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_, err := m.Broadcast(ctx, []*cuda.DeviceBuffer{dev}, old)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Broadcast on a held stream: %v, want a deadline error", err)
	}
	scatter := make(chan error, 1)
	go func() {
		_, err := m.Scatter(context.Background(), []*cuda.DeviceBuffer{dev}, [][]byte{fresh})
		scatter <- err
	}()
	// Give the Scatter the chance to run ahead of the Broadcast's copies.
	select {
	case err := <-scatter:
		scatter <- err
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if err := <-scatter; err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(e.deviceBytes(t, dev), fresh) {
		t.Fatal("the device holds other bytes than the Scatter's: the abandoned Broadcast overwrote them")
	}
}

// A RunMapped waiting for a caller's held stream does not hold up the
// Copier's transfers.
func TestEarlyExitRunMappedDoesNotBlockLanes(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t)
	s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	b := pinnedBuf(t, 4096, pinmem.Mapped)
	releaseS := e.hold(t, s)
	mapped := make(chan error, 1)
	go func() {
		mapped <- c.RunMapped(context.Background(), s, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
			return s.Memset(cuda.WrapDevicePtr(s.Context(), p, n), 0, 1, n)
		})
	}()
	e.waitCalls(t, "cuEventRecord", 0)
	dev := e.devbuf(t, 4096)
	releaseLane := e.hold(t, copierStreams(c)[0])
	time.AfterFunc(50*time.Millisecond, func() { _ = e.d.ReleaseStream(cudadrv.Stream(copierStreams(c)[0].Handle())) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.HtoD(ctx, dev, testutil.RandomBytes(4096, 8)); err != nil {
		t.Errorf("HtoD while a RunMapped waits for the caller's stream: %v", err)
	}
	releaseLane()
	releaseS()
	if err := <-mapped; err != nil {
		t.Fatal(err)
	}
}

// With WithStream, a transfer's wait ends with its own copies, not with
// work the caller queued on the stream afterwards.
func TestEarlyExitWithStreamIgnoresLaterWork(t *testing.T) {
	e := quickFake(t)
	s, gate, ev := laterWork(t, e)
	c := e.copier(t, append(smallRing(), WithStream(s))...)
	const n = 192 << 10 // three pieces in the three stages: all queued before the first wait
	dev := e.devbuf(t, n)
	releaseS := e.hold(t, s)
	releaseGate := e.hold(t, gate)
	if err := ev.Record(gate); err != nil {
		t.Fatal(err)
	}
	queries := e.d.Calls("cuEventQuery")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.HtoD(ctx, dev, testutil.RandomBytes(n, 9))
		done <- err
	}()
	// Once the transfer waits, the caller queues work that cannot run yet.
	e.waitCalls(t, "cuEventQuery", queries)
	if err := s.WaitEvent(ev); err != nil {
		t.Fatal(err)
	}
	releaseS()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		releaseGate()
		t.Fatalf("HtoD still waiting 2 s after its copies ran (for the caller's later work): %v", <-done)
	}
	releaseGate()
}

// A failed enqueue in the middle of a transfer returns within ctx, even
// with the copies queued before it held.
func TestEarlyExitFailedEnqueueBounded(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t)
	const n = 1 << 20
	dev := e.devbuf(t, n)
	e.pause(t)
	if err := e.d.FailOn("cuMemcpyHtoDAsync_v2", 2, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	st, err := c.HtoD(ctx, dev, testutil.RandomBytes(n, 10))
	if err == nil {
		t.Fatal("HtoD with a failing enqueue succeeded")
	}
	t.Logf("%v %v %+v", time.Since(start), err, st)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("HtoD with a failing enqueue returned after %v with a 100 ms deadline (%v)", d, err)
	}
}

// A cancelled HtoDAsync is done only once its copy no longer reads the
// source; a cancelled DtoHAsync only once its destination is no longer
// written.
func TestEarlyExitCancelledOpDone(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t)
	const n = 64 << 10
	dev := e.devbuf(t, n)
	src := pinnedBuf(t, n, 0)
	want := testutil.RandomBytes(n, 11)
	copy(src.Bytes(), want)
	resume := e.pause(t)
	calls := e.d.Calls("cuMemcpyHtoDAsync_v2")
	op := c.HtoDAsync(context.Background(), dev, src.Bytes())
	e.waitCalls(t, "cuMemcpyHtoDAsync_v2", calls)
	op.Cancel()
	time.AfterFunc(50*time.Millisecond, resume)
	<-op.Done()
	testutil.Poison(src.Bytes()) // the caller reuses its memory once the Op is done
	closeCopier(t, c)
	if !bytes.Equal(e.deviceBytes(t, dev), want) {
		t.Fatal("the device got bytes written to the source after the cancelled Op was done")
	}
}

func TestEarlyExitCancelledDtoHOpDone(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t)
	const n = 64 << 10
	dev := e.devbuf(t, n)
	if err := dev.Memset(0x11); err != nil {
		t.Fatal(err)
	}
	dst := pinnedBuf(t, n, 0)
	resume := e.pause(t)
	calls := e.d.Calls("cuMemcpyDtoHAsync_v2")
	op := c.DtoHAsync(context.Background(), dst.Bytes(), dev)
	e.waitCalls(t, "cuMemcpyDtoHAsync_v2", calls)
	op.Cancel()
	time.AfterFunc(50*time.Millisecond, resume)
	<-op.Done()
	testutil.Poison(dst.Bytes())
	closeCopier(t, c)
	for i, b := range dst.Bytes() {
		if b != testutil.PoisonByte {
			t.Fatalf("byte %d of the destination written after the cancelled Op was done", i)
		}
	}
}

// panicReader returns n bytes, then panics.
type panicReader struct{ n int }

func (r *panicReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		panic("reader")
	}
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}

// panicWriter takes n bytes, then panics.
type panicWriter struct{ n int }

func (w *panicWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		panic("writer")
	}
	k := min(len(p), w.n)
	w.n -= k
	return k, nil
}

// A callback of the caller's that panics inside a call (HtoDFrom's
// reader, DtoHTo's writer, RunMapped's work) reaches the caller, and the
// Copier keeps its lane and stages: the copies queued before the panic go
// to the fence, and the next transfer of a one-lane Copier runs, every
// byte right, with nothing left at Close.
func TestEarlyExitCallbackPanicKeepsLane(t *testing.T) {
	const stage = 64 << 10
	for _, tc := range []struct {
		name string
		call func(c *Copier, dev *cuda.DeviceBuffer, b *pinmem.Buffer)
	}{
		{"HtoDFrom", func(c *Copier, dev *cuda.DeviceBuffer, _ *pinmem.Buffer) {
			_, _ = c.HtoDFrom(context.Background(), dev, &panicReader{n: 2 * stage})
		}},
		{"DtoHTo", func(c *Copier, dev *cuda.DeviceBuffer, _ *pinmem.Buffer) {
			_, _ = c.DtoHTo(context.Background(), &panicWriter{n: stage}, dev)
		}},
		{"RunMapped", func(c *Copier, _ *cuda.DeviceBuffer, b *pinmem.Buffer) {
			_ = c.RunMapped(context.Background(), nil, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
				if err := s.Memset(cuda.WrapDevicePtr(s.Context(), p, n), 0, 1, n); err != nil {
					return err
				}
				panic("work")
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := quickFake(t)
			s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Destroy()
			c := e.copier(t, append(smallRing(), WithStream(s))...)
			n := 8 * stage
			dev := e.devbuf(t, n)
			b := pinnedBuf(t, 4096, pinmem.Mapped)
			func() {
				defer func() {
					if r := recover(); r == nil {
						t.Fatal("the callback's panic did not reach the caller")
					}
				}()
				tc.call(c, dev, b)
			}()
			src := testutil.RandomBytes(n, 91)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := c.HtoD(ctx, dev, src); err != nil {
				t.Fatalf("HtoD after a panicking callback: %v", err)
			}
			testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
			closeCopier(t, c)
		})
	}
}

// panicReaderAt is an io.ReaderAt and io.Seeker whose ReadAt at offset 0
// takes a while and whose other ReadAt calls panic once it started; busy
// counts the calls in progress.
type panicReaderAt struct {
	busy    atomic.Int32
	started chan struct{}
}

func (r *panicReaderAt) ReadAt(p []byte, off int64) (int, error) {
	r.busy.Add(1)
	defer r.busy.Add(-1)
	if off != 0 {
		<-r.started
		panic("reader at")
	}
	close(r.started)
	time.Sleep(100 * time.Millisecond)
	return len(p), nil
}

func (r *panicReaderAt) Seek(int64, int) (int64, error) { return 0, nil }

func (r *panicReaderAt) Read(p []byte) (int, error) { return r.ReadAt(p, 0) }

// A ReadAt that panics on HtoDFrom's goroutine reaches the caller only
// once the other ReadAt calls into the stage returned: none reads into a
// stage the fence may already have given to another transfer.
func TestEarlyExitReaderAtPanicWaitsForReads(t *testing.T) {
	e := quickFake(t)
	c := e.copier(t, WithStageSize(2<<20), WithDepth(2), WithParallelism(2))
	dev := e.devbuf(t, 4<<20)
	r := &panicReaderAt{started: make(chan struct{})}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the ReadAt's panic did not reach the caller")
			}
		}()
		_, _ = c.HtoDFrom(context.Background(), dev, r)
	}()
	if n := r.busy.Load(); n != 0 {
		t.Errorf("%d ReadAt calls still read into a stage after HtoDFrom's panic reached the caller", n)
	}
	closeCopier(t, c)
}

// RunMapped on the lane of a Copier given WithStream (s nil) waits for
// its own kernels only, not for work the caller queued on the stream
// afterwards.
func TestEarlyExitRunMappedWithStreamIgnoresLaterWork(t *testing.T) {
	e := quickFake(t)
	s, gate, ev := laterWork(t, e)
	c := e.copier(t, WithStream(s))
	b := pinnedBuf(t, 4096, pinmem.Mapped)
	releaseS := e.hold(t, s)
	releaseGate := e.hold(t, gate)
	if err := ev.Record(gate); err != nil {
		t.Fatal(err)
	}
	queries := e.d.Calls("cuEventQuery")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- c.RunMapped(ctx, nil, b, func(s *cuda.Stream, p cuda.DevicePtr, n int) error {
			return s.Memset(cuda.WrapDevicePtr(s.Context(), p, n), 0, 1, n)
		})
	}()
	// Once RunMapped waits, the caller queues work that cannot run yet.
	e.waitCalls(t, "cuEventQuery", queries)
	if err := s.WaitEvent(ev); err != nil {
		t.Fatal(err)
	}
	releaseS()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		releaseGate()
		t.Fatalf("RunMapped still waiting 2 s after its kernels ran (for the caller's later work): %v", <-done)
	}
	releaseGate()
}

// laterWork makes what the WithStream tests need to queue the caller's
// later work: the caller's stream s, a stream gate to hold that work
// back, and an event ev between them, destroyed when t ends.
func laterWork(t *testing.T, e fakeEnv) (s, gate *cuda.Stream, ev *cuda.Event) {
	t.Helper()
	var err error
	for _, p := range []**cuda.Stream{&s, &gate} {
		if *p, err = e.ctx.NewStream(cuda.StreamNonBlocking); err != nil {
			t.Fatal(err)
		}
		st := *p
		t.Cleanup(func() { st.Destroy() })
	}
	if ev, err = e.ctx.NewEvent(cuda.EventDisableTiming); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Destroy() })
	return s, gate, ev
}
