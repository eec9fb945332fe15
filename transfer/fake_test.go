package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// fakeEnv is a fake driver with a primary context.
type fakeEnv struct {
	d   *fakedrv.Driver
	ctx *cuda.Context
}

// useFake installs a fake driver and checks at the end of the test that
// nothing is left: no pinned memory, device memory, stream or event.
func useFake(t *testing.T, opts fakedrv.Options) fakeEnv {
	t.Helper()
	d := testutil.UseFake(t, opts)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	pinned0 := pinmem.Stats().Pinned
	t.Cleanup(func() {
		c := d.Live()
		if c.HostAllocs != 0 || c.Registrations != 0 || c.DeviceAllocs != 0 || c.Streams != 0 || c.Events != 0 || c.Modules != 0 {
			t.Errorf("fake driver objects left at the end: %+v", c)
		}
		if p := pinmem.Stats().Pinned; p != pinned0 {
			t.Errorf("pinmem ledger: %+v pinned at the end, %+v at the start", p, pinned0)
		}
	})
	return fakeEnv{d, ctx}
}

func (e fakeEnv) copier(t *testing.T, opts ...Option) *Copier {
	t.Helper()
	c, err := New(e.ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func (e fakeEnv) devbuf(t *testing.T, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := e.ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Errorf("freeing device buffer: %v", err)
		}
	})
	return b
}

