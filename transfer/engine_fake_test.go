package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestFakeEngineBounds: 16 Copiers of one context moving data at once
// share one engine: the pinned memory stays at two rings (not 16), the
// copy goroutines are shared (a waiter per lane of a Copier, no copy
// goroutines of its own), and every byte arrives.
func TestFakeEngineBounds(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const stage, depth, par, copiers, n = 64 << 10, 3, 4, 16, 1 << 20
	opts := []Option{WithStageSize(stage), WithDepth(depth), WithParallelism(par)}
	base := pinmem.Stats().Pinned.Bytes
	g0 := runtime.NumGoroutine()
	cps := make([]*Copier, copiers)
	for i := range cps {
		cps[i] = e.copier(t, opts...)
	}
	if grew := runtime.NumGoroutine() - g0; grew > copiers*lanesOwn+par {
		t.Errorf("%d Copiers started %d goroutines, want at most %d (a waiter per lane and one set of copy goroutines)", copiers, grew, copiers*lanesOwn+par)
	}
	eng := cps[0].eng
	for _, c := range cps {
		if c.eng != eng {
			t.Fatal("Copiers of one context with the same stages do not share an engine")
		}
	}
	if all, _ := eng.stageCount(); all != 0 || pinmem.Stats().Pinned.Bytes != base {
		t.Fatalf("engine holds %d stages after New, want 0 (pinned when a transfer needs them)", all)
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			if p := pinmem.Stats().Pinned.Bytes - base; p > peak.Load() {
				peak.Store(p)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, copiers)
	for i, c := range cps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := e.devbuf(t, n)
			src := testutil.RandomBytes(n, uint64(i))
			dst := make([]byte, n)
			for range 4 {
				if _, err := c.HtoD(context.Background(), dev, src); err != nil {
					errs[i] = err
					return
				}
				clear(dst)
				if _, err := c.DtoH(context.Background(), dst, dev); err != nil {
					errs[i] = err
					return
				}
				if j := firstDiff(src, dst); j >= 0 {
					errs[i] = fmt.Errorf("copier %d: byte %d differs", i, j)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if limit := int64(2 * depth * stage); peak.Load() > limit {
		t.Errorf("peak pinned %d bytes with %d Copiers, want at most %d (two rings)", peak.Load(), copiers, limit)
	}
	grown, most := eng.stageCount()
	if most < depth+1 {
		t.Errorf("at most %d stages were borrowed at once: the transfers never ran side by side", most)
	}
	if grown > 2*depth {
		t.Errorf("engine holds %d stages, want at most %d (two rings)", grown, 2*depth)
	}
	// Copiers leave one by one; the last one releases the stages (useFake
	// checks that nothing is left).
	for i, c := range cps {
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i < copiers-1 {
			if all, _ := eng.stageCount(); all != grown {
				t.Fatalf("after %d Closes the engine holds %d stages, %d before", i+1, all, grown)
			}
		}
	}
	if p := pinmem.Stats().Pinned.Bytes; p != base {
		t.Errorf("%d bytes pinned after every Copier closed, %d before", p, base)
	}
}

// TestFakeEngineSeparate: Copiers with other stage sizes, stats settings
// or contexts have engines of their own; one Copier alone holds one ring,
// pinned by its first staged transfer.
func TestFakeEngineSeparate(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := pinmem.Stats().Pinned.Bytes
	a := e.copier(t, WithStageSize(64<<10), WithDepth(2))
	if p := pinmem.Stats().Pinned.Bytes - base; p != 0 {
		t.Errorf("New pinned %d bytes, want 0", p)
	}
	if _, err := a.HtoD(context.Background(), e.devbuf(t, 4*64<<10), make([]byte, 4*64<<10)); err != nil {
		t.Fatal(err)
	}
	if p := pinmem.Stats().Pinned.Bytes - base; p != 2*64<<10 {
		t.Errorf("one Copier pinned %d bytes, want its ring, %d", p, 2*64<<10)
	}
	b := e.copier(t, WithStageSize(128<<10), WithDepth(2))
	c := e.copier(t, WithStageSize(64<<10), WithDepth(2), WithStats(true))
	d := e.copier(t, WithStageSize(64<<10), WithDepth(2), WithStageFlags(0, pinmem.WithDevice(e.ctx.Device())))
	for _, x := range []*Copier{b, c, d} {
		if x.eng == a.eng {
			t.Errorf("engine shared across different stage configurations")
		}
	}
	a2 := e.copier(t, WithStageSize(64<<10), WithDepth(2))
	if a2.eng != a.eng {
		t.Error("same configuration, separate engines")
	}
}

// TestFakeEngineFIFO: stages go to waiting transfers first come, first
// served, at most their depth each; a waiter whose context ends leaves
// the queue without losing stages.
func TestFakeEngineFIFO(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, WithStageSize(64<<10), WithDepth(2))
	e.copier(t, WithStageSize(64<<10), WithDepth(2)) // two members: four stages
	eng := c.eng
	all, err := eng.take(context.Background(), 2)
	if err != nil || len(all) != 2 {
		t.Fatalf("take: %d %v", len(all), err)
	}
	more, err := eng.take(context.Background(), 5)
	if err != nil || len(more) != 2 {
		t.Fatalf("take beyond the depth: %d %v", len(more), err)
	}
	all = append(all, more...)
	queued := func(n int) {
		t.Helper()
		awaitWaiters(t, eng, n, "the queued transfers")
	}
	order := make(chan int, 4)
	got := make([][]*stage, 4)
	var wg sync.WaitGroup
	cctx, cancel := context.WithCancel(context.Background())
	for i := range 4 {
		ctx := context.Background()
		if i == 1 {
			ctx = cctx
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss, err := eng.take(ctx, 2)
			if i == 1 {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled waiter: %v", err)
				}
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = ss
			order <- i
		}()
		queued(i + 1)
	}
	cancel()
	queued(3)
	for _, s := range all {
		eng.give([]*stage{s})
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	close(order)
	var seq []int
	for i := range order {
		seq = append(seq, i)
	}
	if fmt.Sprint(seq) != "[0 2 3]" {
		t.Errorf("served in order %v, want [0 2 3]", seq)
	}
	for _, i := range seq {
		eng.give(got[i])
	}
	if n, _ := eng.stageCount(); n != 4 || len(eng.ring.idle) != 4 {
		t.Errorf("%d stages, %d idle after everything was given back", n, len(eng.ring.idle))
	}
}

// TestFakeEnginePipelines: Pipelines of one context with the same chunk
// size share their staging buffers: four Pipelines running at once from
// Go memory pin at most two sets of in-flight stages, and every byte
// arrives.
func TestFakeEnginePipelines(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const chunk, inFlight, pipes = 64 << 10, 3, 4
	c := e.copier(t, WithStageSize(64<<10), WithDepth(2))
	base := pinmem.Stats().Pinned.Bytes
	ps := make([]*Pipeline, pipes)
	for i := range ps {
		ps[i] = e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: inFlight, PinStages: true})
	}
	if grew := pinmem.Stats().Pinned.Bytes - base; grew != 2*inFlight*chunk {
		t.Fatalf("%d Pipelines pinned %d bytes, want %d (two sets of in-flight stages)", pipes, grew, 2*inFlight*chunk)
	}
	if ps[0].eng != ps[pipes-1].eng || ps[0].eng == c.eng {
		t.Fatal("Pipelines do not share one engine of their own")
	}
	var wg sync.WaitGroup
	errs := make([]error, pipes)
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := testutil.RandomBytes(7*chunk+5, uint64(i))
			out := make([]byte, len(in))
			for range 3 {
				clear(out)
				st, err := p.Run(context.Background(), in, out)
				if err != nil {
					errs[i] = err
					return
				}
				if !st.StagedIn || st.Chunks != 8 {
					errs[i] = fmt.Errorf("pipeline %d: %+v", i, st)
					return
				}
				if j := firstDiff(in, out); j >= 0 {
					errs[i] = fmt.Errorf("pipeline %d: byte %d differs", i, j)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if grew := pinmem.Stats().Pinned.Bytes - base; grew != 2*inFlight*chunk {
		t.Errorf("after the runs %d bytes pinned, want %d", grew, 2*inFlight*chunk)
	}
	if all, _ := ps[0].eng.stageCount(); all != 2*inFlight {
		t.Errorf("engine holds %d stages", all)
	}
}

// TestFakeTwoLanes: a Copier with a stream of its own runs two staged
// transfers at once: while one is stuck on a held stream, another (the
// other way) completes with every byte right, on stages the engine grew
// for it; the stuck one completes once its stream is released. A Copier
// given WithStream has one lane: its second transfer waits, bounded by
// its context.
func TestFakeTwoLanes(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const stage, depth = 64 << 10, 3
	opts := []Option{WithStageSize(stage), WithDepth(depth), WithParallelism(2)}
	c := e.copier(t, opts...)
	if len(c.lanes) != lanesOwn {
		t.Fatalf("%d lanes, want %d", len(c.lanes), lanesOwn)
	}
	n := 10 * stage
	devA, devB := e.devbuf(t, n), e.devbuf(t, n)
	srcA, srcB := testutil.RandomBytes(n, 21), testutil.RandomBytes(n, 22)
	if _, err := devB.WriteAt(srcB, 0); err != nil {
		t.Fatal(err)
	}
	sh := cudadrv.Stream(c.lanes[0].stream.Handle())
	if err := e.d.HoldStream(sh); err != nil {
		t.Fatal(err)
	}
	a := c.HtoDAsync(context.Background(), devA, srcA)
	waitPending(t, e.d, c.lanes[0].stream, depth)
	gotB := make([]byte, n)
	done := make(chan error, 1)
	go func() {
		_, err := c.DtoH(context.Background(), gotB, devB)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a second transfer waited for the first one's lane")
	}
	testutil.CheckBytes(t, srcB, gotB)
	select {
	case <-a.Done():
		t.Fatal("the transfer on the held stream finished")
	default:
	}
	if all, _ := c.eng.stageCount(); all != 2*depth {
		t.Errorf("engine holds %d stages, want %d (grown for two transfers)", all, 2*depth)
	}
	if err := e.d.ReleaseStream(sh); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, srcA, e.deviceBytes(t, devA))

	// One lane with WithStream.
	s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	one := e.copier(t, append(opts, WithStream(s))...)
	if len(one.lanes) != 1 {
		t.Fatalf("WithStream: %d lanes, want 1", len(one.lanes))
	}
	if err := e.d.HoldStream(cudadrv.Stream(s.Handle())); err != nil {
		t.Fatal(err)
	}
	a = one.HtoDAsync(context.Background(), devA, srcB)
	waitPending(t, e.d, s, depth)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := one.DtoH(short, gotB, devB); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second transfer of a one-lane Copier: %v, want context.DeadlineExceeded", err)
	}
	if err := e.d.ReleaseStream(cudadrv.Stream(s.Handle())); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, srcB, e.deviceBytes(t, devA))
}

