package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/copypool"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/lifecycle"
)

// engine is the staging engine of one context, shared as Copier says: the
// pinned stages, borrowed in FIFO order, and the CPU copy goroutines. A
// Copier with WithStageFlags pinmem options (which cannot be compared) has
// one of its own.
type engine struct {
	key    engineKey
	shared bool
	flags  pinmem.Flags
	popts  []pinmem.Option

	mu      sync.Mutex
	refs    int
	depth   int      // the largest depth of the members
	par     int      // the largest parallelism of the members
	all     []*stage // every stage, idle or borrowed
	idle    []*stage
	waiters []*stageWaiter // FIFO
	peak    int            // most stages borrowed at once (tests)
	pool    *copypool.Pool
	closed  bool
	rel     *lifecycle.Releaser
	grown   bool // growForTwo ran
}

// engineKey identifies a shared engine.
type engineKey struct {
	cctx      *cuda.Context
	stageSize int
	flags     pinmem.Flags
	stats     bool
	pipeline  bool // the chunk stages of Pipelines (stageSize is the chunk size)
}

// stageWaiter is a transfer waiting for stages.
type stageWaiter struct {
	want  int
	got   []*stage
	ready chan struct{}
}

var engines = struct {
	sync.Mutex
	m map[engineKey]*engine
}{m: map[engineKey]*engine{}}

