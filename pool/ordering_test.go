package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// orderingCase runs the scenario once: with the stream held (by
// hold), queue an asynchronous H2D copy of a block filled with want, Put
// the block with the stream, immediately Get a block of the same size and
// overwrite it, release the stream, synchronize and read the device memory
// back. reused says whether the second Get returned the first block's memory.
//
// While the stream is held only work that cannot synchronize the device
// may run, or the host thread blocks until spin_wait times out and the
// stream was never really held: no device allocation or memset, no
// synchronous copy, nothing on the legacy default stream, and no pinning
// or unpinning (cuMemHostAlloc, cuMemHostRegister, cuMemFreeHost and
// cuMemHostUnregister can wait for the device). So the device buffer is
// allocated and cleared first, and the pool is warmed with two idle
// blocks of the size before the hold: both Gets are then hits, served
// with no driver call (the ordered Put records an event, which does not
// synchronize). The case fails if the pool pinned or unpinned anything
// while the stream was held.
func orderingCase(t *testing.T, p *Pool, ctx *cuda.Context, s *cuda.Stream, size int, seed uint64, hold, release func()) (reused bool, got, want, over []byte) {
	t.Helper()
	dbuf, err := ctx.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dbuf.Free(); err != nil {
			t.Error(err)
		}
	}()
	if err := dbuf.Memset(0); err != nil {
		t.Fatal(err)
	}
	want = testutil.RandomBytes(size, seed)
	over = testutil.RandomBytes(size, seed^0xdead)
	// Two idle blocks of the size: the first Get takes one, the second
	// Get the other (ordered) or the first again (unordered).
	w1, w2 := mustGet(t, p, size), mustGet(t, p, size)
	mustPut(t, p, w1)
	mustPut(t, p, w2)
	before := p.Stats()
	hold()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	b := mustGet(t, p, size)
	copy(b.Bytes(), want)
	mem := b.Bytes()
	if err := s.CopyHtoD(dbuf, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b, s)
	b2 := mustGet(t, p, size)
	reused = sameMem(mem, b2.Bytes())
	copy(b2.Bytes(), over)
	during := p.Stats()
	release()
	released = true
	if during.Misses != before.Misses || during.Pins != before.Pins || during.Unpins != before.Unpins {
		t.Errorf("size %d: the pool pinned or unpinned memory while the stream was held (misses %d -> %d, pins %d -> %d, unpins %d -> %d): that may synchronize the device",
			size, before.Misses, during.Misses, before.Pins, during.Pins, before.Unpins, during.Unpins)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, size)
	if _, err := dbuf.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b2)
	return reused, got, want, over
}

// checkOrdering asserts the outcome: with ordering the device holds the
// original data; without it the overwrite reached the device, which shows
// that the test detects unordered reuse.
func checkOrdering(t *testing.T, ordered bool, size int, reused bool, got, want, over []byte) {
	t.Helper()
	if ordered {
		if reused {
			t.Errorf("size %d: the block was handed out again while a copy from it was queued", size)
		}
		testutil.CheckBytes(t, want, got)
		return
	}
	if !reused {
		t.Fatalf("size %d: with ordering off the pool did not hand the same block back: the test cannot show the corruption", size)
	}
	if testutil.FirstMismatch(want, got) < 0 {
		t.Fatalf("size %d: with ordering off the device still holds the original data: the test does not detect unordered reuse", size)
	}
	testutil.CheckBytes(t, over, got) // the overwrite, not a mix: the copy ran after it
}

// TestStreamOrderedReuseFake is the ordering test on the fake driver,
// whose held stream keeps the queued copy from running: with ordering on,
// the device gets the original data; switched off, it gets the overwrite.
func TestStreamOrderedReuseFake(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(map[bool]string{true: "ordered", false: "unordered"}[ordered], func(t *testing.T) {
			d := useFake(t)
			p := newPool(t)
			p.s.unordered = !ordered
			ctx, s := newStream(t)
			hold := func() {
				if err := d.HoldStream(fakeStream(s)); err != nil {
					t.Fatal(err)
				}
			}
			release := func() {
				if err := d.ReleaseStream(fakeStream(s)); err != nil {
					t.Fatal(err)
				}
			}
			r := rand.New(rand.NewPCG(4, 4))
			sizes := []int{100, 4 << 10, 1 << 20, 6<<20 + 5, HugeThreshold + 4097}
			random := 6
			if testing.Short() { // a slab and a large size (huge ones take seconds)
				sizes, random = []int{100, 1 << 20}, 1
			}
			for range random {
				sizes = append(sizes, 1+int(r.Int64N(2<<20)))
			}
			for i, size := range sizes {
				reused, got, want, over := orderingCase(t, p, ctx, s, size, uint64(i), hold, release)
				checkOrdering(t, ordered, size, reused, got, want, over)
			}
			if errs := d.AsyncErrors(); len(errs) != 0 {
				t.Errorf("asynchronous errors: %v", errs)
			}
			st := p.Stats()
			if ordered && (st.OrderedPuts != uint64(len(sizes)) || st.EventsCreated == 0) {
				t.Errorf("stats: %v", st)
			}
			if !ordered && (st.OrderedPuts != 0 || st.EventsCreated != 0) {
				t.Errorf("stats with ordering off: %v", st)
			}
		})
	}
}