// TestFakeTwoLanesUnderBudget: when the budget leaves no room for the
// second ring (the first pinned by a first transfer), the engine stays at one (and does not try again for every
// transfer), and two transfers of one Copier share its stages: the second
// waits for them and both complete with every byte right.
func TestFakeTwoLanesUnderBudget(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const stage, depth = 64 << 10, 3
	c := e.copier(t, WithStageSize(stage), WithDepth(depth), WithParallelism(2))
	n := 10 * stage
	devA, devB := e.devbuf(t, n), e.devbuf(t, n)
	srcA, srcB := testutil.RandomBytes(n, 31), testutil.RandomBytes(n, 32)
	if err := c.eng.fill(context.Background(), depth); err != nil { // the first ring, as a first transfer pins it
		t.Fatal(err)
	}
	prev := pinmem.SetBudget(pinmem.Stats().Pinned.Bytes + stage/2) // not one more stage
	defer pinmem.SetBudget(prev)
	if _, err := devB.WriteAt(srcB, 0); err != nil {
		t.Fatal(err)
	}
	sh := cudadrv.Stream(c.lanes[0].stream.Handle())
	if err := e.d.HoldStream(sh); err != nil {
		t.Fatal(err)
	}
	a := c.HtoDAsync(context.Background(), devA, srcA)
	waitPending(t, e.d, c.lanes[0].stream, depth)
	gotB := make([]byte, n)
	b := c.DtoHAsync(context.Background(), gotB, devB)
	select {
	case <-b.Done():
		t.Fatal("the second transfer ran without stages")
	case <-time.After(50 * time.Millisecond):
	}
	if all, _ := c.eng.stageCount(); all != depth {
		t.Fatalf("engine holds %d stages over the budget, want %d", all, depth)
	}
	if err := e.d.ReleaseStream(sh); err != nil {
		t.Fatal(err)
	}
	for _, op := range []*Op{a, b} {
		if _, err := op.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CheckBytes(t, srcA, e.deviceBytes(t, devA))
	testutil.CheckBytes(t, srcB, gotB)
	// Budget back: two transfers at once again, and the engine does not
	// try again (it grows once); they share the stages as before.
	pinmem.SetBudget(prev)
	for _, l := range c.lanes {
		if err := e.d.HoldStream(cudadrv.Stream(l.stream.Handle())); err != nil {
			t.Fatal(err)
		}
	}
	a = c.HtoDAsync(context.Background(), devA, srcB)
	b = c.DtoHAsync(context.Background(), gotB, devB)
	time.Sleep(50 * time.Millisecond)
	if all, _ := c.eng.stageCount(); all != depth {
		t.Errorf("engine holds %d stages after a failed growth, want %d", all, depth)
	}
	for _, l := range c.lanes {
		if err := e.d.ReleaseStream(cudadrv.Stream(l.stream.Handle())); err != nil {
			t.Fatal(err)
		}
	}
	for _, op := range []*Op{a, b} {
		if _, err := op.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CheckBytes(t, srcB, e.deviceBytes(t, devA))
	testutil.CheckBytes(t, srcB, gotB)
}

// TestFakeLanesWaitApart: a wait on one lane never queues behind a wait
// on the other: with lane 0's transfer asleep on a held stream, a
// transfer on lane 1 whose copies take 100 ms completes, in every wait
// mode.
func TestFakeLanesWaitApart(t *testing.T) {
	for _, mode := range []WaitMode{WaitHybrid, WaitSleep, WaitPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			e := useFake(t, fakedrv.Options{})
			const stage, depth = 64 << 10, 3
			c := e.copier(t, WithStageSize(stage), WithDepth(depth), WithParallelism(2), WithWait(mode))
			n := 10 * stage
			devA, devB := e.devbuf(t, n), e.devbuf(t, n)
			srcA, srcB := testutil.RandomBytes(n, 51), testutil.RandomBytes(n, 52)
			if _, err := devB.WriteAt(srcB, 0); err != nil {
				t.Fatal(err)
			}
			sh0 := cudadrv.Stream(c.lanes[0].stream.Handle())
			sh1 := cudadrv.Stream(c.lanes[1].stream.Handle())
			if err := e.d.HoldStream(sh0); err != nil {
				t.Fatal(err)
			}
			a := c.HtoDAsync(context.Background(), devA, srcA)
			waitPending(t, e.d, c.lanes[0].stream, depth)
			time.Sleep(20 * time.Millisecond) // lane 0's wait reaches its waiter
			if err := e.d.HoldStream(sh1); err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(100 * time.Millisecond)
				_ = e.d.ReleaseStream(sh1)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			gotB := make([]byte, n)
			if _, err := c.DtoH(ctx, gotB, devB); err != nil {
				t.Fatalf("transfer on lane 1 while lane 0 waits: %v", err)
			}
			testutil.CheckBytes(t, srcB, gotB)
			if err := e.d.ReleaseStream(sh0); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, srcA, e.deviceBytes(t, devA))
		})
	}
}

