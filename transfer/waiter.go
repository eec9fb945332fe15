package transfer

import (
	"cmp"
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// waiter is one goroutine that sleeps in the driver (cuEventSynchronize on
// blocking-sync events) for the events it is handed, one at a time, so
// that any number of goroutines wait for device work with at most one OS
// thread blocked, each bounded by its own context.
type waiter struct {
	reqs chan waitReq
	wg   sync.WaitGroup
	once sync.Once
}

type waitReq struct {
	ev *cuda.Event
	ch chan error // buffered: the waiter never blocks on an abandoned request
}

// querySpins is how often wait queries an event, yielding in between,
// before it hands the event to the waiter goroutine.
const querySpins = 4

// pollForever is WaitPoll's polling bound: in effect none.
const pollForever = time.Duration(1<<63 - 1)

func newWaiter() *waiter {
	w := &waiter{reqs: make(chan waitReq)}
	w.wg.Go(func() {
		for r := range w.reqs {
			// A context that can end would make cuda poll instead of sleep.
			r.ch <- r.ev.Synchronize(context.Background())
		}
	})
	return w
}

// wait returns nil once ev has completed, the driver's error, or ctx.Err()
// when ctx is done first (the event may then still be pending).
func (w *waiter) wait(ctx context.Context, ev *cuda.Event) error {
	if done, err := poll(ctx, ev.Query, func(i int) bool { return i < querySpins }); done || err != nil {
		return err
	}
	ch := make(chan error, 1)
	select {
	case w.reqs <- waitReq{ev, ch}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitTail polls ev for up to spin before it sleeps through wait: the
// driver wakes a sleeper tens of microseconds after the work ends, and
// polling the last stretch keeps that off the caller's latency. spin <= 0
// is wait.
func (w *waiter) waitTail(ctx context.Context, ev *cuda.Event, spin time.Duration) error {
	if spin > 0 {
		start := time.Now()
		if done, err := poll(ctx, ev.Query, func(int) bool { return time.Since(start) <= spin }); done || err != nil {
			return err
		}
	}
	return w.wait(ctx, ev)
}

// waitAs waits for ev as mode says: WaitSleep sleeps, WaitPoll polls until
// it completes, WaitHybrid polls for up to spin first (tailSpin for the end
// of a transfer, tuning.stageSpin for a stage inside one).
func (w *waiter) waitAs(ctx context.Context, ev *cuda.Event, mode WaitMode, spin time.Duration) error {
	switch mode {
	case WaitSleep:
		spin = 0
	case WaitPoll:
		spin = pollForever
	}
	return w.waitTail(ctx, ev, spin)
}

// poll queries an event or a stream until its work completed (true), the
// query fails or ctx is done (the error), or more(i) reports false after
// the i-th pending query; it yields the processor between queries.
func poll(ctx context.Context, query func() (bool, error), more func(i int) bool) (bool, error) {
	for i := 0; ; i++ {
		done, err := query()
		if err != nil || done {
			return done, err
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if !more(i) {
			return false, nil
		}
		runtime.Gosched()
	}
}

// close stops the waiter once its goroutine has served every request.
func (w *waiter) close() {
	w.once.Do(func() {
		close(w.reqs)
		w.wg.Wait()
	})
}

// streamErr returns the asynchronous errors of our work on s, a stream
// that holds nothing else, bounded by ctx: a stream found idle is
// synchronized in the driver, which returns at once with its errors (a
// query reports only whether it is idle).
func streamErr(ctx context.Context, s *cuda.Stream) error {
	if ctx.Done() != nil {
		if idle, err := s.Query(); err != nil || !idle {
			return cmp.Or(err, s.Synchronize(ctx))
		}
	}
	return s.Synchronize(context.Background())
}