// TestOrderedPutStreams follows one block Put with two streams through its
// events: it is reused only once both have finished, and events are reused.
func TestOrderedPutStreams(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	_, s1 := newStream(t)
	_, s2 := newStream(t)
	if err := d.HoldStream(fakeStream(s1)); err != nil {
		t.Fatal(err)
	}
	b := mustGet(t, p, 1<<20)
	mem := b.Bytes()
	mustPut(t, p, b, s1, s2, s1) // s1 twice: one event
	if s := p.Stats(); s.EventsOutstanding != 2 || s.PendingBlocks != 1 || s.PendingBytes != 1<<20 || s.EventsCreated != 2 {
		t.Fatalf("after an ordered Put: %v", s)
	}
	x := mustGet(t, p, 1<<20)
	if sameMem(mem, x.Bytes()) {
		t.Fatal("block reused before s1 finished")
	}
	if err := d.ReleaseStream(fakeStream(s1)); err != nil {
		t.Fatal(err)
	}
	y := mustGet(t, p, 1<<20)
	if !sameMem(mem, y.Bytes()) {
		t.Error("block not reused after both streams finished")
	}
	if s := p.Stats(); s.EventsOutstanding != 0 || s.PendingBlocks != 0 {
		t.Errorf("%v", s)
	}
	mustPut(t, p, x)
	mustPut(t, p, y)
	// Events are pooled: many ordered cycles need no more than two
	// blocks' worth (one pending while the other is out).
	for range 50 {
		mustPut(t, p, mustGet(t, p, 1<<20), s1, s2)
	}
	if s := p.Stats(); s.EventsCreated > 4 || s.OrderedPuts != 51 {
		t.Errorf("events not reused: %v", s)
	}
	// Trim destroys spare events; Close destroys the rest.
	if _, err := p.Trim(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestOrderedPutPollsOlderBlocks: Puts (not only Gets) notice finished blocks.
func TestOrderedPutPollsOlderBlocks(t *testing.T) {
	useFake(t)
	p := newPool(t)
	_, s := newStream(t)
	a, b := mustGet(t, p, 4096), mustGet(t, p, 4096)
	mustPut(t, p, a, s)
	mustPut(t, p, b, s) // polls a's event, which has completed
	if st := p.Stats(); st.PendingBlocks != 1 || st.EventsOutstanding != 1 {
		t.Errorf("%v", st)
	}
}

// When no event can be recorded, Put does not wait: the block waits for
// its stream to be idle, found by polling as events are.
func TestRecordFailure(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	cc, s := newStream(t)
	dev, err := cc.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	b := mustGet(t, p, 1<<20)
	mem := b.Bytes()
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyHtoD(dev, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := d.FailOn("cuEventRecord", 1, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	put := make(chan error, 1)
	go func() { put <- p.Put(b, s) }()
	select {
	case err := <-put:
		if err != nil {
			t.Fatalf("Put with a failed record: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Put with a failed record waits for the held stream")
	}
	if st := p.Stats(); st.EventErrors != 1 || st.PendingBlocks != 1 {
		t.Errorf("after a failed record: %v", st)
	}
	c := mustGet(t, p, 1<<20)
	if sameMem(mem, c.Bytes()) {
		t.Error("a block whose stream work is queued was reused")
	}
	if err := d.ReleaseStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	e := mustGet(t, p, 1<<20) // polls the stream, now idle
	if !sameMem(mem, e.Bytes()) {
		t.Error("the block was not reused once its stream was idle")
	}
	mustPut(t, p, c)
	mustPut(t, p, e)
}

func TestQueryFailureKeepsBlockPending(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	_, s := newStream(t)
	b := mustGet(t, p, 1<<20)
	mem := b.Bytes()
	mustPut(t, p, b, s)
	if err := d.FailOn("cuEventQuery", 0, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	c := mustGet(t, p, 1<<20)
	if sameMem(mem, c.Bytes()) {
		t.Error("reused a block whose event query failed")
	}
	if st := p.Stats(); st.EventErrors == 0 || st.PendingBlocks != 1 {
		t.Errorf("%v", st)
	}
	d.ClearFaults()
	mustPut(t, p, c)
}

// TestCloseWaitsForStreamWork: Close unpins a pending block only after
// its stream work has run, and a block Put after Close with stream work is
// unpinned once that work has run.
func TestCloseWaitsForStreamWork(t *testing.T) {
	d := useFake(t)
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, s := newStream(t)
	dbuf, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dbuf.Free()
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	a := mustGet(t, p, 1<<20)
	out := mustGet(t, p, 2<<20)
	if err := s.CopyHtoD(dbuf, 0, a.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, a, s)
	// The stream is released once Close has found its work not finished
	// (its first event query): Close must not return before that.
	polled := make(chan struct{}, 1)
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuEventQuery" {
			select {
			case polled <- struct{}{}:
			default:
			}
		}
		return cudadrv.Success
	})
	var released atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		<-polled
		released.Store(true)
		_ = d.ReleaseStream(fakeStream(s))
	})
	err = p.Close(context.Background())
	if !errors.Is(err, ErrOutstanding) {
		t.Errorf("Close: %v", err)
	}
	if !released.Load() {
		t.Error("Close returned before the stream's work ran")
	}
	wg.Wait()
	d.SetHook(nil)
	if errs := d.AsyncErrors(); len(errs) != 0 {
		t.Errorf("a copy ran from unpinned memory: %v", errs)
	}
	// Put after Close, with stream work: unpinned once it has run (Put
	// polls without waiting; Close waits).
	if err := s.CopyHtoD(dbuf, 0, out.Bytes()[:1<<20]); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, out, s)
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.EventsOutstanding != 0 || st.PendingBlocks != 0 {
		t.Errorf("after Close: %v", st)
	}
}