// deviceBytes returns the fake device memory of b.
func (e fakeEnv) deviceBytes(t *testing.T, b *cuda.DeviceBuffer) []byte {
	t.Helper()
	m, err := e.d.DeviceBytes(cudadrv.DevicePtr(b.Ptr()), uint64(b.Size()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// smallRing is a ring of three 64 KiB stages that stages every pageable
// byte (thresholds 0), so that small test transfers exercise the ring.
func smallRing() []Option {
	return []Option{WithStageSize(64 << 10), WithDepth(3), WithParallelism(4)}
}

func TestFakeRoundTrip(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 1<<20+4096)
	for _, n := range []int{1, 7, 4095, 4096, 64<<10 - 1, 64 << 10, 64<<10 + 1, 3*64<<10 + 17, 1<<20 + 4096} {
		for _, off := range []int{0, 1, 13} {
			if off+n > dev.Size() {
				continue
			}
			src := testutil.RandomBytes(off+n, uint64(n*31+off))[off:]
			view, err := dev.Slice(0, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := dev.Memset(0x5a); err != nil {
				t.Fatal(err)
			}
			st, err := c.HtoD(context.Background(), view, src)
			if err != nil {
				t.Fatalf("HtoD %d bytes: %v", n, err)
			}
			if st.Bytes != int64(n) || st.StagedBytes != int64(n) || st.Direction != HostToDevice {
				t.Fatalf("HtoD %d bytes: stats %+v", n, st)
			}
			got := e.deviceBytes(t, dev)
			testutil.CheckBytes(t, src, got[:n])
			if n < dev.Size() && got[n] != 0x5a {
				t.Fatalf("HtoD %d bytes wrote past the end", n)
			}
			back := make([]byte, n+off+5)
			testutil.Poison(back)
			st, err = c.DtoH(context.Background(), back[off:off+n], view)
			if err != nil {
				t.Fatalf("DtoH %d bytes: %v", n, err)
			}
			if st.Bytes != int64(n) || st.Direction != DeviceToHost {
				t.Fatalf("DtoH stats %+v", st)
			}
			testutil.CheckBytes(t, src, back[off:off+n])
			for i, b := range append(back[:off:off], back[off+n:]...) {
				if b != testutil.PoisonByte {
					t.Fatalf("DtoH %d bytes at offset %d wrote outside its destination (byte %d)", n, off, i)
				}
			}
		}
	}
}

func TestFakeTooSmall(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 1000)
	_, err := c.HtoD(context.Background(), dev, make([]byte, 1001))
	var se *SizeError
	if !errors.As(err, &se) || !errors.Is(err, cuda.ErrInvalidValue) || se.Need != 1001 || se.Have != 1000 {
		t.Fatalf("HtoD into a too-small buffer: %v", err)
	}
	_, err = c.DtoH(context.Background(), make([]byte, 2000), dev)
	if !errors.As(err, &se) || se.Op != "device-to-host" {
		t.Fatalf("DtoH from a too-small buffer: %v", err)
	}
	if _, err := c.HtoD(context.Background(), nil, []byte{1}); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("HtoD into nil: %v", err)
	}
	if _, err := c.HtoDAsync(context.Background(), dev, make([]byte, 5000)).Wait(context.Background()); !errors.As(err, &se) {
		t.Fatalf("HtoDAsync into a too-small buffer: %v", err)
	}
}

func TestFakeOptionsRejected(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	bad := []struct {
		o    Option
		name string
	}{
		{WithStageSize(0), "WithStageSize"}, {WithDepth(0), "WithDepth"}, {WithParallelism(0), "WithParallelism"},
		{WithStageFlags(pinmem.WriteCombined), "WithStageFlags"}, {WithRegistrationCache(-1), "WithRegistrationCache"},
		{WithRegistrationMin(-1), "WithRegistrationMin"}, {WithWait(WaitPoll + 1), "WithWait"}, {nil, "Option"},
		{WithStageFlags(0, pinmem.WithThreads(0)), "pinmem.WithThreads"},
	}
	check := func(what, name string, err error) {
		t.Helper()
		var oe *pinmem.OptionError
		if !errors.As(err, &oe) || oe.Option != name || !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s: %v, want a *pinmem.OptionError naming %s", what, err, name)
		}
	}
	for _, b := range bad {
		c, err := New(e.ctx, b.o)
		if c != nil {
			c.Close(context.Background())
		}
		check("New", b.name, err)
		m, err := NewMulti([]*cuda.Context{e.ctx}, b.o)
		if m != nil {
			m.Close(context.Background())
		}
		check("NewMulti", b.name, err)
	}
	_, err := NewMulti([]*cuda.Context{e.ctx}, WithStream(&cuda.Stream{}))
	check("NewMulti", "WithStream", err)
	c, err := New(e.ctx, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, b := range []struct {
		o    PipelineOption
		name string
	}{{WithChunkSize(0), "WithChunkSize"}, {WithStreams(0), "WithStreams"}, {WithInFlight(-1), "WithInFlight"}, {nil, "PipelineOption"}} {
		p, err := c.NewPipeline(b.o)
		if p != nil {
			p.Close(context.Background())
		}
		check("NewPipeline", b.name, err)
	}
	if _, err := New(nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("New(nil): %v", err)
	}
}

// TestFakeNewFailureReleases: a failure half-way through New releases what
// was created before it.
func TestFakeNewFailureReleases(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	for _, op := range []string{"cuStreamCreate", "cuEventCreate", "cuMemHostAlloc", "cuMemHostRegister_v2"} {
		for nth := 1; nth <= 4; nth++ {
			if err := e.d.FailOn(op, nth, cudadrv.ErrorOutOfMemory); err != nil {
				t.Fatal(err)
			}
			c, err := New(e.ctx, smallRing()...)
			e.d.ClearFaults()
			if err == nil {
				if err := c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if c != nil {
				t.Fatalf("New failed (%v) but returned a Copier", err)
			}
			if !errors.Is(err, cuda.ErrOutOfMemory) {
				t.Fatalf("%s #%d: %v", op, nth, err)
			}
			if l := e.d.Live(); l.Streams != 0 || l.Events != 0 || l.HostAllocs != 0 || l.Registrations != 0 {
				t.Fatalf("%s #%d: New failed and left %+v", op, nth, l)
			}
		}
	}
}

func TestFakeClosed(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 10)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.HtoD(context.Background(), dev, []byte{1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("HtoD after Close: %v", err)
	}
	if _, err := c.DtoHAsync(context.Background(), []byte{1}, dev).Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("DtoHAsync after Close: %v", err)
	}
	if _, err := newTestPipeline(c, pipelineCfg{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewPipeline after Close: %v", err)
	}
}

// waitPending waits until n operations are queued on s.
func waitPending(t *testing.T, d *fakedrv.Driver, s *cuda.Stream, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.Pending(cudadrv.Stream(s.Handle())) < n {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %d queued operations, have %d", n, d.Pending(cudadrv.Stream(s.Handle())))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFakeRingOrdering holds the copy stream: the Copier must fill exactly
// depth stages (one copy and one event record each, after the timing
// record with WithStats) and then wait for the first stage's event before
// reusing it. Without WithStats there is no timing record at all.
func TestFakeRingOrdering(t *testing.T) {
	for _, stats := range []bool{false, true} {
		t.Run(fmt.Sprintf("stats=%v", stats), func(t *testing.T) { testRingOrdering(t, stats) })
	}
}

func testRingOrdering(t *testing.T, stats bool) {
	e := useFake(t, fakedrv.Options{})
	const stage, depth = 64 << 10, 3
	c := e.copier(t, WithStageSize(stage), WithDepth(depth), WithParallelism(2), WithStats(stats))
	timing := 0
	if stats {
		timing = 1
	}
	n := 10*stage + 123
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 1)
	var mu sync.Mutex
	var ops []string
	e.d.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemcpyHtoDAsync_v2" || op == "cuEventRecord" || op == "cuEventSynchronize" {
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
		}
		return cudadrv.Success
	})
	sh := cudadrv.Stream(c.Stream().Handle())
	if err := e.d.HoldStream(sh); err != nil {
		t.Fatal(err)
	}
	tr := c.HtoDAsync(context.Background(), dev, src)
	waitPending(t, e.d, c.Stream(), timing+2*depth)
	time.Sleep(50 * time.Millisecond)
	if p := e.d.Pending(sh); p != timing+2*depth {
		t.Fatalf("with the stream held, %d operations queued, want %d (the ring must wait for stage 0)", p, timing+2*depth)
	}
	select {
	case <-tr.Done():
		t.Fatal("transfer finished while its stream was held")
	default:
	}
	if err := e.d.ReleaseStream(sh); err != nil {
		t.Fatal(err)
	}
	st, err := tr.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.d.ClearFaults()
	if st.Stages != 11 || st.StagedBytes != int64(n) {
		t.Fatalf("stats %+v, want 11 stages", st)
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
	mu.Lock()
	defer mu.Unlock()
	// timing record (WithStats), then (copy, record) per stage, with the
	// "near" record before the last copy, then the end records (timing
	// with WithStats, done).
	want := []string{}
	if stats {
		want = append(want, "cuEventRecord")
	}
	for i := range 11 {
		if i == 10 {
			want = append(want, "cuEventRecord")
		}
		want = append(want, "cuMemcpyHtoDAsync_v2", "cuEventRecord")
	}
	want = append(want, "cuEventRecord")
	if stats {
		want = append(want, "cuEventRecord")
	}
	got := slices.DeleteFunc(slices.Clone(ops), func(s string) bool { return s == "cuEventSynchronize" })
	if !slices.Equal(got, want) {
		t.Fatalf("driver calls:\n got %v\nwant %v", got, want)
	}
}

// TestFakeCancelHalfway cancels transfers whose stream is held: they must
// return at once, report the cancellation (never success), leave later
// device memory untouched, leak nothing, and the Copier's next transfers
// must not reuse the stages of the abandoned copies: the next takes the
// other lane and stages of its own, and with both lanes abandoned a
// transfer waits for their copies (bounded by its context).
func TestFakeCancelHalfway(t *testing.T) {
	for _, dir := range []Direction{HostToDevice, DeviceToHost} {
		t.Run(dir.String(), func(t *testing.T) {
			e := useFake(t, fakedrv.Options{})
			const stage, depth = 64 << 10, 3
			c := e.copier(t, WithStageSize(stage), WithDepth(depth), WithParallelism(3))
			n := 10 * stage
			dev := e.devbuf(t, n)
			src := testutil.RandomBytes(n, 2)
			host := make([]byte, n)
			testutil.Poison(host)
			if dir == DeviceToHost {
				if _, err := dev.WriteAt(src, 0); err != nil {
					t.Fatal(err)
				}
			} else if err := dev.Memset(testutil.PoisonByte); err != nil {
				t.Fatal(err)
			}
			release := holdLanes(t, e, c)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ret := make(chan error, 1)
			go func() {
				var err error
				if dir == HostToDevice {
					_, err = c.HtoD(ctx, dev, src)
				} else {
					_, err = c.DtoH(ctx, host, dev)
				}
				ret <- err
			}()
			waitPending(t, e.d, c.Stream(), 2*depth)
			cancel()
			var err error
			select {
			case err = <-ret:
			case <-time.After(5 * time.Second):
				t.Fatal("cancelled transfer did not return while its stream was held")
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled transfer: %v, want context.Canceled", err)
			}
			// The next transfer takes the other lane, whose stream is
			// held too: it is abandoned in its turn (bounded by its
			// context), on a stage other than the first one's, pinned
			// for it ...
			short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancelShort()
			if _, err := c.HtoD(short, dev, src[:10]); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("transfer while the abandoned copies are held: %v, want context.DeadlineExceeded", err)
			}
			if all, peak := c.eng.stageCount(); all != depth+1 || peak != depth+1 {
				t.Fatalf("engine: %d stages, %d borrowed at most; want %d and %d", all, peak, depth+1, depth+1)
			}
			// ... and with both lanes taken by abandoned copies, a
			// transfer waits for them ...
			shorter, cancelShorter := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancelShorter()
			if _, err := c.HtoD(shorter, dev, src[:10]); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("transfer while both lanes are abandoned: %v, want context.DeadlineExceeded", err)
			}
			release()
			// ... and runs once they drained: take every lane to know.
			if _, err := c.HtoD(context.Background(), dev, nil); err != nil {
				t.Fatal(err)
			}
			var ls []*lane
			for range c.lanes {
				l, err := c.acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, l)
			}
			for _, l := range ls {
				c.releaseLane(l)
			}
			got := host
			if dir == HostToDevice {
				got = e.deviceBytes(t, dev)
			}
			// What was copied is intact, what was not is untouched.
			copied := depth * stage
			if dir == DeviceToHost {
				copied = 0 // nothing was copied out of the stages before the cancel
			}
			testutil.CheckBytes(t, src[:copied], got[:copied])
			for i := 3 * stage; i < n; i++ {
				if got[i] != testutil.PoisonByte {
					t.Fatalf("byte %d written after the cancellation", i)
				}
			}
			// The Copier still works.
			if _, err := c.HtoD(context.Background(), dev, src); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFakeCancelBeforeStart: a context already cancelled copies nothing.
func TestFakeCancelBeforeStart(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.HtoD(ctx, dev, make([]byte, 100)); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	tr := c.DtoHAsync(ctx, make([]byte, 100), dev)
	<-tr.Done()
	if _, err := tr.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	// Transfer.Cancel works the same.
	tr = c.HtoDAsync(context.Background(), dev, make([]byte, 100))
	tr.Cancel()
	if _, err := tr.Wait(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestFakeCopyErrors: enqueue failures and asynchronous copy failures are
// returned, typed, and leave nothing behind.
func TestFakeCopyErrors(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	n := 5*64<<10 + 7
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 3)
	cases := []struct {
		op    string
		async bool
		code  cudadrv.Result
		is    error
	}{
		// Enqueue failures use codes the cuda package does not retry (it
		// retries invalid value/handle/context once with the stream's
		// context current, which would hide a one-shot injected fault).
		{"cuMemcpyHtoDAsync_v2", false, cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory},
		{"cuMemcpyHtoDAsync_v2", true, cudadrv.ErrorIllegalAddress, cuda.ErrLaunchFailed},
		{"cuMemcpyDtoHAsync_v2", false, cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory},
		{"cuMemcpyDtoHAsync_v2", true, cudadrv.ErrorIllegalAddress, cuda.ErrLaunchFailed},
		{"cuEventRecord", false, cudadrv.ErrorNotSupported, cuda.ErrNotSupported},
		{"cuEventQuery", false, cudadrv.ErrorLaunchFailed, cuda.ErrLaunchFailed},
	}
	for _, tc := range cases {
		for _, nth := range []int{1, 3} {
			// The copies an earlier case left queued have drained (the
			// drain's queries would take the fault).
			if err := c.Fence(context.Background()); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.async {
				err = e.d.FailAsync(tc.op, nth, tc.code)
			} else {
				err = e.d.FailOn(tc.op, nth, tc.code)
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tc.op, "DtoH") {
				_, err = c.DtoH(context.Background(), make([]byte, n), dev)
			} else {
				_, err = c.HtoD(context.Background(), dev, src)
			}
			e.d.ClearFaults()
			if !errors.Is(err, tc.is) {
				t.Errorf("%s #%d (async %v): got %v, want %v", tc.op, nth, tc.async, err, tc.is)
			}
		}
	}
	// Afterwards the Copier works.
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
}

func TestFakePinnedDirect(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	n := 300 << 10
	buf, err := pinmem.Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	remove := c.AddPinned(buf)
	defer remove()
	dev := e.devbuf(t, n)
	copy(buf.Bytes(), testutil.RandomBytes(n, 4))
	st, err := c.HtoD(context.Background(), dev, buf.Bytes()[100:])
	if err != nil {
		t.Fatal(err)
	}
	if st.DirectBytes != int64(n-100) || st.StagedBytes != 0 {
		t.Fatalf("pinned source was staged: %+v", st)
	}
	testutil.CheckBytes(t, buf.Bytes()[100:], e.deviceBytes(t, dev)[:n-100])
	// A Go slice straddling nothing pinned is staged; the pinned buffer read back directly.
	out := make([]byte, n)
	if st, err = c.DtoH(context.Background(), out, dev); err != nil || st.DirectBytes != 0 {
		t.Fatalf("DtoH to Go memory: %+v, %v", st, err)
	}
	clear(buf.Bytes())
	if st, err = c.DtoH(context.Background(), buf.Bytes(), dev); err != nil || st.DirectBytes != int64(n) {
		t.Fatalf("DtoH to pinned memory: %+v, %v", st, err)
	}
	testutil.CheckBytes(t, out, buf.Bytes())
	// pinmem's own buffers are recognised without AddPinned.
	remove()
	if st, _ = c.HtoD(context.Background(), dev, buf.Bytes()); st.DirectBytes != int64(n) {
		t.Fatalf("pinmem buffer not copied directly without AddPinned: %+v", st)
	}
}

// TestFakeDirectTail: a long direct copy goes in two pieces with the
// "near" event between them, so that the transfer sleeps through the first
// and polls only the last tailBytes; WaitSleep and WaitPoll queue one copy.
func TestFakeDirectTail(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	n := 2*tailBytes + 4097
	buf, err := pinmem.Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	dev := e.devbuf(t, n)
	for _, tc := range []struct {
		name string
		mode WaitMode
		want []string
	}{
		{"hybrid", WaitHybrid, []string{"cuMemcpyHtoDAsync_v2", "cuEventRecord", "cuMemcpyHtoDAsync_v2", "cuEventRecord"}},
		{"sleep", WaitSleep, []string{"cuMemcpyHtoDAsync_v2", "cuEventRecord"}},
		{"poll", WaitPoll, []string{"cuMemcpyHtoDAsync_v2", "cuEventRecord"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.copier(t, append(smallRing(), WithWait(tc.mode))...)
			defer c.AddPinned(buf)()
			copy(buf.Bytes(), testutil.RandomBytes(n, 9))
			var mu sync.Mutex
			var ops []string
			e.d.SetHook(func(op string) cudadrv.Result {
				if op == "cuMemcpyHtoDAsync_v2" || op == "cuEventRecord" {
					mu.Lock()
					ops = append(ops, op)
					mu.Unlock()
				}
				return cudadrv.Success
			})
			st, err := c.HtoD(context.Background(), dev, buf.Bytes())
			e.d.SetHook(nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.DirectBytes != int64(n) || st.StagedBytes != 0 {
				t.Fatalf("stats %+v", st)
			}
			testutil.CheckBytes(t, buf.Bytes(), e.deviceBytes(t, dev))
			mu.Lock()
			defer mu.Unlock()
			// [first piece, near, then] the last piece, done (no timing
			// events without WithStats)
			if !slices.Equal(ops, tc.want) {
				t.Fatalf("driver calls:\n got %v\nwant %v", ops, tc.want)
			}
			// Back from the device, the same split and the same bytes.
			clear(buf.Bytes()[:4096])
			want := e.deviceBytes(t, dev)
			if _, err := c.DtoH(context.Background(), buf.Bytes(), dev); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, want, buf.Bytes())
		})
	}
	if _, err := New(e.ctx, WithWait(WaitPoll+1)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("unknown wait mode: %v, want ErrInvalidValue", err)
	}
}

func TestFakeTyped(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	src := make([]float64, 100_001)
	for i := range src {
		src[i] = float64(i) * 1.5
	}
	dev := e.devbuf(t, len(src)*8)
	if _, err := c.HtoD(context.Background(), dev, AsBytes(src)); err != nil {
		t.Fatal(err)
	}
	dst := make([]float64, len(src))
	if _, err := c.DtoHAsync(context.Background(), AsBytes(dst), dev).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(src, dst) {
		t.Fatal("float64 round trip differs")
	}
	if AsBytes([]int32(nil)) != nil || len(AsBytes([]complex128{1})) != 16 {
		t.Fatal("AsBytes")
	}
}

// TestFakeConcurrent runs many asynchronous transfers on one Copier at
// once (run it under -race).
func TestFakeConcurrent(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	const k, n = 8, 200<<10 + 3
	var trs []*Op
	var srcs, outs [][]byte
	var devs []*cuda.DeviceBuffer
	for i := range k {
		srcs = append(srcs, testutil.RandomBytes(n, uint64(10+i)))
		devs = append(devs, e.devbuf(t, n))
		trs = append(trs, c.HtoDAsync(context.Background(), devs[i], srcs[i]))
	}
	for i, tr := range trs {
		if _, err := tr.Wait(context.Background()); err != nil {
			t.Fatal(i, err)
		}
	}
	trs = trs[:0]
	for i := range k {
		outs = append(outs, make([]byte, n))
		trs = append(trs, c.DtoHAsync(context.Background(), outs[i], devs[i]))
	}
	for i, tr := range trs {
		if _, err := tr.Wait(context.Background()); err != nil {
			t.Fatal(i, err)
		}
		testutil.CheckBytes(t, srcs[i], outs[i])
	}
}

// TestFakeWaitContext: Wait's own context bounds the wait, not the transfer.
func TestFakeWaitContext(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 1<<20)
	sh := cudadrv.Stream(c.Stream().Handle())
	e.d.HoldStream(sh)
	src := testutil.RandomBytes(1<<20, 5)
	tr := c.HtoDAsync(context.Background(), dev, src)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := tr.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a short context: %v", err)
	}
	e.d.ReleaseStream(sh)
	if _, err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
}

type errReader struct {
	r   io.Reader
	n   int
	err error
}

func (r *errReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, r.err
	}
	if len(p) > r.n {
		p = p[:r.n]
	}
	n, err := r.r.Read(p)
	r.n -= n
	return n, err
}