// TestFakeRetryAfterAbandon: a transfer retried after its first attempt
// timed out takes the other lane, and its copies run after the copies the
// first attempt left queued: the device ends with the retry's bytes.
func TestFakeRetryAfterAbandon(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const stage, depth = 64 << 10, 3
	c := e.copier(t, WithStageSize(stage), WithDepth(depth), WithParallelism(2))
	n := 2 * stage
	dev := e.devbuf(t, n)
	first, retry := testutil.RandomBytes(n, 61), testutil.RandomBytes(n, 62)
	sh := cudadrv.Stream(c.lanes[0].stream.Handle())
	if err := e.d.HoldStream(sh); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.HtoD(short, dev, first); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first attempt: %v, want context.DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.HtoD(context.Background(), dev, retry)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the retry finished (%v) before the first attempt's copies ran", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := e.d.ReleaseStream(sh); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, retry, e.deviceBytes(t, dev))
}

// TestFakeEnginePinsOnUse: a default Copier pins nothing in New; a 4 KiB
// round trip pins one small stage (1 MiB), and another pins nothing more;
// a 256 MiB round trip pins one ring (depth stages of the stage size)
// beside it (checkPinsOnUse). Every byte is checked; useFake checks that
// Close gave everything back.
func TestFakeEnginePinsOnUse(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	// Short runs leave out the 2 x 256 MiB through the fake.
	checkPinsOnUse(t, func() *Copier { return e.copier(t) }, func(n int) *cuda.DeviceBuffer { return e.devbuf(t, n) }, !testing.Short())
}

