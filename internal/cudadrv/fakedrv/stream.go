package fakedrv

import (
	"slices"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
)

// task is one queued asynchronous operation.
type task struct {
	name      string
	stream    *stream
	ctx       cudadrv.Context // the context the work runs in
	wait      []*task         // operations that must be done before this one runs
	run       func() error    // nil for markers (event records, waits)
	fail      inject          // an injected asynchronous fault
	done      bool
	cancelled bool
	doneAt    time.Time
	err       error
	sync      bool   // a synchronous call waits for it and reports its error itself
	fault     *fault // for an event record: the fault of its stream not yet reported when it ran
}

// fault is an asynchronous error, reported once: by the first query or
// synchronization that observes it (see exec).
type fault struct {
	err      error
	ctx      cudadrv.Context // the context of the work that faulted
	reported bool
}

type stream struct {
	h         cudadrv.Stream
	seq       int             // creation order among the fake's streams, from 1
	ctx       cudadrv.Context // the context the stream was created in; 0 for the legacy default stream
	flags     uint32
	queue     []*task
	last      *task // last operation enqueued
	held      bool
	destroyed bool
	err       *fault // latest asynchronous fault of the stream's work, reported or not
	polls     int    // queries that found the stream's work not ready
	pollOp    string // the driver function of the latest one
}

func (s *stream) blocking() bool { return s.flags&cudadrv.StreamNonBlocking == 0 }

type event struct {
	h         cudadrv.Event
	ctx       cudadrv.Context // the context current at creation
	flags     uint32
	rec       *task // the latest EventRecord, nil when never recorded
	destroyed bool
}

// stream returns the stream of handle h; 0, 1 (CU_STREAM_LEGACY) and 2
// (CU_STREAM_PER_THREAD) are the legacy default stream.
func (d *Driver) stream(op string, h cudadrv.Stream) (*stream, error) {
	if h <= 2 {
		return d.def, nil
	}
	s, ok := d.streams[h]
	if !ok {
		return nil, errorWhy(op, cudadrv.ErrorInvalidHandle, "stream %#x unknown or destroyed", uintptr(h))
	}
	return s, nil
}

