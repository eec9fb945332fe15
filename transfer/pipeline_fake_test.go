package transfer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// addKernel registers a Go add_u8 with the fake and loads it.
func (e fakeEnv) addKernel(t *testing.T) *cuda.Function {
	t.Helper()
	e.d.RegisterKernel(kernels.KernelAdd, []int{8, 8, 1}, func(k *fakedrv.KernelCall) error {
		m, err := k.Mem(k.Ptr(0), k.Uint64(1))
		if err != nil {
			return err
		}
		kernels.AddBytes(m, uint8(k.Uint64(2)))
		return nil
	})
	mod, err := e.ctx.LoadModule(kernels.Image())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mod.Destroy() })
	f, err := mod.Function(kernels.KernelAdd)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func addWork(f *cuda.Function, delta uint8) func(*cuda.Stream, Chunk) error {
	return LaunchWork(f, cuda.D1(4), cuda.D1(256), func(ch Chunk) []any {
		return []any{ch.Dev.Ptr(), uint64(ch.Len), delta}
	})
}

func (e fakeEnv) pipeline(t *testing.T, c *Copier, cfg pipelineCfg) *Pipeline {
	t.Helper()
	p, err := newTestPipeline(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("pipeline Close: %v", err)
		}
	})
	return p
}

func added(in []byte, delta uint8) []byte {
	out := slices.Clone(in)
	kernels.AddBytes(out, delta)
	return out
}

func TestFakePipeline(t *testing.T) {
	const chunk = 64 << 10
	n := 10*chunk + 777
	for _, mode := range []string{"go", "pinned", "inplace", "nooutput", "pinned-in-go-out"} {
		for _, ordered := range []bool{true, false} {
			t.Run(mode+map[bool]string{true: "/ordered", false: "/unordered"}[ordered], func(t *testing.T) {
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, smallRing()...)
				f := e.addKernel(t)
				var got []int
				p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 3, InFlight: 4, Ordered: ordered,
					Work: addWork(f, 3),
					Done: func(ch Chunk) error {
						got = append(got, ch.Index)
						return nil
					}})
				src := testutil.RandomBytes(n, 42)
				in := slices.Clone(src)
				var out []byte
				switch mode {
				case "go":
					out = make([]byte, n+10)
					testutil.Poison(out)
				case "pinned", "pinned-in-go-out":
					bin, err := pinmem.Alloc(n, 0)
					if err != nil {
						t.Fatal(err)
					}
					defer bin.Free()
					defer c.AddPinned(bin)()
					in = bin.Bytes()
					copy(in, src)
					out = make([]byte, n)
					if mode == "pinned" {
						bout, err := pinmem.Alloc(n, 0)
						if err != nil {
							t.Fatal(err)
						}
						defer bout.Free()
						defer c.AddPinned(bout)()
						out = bout.Bytes()
					}
				case "inplace":
					out = in
				}
				st, err := p.Run(context.Background(), in, out)
				if err != nil {
					t.Fatal(err)
				}
				if st.Chunks != 11 || st.Bytes != int64(n) {
					t.Fatalf("stats %+v", st)
				}
				wantStagedIn := mode == "go" || mode == "inplace" || mode == "nooutput"
				if st.StagedIn != wantStagedIn || st.StagedOut != (mode == "go" || mode == "inplace" || mode == "pinned-in-go-out") {
					t.Fatalf("mode %s: staged in %v, out %v", mode, st.StagedIn, st.StagedOut)
				}
				if len(got) != 11 {
					t.Fatalf("%d callbacks", len(got))
				}
				if ordered && !slices.IsSorted(got) {
					t.Fatalf("ordered callbacks out of order: %v", got)
				}
				slices.Sort(got)
				for i, g := range got {
					if g != i {
						t.Fatalf("callbacks %v", got)
					}
				}
				if out != nil {
					testutil.CheckBytes(t, added(src, 3), out[:n])
					for _, b := range out[n:] {
						if b != testutil.PoisonByte {
							t.Fatal("pipeline wrote past the input length")
						}
					}
				}
				// A second run on the same pipeline.
				if _, err := p.Run(context.Background(), in[:chunk+1], nil); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestFakePipelineBackPressure(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	f := e.addKernel(t)
	var issued atomic.Int32
	work := addWork(f, 1)
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 4096, Streams: 2, InFlight: 3, Work: func(s *cuda.Stream, ch Chunk) error {
		issued.Add(1)
		return work(s, ch)
	}})
	e.d.Pause()
	in := testutil.RandomBytes(20*4096, 1)
	out := make([]byte, len(in))
	done := make(chan error, 1)
	go func() {
		_, err := p.Run(context.Background(), in, out)
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for issued.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	if n := issued.Load(); n != 3 {
		t.Fatalf("with the device paused, %d chunks issued, want InFlight = 3", n)
	}
	e.d.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, added(in, 1), out)
}