// TestFakeEngineSmallBesideAddPinned: a Copier that knows a pinned
// buffer (AddPinned) still moves a 4 KiB Go slice outside it through its
// small stage: the buffer says nothing of memory it does not hold, so no
// ring of 32 MiB stages is pinned for it.
func TestFakeEngineSmallBesideAddPinned(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	buf, err := pinmem.Alloc(1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	remove := c.AddPinned(buf)
	defer remove()
	base := pinmem.Stats().Pinned.Bytes
	dev := e.devbuf(t, 4<<10)
	src := testutil.RandomBytes(4<<10, 7)
	dst := make([]byte, 4<<10)
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DtoH(context.Background(), dst, dev); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, dst)
	if p := pinmem.Stats().Pinned.Bytes - base; p != smallStageSize {
		t.Fatalf("a 4 KiB round trip beside an AddPinned buffer pinned %d bytes, want one small stage of %d", p, smallStageSize)
	}
}

// TestFakeEnginePinFailure: a transfer whose stages the budget refuses
// fails with the budget's error and pins nothing; transfers of four
// Copiers sharing an engine, racing for a ring nobody can pin, all fail
// and none waits for stages nobody pins; with room for one stage a
// transfer runs on that one, and the engine pins no more (it does not
// try again for each transfer) until a Copier joins; a small transfer
// pins its small stage once the budget allows it.
func TestFakeEnginePinFailure(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := pinmem.Stats().Pinned.Bytes
	prev := pinmem.SetBudget(pinmem.Stats().Reserved + 4096)
	defer pinmem.SetBudget(prev)
	const stage, depth = 64 << 10, 3
	n := 10 * stage
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 71)
	bg := context.Background()
	def := e.copier(t)
	if _, err := def.HtoD(bg, dev, src[:4096]); !errors.Is(err, pinmem.ErrBudget) {
		t.Fatalf("4 KiB over the budget: %v, want pinmem.ErrBudget", err)
	}
	cps := make([]*Copier, 4)
	for i := range cps {
		cps[i] = e.copier(t, WithStageSize(stage), WithDepth(depth))
	}
	errs := make(chan error, 2*len(cps))
	for i := range cap(errs) {
		c := cps[i%len(cps)]
		go func() {
			_, err := c.HtoD(bg, dev, src)
			errs <- err
		}()
	}
	for range cap(errs) {
		select {
		case err := <-errs:
			if !errors.Is(err, pinmem.ErrBudget) || !strings.Contains(err.Error(), "staging buffer") {
				t.Errorf("ring transfer over the budget: %v, want pinmem.ErrBudget pinning a staging buffer", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a transfer waits for stages that nobody pins")
		}
	}
	if p := pinmem.Stats().Pinned.Bytes; p != base {
		t.Fatalf("%d bytes pinned after failed transfers, %d before", p, base)
	}
	// Room for one stage: the transfer runs on it.
	pinmem.SetBudget(pinmem.Stats().Reserved + stage + stage/2)
	if _, err := cps[0].HtoD(bg, dev, src); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
	pinmem.SetBudget(prev)
	if _, err := cps[0].HtoD(bg, dev, src); err != nil {
		t.Fatal(err)
	}
	if all, _ := cps[0].eng.stageCount(); all != 1 {
		t.Errorf("engine holds %d stages after a short pinning, want 1 until a Copier joins", all)
	}
	e.copier(t, WithStageSize(stage), WithDepth(depth))
	if _, err := cps[0].HtoD(bg, dev, src); err != nil {
		t.Fatal(err)
	}
	if all, _ := cps[0].eng.stageCount(); all != depth {
		t.Errorf("engine holds %d stages after a Copier joined, want %d", all, depth)
	}
	dst := make([]byte, 4096)
	if _, err := def.DtoH(bg, dst, dev); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src[:4096], dst)
}

