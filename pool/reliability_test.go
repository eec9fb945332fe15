package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/track"
)

// noPanic runs f and reports a panic as a test failure.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v\n%s", what, r, debug.Stack())
		}
	}()
	f()
}

// TestNilAndForeign: every method of a nil *Pool, a zero Pool and a nil
// *Block, and Put of a nil, foreign or returned block, returns a typed
// error (or a zero value) and never panics.
func TestNilAndForeign(t *testing.T) {
	useFake(t)
	bg := context.Background()
	for _, tc := range []struct {
		name string
		p    *Pool
	}{{"nil", nil}, {"zero", &Pool{}}} {
		p := tc.p
		noPanic(t, tc.name+" Get", func() {
			if b, err := p.Get(context.Background(), 10); b != nil || !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Get: %v, %v", tc.name, b, err)
			}
		})
		noPanic(t, tc.name+" Put", func() {
			if err := p.Put(&Block{}); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Put: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Trim", func() {
			if _, err := p.Trim(context.Background()); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Trim: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Close", func() {
			if err := p.Close(bg); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s pool: Close: %v", tc.name, err)
			}
		})
		noPanic(t, tc.name+" Stats", func() {
			if s := p.Stats(); s != (Stats{}) {
				t.Errorf("%s pool: Stats %v", tc.name, s)
			}
		})
		noPanic(t, tc.name+" Name/Flags", func() {
			if p.Name() != "" || p.Flags() != 0 {
				t.Errorf("%s pool: name %q, flags %v", tc.name, p.Name(), p.Flags())
			}
		})
	}
	for _, tc := range []struct {
		name string
		b    *Block
	}{{"nil", nil}, {"zero", &Block{}}} {
		b := tc.b
		noPanic(t, tc.name+" block", func() {
			if b.Bytes() != nil || b.Segments() != nil || b.Len() != 0 || b.Cap() != 0 || b.ID() != 0 {
				t.Errorf("%s block: %v %v %d %d %d", tc.name, b.Bytes(), b.Segments(), b.Len(), b.Cap(), b.ID())
			}
			if _, err := b.DevicePtr(); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s block: DevicePtr: %v", tc.name, err)
			}
		})
	}

	p, q := newPool(t), newPool(t)
	b := mustGet(t, p, 100)
	noPanic(t, "Put misuse", func() {
		if err := p.Put(nil); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put(nil): %v", err)
		}
		if err := p.Put(&Block{}); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put of a zero block: %v", err)
		}
		if err := q.Put(b); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Put into another pool: %v", err)
		}
		mustPut(t, p, b)
		if err := p.Put(b); !errors.Is(err, pinmem.ErrFreed) {
			t.Errorf("second Put: %v", err)
		}
		//lint:ignore SA1012 a nil context is the input under test
		if err := p.Close(nil); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Close(nil): %v", err)
		}
	})
	// The refused calls changed nothing: the pool still works.
	mustPut(t, p, mustGet(t, p, 100))
	if s := p.Stats(); s.Gets != 2 || s.Puts != 2 || s.InUseBlocks != 0 {
		t.Errorf("after the misuse: %v", s)
	}
}

