package pool

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

// putOrdered takes a block, queues a copy from it on a stream and Puts it
// ordered after the copy, so that the pool holds an event; the stream has
// run when it returns.
func putOrdered(t *testing.T, p *Pool) {
	t.Helper()
	ctx, s := newStream(t)
	dev, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Free() })
	b := mustGet(t, p, 4096)
	if err := s.CopyHtoD(dev, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b, s)
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSecondCloseRetriesEvents: when destroying the pool's events fails
// at Close, the events stay counted (Stats.UndestroyedEvents) and a
// second Close destroys them, instead of answering ErrClosed while the
// driver still holds them; only a third Close answers ErrClosed.
func TestSecondCloseRetriesEvents(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	putOrdered(t, p)
	if d.Live().Events != 1 {
		t.Fatalf("the pool holds %d events, want 1", d.Live().Events)
	}
	if err := d.FailOn("cuEventDestroy_v2", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("Close with cuEventDestroy failing: %v", err)
	}
	if n := d.Live().Events; n != 1 || p.Stats().UndestroyedEvents != 1 {
		t.Fatalf("after the failed Close: driver holds %d events, pool says %d undestroyed", n, p.Stats().UndestroyedEvents)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v (it must retry the event, not report ErrClosed)", err)
	}
	if n := d.Live().Events; n != 0 || p.Stats().UndestroyedEvents != 0 {
		t.Errorf("after the second Close: driver holds %d events, pool says %d undestroyed", n, p.Stats().UndestroyedEvents)
	}
	if err := p.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("third Close: %v, want ErrClosed", err)
	}
}

// TestTrimRetriesEvents: Trim destroys the spare events; one whose
// destruction failed is destroyed by the next Trim.
func TestTrimRetriesEvents(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	putOrdered(t, p)
	if err := d.FailOn("cuEventDestroy_v2", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Trim(context.Background()); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("Trim with cuEventDestroy failing: %v", err)
	}
	if n := d.Live().Events; n != 1 || p.Stats().UndestroyedEvents != 1 {
		t.Fatalf("after the failed Trim: driver holds %d events, pool says %d undestroyed", n, p.Stats().UndestroyedEvents)
	}
	if _, err := p.Trim(context.Background()); err != nil {
		t.Fatalf("second Trim: %v", err)
	}
	if n := d.Live().Events; n != 0 || p.Stats().UndestroyedEvents != 0 {
		t.Errorf("after the second Trim: driver holds %d events, pool says %d undestroyed", n, p.Stats().UndestroyedEvents)
	}
}

// TestFailedPrewarmReleasedByNextNew: when New's prewarming fails and
// unpinning what it had pinned fails too, the memory stays counted in
// the ledger while the driver holds it, and the next New releases it.
func TestFailedPrewarmReleasedByNextNew(t *testing.T) {
	d := useFake(t)
	base := pinmem.Stats().Pinned.Bytes
	// A mapped slab is pinned, its device pointer cannot be read, and
	// unpinning it fails, at New's first attempt and at its Close.
	if err := d.FailOn("cuMemHostGetDevicePointer_v2", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := d.FailOn("cuMemFreeHost", 0, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	p, err := New(WithPrewarm(4096, 64<<10), WithFlags(pinmem.Mapped, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	if p != nil || !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("New with the device pointer failing: %v, %v", p, err)
	}
	c := d.Live()
	held := int64(c.HostAllocBytes)
	if held == 0 {
		t.Fatalf("the driver holds nothing: the release did not fail (%v)", err)
	}
	if got := pinmem.Stats().Pinned.Bytes - base; got != held {
		t.Fatalf("ledger counts %d bytes, the driver holds %d", got, held)
	}
	d.ClearFaults()
	p = newPool(t)
	if c := d.Live(); c.HostAllocBytes != 0 {
		t.Errorf("after the next New the driver still holds %+v", c)
	}
	if got := pinmem.Stats().Pinned.Bytes; got != base {
		t.Errorf("after the next New the ledger counts %d bytes, %d before", got, base)
	}
	_ = p
}

// TestCloseQueryFailureOnceKeepsBusyBlock: a query of a pending block's
// event that fails once at Close must not count as finished: the block
// stays pinned until its stream work has run, and that work never reads
// unpinned memory.
func TestCloseQueryFailureOnceKeepsBusyBlock(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	ctx, s := newStream(t)
	dev, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	b := mustGet(t, p, 1<<20)
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			_ = d.ReleaseStream(fakeStream(s))
		}
	}()
	if err := s.CopyHtoD(dev, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b, s)
	if err := d.FailOn("cuEventQuery", 1, cudadrv.ErrorUnknown); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Close(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with the block's work held: %v, want context.Canceled", err)
	}
	if st := p.Stats(); st.PendingBlocks != 1 || d.Live().HostAllocs != 1 {
		t.Fatalf("after one failed query the busy block was released: %v, driver %+v", st, d.Live())
	}
	if err := d.ReleaseStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	released = true
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("Close after the work ran: %v", err)
	}
	if errs := d.AsyncErrors(); len(errs) != 0 {
		t.Errorf("queued work read released memory: %v", errs)
	}
}

// TestCloseQueryFailingForGoodCountsAsFinished: an event whose query
// keeps failing (a broken context) counts as finished at Close, which
// returns the error and unpins the block instead of waiting forever.
func TestCloseQueryFailingForGoodCountsAsFinished(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	ctx, s := newStream(t)
	dev, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	b := mustGet(t, p, 1<<20)
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyHtoD(dev, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b, s)
	if err := d.FailOn("cuEventQuery", 0, cudadrv.ErrorIllegalAddress); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Errorf("Close with every query failing: %v", err)
	}
	if st := p.Stats(); st.PendingBlocks != 0 || st.PinnedBytes != 0 {
		t.Errorf("after Close: %v", st)
	}
	d.ClearFaults()
}

// The budget's reclaim counts the memory whose release it retries (held by
// the driver after a failed unpinning) towards what it was asked for: it
// evicts idle blocks only for the rest.
func TestReclaimCountsRetriedReleases(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	a, b := mustGet(t, p, 1<<20), mustGet(t, p, 1<<20)
	mustPut(t, p, a)
	if err := d.FailOn("cuMemFreeHost", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Trim(context.Background()); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("Trim with cuMemFreeHost failing: %v", err)
	}
	held := p.Stats().UnreleasedBytes
	if held == 0 {
		t.Fatal("no release failed")
	}
	mustPut(t, p, b)
	if freed := p.s.Reclaim(held); freed != held {
		t.Errorf("Reclaim(%d) freed %d, want the %d bytes of the retried release", held, freed, held)
	}
	if st := p.Stats(); st.CachedBlocks != 1 || st.UnreleasedBytes != 0 {
		t.Errorf("after Reclaim: %v; want the idle block still cached", st)
	}
}