// TestFakeEngineHandOver: a transfer waiting for the ring stages another
// is pinning is woken to pin them itself when that pinning ends with none
// (it failed, or its context ended), and gets them.
func TestFakeEngineHandOver(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, WithStageSize(64<<10), WithDepth(2))
	eng := c.eng
	eng.mu.Lock()
	eng.ring.growing = eng.target() // another borrower pins every stage
	eng.mu.Unlock()
	got := make(chan error, 1)
	go func() {
		ss, err := eng.take(context.Background(), 2)
		if err == nil && len(ss) != 2 {
			err = fmt.Errorf("took %d stages, want 2", len(ss))
		}
		eng.give(ss)
		got <- err
	}()
	awaitWaiters(t, eng, 1, "the transfer waiting for the stages being pinned")
	eng.mu.Lock()
	eng.ring.growing = 0 // that pinning ended with none
	eng.handOver(&eng.ring)
	eng.mu.Unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken to pin the stages")
	}
	if all, _ := eng.stageCount(); all != 2 {
		t.Errorf("engine holds %d stages, want 2", all)
	}
}

// holdPinning makes the next pinning of host memory (cuMemHostAlloc or
// cuMemHostRegister_v2) wait until the returned function is called with
// the result it ends with; entered is closed once it waits.
func holdPinning(e fakeEnv) (entered <-chan struct{}, end func(cudadrv.Result)) {
	in, out := make(chan struct{}), make(chan cudadrv.Result, 1)
	var once sync.Once
	e.d.SetHook(func(op string) cudadrv.Result {
		if op != "cuMemHostAlloc" && op != "cuMemHostRegister_v2" {
			return cudadrv.Success
		}
		held := false
		once.Do(func() { held = true })
		if !held {
			return cudadrv.Success
		}
		close(in)
		return <-out
	})
	return in, func(r cudadrv.Result) { out <- r }
}

