package transfer

import (
	"context"
	"errors"
	"fmt"
	"math"
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
//
// Joining pins nothing: a borrower pins the stages it lacks (grow), up to
// the target count (a ring of depth stages, two once two members or two
// transfers of one Copier stage at once), so that memory is pinned only
// when a transfer needs it. A Pipeline's engine pins its stages at once
// (fill), as its options say.
type engine struct {
	key    engineKey
	shared bool
	flags  pinmem.Flags
	popts  []pinmem.Option

	mu     sync.Mutex
	refs   int
	depth  int   // the largest depth of the members
	par    int   // the largest parallelism of the members
	two    bool  // two rings: two members, or two transfers of one Copier staging at once
	ring   class // stages of the stage size: the rings, and one-stage transfers (pathStage)
	small  class // small stages of small one-stage transfers (pathSmall)
	peak   int   // most ring stages borrowed at once (tests)
	pool   *copypool.Pool
	closed bool
	rel    *lifecycle.Releaser
}

// class is the engine's stages of one size.
type class struct {
	size    int
	all     []*stage // every stage, idle or borrowed
	idle    []*stage
	growing int            // stages being pinned (grow)
	short   bool           // pinning failed with stages there: run with them until a member joins
	waiters []*stageWaiter // FIFO
}

// engineKey identifies a shared engine.
type engineKey struct {
	cctx      *cuda.Context
	stageSize int
	flags     pinmem.Flags
	stats     bool
	pipeline  bool // the chunk stages of Pipelines (stageSize is the chunk size)
}

// stageWaiter is a transfer waiting for ring stages.
type stageWaiter struct {
	want  int
	got   []*stage
	retry bool // woken with no stage: nothing is pinned or being pinned, grow them (handOver)
	ready chan struct{}
}

var engines = struct {
	sync.Mutex
	m map[engineKey]*engine
}{m: map[engineKey]*engine{}}

// joinEngine returns the engine for a Copier of c with options o (with
// pipeline, for a Pipeline: stage size its chunk, depth its chunks in
// flight), made or raised to its depth and parallelism here. It pins
// nothing (see engine).
func joinEngine(c *cuda.Context, o options, pipeline bool) *engine {
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
			popts: append([]pinmem.Option{pinmem.WithDevice(c.Device())}, o.stageOpts...),
			ring:  class{size: o.stageSize}, small: class{size: smallStageSize}}
		e.rel = lifecycle.NewReleaser(e.releaseStep)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.depth, e.par = max(e.depth, o.depth), max(e.par, o.parallelism)
	e.two = e.two || e.refs+1 >= 2
	// A member joining tries again where pinning failed.
	e.ring.short, e.small.short = false, false
	workers := 0
	if e.par > 1 {
		workers = max(1, min(e.par, runtime.NumCPU())-1)
	}
	if e.pool == nil {
		e.pool = copypool.New(workers, o.stats)
	} else {
		e.pool.Grow(workers)
	}
	e.refs++
	if fresh && shared {
		engines.m[key] = e
	}
	return e
}

// target is the most ring stages the engine pins. e.mu held.
func (e *engine) target() int {
	if e.two {
		return 2 * e.depth
	}
	return e.depth
}

// limit is the most stages of class k the engine pins: the target for
// the ring; small stages grow without a limit, as there is at most one
// per lane of the members. e.mu held.
func (e *engine) limit(k *class) int {
	if k == &e.small {
		return math.MaxInt
	}
	return e.target()
}

// allowTwo lets the engine grow to two rings, for a Copier running two
// staged transfers at once; a failed pinning (the budget, say) leaves
// them sharing the stages there are.
func (e *engine) allowTwo() {
	e.mu.Lock()
	e.two = true
	e.mu.Unlock()
}

