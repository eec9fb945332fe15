package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// gate makes the fake driver's calls of some ops block until it is opened,
// as pinning and unpinning block on a GPU that is busy (or hung): they wait
// for all work on the device. Each blocked call is announced on entered.
type gate struct {
	entered chan string
	open    chan struct{}
}

func newGate(t *testing.T, d *fakedrv.Driver, ops ...string) *gate {
	g := &gate{entered: make(chan string, 16), open: make(chan struct{})}
	d.SetHook(func(op string) cudadrv.Result {
		for _, o := range ops {
			if o == op {
				g.entered <- op
				<-g.open
			}
		}
		return cudadrv.Success
	})
	t.Cleanup(g.release)
	return g
}

// release lets blocked and later calls through.
func (g *gate) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// within returns the error sent on got, failing the test if none comes in
// 10 s: a call bounded by a ctx that has ended returns at once (the driver
// call it left is still blocked).
func within(t *testing.T, got <-chan error) error {
	t.Helper()
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return when its ctx ended")
		return nil
	}
}

var pinOps = []string{"cuMemHostAlloc", "cuMemHostRegister_v2"}

// A miss whose pinning blocks in the driver returns when ctx ends; the
// pinning goes on, and Close waits for it and unpins what it pinned (the
// fake's ledger check at the end of the test finds nothing left).
func TestGetMissBoundedByContext(t *testing.T) {
	d := useFake(t)
	p, err := New(WithName("bounded"))
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, d, pinOps...)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := p.Get(ctx, 1<<20)
		got <- err
	}()
	<-g.entered // the miss is in the driver
	cancel()
	if err := within(t, got); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled ctx while pinning blocks = %v, want context.Canceled", err)
	}
	// Close with a ctx already done reports the pinning still running.
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := p.Close(done); !errors.Is(err, context.Canceled) {
		t.Errorf("Close while the pinning runs = %v, want context.Canceled", err)
	}
	g.release()
	if err := p.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("Close after the pinning could finish: %v", err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.InUseBlocks != 0 {
		t.Errorf("after Close: %v", st)
	}
}

// Trim's unpinning is bounded by ctx as a miss's pinning is.
func TestTrimBoundedByContext(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	mustPut(t, p, mustGet(t, p, 1<<20))
	g := newGate(t, d, "cuMemFreeHost", "cuMemHostUnregister")
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := p.Trim(ctx)
		got <- err
	}()
	<-g.entered
	cancel()
	if err := within(t, got); !errors.Is(err, context.Canceled) {
		t.Fatalf("Trim with a cancelled ctx while unpinning blocks = %v, want context.Canceled", err)
	}
	g.release()
}

// A nil ctx is refused, not a panic.
func TestNilContextRefused(t *testing.T) {
	useFake(t)
	p := newPool(t)
	var nilCtx context.Context
	if _, err := p.Get(nilCtx, 8); err == nil {
		t.Error("Get(nil ctx) succeeded")
	}
	if _, err := p.Trim(nilCtx); err == nil {
		t.Error("Trim(nil ctx) succeeded")
	}
}

// Close's unpinning of idle memory is bounded by ctx as Trim's is: when
// ctx ends while the driver is still unpinning, Close returns an error
// matching ctx.Err() and the unpinning finishes in the background; a later
// Close waits for it.
func TestCloseUnpinBoundedByContext(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	mustPut(t, p, mustGet(t, p, 1<<20))
	g := newGate(t, d, "cuMemFreeHost", "cuMemHostUnregister")
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- p.Close(ctx) }()
	<-g.entered
	cancel()
	if err := within(t, got); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with a cancelled ctx while unpinning blocks = %v, want context.Canceled", err)
	}
	g.release()
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close once the unpinning could finish: %v", err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.CachedBlocks != 0 {
		t.Errorf("after Close: %v", st)
	}
}

// Trim with a ctx that is done already returns its error and leaves the
// idle memory where it was (Close unpins it): it must not take the memory
// out of the cache and then drop it, pinned for good.
func TestTrimDoneContextLeavesCache(t *testing.T) {
	useFake(t)
	p := newPool(t)
	mustPut(t, p, mustGet(t, p, 1<<20))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Trim(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Trim with a cancelled ctx = %v, want context.Canceled", err)
	}
	if st := p.Stats(); st.CachedBlocks != 1 {
		t.Errorf("after Trim with a cancelled ctx: %v", st)
	}
	if freed, err := p.Trim(context.Background()); err != nil || freed != 1<<20 {
		t.Errorf("Trim afterwards freed %d: %v", freed, err)
	}
}

// Close's unpinning of a block once its stream work has run is bounded by
// ctx too: the driver may wait there for all work on the device.
func TestCloseUnpinPendingBoundedByContext(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	cc, s := newStream(t)
	dbuf, err := cc.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dbuf.Free()
	b := mustGet(t, p, 1<<20)
	if err := d.HoldStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyHtoD(dbuf, 0, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, b, s)
	g := newGate(t, d, "cuMemFreeHost", "cuMemHostUnregister")
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- p.Close(ctx) }()
	if err := d.ReleaseStream(fakeStream(s)); err != nil {
		t.Fatal(err)
	}
	<-g.entered // Close saw the work finished and unpins the block
	cancel()
	if err := within(t, got); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with a cancelled ctx while unpinning blocks = %v, want context.Canceled", err)
	}
	g.release()
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close once the unpinning could finish: %v", err)
	}
	if st := p.Stats(); st.PinnedBytes != 0 || st.PendingBlocks != 0 {
		t.Errorf("after Close: %v", st)
	}
}