// TestFakeEngineOneStagePinWakesWaiter: a one-stage transfer pinning the
// last ring stage the engine may pin (tryTake), while a ring transfer
// waits for it, leaves the waiter neither without the stage it pinned
// (tryTake, which yields to a waiter, hands it over) nor waiting for a
// pinning that failed with no stage there (the waiter is woken to pin it
// itself).
func TestFakeEngineOneStagePinWakesWaiter(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  cudadrv.Result
	}{{"pinned", cudadrv.Success}, {"failed", cudadrv.ErrorOutOfMemory}} {
		t.Run(tc.name, func(t *testing.T) {
			e := useFake(t, fakedrv.Options{})
			c := e.copier(t, WithStageSize(64<<10), WithDepth(1))
			eng := c.eng
			entered, end := holdPinning(e)
			defer e.d.SetHook(nil)
			took := make(chan *stage, 1)
			go func() { s, _ := eng.tryTake(context.Background(), false); took <- s }()
			<-entered
			got := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			go func() {
				ss, err := eng.take(ctx, 1)
				if err == nil && len(ss) != 1 {
					err = fmt.Errorf("took %d stages, want 1", len(ss))
				}
				eng.give(ss)
				got <- err
			}()
			awaitWaiters(t, eng, 1, "the ring transfer waiting for the stage being pinned")
			end(tc.end)
			if s := <-took; s != nil {
				t.Error("tryTake took a stage while a ring transfer waited")
				eng.give([]*stage{s})
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiting ring transfer: %v", err)
			}
			if all, _ := eng.stageCount(); all != 1 {
				t.Errorf("engine holds %d stages, want 1", all)
			}
		})
	}
}

// TestFakeEngineWaitsForStagePinning: under a budget with room for one
// stage, a ring transfer whose own pinning is refused while another
// transfer is still pinning the engine's first stage waits for that
// stage instead of failing with the budget's error.
func TestFakeEngineWaitsForStagePinning(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	const size = 64 << 10
	c := e.copier(t, WithStageSize(size), WithDepth(2))
	eng := c.eng
	prev := pinmem.SetBudget(pinmem.Stats().Reserved + size + size/2)
	defer pinmem.SetBudget(prev)
	rejected := pinmem.Stats().BudgetRejections
	entered, end := holdPinning(e)
	defer e.d.SetHook(nil)
	bg := context.Background()
	first := make(chan []*stage, 1)
	go func() {
		ss, err := eng.take(bg, 1)
		if err != nil {
			t.Errorf("the transfer pinning the stage: %v", err)
		}
		first <- ss
	}()
	<-entered
	second := make(chan error, 1)
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	go func() {
		ss, err := eng.take(ctx, 1)
		if err == nil && len(ss) != 1 {
			err = fmt.Errorf("took %d stages, want 1", len(ss))
		}
		eng.give(ss)
		second <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		select {
		case err := <-second:
			end(cudadrv.Success)
			eng.give(<-first)
			t.Fatalf("the transfer refused a stage while another was pinning one: %v", err)
		default:
		}
		q := waiterCount(eng)
		if q == 2 && pinmem.Stats().BudgetRejections > rejected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second transfer's pinning was not refused")
		}
	}
	end(cudadrv.Success)
	eng.give(<-first)
	if err := <-second; err != nil {
		t.Fatalf("the transfer waiting for the stage being pinned: %v", err)
	}
	if all, _ := eng.stageCount(); all != 1 {
		t.Errorf("engine holds %d stages, want 1", all)
	}
}