type limitWriter struct {
	bytes.Buffer
	left int
}

func (w *limitWriter) Write(p []byte) (int, error) {
	if len(p) > w.left {
		n, _ := w.Buffer.Write(p[:w.left])
		w.left = 0
		return n, errors.New("disk full")
	}
	w.left -= len(p)
	return w.Buffer.Write(p)
}

func TestFakeReaderWriter(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	for _, n := range []int{0, 1, 64 << 10, 5*64<<10 + 999} {
		dev := e.devbuf(t, max(n, 1)+100)
		src := testutil.RandomBytes(n, uint64(n))
		st, err := c.HtoDFrom(context.Background(), dev, iotest.HalfReader(bytes.NewReader(src)))
		if err != nil || st.Bytes != int64(n) {
			t.Fatalf("ReadFrom %d bytes: %+v, %v", n, st, err)
		}
		testutil.CheckBytes(t, src, e.deviceBytes(t, dev)[:n])
		view, _ := dev.Slice(0, n)
		if n == 0 {
			continue
		}
		var out bytes.Buffer
		st, err = c.DtoHTo(context.Background(), &out, view)
		if err != nil || st.Bytes != int64(n) {
			t.Fatalf("WriteTo %d bytes: %+v, %v", n, st, err)
		}
		testutil.CheckBytes(t, src, out.Bytes())
	}
	// A reader longer than the buffer: ReadFrom stops when the buffer is full.
	dev := e.devbuf(t, 100_000)
	src := testutil.RandomBytes(300_000, 9)
	r := bytes.NewReader(src)
	if st, err := c.HtoDFrom(context.Background(), dev, r); err != nil || st.Bytes != 100_000 || r.Len() != 200_000 {
		t.Fatalf("ReadFrom a long reader: %+v, %v, %d left", st, err, r.Len())
	}
	testutil.CheckBytes(t, src[:100_000], e.deviceBytes(t, dev))
	// Read errors stop the transfer.
	boom := errors.New("boom")
	if _, err := c.HtoDFrom(context.Background(), dev, &errReader{bytes.NewReader(src), 70_000, boom}); !errors.Is(err, boom) {
		t.Fatalf("ReadFrom with a failing reader: %v", err)
	}
	// Write errors and short writes stop it too.
	w := &limitWriter{left: 70_000}
	if st, err := c.DtoHTo(context.Background(), w, dev); err == nil || st.Bytes != 70_000 {
		t.Fatalf("WriteTo with a failing writer: %+v, %v", st, err)
	}
	// Cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.DtoHTo(ctx, io.Discard, dev); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// holdLanes holds the streams of c's lanes in the fake driver, as a hung
// device would, and returns a function that lets them run again.
func holdLanes(t *testing.T, e fakeEnv, c *Copier) (release func()) {
	t.Helper()
	var held []cudadrv.Stream
	for _, l := range c.lanes {
		sh := cudadrv.Stream(l.stream.Handle())
		if err := e.d.HoldStream(sh); err != nil {
			t.Fatal(err)
		}
		held = append(held, sh)
	}
	return func() {
		t.Helper()
		for _, sh := range held {
			if err := e.d.ReleaseStream(sh); err != nil {
				t.Fatal(err)
			}
		}
	}
}
