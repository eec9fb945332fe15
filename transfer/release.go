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

// The release helpers free what *p points to and clear it once the
// driver no longer holds it, so that a release that failed can be
// retried by calling them again: a failed release leaves the object in
// place (the driver still holds it; pinmem and cuda keep counting it).
// An error matching pinmem.ErrFreed or cuda.ErrInvalidHandle says the
// object is gone already (freed before, or released with its destroyed
// context): there is nothing left to retry. left counts the objects that
// stay.

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

// drop releases *p with rel and clears it when the release succeeded or
// failed with an error matching gone; otherwise it counts it in left. It
// returns the release's error.
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

// releaser makes a state's release retryable: release runs step under a
// lock until a pass leaves nothing behind (what the driver fails to
// release stays held and counted, and the next call retries it), and
// released reports whether that has happened.
type releaser struct {
	mu   sync.Mutex
	done bool
	step func() (left int, err error) // left: the objects still held
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

// orphans are the releasers whose release left something the driver
// still holds: those of Copiers, Pipelines and Multis whose constructor
// failed, and of stages freed outside an engine. Every constructor
// retries them first, so that a caller retrying the constructor once the
// driver works again leaves nothing behind.
var orphans struct {
	sync.Mutex
	states []*releaser
}

// orphan keeps s for a later retry when its release left something.
func orphan(s *releaser) {
	if s.released() {
		return
	}
	orphans.Lock()
	orphans.states = append(orphans.states, s)
	orphans.Unlock()
}

// retryOrphans retries the release of every orphan and forgets those
// that released everything.
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

// closeOwner is the body of the Close of a Copier, Pipeline or Multi,
// after its nil and ctx checks. first says whether this call closed it
// (markClosed): the first stops the cleanup; a later one returns ErrClosed
// once everything is released, else waits again and retries what an
// earlier Close left. It waits, bounded by ctx, for idle (no work in
// progress) and then for release; when ctx ends first the release still
// happens in the background.
func closeOwner(ctx context.Context, what string, first bool, rel *releaser, cleanup *runtime.Cleanup,
	idle <-chan struct{}) error {
	if first {
		cleanup.Stop()
	} else if rel.released() {
		return ErrClosed
	}
	done := make(chan error, 1)
	go func() {
		<-idle
		err := rel.release()
		retryOrphans() // staging buffers a failed New or Run could not release
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("transfer: closing the %s: %w (it is closed; its resources are released once the copies in flight finish)", what, ctx.Err())
	}
}

// gate counts the work in progress of a Copier or Multi and closes idle
// once the owner is closed and no work is left.
type gate struct {
	mu     sync.Mutex
	closed bool
	active int
	idle   chan struct{} // closed when closed and active is 0
}

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
	g.active--
	if g.active == 0 && g.closed {
		close(g.idle)
	}
}

// hold registers one more piece of work for a caller that already holds
// one (an abandoned drain taking over from its call), closed or not.
func (g *gate) hold() {
	g.mu.Lock()
	g.active++
	g.mu.Unlock()
}