// TestCloseBoundedByContext: with the stream of a block Put with stream
// work held (a hung GPU), Close returns by its context's deadline with an
// error matching context.DeadlineExceeded; the pool is then closed, the
// pending block stays pinned, a Put after Close does not wait either, and
// a later Close finishes once the stream has run.
func TestCloseBoundedByContext(t *testing.T) {
	d := useFakeOpts(t, fakedrv.Options{WaitTimeout: 3 * time.Second})
	p := newPool(t)
	ctx, s := newStream(t)
	dbuf, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dbuf.Free()
	a, b := mustGet(t, p, 1<<20), mustGet(t, p, 1<<20)
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			_ = d.ReleaseStream(fakeStream(s))
		}
	}()
	if err := s.CopyHtoD(dbuf, 0, a.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, a, s)

	cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = p.Close(cctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took > 10*50*time.Millisecond {
		t.Fatalf("Close with a held stream: %v after %v; want context.DeadlineExceeded by the 50ms deadline", err, took)
	}
	if !errors.Is(err, ErrOutstanding) {
		t.Errorf("Close did not report the block still out: %v", err)
	}
	st := p.Stats()
	if st.PendingBlocks != 1 || st.PinnedBytes < 1<<20 {
		t.Errorf("after the expired Close the pending block must stay pinned: %v", st)
	}
	if _, err := p.Get(context.Background(), 10); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after an expired Close: %v", err)
	}
	// A Put after Close with held stream work does not wait for it.
	if err := s.CopyHtoD(dbuf, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := p.Put(b, s); err != nil || time.Since(start) > 500*time.Millisecond {
		t.Errorf("Put after Close with a held stream: %v after %v", err, time.Since(start))
	}
	if err := d.ReleaseStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	released = true
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("Close after the stream ran: %v", err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.PendingBlocks != 0 || st.EventsOutstanding != 0 {
		t.Errorf("after the last Close: %v", st)
	}
	if err := p.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Close of a closed pool: %v", err)
	}
	if errs := d.AsyncErrors(); len(errs) != 0 {
		t.Errorf("a copy ran from unpinned memory: %v", errs)
	}
}