// TestConcurrentStress runs many goroutines getting, filling, checking and
// putting blocks (some stream-ordered) while others trim, reclaim and read
// stats; run it with -race. A block handed to two goroutines at once shows
// as a changed fill.
func TestConcurrentStress(t *testing.T) {
	useFake(t)
	p := newPool(t, WithMaxCached(8<<20))
	_, s1 := newStream(t)
	_, s2 := newStream(t)
	goroutines, iters := 8, 400
	if testing.Short() {
		iters = 100
	}
	type held struct {
		b   *Block
		tag byte
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = p.Stats().String()
			_ = p.s.Reclaim(1 << 20)
			if _, err := p.Trim(context.Background()); err != nil {
				t.Error(err)
			}
			runtime.Gosched()
		}
	})
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 99))
			var hs []held
			put := func(i int) {
				h := hs[i]
				hs = append(hs[:i], hs[i+1:]...)
				for j, v := range h.b.Bytes() {
					if v != h.tag {
						t.Errorf("goroutine %d: block %d byte %d is %d, want %d: the block was shared", g, h.b.ID(), j, v, h.tag)
						break
					}
				}
				var err error
				switch r.IntN(3) {
				case 0:
					err = p.Put(h.b)
				case 1:
					err = p.Put(h.b, s1)
				default:
					err = p.Put(h.b, s2, s1)
				}
				if err != nil {
					t.Error(err)
				}
			}
			for i := range iters {
				size := 1 + r.IntN(16<<10)
				if r.IntN(10) == 0 {
					size = 1 + r.IntN(3<<20)
				}
				b, err := p.Get(context.Background(), size)
				if err != nil {
					t.Error(err)
					return
				}
				tag := byte(g*53 + i)
				fill(b.Bytes(), tag)
				hs = append(hs, held{b, tag})
				if len(hs) > 6 || r.IntN(2) == 0 {
					put(r.IntN(len(hs)))
				}
			}
			for len(hs) > 0 {
				put(0)
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	st := p.Stats()
	if st.InUseBlocks != 0 || st.Gets != st.Puts || st.Gets != uint64(goroutines*iters) || st.RequestedBytes != 0 || st.InUseBytes != 0 {
		t.Errorf("after the stress: %v", st)
	}
	if st.Hits == 0 || st.OrderedPuts == 0 {
		t.Errorf("the stress did not exercise hits and ordered puts: %v", st)
	}
	t.Log(st)
}

// A Get that may take a block of a larger class (wasting at most 1/8)
// also polls that class's stream-ordered blocks: one whose work has run
// is reused, not left pending while the Get pins new memory.
func TestGetPollsLargerClassPending(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	_, s := newStream(t)
	a := mustGet(t, p, 1152<<10) // class 1152 KiB
	mem := a.Bytes()
	mustPut(t, p, a)
	b := mustGet(t, p, 1<<20) // class 1 MiB is empty: takes the 1152 KiB block
	if !sameMem(mem, b.Bytes()) {
		t.Fatalf("Get(1 MiB) did not take the idle 1152 KiB block: %v", p.Stats())
	}
	mustPut(t, p, b, s) // the stream has no work: done at once
	pins := d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2")
	c := mustGet(t, p, 1<<20)
	if n := d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2"); !sameMem(mem, c.Bytes()) || n != pins {
		t.Errorf("Get(1 MiB) pinned %d times rather than reuse the finished 1152 KiB block: %v", n-pins, p.Stats())
	}
	mustPut(t, p, c)
	if st := p.Stats(); st.PendingBlocks != 0 {
		t.Errorf("a finished block stays pending: %v", st)
	}
}
