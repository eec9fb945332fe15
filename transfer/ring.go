package transfer

import (
	"context"

	"github.com/pinmem/pinmem/cuda"
)

// ring is a staged loop's stages and the signal that a stage may be
// reused: every lane's copy out of it (host to device) ran, or the copy
// into it (device to host) ran and the CPU copied it out. The Copier's
// executor and its io rings (one lane) and Broadcast (a lane per device,
// every device copying out of the same stage) run on one.
//
//   - next hands out the stages in turn, each once every lane's last copy
//     on it ran, waiting for those not yet seen run (bounded by ctx);
//   - queued records lane i's event behind the copy just queued on the
//     stage next handed out; toHost: the copy fills the stage for the CPU,
//     which makes it pending;
//   - oldest waits for the oldest pending stage's copy and hands it out to
//     be copied out; full says that every stage is pending (the window of
//     a device-to-host loop: as many copies in flight as stages).
//
// Stages come from the engine with every copy queued on them run (give),
// so a ring starts with nothing to wait for.
type ring struct {
	stages []*stage
	lanes  []*lane
	// evs[i][j] is lane i's event for stage j; nil: the stage's own
	// event (one lane, on the stage's context).
	evs     [][]*cuda.Event
	used    []bool // [i*len(stages)+j]: lane i's event for stage j recorded and not seen run
	turn    int    // stages handed out by next
	pending int    // stages filled for the CPU and not yet handed out by oldest
	// wait waits for lane l's event ev, bounded by ctx; last: the wait
	// for the end of a device-to-host transfer (waitLast).
	wait func(ctx context.Context, l *lane, ev *cuda.Event, last bool) error
}

// reset starts the ring over stages, for its lanes.
func (r *ring) reset(stages []*stage) {
	r.stages = stages
	n := len(stages) * len(r.lanes)
	if cap(r.used) < n {
		r.used = make([]bool, n)
	}
	r.used = r.used[:n]
	clear(r.used)
	r.turn, r.pending = 0, 0
}

// event returns lane i's event for stage j.
func (r *ring) event(i, j int) *cuda.Event {
	if r.evs == nil {
		return r.stages[j].ev
	}
	return r.evs[i][j]
}

// ran waits, bounded by ctx, until every lane's copy on stage j ran.
func (r *ring) ran(ctx context.Context, j int, last bool) error {
	for i, l := range r.lanes {
		u := &r.used[i*len(r.stages)+j]
		if !*u {
			continue
		}
		if err := r.wait(ctx, l, r.event(i, j), last); err != nil {
			return err
		}
		*u = false
	}
	return nil
}

// next returns the next stage in turn once it may be reused.
func (r *ring) next(ctx context.Context) (*stage, error) {
	j := r.turn % len(r.stages)
	if err := r.ran(ctx, j, false); err != nil {
		return nil, err
	}
	r.turn++
	return r.stages[j], nil
}

// queued records lane i's event for the stage next handed out last,
// behind the copy just queued on it (err nil, else returned); toHost: the
// copy fills the stage for the CPU (see oldest).
func (r *ring) queued(i int, toHost bool, err error) error {
	if err != nil {
		return err
	}
	j := (r.turn - 1) % len(r.stages)
	if err := r.event(i, j).Record(r.lanes[i].stream); err != nil {
		return err
	}
	r.used[i*len(r.stages)+j] = true
	if toHost {
		r.pending++
	}
	return nil
}

// full reports whether every stage is pending.
func (r *ring) full() bool { return r.pending == len(r.stages) }

// oldest waits, bounded by ctx, for the oldest pending stage's copy and
// returns the stage, for the CPU to copy out before the next call of next
// may hand it out again; last: it is the transfer's end (waitLast).
func (r *ring) oldest(ctx context.Context, last bool) (*stage, error) {
	j := (r.turn - r.pending) % len(r.stages)
	if err := r.ran(ctx, j, last); err != nil {
		return nil, err
	}
	r.pending--
	return r.stages[j], nil
}