// streamOf is stream for a driver call that queues work on h or waits for
// it: the legacy default stream belongs to the context current on the
// calling thread, so it needs one; an explicit stream carries its own
// context and is refused only while another context is current. d.mu must
// be held.
func (d *Driver) streamOf(op string, h cudadrv.Stream) (*stream, error) {
	s, err := d.stream(op, h)
	if err != nil {
		return nil, err
	}
	if s == d.def {
		if _, _, err := d.needCtx(op); err != nil {
			return nil, err
		}
		return s, nil
	}
	if c := d.cur[threadID()]; c != 0 && s.ctx != 0 && c != s.ctx {
		return nil, errorWhy(op, cudadrv.ErrorInvalidContext, "stream %#x belongs to context %#x, but context %#x is current on the calling thread", uintptr(h), uintptr(s.ctx), uintptr(c))
	}
	if err := d.stuck(op, s.ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (d *Driver) notify() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// enqueue queues work on s, with the legacy default stream's implicit
// synchronization, and runs whatever can run. d.mu must be held.
func (d *Driver) enqueue(s *stream, name string, fail inject, run func() error) *task {
	return d.push(s, &task{name: name, run: run, fail: fail})
}

// push queues o on s, adding the legacy default stream's implicit waits.
func (d *Driver) push(s *stream, o *task) *task {
	o.stream = s
	o.ctx = s.ctx
	if s == d.def {
		o.ctx = d.cur[threadID()]
	}
	if s == d.def {
		for _, t := range d.active {
			if t != s && t.blocking() && t.last != nil && !t.last.done {
				o.wait = append(o.wait, t.last)
			}
		}
	} else if s.blocking() && d.def.last != nil && !d.def.last.done {
		o.wait = append(o.wait, d.def.last)
	}
	s.queue = append(s.queue, o)
	s.last = o
	d.pump()
	return o
}

// pump runs every queued operation that nothing holds back. d.mu must be held.
func (d *Driver) pump() {
	any := false
	for progress := true; progress && !d.paused; {
		progress = false
		for _, s := range d.active {
			for !s.held && len(s.queue) > 0 {
				o := s.queue[0]
				if !ready(o.wait) {
					break
				}
				s.queue[0] = nil
				s.queue = s.queue[1:]
				d.exec(o)
				progress, any = true, true
			}
		}
	}
	// Forget destroyed streams once their work is done.
	keep := d.active[:0]
	for _, s := range d.active {
		if !s.destroyed || len(s.queue) > 0 {
			keep = append(keep, s)
		}
	}
	clear(d.active[len(keep):])
	d.active = keep
	if any {
		d.notify()
	}
}

func ready(wait []*task) bool {
	for _, w := range wait {
		if w != nil && !w.done {
			return false
		}
	}
	return true
}

// exec runs o. An asynchronous error becomes the fault of o's stream,
// reported as a GPU reports a fault: by the first of a query or
// synchronization of the stream, a query or synchronization of an event
// recorded on the stream after o, or a synchronization of the context. A
// sticky fault (a fault of the work itself, or an injected one with
// When.Sticky in cudatest) also fails every later call in o's context
// (see stuck), as the driver reports an earlier asynchronous failure.
func (d *Driver) exec(o *task) {
	marker := o.run == nil
	if !o.cancelled {
		switch {
		case o.fail.code != cudadrv.Success:
			o.err = errorWhy(o.name, o.fail.code, "injected asynchronous fault (FailAsync %s)", o.fail.rule)
		case o.run != nil:
			o.err = o.run()
		}
	}
	o.done = true
	o.doneAt = time.Now()
	o.wait = nil
	o.run = nil
	s := o.stream
	if o.err != nil && !o.sync {
		d.asyncErrs = append(d.asyncErrs, o.err)
		if s.err == nil || s.err.reported {
			s.err = &fault{err: o.err, ctx: o.ctx}
		}
	}
	// A fault of the work itself (memory freed or unregistered before it
	// ran, a kernel that failed) breaks the context, as
	// CUDA_ERROR_ILLEGAL_ADDRESS does on a GPU: every later call in it,
	// cuStreamQuery of any of its streams included, reports it again. An
	// injected fault does so only when the rule is sticky.
	if o.err != nil && (o.fail.sticky || o.fail.code == cudadrv.Success) {
		d.stick(o.ctx, o.err)
	}
	if marker && s.err != nil && !s.err.reported {
		o.fault = s.err // an event record behind the fault reports it
	}
}

// waitFor blocks, with d.mu held on entry and exit, until every task of
// on is done, running released work as it goes; while it blocks, Blocked
// reports it as op. It fails after the wait timeout.
func (d *Driver) waitFor(op string, on ...*task) error {
	cond := func() bool { return ready(on) }
	var timeout <-chan time.Time
	w := &waiter{op: op, on: on}
	defer func() {
		if d.waiters[w] {
			delete(d.waiters, w)
			d.notify()
		}
	}()
	for {
		d.pump()
		if cond() {
			return nil
		}
		if !d.waiters[w] {
			d.waiters[w] = true
			d.notify()
		}
		if timeout == nil && d.timeout > 0 {
			t := time.NewTimer(d.timeout)
			defer t.Stop()
			timeout = t.C
		}
		ch := d.changed
		d.mu.Unlock()
		select {
		case <-ch:
			d.mu.Lock()
		case <-timeout:
			d.mu.Lock()
			if cond() {
				return nil
			}
			return errorWhy(op, cudadrv.ErrorLaunchTimeout, "waited %v for held or paused work (release it from another goroutine)", d.timeout)
		}
		if d.closed {
			return errorWhy(op, cudadrv.ErrorDeinitialized, "driver closed while waiting")
		}
	}
}

// waitOp waits for a synchronous call's operation and returns its error.
func (d *Driver) waitOp(name string, o *task) error {
	o.sync = true
	if err := d.waitFor(name, o); err != nil {
		o.cancelled = true
		return err
	}
	return o.err
}

// report returns f's error, relabelled as reported by the call op, unless
// f is nil or was reported already; f counts as reported from now on.
func report(f *fault, op string) error {
	if f == nil || f.reported {
		return nil
	}
	f.reported = true
	return relabelFor(f.err, op)
}

// relabelFor returns err as reported by the call op, naming the operation
// that failed.
func relabelFor(err error, op string) error {
	if e, ok := err.(*cudadrv.Error); ok {
		c := *e
		if e.Op != op {
			c.Detail += " (reported for " + e.Op + ")"
		}
		c.Op = op
		return &c
	}
	return err
}

// HoldStream stops queued work on s (0 is the legacy default stream) from
// running until ReleaseStream. Synchronizing on held work blocks.
func (d *Driver) HoldStream(s cudadrv.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stream("HoldStream", s)
	if err != nil {
		return err
	}
	st.held = true
	return nil
}

// ReleaseStream lets held work on s run; it may be called from any goroutine.
func (d *Driver) ReleaseStream(s cudadrv.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stream("ReleaseStream", s)
	if err != nil {
		return err
	}
	st.held = false
	d.pump()
	d.notify()
	return nil
}

// Pause stops all queued work, on every stream, from running until Resume.
func (d *Driver) Pause() {
	d.mu.Lock()
	d.paused = true
	d.mu.Unlock()
}

// Resume undoes Pause; it may be called from any goroutine.
func (d *Driver) Resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.paused = false
	d.pump()
	d.notify()
}

// Pending returns how many operations are queued on s and not yet run.
func (d *Driver) Pending(s cudadrv.Stream) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stream("Pending", s)
	if err != nil {
		return 0
	}
	return len(st.queue)
}

