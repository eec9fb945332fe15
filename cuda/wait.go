package cuda

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Every blocking wait of this package (Stream.Synchronize, Event.Synchronize,
// Context.Synchronize) takes a context. A context that can never end
// (context.Background, context.TODO) waits in the driver, as the driver's
// own synchronize does. A context that can end bounds the wait: the work is
// polled, yielding the processor for the first few queries and then sleeping
// with a growing interval (at most maxPollSleep), and ctx.Err() is returned
// once ctx is done. The queued work is not cancelled by that: it may still be
// running, and memory it reads or writes must not be reused until a later
// wait reports it done.

// pollSpins is how many queries yield the processor before polling sleeps.
const pollSpins = 8

// minPollSleep and maxPollSleep bound the sleep between two queries.
const (
	minPollSleep = 10 * time.Microsecond
	maxPollSleep = time.Millisecond
)

// checkCtx refuses a nil context with ErrInvalidValue.
func checkCtx(ctx context.Context, what string) error {
	if ctx == nil {
		return fmt.Errorf("cuda: %s with a nil context: %w", what, ErrInvalidValue)
	}
	return nil
}

// pollUntil calls query until it reports done or an error, or until ctx is
// done (ctx.Err() is returned then).
func pollUntil(ctx context.Context, query func() (bool, error)) error {
	sleep := minPollSleep
	var timer *time.Timer
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		done, err := query()
		if done || err != nil {
			return err
		}
		if i < pollSpins {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(sleep)
			defer timer.Stop()
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		sleep = min(2*sleep, maxPollSleep)
	}
}
