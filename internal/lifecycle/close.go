package lifecycle

import (
	"context"
	"fmt"
	"runtime"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/track"
)

// Closed returns a package's ErrClosed: an error with pkg's message
// ("transfer: closed") that matches cuda.ErrClosed with errors.Is, so
// that one errors.Is(err, cuda.ErrClosed) holds for every owner of pinmem.
func Closed(msg string) error { return fmt.Errorf("%s: %w", msg, cuda.ErrClosed) }

// Close is an owner's Close after its nil and ctx checks: it closes g
// (stopping cleanup, the dropped-owner cleanup, when this call closed it)
// and waits, bounded by ctx, for g's idle and then for rel's release and
// a retry of the orphans, which go on in the background when ctx ends
// first. A Close after everything was released returns g's ErrClosed.
// what names the owner in the error of an ended ctx ("transfer: closing
// the Copier").
func Close(ctx context.Context, what string, g *Gate, rel *Releaser, cleanup *runtime.Cleanup) error {
	if g.MarkClosed() {
		cleanup.Stop()
	} else if rel.Released() {
		return g.err
	}
	return ReleaseWhenIdle(ctx, what, g.Idle(), rel)
}

// ReleaseWhenIdle waits, bounded by ctx, for idle and then for rel's
// release and a retry of the orphans; when ctx ends first they go on in
// the background and the error, naming what, matches ctx.Err(). A release
// that leaves something held is an orphan: the next constructor, or a
// later Close, retries it.
func ReleaseWhenIdle(ctx context.Context, what string, idle <-chan struct{}, rel *Releaser) error {
	done := make(chan error, 1)
	go func() {
		<-idle
		err := rel.Release()
		RetryOrphans()
		rel.Orphan()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s: %w (it is closed; its resources are released once the copies in flight finish)", what, ctx.Err())
	}
}

// Dropped is the cleanup of an owner dropped without Close: unless Close
// ran, it counts and logs the drop (track.Dropped, with kind and attrs)
// and releases rel once g is idle, off the cleanup goroutine (release
// calls the driver).
func Dropped(g *Gate, rel *Releaser, kind string, attrs ...any) {
	if !g.MarkClosed() {
		return
	}
	track.Dropped(kind, attrs...)
	go func() { <-g.Idle(); _ = rel.Release() }()
}