// StreamCreate is cuStreamCreate; flags are StreamDefault or StreamNonBlocking.
func (d *Driver) StreamCreate(flags uint32) (cudadrv.Stream, error) {
	const op = "cuStreamCreate"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if flags&^cudadrv.StreamNonBlocking != 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, _, err := d.needCtx(op)
	if err != nil {
		return 0, err
	}
	d.nextStream += 0x10
	d.streamSeq++
	s := &stream{h: cudadrv.Stream(d.nextStream), seq: d.streamSeq, ctx: ctx, flags: flags}
	d.streams[s.h] = s
	d.active = append(d.active, s)
	return s.h, nil
}

// StreamDestroy is cuStreamDestroy_v2. As in CUDA, queued work still runs;
// the handle is invalid at once. The default stream cannot be destroyed.
func (d *Driver) StreamDestroy(s cudadrv.Stream) error {
	const op = "cuStreamDestroy_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.streams[s]
	if !ok {
		return errorWhy(op, cudadrv.ErrorInvalidHandle, "stream %#x unknown, destroyed or the default stream", uintptr(s))
	}
	delete(d.streams, s)
	st.destroyed = true
	st.held = false
	d.pump()
	return nil
}

// StreamSynchronize is cuStreamSynchronize: it waits for the work queued on
// s and returns the fault of that work not yet reported, if any.
func (d *Driver) StreamSynchronize(s cudadrv.Stream) error {
	const op = "cuStreamSynchronize"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	if err := d.waitFor(op, st.last); err != nil {
		return err
	}
	return report(st.err, op)
}

// StreamQuery is cuStreamQuery: an error matching ErrNotReady while s has
// queued work; then the fault of its work not yet reported, if any, as
// StreamSynchronize reports it.
func (d *Driver) StreamQuery(s cudadrv.Stream) error {
	const op = "cuStreamQuery"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	d.pump()
	if len(st.queue) > 0 {
		d.poll(st, op)
		return errorOf(op, cudadrv.ErrorNotReady)
	}
	return report(st.err, op)
}