// TestFakeEngineFillFailureWakesWaiter: a Pipeline's pinning of its
// stages (fill) that fails with none there wakes a Run of another
// Pipeline of the engine waiting for those stages, to pin them itself.
func TestFakeEngineFillFailureWakesWaiter(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	o := options{stageSize: 64 << 10, depth: 2, parallelism: 1}
	eng := joinEngine(e.ctx, o, true)
	if eng2 := joinEngine(e.ctx, o, true); eng2 != eng {
		t.Fatal("two Pipelines of one context and chunk size do not share an engine")
	}
	members := []bool{true, true}
	defer func() {
		for i := range members {
			if _, err := eng.leave(&members[i]); err != nil {
				t.Error(err)
			}
		}
	}()
	entered, end := holdPinning(e)
	defer e.d.SetHook(nil)
	filled := make(chan error, 1)
	go func() { filled <- eng.fill(context.Background(), o.depth) }()
	<-entered
	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		ss, err := eng.take(ctx, o.depth)
		if err == nil && len(ss) == 0 {
			err = errors.New("took no stage")
		}
		eng.give(ss)
		got <- err
	}()
	awaitWaiters(t, eng, 1, "the Run waiting for the stages being pinned")
	end(cudadrv.ErrorOutOfMemory)
	if err := <-filled; err == nil {
		t.Error("fill with its first pinning refused: no error")
	}
	if err := <-got; err != nil {
		t.Fatalf("the Run waiting for the stages: %v", err)
	}
}

// TestFakeEngineCloseRacingFirstPin: Close while a Copier's first
// transfer is pinning its stage returns at its context's end (the Copier
// is closed: later calls fail with ErrClosed); the transfer completes
// with every byte, and the stage is released once it did, unless a
// Copier that joined the engine meanwhile still uses it: that one's
// transfers run on it, and its Close releases it.
func TestFakeEngineCloseRacingFirstPin(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := pinmem.Stats().Pinned
	bg := context.Background()
	for _, joins := range []bool{false, true} {
		a, err := New(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 4 << 10
		dev := e.devbuf(t, n)
		src := testutil.RandomBytes(n, 5)
		entered, end := holdPinning(e)
		done := make(chan error, 1)
		go func() {
			_, err := a.HtoD(bg, dev, src)
			done <- err
		}()
		<-entered
		var b *Copier
		if joins {
			b = e.copier(t)
		}
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		err = a.Close(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close while the first transfer pins: %v, want context.DeadlineExceeded", err)
		}
		if _, err := a.HtoD(bg, dev, src); !errors.Is(err, ErrClosed) {
			t.Fatalf("HtoD after Close: %v, want ErrClosed", err)
		}
		end(cudadrv.Success)
		e.d.SetHook(nil)
		if err := <-done; err != nil {
			t.Fatalf("the transfer that was pinning: %v", err)
		}
		testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
		// The release Close left to the background is done once a second
		// Close returns: the leak check at the end does not race it.
		if err := a.Close(bg); err != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("Close once the transfer completed: %v", err)
		}
		if joins {
			eng := b.eng
			got := make([]byte, n)
			if _, err := b.DtoH(bg, got, dev); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, src, got)
			eng.mu.Lock()
			small := len(eng.small.all)
			eng.mu.Unlock()
			if small != 1 {
				t.Errorf("the Copier that joined uses %d small stages, want the one pinned before (1)", small)
			}
			if err := b.Close(bg); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); pinmem.Stats().Pinned != base; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("joins %v: %+v pinned once every Copier closed, %+v before", joins, pinmem.Stats().Pinned, base)
			}
		}
	}
}

