package transfer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem/cuda"
)

// fence is the Copier's fence: an early exit hands it the copies it left
// queued as a drain, and every later call of the Copier, its Pipelines and
// its Multi makes each stream it uses wait for them on the device
// (cuStreamWaitEvent) before queueing anything. Copier.Fence waits for the
// drains on the host.
type fence struct {
	pending atomic.Int32 // drains in progress: the small path reads only this

	mu      sync.Mutex
	next    uint64            // id of the next drain
	drains  map[uint64]*drain // in progress
	changed chan struct{}     // closed and replaced when a drain ends
}

// drain is the copies one early exit left queued: they ran once every
// event in evs completed and every stream in streams (named only where no
// event could be recorded) is idle.
type drain struct {
	evs     []*cuda.Event
	streams []*cuda.Stream
}

// order makes s wait on the device for every drain in progress (whose
// lane or Run, holding the events, stays held until it ends under f.mu),
// and on the host, bounded by ctx, for one without events.
func (f *fence) order(ctx context.Context, s *cuda.Stream) error {
	if f.pending.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	var upTo uint64 // the latest drain without events
	for id, d := range f.drains {
		if len(d.streams) > 0 {
			upTo = max(upTo, id)
		}
		for _, ev := range d.evs {
			if err := s.WaitEvent(ev); err != nil {
				f.mu.Unlock()
				return err
			}
		}
	}
	f.mu.Unlock()
	if upTo == 0 {
		return nil
	}
	return f.wait(ctx, upTo)
}

// last returns the id of the latest drain handed to f (0: none).
func (f *fence) last() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// wait waits, bounded by ctx, until every drain up to id upTo has ended.
func (f *fence) wait(ctx context.Context, upTo uint64) error {
	for {
		f.mu.Lock()
		busy := false
		for id := range f.drains {
			if id <= upTo {
				busy = true
				break
			}
		}
		ch := f.changed
		f.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// handOff is the one place that waits in the background: it waits for d
// to run (on a hung device, for ever), then calls then, which gives back
// what the copies used. Meanwhile later calls are ordered after them and
// hold/end register the wait so that Close waits for it. The returned
// channel is closed once d's copies ran (before then): a caller whose own
// memory they touch (pinned memory copied directly) waits on it, bounded
// by its ctx; one whose copies touch only pinmem's stages need not.
func (f *fence) handOff(hold func(), end func(), d drain, then func()) <-chan struct{} {
	f.mu.Lock()
	if f.drains == nil {
		f.drains = map[uint64]*drain{}
		f.changed = make(chan struct{})
	}
	f.next++
	id := f.next
	f.drains[id] = &d
	f.pending.Add(1)
	f.mu.Unlock()
	hold()
	ran := make(chan struct{})
	go func() {
		defer end()
		d.settle()
		f.mu.Lock()
		delete(f.drains, id)
		f.pending.Add(-1)
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
		close(ran)
		if then != nil {
			then()
		}
	}()
	return ran
}

// settle returns once the drain's copies ran or the driver fails the
// queries (nothing will run any more). It polls, backing off to drainPoll,
// so that no OS thread stays blocked in the driver; it does not change d,
// which order reads.
func (d *drain) settle() {
	pause := 50 * time.Microsecond
	for i := 0; i < len(d.evs)+len(d.streams); {
		var ok bool
		var err error
		if i < len(d.evs) {
			ok, err = d.evs[i].Query()
		} else {
			ok, err = d.streams[i-len(d.evs)].Query()
		}
		if ok || err != nil {
			i++
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, drainPoll)
	}
}

// drainPoll is the longest pause between two queries of a drain.
const drainPoll = 5 * time.Millisecond
