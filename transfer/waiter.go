package transfer

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// waiter is a single goroutine that blocks in the driver
// (cuEventSynchronize) on events it is asked about, one at a time, so that
// any number of goroutines can wait for device work while at most one OS
// thread is blocked. Events are created with EventBlockingSync, so the
// blocked thread sleeps instead of spinning.
type waiter struct {
	reqs chan waitReq
	wg   sync.WaitGroup
	once sync.Once
}

type waitReq struct {
	ev *cuda.Event
	ch chan error // buffered: the waiter never blocks on an abandoned request
}

// querySpins is how many times wait queries an event (yielding the
// processor in between) before handing it to the waiter goroutine.
const querySpins = 4

func newWaiter() *waiter {
	w := &waiter{reqs: make(chan waitReq)}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for r := range w.reqs {
			// The one thread that sleeps in the driver (a context that
			// can end would make cuda poll instead); every requester's
			// wait is bounded by its own context (wait).
			r.ch <- r.ev.Synchronize(context.Background())
		}
	}()
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

// waitTail waits for the event that ends a transfer: it polls ev for up to
// spin (yielding the processor between queries) before handing it to the
// waiter goroutine. The driver wakes a blocking-sync waiter some time after
// the work completes; polling the last few hundred microseconds of a
// transfer takes that wake-up off the caller's latency. spin <= 0 is wait.
func (w *waiter) waitTail(ctx context.Context, ev *cuda.Event, spin time.Duration) error {
	if spin <= 0 {
		return w.wait(ctx, ev)
	}
	start := time.Now()
	if done, err := poll(ctx, ev.Query, func(int) bool { return time.Since(start) <= spin }); done || err != nil {
		return err
	}
	return w.wait(ctx, ev)
}

// poll queries an event or a stream (query), yielding the processor
// between queries, until its work has completed (true), the query fails
// or ctx is done (the error), or more(i) reports false after the i-th
// query (counting from 0) found it pending.
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

// waitEnd waits for the event that ends a transfer as mode says: WaitSleep
// sleeps in the driver, WaitHybrid polls for at most tailSpin first,
// WaitPoll polls until the event completes or ctx is done.
func (w *waiter) waitEnd(ctx context.Context, ev *cuda.Event, mode WaitMode) error {
	switch mode {
	case WaitSleep:
		return w.wait(ctx, ev)
	case WaitPoll:
		return w.waitTail(ctx, ev, pollForever)
	}
	return w.waitTail(ctx, ev, tailSpin)
}

// waitStage waits for a stage inside a staged transfer (the copy that
// last used it, or the copy into it), as mode says: WaitHybrid polls for
// up to spin (tuning.stageSpin) before it sleeps in the driver. Such a wait is for a
// copy queued at most a ring of stages earlier, which ends within about
// a stage's DMA time, and the driver wakes a sleeper tens of microseconds
// after the copy ends, a cost a staged transfer would pay once per piece.
func (w *waiter) waitStage(ctx context.Context, ev *cuda.Event, mode WaitMode, spin time.Duration) error {
	switch mode {
	case WaitSleep:
		return w.wait(ctx, ev)
	case WaitPoll:
		return w.waitTail(ctx, ev, pollForever)
	}
	return w.waitTail(ctx, ev, spin)
}

// pollForever is WaitPoll's polling bound: in effect none.
const pollForever = time.Duration(1<<63 - 1)

// stop closes the waiter without waiting for its goroutine, which exits
// once the request it serves, if any, returns (on a hung device, when the
// device does).
func (w *waiter) stop() { w.once.Do(func() { close(w.reqs) }) }

// close stops the waiter goroutine once it has served every request.
func (w *waiter) close() {
	w.once.Do(func() {
		close(w.reqs)
		w.wg.Wait()
	})
}