func TestFakePipelineErrors(t *testing.T) {
	const chunk = 4096
	in := testutil.RandomBytes(12*chunk, 7)
	boom := errors.New("boom")
	var armed atomic.Bool // faults fire only in the first run of each case
	cases := []struct {
		name   string
		setup  func(e fakeEnv)
		work   func(i int) error
		done   func(i int) error
		is     error
		chunk  int
		cancel int // cancel the context in the Done callback of the chunk delivered after this many (when > 0): chunk cancel when ordered
	}{
		{name: "work", work: func(i int) error {
			if i == 5 && armed.Load() {
				return boom
			}
			return nil
		}, is: boom, chunk: 5},
		{name: "callback", done: func(i int) error {
			if i == 2 && armed.Load() {
				return boom
			}
			return nil
		}, is: boom, chunk: 2},
		{name: "launch", setup: func(e fakeEnv) { e.d.FailOn("cuLaunchKernel", 4, cudadrv.ErrorLaunchOutOfResources) }, is: cuda.ErrLaunchFailed, chunk: 3},
		{name: "h2d", setup: func(e fakeEnv) { e.d.FailOn("cuMemcpyHtoDAsync_v2", 6, cudadrv.ErrorOutOfMemory) }, is: cuda.ErrOutOfMemory, chunk: 5},
		{name: "async-kernel", setup: func(e fakeEnv) { e.d.FailAsync("cuLaunchKernel", 3, cudadrv.ErrorLaunchFailed) }, is: cuda.ErrLaunchFailed, chunk: -1},
		{name: "cancel", cancel: 3, is: context.Canceled, chunk: -1},
	}
	for _, tc := range cases {
		for _, ordered := range []bool{true, false} {
			t.Run(tc.name, func(t *testing.T) {
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, smallRing()...)
				f := e.addKernel(t)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var delivered []int
				work := addWork(f, 1)
				p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: 4, Ordered: ordered,
					Work: func(s *cuda.Stream, ch Chunk) error {
						if tc.work != nil {
							if err := tc.work(ch.Index); err != nil {
								return err
							}
						}
						return work(s, ch)
					},
					Done: func(ch Chunk) error {
						delivered = append(delivered, ch.Index)
						if tc.cancel > 0 && len(delivered) == tc.cancel+1 {
							// Unordered, the chunks come back as their streams
							// finish: count them rather than wait for one index.
							cancel()
						}
						if tc.done != nil {
							return tc.done(ch.Index)
						}
						return nil
					}})
				if tc.setup != nil {
					tc.setup(e)
				}
				armed.Store(true)
				st, err := p.Run(ctx, in, make([]byte, len(in)))
				armed.Store(false)
				e.d.ClearFaults()
				if !errors.Is(err, tc.is) {
					t.Fatalf("Run: %v, want %v", err, tc.is)
				}
				var ce *ChunkError
				if tc.chunk >= 0 && (!errors.As(err, &ce) || ce.Chunk != tc.chunk) {
					t.Fatalf("Run: %v, want a ChunkError for chunk %d", err, tc.chunk)
				}
				// The fake reports asynchronous faults only when a stream is
				// synchronized (the real driver's event queries report them,
				// sticky), so there the failure may surface after the last chunk.
				if st.Chunks == 12 && tc.name != "async-kernel" {
					t.Fatalf("a failed run reports all chunks done: %+v", st)
				}
				if tc.chunk >= 0 && ordered && slices.Contains(delivered, tc.chunk+1) {
					t.Fatalf("chunk %d delivered after chunk %d failed (%v)", tc.chunk+1, tc.chunk, delivered)
				}
				if tc.cancel > 0 && len(delivered) > 0 && slices.Max(delivered) > tc.cancel && ordered {
					t.Fatalf("chunks delivered after the cancellation: %v", delivered)
				}
				if l := e.d.Live(); l.PendingOps != 0 {
					t.Fatalf("Run returned with %d operations still queued", l.PendingOps)
				}
				// The pipeline still works.
				out := make([]byte, len(in))
				if _, err := p.Run(context.Background(), in, out); err != nil {
					t.Fatal(err)
				}
				testutil.CheckBytes(t, added(in, 1), out)
			})
		}
	}
}

