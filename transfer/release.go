package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// The release helpers free *p and clear it unless the driver still holds
// it (counted in left), so that calling them again retries a failed
// release (see drop).

func freeBuf(p **pinmem.Buffer, left *int) error {
	return drop(p, left, (*pinmem.Buffer).Free, pinmem.ErrFreed)
}

func destroyEvent(p **cuda.Event, left *int) error {
	return drop(p, left, (*cuda.Event).Destroy, cuda.ErrInvalidHandle)
}

func destroyStream(p **cuda.Stream, left *int) error {
	return drop(p, left, (*cuda.Stream).Destroy, cuda.ErrInvalidHandle)
}

func freeDev(p **cuda.DeviceBuffer, left *int) error {
	return drop(p, left, (*cuda.DeviceBuffer).Free, cuda.ErrInvalidHandle)
}

// drop releases *p with rel and clears it when that succeeded or failed
// with gone (the object is gone already: freed before, or with its
// destroyed context), else counts it in left; it returns rel's error.
func drop[T any](p **T, left *int, rel func(*T) error, gone error) error {
	if *p == nil {
		return nil
	}
	err := rel(*p)
	if err == nil || errors.Is(err, gone) {
		*p = nil
		return err
	}
	*left++
	return err
}

// releaser makes a state's release retryable: each release runs step,
// under a lock, until a pass leaves nothing held.
type releaser struct {
	mu   sync.Mutex
	done bool
	step func() (left int, err error) // left: the objects the driver still holds
}

// release runs step unless an earlier pass released everything.
func (r *releaser) release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return nil
	}
	left, err := r.step()
	r.done = left == 0
	return err
}

// released reports whether a pass released everything.
func (r *releaser) released() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// orphans are the releasers of failed constructors and of stages freed
// outside an engine whose release left something held. Every constructor
// (and Close) retries them, so that a retry once the driver works again
// leaves nothing behind.
var orphans struct {
	sync.Mutex
	states []*releaser
}

// orphan keeps s for retryOrphans when its release left something.
func orphan(s *releaser) {
	if s.released() {
		return
	}
	orphans.Lock()
	orphans.states = append(orphans.states, s)
	orphans.Unlock()
}

// retryOrphans retries every orphan's release, keeping those still held.
func retryOrphans() {
	orphans.Lock()
	states := orphans.states
	orphans.states = nil
	orphans.Unlock()
	for _, s := range states {
		_ = s.release()
		orphan(s)
	}
}

// closeOwner is the Close of a Copier, Pipeline or Multi after its nil
// and ctx checks; first: this call closed it (markClosed), so it stops
// the cleanup. It waits, bounded by ctx, for idle and then for release,
// which goes on in the background when ctx ends first.
func closeOwner(ctx context.Context, what string, first bool, rel *releaser, cleanup *runtime.Cleanup, idle <-chan struct{}) error {
	if first {
		cleanup.Stop()
	} else if rel.released() {
		return ErrClosed
	}
	done := make(chan error, 1)
	go func() {
		<-idle
		err := rel.release()
		retryOrphans()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("transfer: closing the %s: %w (it is closed; its resources are released once the copies in flight finish)", what, ctx.Err())
	}
}

// gate counts the work in progress of a Copier, Pipeline or Multi; idle is closed
// once the owner is closed and no work is left.
type gate struct {
	mu     sync.Mutex
	closed bool
	active int
	idle   chan struct{}
}

// newGate returns an open gate.
func newGate() gate { return gate{idle: make(chan struct{})} }

// markClosed closes the owner to new work; false if it already was.
func (g *gate) markClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	if g.active == 0 {
		close(g.idle)
	}
	return true
}

// isClosed reports whether the owner is closed.
func (g *gate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// begin registers work in progress, or fails after Close.
func (g *gate) begin() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	g.active++
	return nil
}

// end ends what begin (or hold) registered.
func (g *gate) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active--; g.active == 0 && g.closed {
		close(g.idle)
	}
}

// hold registers one more piece of work, closed or not, for a caller that
// already holds one (a drain taking over from its call).
func (g *gate) hold() {
	g.mu.Lock()
	g.active++
	g.mu.Unlock()
}
