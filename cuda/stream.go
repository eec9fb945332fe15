package cuda

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/track"
)

// StreamFlags select a stream's synchronisation with the legacy default stream.
type StreamFlags uint32

// Stream flags.
const (
	// StreamBlocking streams synchronise with the legacy default stream.
	StreamBlocking StreamFlags = 0x0
	// StreamNonBlocking streams run concurrently with the legacy default stream.
	StreamNonBlocking StreamFlags = 0x1
)

// Stream is a CUDA stream: an ordered queue of device work.
type Stream struct {
	ctx       *Context
	h         cudadrv.Stream
	borrowed  bool
	destroyed atomic.Bool
}

// NewStream creates a stream in c. The caller must Destroy it.
func (c *Context) NewStream(flags StreamFlags) (*Stream, error) {
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return nil, err
	}
	h, err := pub2(c.drv.StreamCreate(uint32(flags)))
	if err != nil {
		return nil, err
	}
	track.Add(track.Stream, uint64(h), 0)
	return &Stream{ctx: c, h: h}, nil
}

// WrapStream borrows a CUstream created by other code. pinmem never destroys it.
// A zero handle is the context's legacy default stream.
// With a nil c, every method of the Stream returns an error matching
// ErrInvalidValue.
func WrapStream(c *Context, handle uintptr) *Stream {
	return &Stream{ctx: c, h: cudadrv.Stream(handle), borrowed: true}
}

// Handle returns the raw CUstream (0 for a nil Stream).
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return uintptr(s.h)
}

// Context returns the stream's context.
func (s *Stream) Context() *Context {
	if s == nil {
		return nil
	}
	return s.ctx
}

// usable returns nil for a stream that may be used, an error matching
// ErrInvalidValue for a nil one (or one of a nil context) and
// ErrInvalidHandle for a destroyed one.
func (s *Stream) usable() error {
	if s == nil {
		return fmt.Errorf("cuda: nil stream: %w", ErrInvalidValue)
	}
	if s.destroyed.Load() {
		return fmt.Errorf("cuda: stream %#x already destroyed: %w", uintptr(s.h), ErrInvalidHandle)
	}
	return s.ctx.alive()
}

// call runs f, a driver call that names s (or an event of s's context)
// explicitly, and returns its error in this package's types (pub). The driver takes such work's context from the stream, so when
// no context, or s's own, is current on the calling OS thread, f needs no
// cuCtxSetCurrent (a driver call of its own) and no thread lock. When another context is current the driver validates against
// it and rejects the call; f is then run again with s's context made current
// on a locked thread. The legacy default stream (handle 0) has no context of
// its own and always takes the slow path.
func (s *Stream) call(f func() error) error {
	if err := s.usable(); err != nil {
		return err
	}
	if s.h != 0 {
		if err := f(); !retryInContext(err) {
			return pub(err)
		}
	}
	sc, err := s.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	return pub(f())
}

// retryInContext reports whether err is how the driver rejects a call made
// while the wrong context (or none it accepts) is current.
func retryInContext(err error) bool {
	e, ok := err.(*cudadrv.Error)
	if !ok {
		return false
	}
	switch e.Code {
	case cudadrv.ErrorInvalidContext, cudadrv.ErrorInvalidValue, cudadrv.ErrorInvalidHandle:
		return true
	}
	return false
}

// Synchronize waits until all work queued on s has finished, or until ctx
// is done: then it returns ctx.Err() and the work may still be running. A
// ctx that can never end (context.Background) waits in the driver; any other
// polls the stream (see Stream.Query). A nil ctx is refused with
// ErrInvalidValue.
func (s *Stream) Synchronize(ctx context.Context) error {
	if err := checkCtx(ctx, "Stream.Synchronize"); err != nil {
		return err
	}
	if ctx.Done() == nil {
		return s.call(func() error { return s.ctx.drv.StreamSynchronize(s.h) })
	}
	return pollUntil(ctx, s.Query)
}

// Query reports whether all work queued on s has finished, without waiting.
func (s *Stream) Query() (bool, error) {
	return doneOrErr(s.call(func() error { return s.ctx.drv.StreamQuery(s.h) }))
}

// WaitEvent makes all later work on s wait until e has completed.
func (s *Stream) WaitEvent(e *Event) error {
	if err := e.usable(); err != nil {
		return err
	}
	return s.call(func() error { return s.ctx.drv.StreamWaitEvent(s.h, e.h, 0) })
}