// TestFakeEngineFirstTransfersLedger: 16 goroutines on four default
// Copiers start at once with transfers of every path (small stage, one
// stage, ring), some cancelled mid-flight: the engine pins at most two
// rings and a small stage per lane, every byte of the transfers that
// succeed arrives, and pinmem's ledger counts exactly the stages the
// engine holds.
func TestFakeEngineFirstTransfersLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("moves about 1 GiB through the fake")
	}
	e := useFake(t, fakedrv.Options{})
	base := pinmem.Stats().Pinned
	const copiers, workers = 4, 16
	cps := make([]*Copier, copiers)
	for i := range cps {
		cps[i] = e.copier(t)
	}
	eng := cps[0].eng
	sizes := []int{1, 4 << 10, smallStageSize, smallStageSize + 1, 4 << 20, DefaultStageSize + 1}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range workers {
		c := cps[g%copiers]
		dev := e.devbuf(t, DefaultStageSize+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range 6 {
				n := sizes[(g+i)%len(sizes)]
				src := testutil.RandomBytes(n, uint64(g*16+i))
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%3 == 0 {
					time.AfterFunc(time.Duration(g*50)*time.Microsecond, cancel)
				}
				_, err := c.HtoD(ctx, dev, src)
				cancel()
				if errors.Is(err, context.Canceled) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, n)
				if _, err := c.DtoH(context.Background(), got, dev); err != nil {
					t.Error(err)
					return
				}
				testutil.CheckBytes(t, src, got)
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, c := range cps {
		if err := c.Fence(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// The drains give the stages back after Fence returns: wait for them.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		eng.mu.Lock()
		ring, small := len(eng.ring.all), len(eng.small.all)
		idle := len(eng.ring.idle) + len(eng.small.idle)
		eng.mu.Unlock()
		if idle == ring+small {
			p := pinmem.Stats().Pinned
			if p.Bytes-base.Bytes != int64(ring*DefaultStageSize+small*smallStageSize) || p.Buffers-base.Buffers != int64(ring+small) {
				t.Errorf("ledger %+v (%+v before), engine %d ring and %d small stages", p, base, ring, small)
			}
			if ring > 2*DefaultDepth || small > copiers*lanesOwn {
				t.Errorf("engine holds %d ring and %d small stages, want at most %d and %d", ring, small, 2*DefaultDepth, copiers*lanesOwn)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stages idle once every transfer ended", idle, ring+small)
		}
	}
}

// TestFakeEngineSmallTransfersBusyLanes: eight goroutines moving only
// 4 KiB transfers through one default Copier, more than its lanes, pin
// no more than a small stage per lane: a transfer finding both lanes
// busy waits for one and takes a small stage, as route says, not a 32 MiB
// ring stage. Every byte is checked.
func TestFakeEngineSmallTransfersBusyLanes(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := pinmem.Stats().Pinned.Bytes
	c := e.copier(t)
	const n, workers, rounds = 4 << 10, 8, 50
	var wg sync.WaitGroup
	for g := range workers {
		dev := e.devbuf(t, n)
		wg.Go(func() {
			got := make([]byte, n)
			for i := range rounds {
				src := testutil.RandomBytes(n, uint64(g*rounds+i))
				if _, err := c.HtoD(context.Background(), dev, src); err != nil {
					t.Error(err)
					return
				}
				if _, err := c.DtoH(context.Background(), got, dev); err != nil {
					t.Error(err)
					return
				}
				testutil.CheckBytes(t, src, got)
			}
		})
	}
	wg.Wait()
	if p, most := pinmem.Stats().Pinned.Bytes-base, int64(lanesOwn*smallStageSize); p > most {
		t.Errorf("%d goroutines moving 4 KiB transfers pinned %d bytes, want at most %d (a small stage per lane)", workers, p, most)
	}
}

// awaitWaiters waits up to 5 s until n transfers wait for eng's stages,
// else fails the test naming what.
func awaitWaiters(t *testing.T, eng *engine, n int, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); waiterCount(eng) != n; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d waiters, want %d", what, waiterCount(eng), n)
		}
	}
}

// waiterCount returns how many transfers wait for eng's stages.
func waiterCount(eng *engine) int {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	return len(eng.ring.waiters)
}

// TestFakeEngineSmallStageUnderBudget: under a budget with room for one
// small stage, held by a 4 KiB transfer on one lane, a 4 KiB transfer on
// the other lane waits for that stage (the stages there, as Copier says)
// instead of failing with the budget's error, and pins nothing more.
func TestFakeEngineSmallStageUnderBudget(t *testing.T) {
	e := quickFake(t)
	base := pinmem.Stats().Pinned.Bytes
	c := e.copier(t)
	const n = 4 << 10
	devA, devB := e.devbuf(t, n), e.devbuf(t, n)
	srcA, srcB := testutil.RandomBytes(n, 41), testutil.RandomBytes(n, 42)
	bg := context.Background()
	if _, err := c.HtoD(bg, devA, srcA); err != nil { // pins the small stage
		t.Fatal(err)
	}
	prev := pinmem.SetBudget(pinmem.Stats().Reserved + smallStageSize/2) // not one more small stage
	defer pinmem.SetBudget(prev)
	release := holdLanes(t, e, c)
	a := c.HtoDAsync(bg, devA, srcA)
	for deadline := time.Now().Add(5 * time.Second); e.d.Pending(cudadrv.Stream(c.lanes[0].stream.Handle()))+e.d.Pending(cudadrv.Stream(c.lanes[1].stream.Handle())) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first transfer queued nothing")
		}
	}
	ctx, cancel := context.WithTimeout(bg, 2*time.Second)
	defer cancel()
	b := c.HtoDAsync(ctx, devB, srcB)
	select {
	case <-b.Done():
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if _, err := b.Wait(bg); err != nil {
		t.Fatalf("a 4 KiB transfer while the only small stage is busy, under the budget: %v", err)
	}
	if _, err := a.Wait(bg); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, srcA, e.deviceBytes(t, devA))
	testutil.CheckBytes(t, srcB, e.deviceBytes(t, devB))
	if p := pinmem.Stats().Pinned.Bytes - base; p != smallStageSize {
		t.Errorf("pinned %d bytes, want the one small stage of %d", p, smallStageSize)
	}
}
