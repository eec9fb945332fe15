package soak_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/pool"
)

func primary() (*cuda.Context, error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return nil, err
	}
	return dev.PrimaryContext()
}

// TestGPUBudgetUnderPressure runs 64 goroutines pinning through Alloc and
// two pools against a 1 GiB budget, while a sampler reads the ledger: the
// pinned total never exceeds the budget, some callers get the typed
// budget error, nobody deadlocks, and everything is released at the end.
func TestGPUBudgetUnderPressure(t *testing.T) {
	testutil.GPUContext(t)
	const limit = 1 << 30
	base := pinmem.Stats().Pinned.Bytes
	prev := pinmem.SetBudget(base + limit)
	t.Cleanup(func() { pinmem.SetBudget(prev) })
	pools := make([]*pool.Pool, 2)
	for i := range pools {
		p, err := pool.New(pool.WithName("pressure"), pool.WithMaxCached(256<<20))
		if err != nil {
			t.Fatal(err)
		}
		pools[i] = p
	}
	var over atomic.Int64
	stop := make(chan struct{})
	var samplerDone sync.WaitGroup
	samplerDone.Add(1)
	go func() {
		defer samplerDone.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if p := pinmem.Stats().Pinned.Bytes - base; p > limit {
				over.Store(p)
			}
			time.Sleep(50 * time.Microsecond) // the sampling period, not a wait for an event
		}
	}()
	var budgetErrs, okCount, otherErrs atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sizes := []int{1 << 20, 8 << 20, 32 << 20, 64 << 20}
			for i := 0; time.Now().Before(deadline); i++ {
				n := sizes[(g+i)%len(sizes)]
				var err error
				if g%2 == 0 {
					var b *pinmem.Buffer
					if b, err = pinmem.Alloc(n, 0); err == nil {
						b.Bytes()[0], b.Bytes()[n-1] = 1, 2
						time.Sleep(time.Millisecond) // holds the buffer a while, as a user would
						err = b.Free()
					}
				} else {
					p := pools[g%4/2]
					var b *pool.Block
					if b, err = p.Get(context.Background(), n); err == nil {
						b.Bytes()[0] = 1
						time.Sleep(time.Millisecond) // holds the block a while, as a user would
						err = p.Put(b)
					}
				}
				switch {
				case err == nil:
					okCount.Add(1)
				case errors.Is(err, pinmem.ErrBudget):
					budgetErrs.Add(1)
				default:
					otherErrs.Add(1)
					t.Errorf("goroutine %d: %v", g, err)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("deadlock: the goroutines did not finish within 2 minutes")
	}
	close(stop)
	samplerDone.Wait()
	st := pinmem.Stats()
	for _, p := range pools {
		if err := p.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}
	t.Logf("SOAK: budget: limit %d MiB, %d pins ok, %d budget errors, %d other errors, peak %d MiB over baseline",
		limit>>20, okCount.Load(), budgetErrs.Load(), otherErrs.Load(), (st.PeakBytes-base)>>20)
	if o := over.Load(); o != 0 {
		t.Errorf("the pinned total reached %d bytes, over the %d budget", o, limit)
	}
	if peak := st.PeakBytes - base; peak > limit {
		t.Errorf("the ledger's peak is %d bytes over the baseline, over the %d budget", peak, limit)
	}
	if budgetErrs.Load() == 0 {
		t.Error("no caller met the budget: the test did not press against it")
	}
	if okCount.Load() == 0 {
		t.Error("no pin succeeded")
	}
	if p := pinmem.Stats().Pinned.Bytes; p != base {
		t.Errorf("after Close %d bytes pinned, want the baseline %d", p, base)
	}
}