// StreamWaitEvent is cuStreamWaitEvent: later work on s waits for the
// event's latest record (as of this call) to complete.
func (d *Driver) StreamWaitEvent(s cudadrv.Stream, e cudadrv.Event, flags uint32) error {
	const op = "cuStreamWaitEvent"
	if _, err := d.begin(op); err != nil {
		return err
	}
	if flags&^uint32(1) != 0 {
		return errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	ev, ok := d.events[e]
	if !ok {
		return errorWhy(op, cudadrv.ErrorInvalidHandle, "event %#x unknown or destroyed", uintptr(e))
	}
	o := &task{name: op, stream: st}
	if ev.rec != nil && !ev.rec.done {
		o.wait = []*task{ev.rec}
	}
	d.push(st, o)
	return nil
}

// CtxSynchronize is cuCtxSynchronize: it waits for the work queued in the
// current context and returns the first asynchronous error of that work
// not yet reported. The work and the faults of other contexts are theirs.
func (d *Driver) CtxSynchronize() error {
	const op = "cuCtxSynchronize"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, _, err := d.needCtx(op)
	if err != nil {
		return err
	}
	var lasts []*task
	for _, s := range d.active {
		if s == d.def {
			// The fake's one legacy default stream serves every context:
			// the context's work on it is what it queued there last.
			for _, o := range slices.Backward(s.queue) {
				if o.ctx == ctx {
					lasts = append(lasts, o)
					break
				}
			}
		} else if s.ctx == ctx && s.last != nil {
			lasts = append(lasts, s.last)
		}
	}
	if err := d.waitFor(op, lasts...); err != nil {
		return err
	}
	var first error
	for _, s := range d.active {
		if s.err == nil || s.err.ctx != ctx {
			continue
		}
		if err := report(s.err, op); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// EventCreate is cuEventCreate.
func (d *Driver) EventCreate(flags uint32) (cudadrv.Event, error) {
	const op = "cuEventCreate"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	if flags&^uint32(0x7) != 0 {
		return 0, errorWhy(op, cudadrv.ErrorInvalidValue, "flags %#x", flags)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, _, err := d.needCtx(op)
	if err != nil {
		return 0, err
	}
	d.nextEvent += 0x10
	e := &event{h: cudadrv.Event(d.nextEvent), ctx: ctx, flags: flags}
	d.events[e.h] = e
	return e.h, nil
}

// EventDestroy is cuEventDestroy_v2; a pending record still completes.
func (d *Driver) EventDestroy(e cudadrv.Event) error {
	const op = "cuEventDestroy_v2"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.events[e]
	if !ok {
		return errorWhy(op, cudadrv.ErrorInvalidHandle, "event %#x unknown or destroyed", uintptr(e))
	}
	ev.destroyed = true
	delete(d.events, e)
	return nil
}

// event returns the live event e for a call that uses it. d.mu must be held.
func (d *Driver) event(op string, e cudadrv.Event) (*event, error) {
	ev, ok := d.events[e]
	if !ok {
		return nil, errorWhy(op, cudadrv.ErrorInvalidHandle, "event %#x unknown or destroyed", uintptr(e))
	}
	if err := d.stuck(op, ev.ctx); err != nil {
		return nil, err
	}
	return ev, nil
}

// EventRecord is cuEventRecord: the event completes when the work queued
// on s before it has run.
func (d *Driver) EventRecord(e cudadrv.Event, s cudadrv.Stream) error {
	const op = "cuEventRecord"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, err := d.event(op, e)
	if err != nil {
		return err
	}
	st, err := d.streamOf(op, s)
	if err != nil {
		return err
	}
	o := &task{name: op, stream: st}
	ev.rec = o
	d.push(st, o)
	return nil
}

// EventQuery is cuEventQuery: nil when the latest record completed (or the
// event was never recorded), an error matching ErrNotReady while it has not;
// a fault of the work recorded before it that nothing reported yet is
// reported here.
func (d *Driver) EventQuery(e cudadrv.Event) error {
	const op = "cuEventQuery"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, err := d.event(op, e)
	if err != nil {
		return err
	}
	d.pump()
	if ev.rec == nil {
		return nil
	}
	if !ev.rec.done {
		d.poll(ev.rec.stream, op)
		return errorOf(op, cudadrv.ErrorNotReady)
	}
	return report(ev.rec.fault, op)
}

// EventSynchronize is cuEventSynchronize: it waits for the latest record
// and reports, as EventQuery does, a fault of the work recorded before it.
func (d *Driver) EventSynchronize(e cudadrv.Event) error {
	const op = "cuEventSynchronize"
	if _, err := d.begin(op); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, err := d.event(op, e)
	if err != nil {
		return err
	}
	rec := ev.rec
	if rec == nil {
		return nil
	}
	if err := d.waitFor(op, rec); err != nil {
		return err
	}
	return report(rec.fault, op)
}

// EventElapsedTime is cuEventElapsedTime: the wall-clock milliseconds
// between the moments the two records ran, never negative. Events never
// recorded or created with EventDisableTiming are CUDA_ERROR_INVALID_HANDLE;
// records not yet run are CUDA_ERROR_NOT_READY.
func (d *Driver) EventElapsedTime(start, end cudadrv.Event) (float32, error) {
	const op = "cuEventElapsedTime"
	if _, err := d.begin(op); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a, err := d.event(op, start)
	if err != nil {
		return 0, err
	}
	b, err := d.event(op, end)
	if err != nil {
		return 0, err
	}
	for _, ev := range []*event{a, b} {
		if ev.flags&cudadrv.EventDisableTiming != 0 || ev.rec == nil {
			return 0, errorWhy(op, cudadrv.ErrorInvalidHandle, "event %#x not recorded or created without timing", uintptr(ev.h))
		}
	}
	d.pump()
	if !a.rec.done || !b.rec.done {
		return 0, errorOf(op, cudadrv.ErrorNotReady)
	}
	ms := float32(b.rec.doneAt.Sub(a.rec.doneAt).Seconds() * 1000)
	if ms < 0 {
		ms = 0
	}
	return ms, nil
}

// waiter is a call blocked in waitFor.
type waiter struct {
	op string
	on []*task
}

// poll records that the query op found work of s not ready, for Blocked.
// d.mu must be held.
func (d *Driver) poll(s *stream, op string) {
	s.polls++
	s.pollOp = op
	d.polls++
	d.pollOp = op
	d.notify()
}

// Blocked returns the driver function of a call that waits for work queued
// on stream h (any stream when all is true) and not yet run: a
// synchronizing call blocked on it now, or a query that found it not
// ready since the caller's previous call of Blocked (code that polls
// queries again and again). It also returns the count of such queries so
// far, which the caller passes as seen to its next call; a first call
// passes seen < 0, since the queries before it may have stopped. It
// returns "" when no call waits, and an error for a stream unknown to the
// fake. In the fake, work that has not run is held (HoldStream, Pause) or
// waits for held work, so such a call is blocked on a hold. Changed
// returns a channel closed at the next change, for waiting on Blocked.
func (d *Driver) Blocked(h cudadrv.Stream, all bool, seen int) (op string, polls int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var target *stream
	polls, pollOp := d.polls, d.pollOp
	if !all {
		if target, err = d.stream("Blocked", h); err != nil {
			return "", 0, err
		}
		polls, pollOp = target.polls, target.pollOp
	}
	for w := range d.waiters {
		for _, t := range w.on {
			if t != nil && !t.done && (target == nil || behind(t, target, map[*task]bool{})) {
				return w.op, polls, nil
			}
		}
	}
	if seen >= 0 && polls > seen {
		return pollOp, polls, nil
	}
	return "", polls, nil
}

// behind reports whether task t waits, directly or through the tasks
// queued before it and what they wait for, on work queued on s.
func behind(t *task, s *stream, seen map[*task]bool) bool {
	if t == nil || t.done || seen[t] {
		return false
	}
	seen[t] = true
	if t.stream == s {
		return true
	}
	for _, w := range t.wait {
		if behind(w, s, seen) {
			return true
		}
	}
	for _, o := range t.stream.queue {
		if o == t {
			break
		}
		if behind(o, s, seen) {
			return true
		}
	}
	return false
}

// Changed returns a channel that is closed when queued work makes
// progress, a hold changes or a call starts or stops waiting.
func (d *Driver) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// StreamInfo is a live stream of the fake.
type StreamInfo struct {
	Handle cudadrv.Stream
	Ctx    cudadrv.Context // the context it was created in
	Device cudadrv.Device  // that context's device
}

// Streams returns the live streams, in the order they were created.
func (d *Driver) Streams() []StreamInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []StreamInfo
	for _, s := range d.active {
		if s == d.def || s.destroyed {
			continue
		}
		dev, _ := d.ctxDevice(s.ctx)
		out = append(out, StreamInfo{Handle: s.h, Ctx: s.ctx, Device: dev})
	}
	return out
}