// newStage pins a stage of size bytes and, for a Copier, makes the event
// that guards its reuse (a Pipeline's slots have their own).
func (e *engine) newStage(size int) (*stage, error) {
	s := &stage{}
	var err error
	if s.buf, err = pinmem.Alloc(size, e.flags, e.popts...); err != nil {
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

// grow pins the stages of class k that a borrower lacks to find want idle,
// up to limit in all, outside the lock, and adds them to the idle ones. It
// stops when ctx ends or pinning fails and returns that error; a failed
// pinning with stages there marks the class short (no more pinning until
// a member joins), so that transfers run with what there is rather than
// try again each time. e.mu held on entry and return.
func (e *engine) grow(ctx context.Context, k *class, want, limit int) error {
	n := min(want-len(k.idle), limit-len(k.all)-k.growing)
	if n <= 0 || k.short {
		return nil
	}
	k.growing += n
	e.mu.Unlock()
	var added []*stage
	var err error
	failed := false
	for range n {
		if err = ctx.Err(); err != nil {
			break
		}
		s, aerr := e.newStage(k.size)
		if aerr != nil {
			err, failed = fmt.Errorf("transfer: pinning a staging buffer of %d bytes: %w", k.size, aerr), true
			break
		}
		s.small = k == &e.small
		added = append(added, s)
	}
	e.mu.Lock()
	k.growing -= n
	k.all = append(k.all, added...)
	k.idle = append(k.idle, added...)
	if failed && len(k.all) > 0 {
		k.short = true
	}
	return err
}

// fill pins the ring stages up to the target now (a Pipeline's, see
// engine); it fails when fewer than want are there. A Run of another
// Pipeline waiting for them is served, or woken to pin them itself when
// none is there (handOver).
func (e *engine) fill(ctx context.Context, want int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.grow(ctx, &e.ring, e.target(), e.target())
	e.serve(&e.ring)
	e.handOver(&e.ring)
	if err != nil && len(e.ring.all) < want {
		return err
	}
	return nil
}

// take borrows 1 to want ring stages (takeFrom).
func (e *engine) take(ctx context.Context, want int) ([]*stage, error) {
	return e.takeFrom(ctx, &e.ring, want)
}

// takeFrom borrows 1 to want stages of class k, waiting in FIFO order,
// bounded by ctx. It first pins the stages it lacks (grow): when none is
// pinned nor being pinned and pinning fails, that is its error; with
// stages there, or being pinned by another borrower, it waits for them.
func (e *engine) takeFrom(ctx context.Context, k *class, want int) ([]*stage, error) {
	e.mu.Lock()
	want = max(1, min(want, e.depth))
	if len(k.waiters) == 0 && len(k.idle) >= want {
		got := e.grant(k, want)
		e.mu.Unlock()
		return got, nil
	}
	w := &stageWaiter{want: want}
	front := false // a waiter woken to grow keeps its turn
	for {
		w.ready, w.retry = make(chan struct{}), false
		if front {
			k.waiters = append([]*stageWaiter{w}, k.waiters...)
		} else {
			k.waiters = append(k.waiters, w)
		}
		err := e.grow(ctx, k, want, e.limit(k))
		e.serve(k)
		if err != nil && len(k.all) == 0 && k.growing == 0 && k.dequeue(w) {
			// Nothing to wait for: the error is the transfer's.
			e.handOver(k)
			e.mu.Unlock()
			return nil, err
		}
		e.mu.Unlock()
		select {
		case <-w.ready:
		case <-ctx.Done():
			e.mu.Lock()
			if k.dequeue(w) {
				e.mu.Unlock()
				return nil, ctx.Err()
			}
			e.mu.Unlock()
			<-w.ready // served meanwhile: give the stages back
			if w.retry {
				e.mu.Lock()
				e.handOver(k)
				e.mu.Unlock()
			}
			e.give(w.got)
			return nil, ctx.Err()
		}
		if !w.retry {
			return w.got, nil
		}
		e.mu.Lock()
		front = true
	}
}

// dequeue removes w from k's waiters and reports whether it was there. e.mu held.
func (k *class) dequeue(w *stageWaiter) bool {
	for i, x := range k.waiters {
		if x == w {
			k.waiters = append(k.waiters[:i], k.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// handOver wakes k's first waiter to pin the stages itself when none is
// pinned or being pinned (the borrower pinning them failed or its context
// ended), so that no waiter waits for nothing. e.mu held.
func (e *engine) handOver(k *class) {
	if len(k.all) > 0 || k.growing > 0 || len(k.waiters) == 0 {
		return
	}
	w := k.waiters[0]
	k.waiters = k.waiters[1:]
	w.retry = true
	close(w.ready)
}

// grant takes up to want idle stages of class k. e.mu held.
func (e *engine) grant(k *class, want int) []*stage {
	n := min(want, len(k.idle))
	got := append([]*stage(nil), k.idle[len(k.idle)-n:]...)
	k.idle = k.idle[:len(k.idle)-n]
	if k == &e.ring {
		e.peak = max(e.peak, len(k.all)-len(k.idle))
	}
	return got
}

// serve hands idle stages of class k to its waiters, first come first
// served. e.mu held.
func (e *engine) serve(k *class) {
	for len(k.waiters) > 0 && len(k.idle) > 0 {
		w := k.waiters[0]
		k.waiters = k.waiters[1:]
		w.got = e.grant(k, w.want)
		close(w.ready)
	}
}

// give returns borrowed stages; everything queued on them has run.
func (e *engine) give(ss []*stage) {
	if len(ss) == 0 {
		return
	}
	e.mu.Lock()
	for _, s := range ss {
		k := &e.ring
		if s.small {
			k = &e.small
		}
		k.idle = append(k.idle, s)
	}
	e.serve(&e.ring)
	e.serve(&e.small)
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
	for _, k := range []*class{&e.ring, &e.small} {
		for _, s := range k.all {
			errs = append(errs, s.free(&left))
		}
	}
	return left, errors.Join(errs...)
}

// isClosed reports whether the engine's last member has left.
func (e *engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// tryTake borrows an idle stage for a one-stage transfer without waiting
// for one, a small stage when small (pathSmall) else a ring stage, first
// pinning one when none is idle and the class may grow (bounded by ctx).
// It returns nil when it has none, or a transfer waits for stages of the
// class already (it is not overtaken): the transfer then takes the ring,
// which waits or reports the pinning's error; a small one waits for a
// small stage instead (wait) when the small stages there (or being
// pinned) are all it may run on, none of the ring's being pinned. A
// transfer that came to wait while it pinned gets what it pinned
// (serve), or is woken to pin itself when it pinned none and none is
// there (handOver).
func (e *engine) tryTake(ctx context.Context, small bool) (s *stage, wait bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := &e.ring
	if small {
		k = &e.small
	}
	if len(k.waiters) == 0 {
		_ = e.grow(ctx, k, 1, e.limit(k)) // failing, the ring path tries and says why
	}
	if len(k.waiters) > 0 || len(k.idle) == 0 {
		e.serve(k)
		e.handOver(k)
		return nil, small && len(e.ring.all) == 0 && (len(k.all) > 0 || k.growing > 0)
	}
	s = k.idle[len(k.idle)-1]
	k.idle = k.idle[:len(k.idle)-1]
	if !small {
		e.peak = max(e.peak, len(k.all)-len(k.idle))
	}
	return s, false
}