func TestFakePipelineBadArgs(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 4096, Streams: 1})
	_, err := p.Run(context.Background(), make([]byte, 100), make([]byte, 99))
	var se *SizeError
	if !errors.As(err, &se) || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("Run with a short output: %v", err)
	}
	if _, err := newTestPipeline(c, pipelineCfg{ChunkSize: -1}); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatal(err)
	}
	if st, err := p.Run(context.Background(), nil, nil); err != nil || st.Chunks != 0 {
		t.Fatal(st, err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Run(context.Background(), []byte{1}, nil); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	// A failure half-way through NewPipeline releases what it made.
	for nth := 1; nth <= 3; nth++ {
		e.d.FailOn("cuMemAlloc_v2", nth, cudadrv.ErrorOutOfMemory)
		p, err := newTestPipeline(c, pipelineCfg{ChunkSize: 4096, Streams: 2})
		e.d.ClearFaults()
		if !errors.Is(err, cuda.ErrOutOfMemory) || p != nil {
			t.Fatalf("NewPipeline with a failing allocation: %v", err)
		}
	}
}

// TestFakePipelinePinStages: with PinStages the staging buffers are pinned
// in NewPipeline, so a Run from Go memory pins nothing (Setup 0); without
// it the first staged Run pins them and says so in Setup, later Runs do not.
func TestFakePipelinePinStages(t *testing.T) {
	const chunk, inFlight = 64 << 10, 4
	for _, pinStages := range []bool{true, false} {
		e := useFake(t, fakedrv.Options{})
		c := e.copier(t, smallRing()...)
		before := pinmem.Stats().Pinned.Bytes
		p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: inFlight, PinStages: pinStages})
		grew := pinmem.Stats().Pinned.Bytes - before
		if want := map[bool]int64{true: inFlight * chunk, false: 0}[pinStages]; grew != want {
			t.Fatalf("PinStages %v: NewPipeline pinned %d bytes, want %d", pinStages, grew, want)
		}
		in := testutil.RandomBytes(5*chunk+3, 7)
		out := make([]byte, len(in))
		for run := range 2 {
			st, err := p.Run(context.Background(), in, out)
			if err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, in, out)
			if staged := !pinStages && run == 0; (st.Setup > 0) != staged || st.Setup > st.Wall {
				t.Errorf("PinStages %v, run %d: %+v", pinStages, run, st)
			}
		}
		if grew := pinmem.Stats().Pinned.Bytes - before; grew != inFlight*chunk {
			t.Fatalf("PinStages %v: %d bytes pinned after the runs", pinStages, grew)
		}
	}
}

// TestFakePipelineUnorderedStagedOut: with a staged output and
// WithOrdered(false), a chunk whose stream is held does not hold back the
// chunks of the other streams: they are delivered while it waits. Every
// byte is checked once the stream runs again.
func TestFakePipelineUnorderedStagedOut(t *testing.T) {
	heldStreamDelivers(t, 1, "no chunk delivered while chunk 0's stream was held")
}