// joinEngine returns the engine for a Copier of c with options o (with
// pipeline, for a Pipeline: stage size its chunk, depth its chunks in
// flight), made or grown for it here, so that the caller reports a failure.
func joinEngine(c *cuda.Context, o options, pipeline bool) (*engine, error) {
	key := engineKey{cctx: c, stageSize: o.stageSize, flags: o.stageFlags, stats: o.stats, pipeline: pipeline}
	shared := len(o.stageOpts) == 0
	engines.Lock()
	defer engines.Unlock()
	var e *engine
	if shared {
		e = engines.m[key]
	}
	if e != nil && e.isClosed() {
		e = nil // left by its last member; never joined again
	}
	fresh := e == nil
	if fresh {
		e = &engine{key: key, shared: shared, flags: o.stageFlags | pinmem.Portable,
			popts: append([]pinmem.Option{pinmem.WithDevice(c.Device())}, o.stageOpts...)}
		e.rel = lifecycle.NewReleaser(e.releaseStep)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	depth, par := max(e.depth, o.depth), max(e.par, o.parallelism)
	target := depth
	if e.refs+1 >= 2 {
		target = 2 * depth
	}
	var added []*stage
	var err error
	for len(e.all)+len(added) < target {
		var s *stage
		if s, err = e.newStage(); err != nil {
			err = fmt.Errorf("transfer: allocating staging buffer %d of %d bytes: %w", len(e.all)+len(added), o.stageSize, err)
			break
		}
		added = append(added, s)
	}
	if err != nil && len(e.all)+len(added) < o.depth {
		// Not even one ring: give the new stages back and fail.
		return nil, errors.Join(err, freeStages(added))
	}
	// Short of two rings (the budget, say): run with what there is.
	e.all = append(e.all, added...)
	e.idle = append(e.idle, added...)
	e.depth, e.par = depth, par
	workers := 0
	if par > 1 {
		workers = max(1, min(par, runtime.NumCPU())-1)
	}
	if e.pool == nil {
		e.pool = copypool.New(workers, o.stats)
	} else {
		e.pool.Grow(workers)
	}
	e.refs++
	e.serve()
	if fresh && shared {
		engines.m[key] = e
	}
	return e, nil
}

// newStage allocates a stage and, for a Copier, the event that guards its
// reuse (a Pipeline's slots have their own).
func (e *engine) newStage() (*stage, error) {
	s := &stage{}
	var err error
	if s.buf, err = pinmem.Alloc(e.key.stageSize, e.flags, e.popts...); err != nil {
		return nil, err
	}
	s.mem, s.cuts = s.buf.Bytes(), hostspan.Cuts(s.buf)
	if !e.key.pipeline {
		if s.ev, err = e.key.cctx.NewEvent(syncEvent); err != nil {
			return nil, errors.Join(err, freeStages([]*stage{s}))
		}
	}
	return s, nil
}

// take borrows 1 to want stages, waiting in FIFO order, bounded by ctx.
func (e *engine) take(ctx context.Context, want int) ([]*stage, error) {
	e.mu.Lock()
	want = max(1, min(want, e.depth))
	if len(e.waiters) == 0 && len(e.idle) > 0 {
		got := e.grant(want)
		e.mu.Unlock()
		return got, nil
	}
	w := &stageWaiter{want: want, ready: make(chan struct{})}
	e.waiters = append(e.waiters, w)
	e.mu.Unlock()
	select {
	case <-w.ready:
		return w.got, nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	for i, x := range e.waiters {
		if x == w {
			e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			e.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	e.mu.Unlock()
	// Granted meanwhile: give the stages back.
	<-w.ready
	e.give(w.got)
	return nil, ctx.Err()
}

// grant takes up to want idle stages. e.mu held.
func (e *engine) grant(want int) []*stage {
	n := min(want, len(e.idle))
	got := append([]*stage(nil), e.idle[len(e.idle)-n:]...)
	e.idle = e.idle[:len(e.idle)-n]
	e.peak = max(e.peak, len(e.all)-len(e.idle))
	return got
}

// serve hands idle stages to the waiters, first come first served. e.mu held.
func (e *engine) serve() {
	for len(e.waiters) > 0 && len(e.idle) > 0 {
		w := e.waiters[0]
		e.waiters = e.waiters[1:]
		w.got = e.grant(w.want)
		close(w.ready)
	}
}

// give returns borrowed stages; everything queued on them has run.
func (e *engine) give(ss []*stage) {
	if len(ss) == 0 {
		return
	}
	e.mu.Lock()
	e.idle = append(e.idle, ss...)
	e.serve()
	e.mu.Unlock()
}

// leave ends a membership; the last member releases the stages and copy
// goroutines and returns what the driver failed to release (retried).
func (e *engine) leave(member *bool) (left int, err error) {
	// Under the registry's lock, as in joinEngine: no Copier joins an
	// engine whose stages are about to be freed.
	if e.shared {
		engines.Lock()
	}
	e.mu.Lock()
	if *member {
		*member = false
		e.refs--
		if e.refs == 0 {
			e.closed = true
		}
	}
	last := e.closed
	if last && e.shared && engines.m[e.key] == e {
		delete(engines.m, e.key)
	}
	e.mu.Unlock()
	if e.shared {
		engines.Unlock()
	}
	if !last {
		return 0, nil
	}
	err = e.rel.Release()
	if !e.rel.Released() {
		left = 1
	}
	return left, err
}

// releaseStep stops the copy goroutines and frees the stages (rel.step).
func (e *engine) releaseStep() (left int, err error) {
	e.pool.Close()
	var errs []error
	for _, s := range e.all {
		errs = append(errs, s.free(&left))
	}
	return left, errors.Join(errs...)
}

// growForTwo grows the engine to two rings, once, for a Copier running two
// staged transfers at once; a failed allocation (the budget, say) leaves
// them sharing the stages there are. It allocates outside the lock; the
// caller's membership keeps the engine open meanwhile.
func (e *engine) growForTwo() {
	e.mu.Lock()
	if e.closed || e.grown || len(e.all) >= 2*e.depth {
		e.mu.Unlock()
		return
	}
	e.grown = true
	want := 2*e.depth - len(e.all)
	e.mu.Unlock()
	var added []*stage
	for range want {
		s, err := e.newStage()
		if err != nil {
			break
		}
		added = append(added, s)
	}
	if len(added) == 0 {
		return
	}
	e.mu.Lock()
	// A Copier joining meanwhile may have grown the engine already.
	keep := min(len(added), max(0, 2*e.depth-len(e.all)))
	e.all = append(e.all, added[:keep]...)
	e.idle = append(e.idle, added[:keep]...)
	e.serve()
	e.mu.Unlock()
	_ = freeStages(added[keep:])
}

// isClosed reports whether the engine's last member has left.
func (e *engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// tryTake borrows an idle stage without waiting: nil when none is idle or
// a transfer waits already (it is not overtaken).
func (e *engine) tryTake() *stage {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.waiters) > 0 || len(e.idle) == 0 {
		return nil
	}
	// grant(1) without allocating.
	s := e.idle[len(e.idle)-1]
	e.idle = e.idle[:len(e.idle)-1]
	e.peak = max(e.peak, len(e.all)-len(e.idle))
	return s
}