// TestDroppedPool: a Pool dropped without Close is reported
// (track.Dropped("pool")) and the idle memory it cached is unpinned.
func TestDroppedPool(t *testing.T) {
	d := useFake(t)
	before := track.DroppedCounts()["pool"]
	func() {
		p, err := New(WithName("dropped"))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{100, 1 << 20, HugeThreshold + 1} {
			mustPut(t, p, mustGet(t, p, n))
		}
		if p.Stats().PinnedBytes == 0 {
			t.Fatal("nothing cached")
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		c := d.Live()
		if track.DroppedCounts()["pool"] > before && c.HostAllocs == 0 && c.Registrations == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dropped pool: %d reported (was %d), driver still holds %+v", track.DroppedCounts()["pool"], before, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := track.DroppedCounts()["pool"]; got != before+1 {
		t.Errorf("%d pools reported dropped, want %d", got, before+1)
	}
}

// TestDroppedPoolKeepsBusyMemory: memory a dropped pool cannot know to be
// unused (a block still out, a block whose stream work has not run) stays
// pinned and valid.
func TestDroppedPoolKeepsBusyMemory(t *testing.T) {
	d := useFake(t)
	_, s := newStream(t)
	before := track.DroppedCounts()["pool"]
	var out, pend *Block
	var st *state
	func() {
		p, err := New()
		if err != nil {
			t.Fatal(err)
		}
		st = p.s
		out = mustGet(t, p, 1<<20)
		pend = mustGet(t, p, 2<<20)
		mustPut(t, p, mustGet(t, p, 4<<20)) // idle: released
		if err := d.HoldStream(fakeStream(s)); err != nil {
			t.Fatal(err)
		}
		mustPut(t, p, pend, s)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for track.DroppedCounts()["pool"] == before || st.stats().CachedBytes != 0 {
		runtime.GC()
		if time.Now().After(deadline) {
			t.Fatalf("dropped pool not reported: %v", st.stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fill(out.Bytes(), 3) // still valid
	if got := st.stats(); got.PinnedBytes != 3<<20 || got.PendingBlocks != 1 || got.InUseBlocks != 1 {
		t.Errorf("dropped pool with a block out and one pending: %v", got)
	}
	if err := d.ReleaseStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	// The test holds the state: give the block back; it and the pending
	// block, whose work has run, are unpinned.
	if err := st.put(out); err != nil {
		t.Error(err)
	}
	if err := st.close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
		t.Error(err)
	}
	if got := st.stats(); got.PinnedBytes != 0 || got.PendingBlocks != 0 {
		t.Errorf("after the last Put: %v", got)
	}
}

// TestFailedReleaseKeepsBooks: when unpinning an idle slab fails, the
// pool keeps counting the memory the driver still holds and releases it
// on the next Trim.
func TestFailedReleaseKeepsBooks(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	b := mustGet(t, p, 1000)
	mem := b.Bytes()
	mustPut(t, p, b)
	if err := d.FailOn("cuMemFreeHost", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	ledger := pinmem.Stats().Pinned.Bytes
	if _, err := p.Trim(context.Background()); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("Trim with cuMemFreeHost failing: %v", err)
	}
	held := int64(d.Live().HostAllocBytes)
	if held == 0 {
		t.Fatal("the driver released the slab although its release failed")
	}
	if pinmem.Stats().Pinned.Bytes != ledger {
		// pinmem forgot the buffer whose release failed: the pool cannot
		// retry it. Free the driver's memory so that the leak check passes.
		_ = d.MemFreeHost(hostptr.PtrOf(mem))
		t.Fatalf("the ledger dropped to %d from %d although the driver still holds %d bytes", pinmem.Stats().Pinned.Bytes, ledger, held)
	}
	st := p.Stats()
	if st.PinnedBytes != held || st.ReleaseErrors != 1 || st.UnreleasedBytes != held {
		t.Errorf("driver holds %d bytes, the pool says pinned %d, unreleased %d, release errors %d", held, st.PinnedBytes, st.UnreleasedBytes, st.ReleaseErrors)
	}
	if freed, err := p.Trim(context.Background()); err != nil || freed != held {
		t.Errorf("second Trim freed %d: %v", freed, err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.UnreleasedBytes != 0 || d.Live().HostAllocBytes != 0 {
		t.Errorf("after the retry: %v, driver %+v", st, d.Live())
	}
}

// TestBudgetUnderConcurrentGets: many goroutines Get and Put under a
// budget far smaller than their demand. The driver is capped at the
// budget, so pinning beyond it would fail there with out-of-memory; the
// only failures are the typed budget error, some callers get it, and
// nothing deadlocks.
func TestBudgetUnderConcurrentGets(t *testing.T) {
	const budget = 6 << 20
	d := useFakeOpts(t, fakedrv.Options{HostAllocLimit: budget})
	pinmem.SetBudget(budget)
	pools := []*Pool{newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc))), newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)), WithMaxCached(1<<20))}
	var ok, budgetErrs atomic.Int64
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stopSampling:
				return
			default:
			}
			if n := d.Live().HostAllocBytes; n > peak.Load() {
				peak.Store(n)
			}
			runtime.Gosched()
		}
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 5))
			p := pools[g%len(pools)]
			for range 60 {
				size := 1 + r.IntN(3<<20)
				b, err := p.Get(context.Background(), size)
				switch {
				case err == nil:
					ok.Add(1)
					fill(b.Bytes()[:min(size, 64)], byte(g))
					runtime.Gosched()
					if err := p.Put(b); err != nil {
						t.Error(err)
					}
				case errors.Is(err, pinmem.ErrBudget):
					budgetErrs.Add(1)
				default:
					t.Errorf("Get(%d): %v (only budget errors are expected)", size, err)
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("deadlock: Gets still running after 60s\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(stopSampling)
	sampler.Wait()
	if ok.Load() == 0 || budgetErrs.Load() == 0 {
		t.Errorf("%d Gets succeeded, %d failed on the budget: want some of each", ok.Load(), budgetErrs.Load())
	}
	if peak.Load() > budget || pinmem.Stats().Pinned.Bytes > budget {
		t.Errorf("pinned %d bytes at the peak, budget %d", peak.Load(), budget)
	}
	t.Logf("%d Gets served, %d refused on the budget, peak %s pinned of %s", ok.Load(), budgetErrs.Load(), human(int64(peak.Load())), human(budget))
}
