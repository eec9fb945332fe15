package cuda_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

// Every Synchronize is bounded by its context: behind a held stream a wait
// with a deadline returns context.DeadlineExceeded, and once the stream is
// released the same wait (and the driver's own, with a context that cannot
// end) reports the work done. A nil context is refused.
func TestSynchronizeIsBoundedByContext(t *testing.T) {
	fd, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	ev, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	defer ev.Destroy()
	d, err := ctx.Alloc(16)
	must(t, err)
	defer d.Free()

	must(t, fd.HoldStream(cudadrv.Stream(s.Handle())))
	must(t, s.Memset(d, 0, 7, 16))
	must(t, ev.Record(s))
	waits := map[string]func(context.Context) error{
		"Stream.Synchronize":  s.Synchronize,
		"Event.Synchronize":   ev.Synchronize,
		"Context.Synchronize": ctx.Synchronize,
	}
	for name, wait := range waits {
		dl, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		start := time.Now()
		err := wait(dl)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s behind a held stream = %v, want context.DeadlineExceeded", name, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("%s returned %v after a 20ms deadline", name, el)
		}
		if err := wait(nil); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s(nil) = %v, want ErrInvalidValue", name, err)
		}
	}
	must(t, fd.ReleaseStream(cudadrv.Stream(s.Handle())))
	for name, wait := range waits {
		dl, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := wait(dl); err != nil {
			t.Errorf("%s after release with a deadline = %v", name, err)
		}
		cancel()
		if err := wait(context.Background()); err != nil {
			t.Errorf("%s after release = %v", name, err)
		}
	}
}