// Destroy releases the stream. Work already queued still completes.
// Destroying a borrowed stream is refused; a second Destroy returns an
// error matching ErrInvalidHandle. When the driver fails to release it,
// it stays usable and the call may be repeated.
func (s *Stream) Destroy() error {
	if s == nil {
		return s.usable()
	}
	if s.borrowed {
		return fmt.Errorf("cuda: stream %#x is borrowed: %w", uintptr(s.h), ErrInvalidValue)
	}
	if !s.destroyed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: stream %#x already destroyed: %w", uintptr(s.h), ErrInvalidHandle)
	}
	return release(s.ctx, &s.destroyed, track.Stream, uint64(s.h), func() error { return s.ctx.drv.StreamDestroy(s.h) })
}

func doneOrErr(err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	if e, ok := err.(*Error); ok && e.Code == ResultNotReady {
		return false, nil
	}
	return false, err
}

// EventFlags choose how an event is waited on and whether it records time.
type EventFlags uint32

// Event flags.
const (
	// EventDefault events record time; waiting on them spins or yields as the context's scheduling policy says.
	EventDefault EventFlags = 0x0
	// EventBlockingSync events put a waiting thread to sleep instead of spinning.
	EventBlockingSync EventFlags = 0x1
	// EventDisableTiming events record no time, which makes them cheaper for pure ordering.
	EventDisableTiming EventFlags = 0x2
)

// Event marks a point in a stream.
type Event struct {
	ctx       *Context
	h         cudadrv.Event
	borrowed  bool
	destroyed atomic.Bool
}

// NewEvent creates an event in c. The caller must Destroy it.
func (c *Context) NewEvent(flags EventFlags) (*Event, error) {
	sc, err := c.enter()
	defer sc.Exit()
	if err != nil {
		return nil, err
	}
	h, err := pub2(c.drv.EventCreate(uint32(flags)))
	if err != nil {
		return nil, err
	}
	track.Add(track.Event, uint64(h), 0)
	return &Event{ctx: c, h: h}, nil
}

// Handle returns the raw CUevent (0 for a nil Event).
func (e *Event) Handle() uintptr {
	if e == nil {
		return 0
	}
	return uintptr(e.h)
}

// usable is Stream.usable for an event.
func (e *Event) usable() error {
	if e == nil {
		return fmt.Errorf("cuda: nil event: %w", ErrInvalidValue)
	}
	if e.destroyed.Load() {
		return fmt.Errorf("cuda: event %#x already destroyed: %w", uintptr(e.h), ErrInvalidHandle)
	}
	return e.ctx.alive()
}

// call runs f, a driver call naming e, as Stream.call does: without a
// context switch first, and again with e's context current only if the
// driver rejects it.
func (e *Event) call(f func() error) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := f(); !retryInContext(err) {
		return pub(err)
	}
	sc, err := e.ctx.enter()
	defer sc.Exit()
	if err != nil {
		return err
	}
	return pub(f())
}

// Record captures the work queued on s so far; the event completes when that work has.
func (e *Event) Record(s *Stream) error {
	if err := e.usable(); err != nil {
		return err
	}
	return s.call(func() error { return e.ctx.drv.EventRecord(e.h, s.h) })
}

// Synchronize waits until the event has completed, or until ctx is done:
// then it returns ctx.Err() and the work before the event may still be
// running. A ctx that can never end (context.Background) waits in the
// driver; any other polls the event (see Event.Query). A nil ctx is refused
// with ErrInvalidValue.
func (e *Event) Synchronize(ctx context.Context) error {
	if err := checkCtx(ctx, "Event.Synchronize"); err != nil {
		return err
	}
	if ctx.Done() == nil {
		return e.call(func() error { return e.ctx.drv.EventSynchronize(e.h) })
	}
	return pollUntil(ctx, e.Query)
}

// Query reports whether the event has completed, without waiting.
func (e *Event) Query() (bool, error) {
	return doneOrErr(e.call(func() error { return e.ctx.drv.EventQuery(e.h) }))
}

// Elapsed returns the device time between start and e (both recorded and completed).
func (e *Event) Elapsed(start *Event) (time.Duration, error) {
	if err := start.usable(); err != nil {
		return 0, err
	}
	var ms float32
	err := e.call(func() error {
		var err error
		ms, err = e.ctx.drv.EventElapsedTime(start.h, e.h)
		return err
	})
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Destroy releases the event. A second Destroy returns an error matching
// ErrInvalidHandle. When the driver fails to release it,
// it stays usable and the call may be repeated.
func (e *Event) Destroy() error {
	if e == nil {
		return e.usable()
	}
	if e.borrowed {
		return fmt.Errorf("cuda: event %#x is borrowed: %w", uintptr(e.h), ErrInvalidValue)
	}
	if !e.destroyed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: event %#x already destroyed: %w", uintptr(e.h), ErrInvalidHandle)
	}
	return release(e.ctx, &e.destroyed, track.Event, uint64(e.h), func() error { return e.ctx.drv.EventDestroy(e.h) })
}