// heldStreamDelivers runs 16 chunks through a Pipeline of 2 streams and 4
// chunks in flight, with a staged output and a kernel, while chunk 0's
// stream is held, waits (at most 5 s) until at least want chunks are
// delivered, failing with why when they are not, then releases the stream
// and checks that every chunk was delivered and every byte is right.
func heldStreamDelivers(t *testing.T, want int, why string) {
	t.Helper()
	const chunk = 4096
	e := useFake(t, fakedrv.Options{WaitTimeout: -1})
	c := e.copier(t, smallRing()...)
	f := e.addKernel(t)
	var mu sync.Mutex
	var got []int
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: 4, Work: addWork(f, 1),
		Done: func(ch Chunk) error { mu.Lock(); got = append(got, ch.Index); mu.Unlock(); return nil }})
	in := testutil.RandomBytes(16*chunk, 3)
	out := make([]byte, len(in))
	if _, err := p.Run(context.Background(), in, out); err != nil { // pins the stages
		t.Fatal(err)
	}
	mu.Lock()
	got = nil
	mu.Unlock()
	clear(out)
	held := cudadrv.Stream(p.slots[0].stream.Handle()) // chunk 0's stream
	if err := e.d.HoldStream(held); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Run(context.Background(), in, out); done <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= want {
			break
		}
		if time.Now().After(deadline) {
			e.d.ReleaseStream(held)
			<-done
			t.Fatalf("%s: %d chunks delivered", why, n)
		}
		time.Sleep(time.Millisecond)
	}
	e.d.ReleaseStream(held)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != 16 {
		t.Fatalf("%d chunks delivered: %v", len(got), got)
	}
	testutil.CheckBytes(t, added(in, 1), out)
}

// TestFakePipelinePanicInDone: a Done callback that panics stops the Run
// at once: no further callback runs while the panic unwinds, the panic
// reaches the caller even with a stream held (a hung device) and a
// context that never ends, and the Pipeline runs again afterwards.
func TestFakePipelinePanicInDone(t *testing.T) {
	const chunk = 4096
	e := useFake(t, fakedrv.Options{WaitTimeout: -1})
	c := e.copier(t, smallRing()...)
	var calls []int
	var held cudadrv.Stream
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: 4, Ordered: true,
		Done: func(ch Chunk) error {
			calls = append(calls, ch.Index)
			if ch.Index == 1 {
				panic("boom")
			}
			return nil
		}})
	in := testutil.RandomBytes(12*chunk, 3)
	out := make([]byte, len(in))
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		// Hold the stream of the slot after chunk 1's once chunk 0 is
		// done: the output goroutine then waits on a chunk that does not
		// finish while Done(1) panics.
		p.cfg.done = func(ch Chunk) error {
			calls = append(calls, ch.Index)
			switch ch.Index {
			case 0:
				held = cudadrv.Stream(p.slots[2].stream.Handle())
				if err := e.d.HoldStream(held); err != nil {
					t.Error(err)
				}
			case 1:
				panic("boom")
			}
			return nil
		}
		p.Run(context.Background(), in, out)
	}()
	select {
	case r := <-recovered:
		if r != "boom" {
			t.Fatalf("recovered %v, want the callback's panic", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the panic of a Done callback did not reach the caller")
	}
	if held != 0 {
		e.d.ReleaseStream(held)
	}
	if !slices.Equal(calls, []int{0, 1}) {
		t.Errorf("Done called for %v, want [0 1] (none while the panic unwinds)", calls)
	}
	p.cfg.done = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	clear(out)
	if _, err := p.Run(ctx, in, out); err != nil {
		t.Fatalf("Run after the panic: %v", err)
	}
	testutil.CheckBytes(t, in, out)
}

// TestFakePipelineHeldStreamOthersFlow: a slot is reused as soon as its
// chunk is given back, not in turn. With chunk 0's stream held, chunks 0
// and 2 stay on it and every other chunk (14 of 16) flows through the
// other stream's slots and is delivered before the stream runs again; a
// reuse in turn (the FIFO of ring.go) would stall at chunk 4, whose slot
// is chunk 0's, with 2 delivered.
func TestFakePipelineHeldStreamOthersFlow(t *testing.T) {
	heldStreamDelivers(t, 14, "want 14 chunks (all but chunks 0 and 2) delivered while chunk 0's stream was held")
}
