package lifecycle_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

// TestErrClosedMatchesCuda: every ErrClosed of pinmem matches
// cuda.ErrClosed, and each package's still matches only its own.
func TestErrClosedMatchesCuda(t *testing.T) {
	for name, err := range map[string]error{"transfer": transfer.ErrClosed, "load": load.ErrClosed, "pool": pool.ErrClosed} {
		if !errors.Is(err, cuda.ErrClosed) {
			t.Errorf("%s.ErrClosed (%v) does not match cuda.ErrClosed", name, err)
		}
	}
	if errors.Is(load.ErrClosed, transfer.ErrClosed) || errors.Is(transfer.ErrClosed, load.ErrClosed) {
		t.Error("transfer.ErrClosed and load.ErrClosed match each other")
	}
}

// TestGate: Begin fails with the gate's error once closed, and Idle is
// closed when the last work in progress ends.
func TestGate(t *testing.T) {
	errMine := lifecycle.Closed("mine: closed")
	g := lifecycle.NewGate(errMine)
	if err := g.Begin(); err != nil {
		t.Fatal(err)
	}
	g.Hold()
	if !g.MarkClosed() || g.MarkClosed() {
		t.Fatal("MarkClosed: want true once, then false")
	}
	if err := g.Begin(); !errors.Is(err, errMine) || !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Begin after MarkClosed: %v, want %v", err, errMine)
	}
	g.End()
	select {
	case <-g.Idle():
		t.Fatal("idle with work in progress")
	default:
	}
	g.End()
	<-g.Idle()
	if g.Active() != 0 || !g.IsClosed() {
		t.Fatalf("Active %d, IsClosed %v", g.Active(), g.IsClosed())
	}
}

// TestOrphanRetried: a release that fails is kept and retried by
// RetryOrphans until it releases everything, then forgotten.
func TestOrphanRetried(t *testing.T) {
	fail := errors.New("driver failing")
	held, passes := 2, 0
	r := lifecycle.NewReleaser(func() (int, error) {
		passes++
		if held > 0 {
			held--
			return held, fail
		}
		return 0, nil
	})
	if err := r.Release(); !errors.Is(err, fail) {
		t.Fatalf("first release: %v", err)
	}
	r.Orphan()
	before, _ := lifecycle.Orphans()
	lifecycle.RetryOrphans() // releases the second object: nothing held
	after, _ := lifecycle.Orphans()
	if !r.Released() || passes != 2 || after != before-1 {
		t.Fatalf("released %v after %d passes, orphans %d -> %d", r.Released(), passes, before, after)
	}
	lifecycle.RetryOrphans()
	if passes != 2 {
		t.Fatalf("a released orphan was retried: %d passes", passes)
	}
}

// TestCloseBoundedByCtx: Close returns ctx's error while work is in
// progress, releases in the background once idle, and a later Close
// returns the gate's ErrClosed.
func TestCloseBoundedByCtx(t *testing.T) {
	g := lifecycle.NewGate(lifecycle.Closed("mine: closed"))
	released := make(chan struct{})
	r := lifecycle.NewReleaser(func() (int, error) { close(released); return 0, nil })
	var cleanup runtime.Cleanup
	if err := g.Begin(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lifecycle.Close(ctx, "mine: closing", g, r, &cleanup); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with work in progress and an ended ctx: %v", err)
	}
	g.End()
	<-released
	if err := lifecycle.Close(context.Background(), "mine: closing", g, r, &cleanup); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Close after the release: %v, want ErrClosed", err)
	}
}
