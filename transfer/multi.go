package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/track"
)

// Multi moves data between host memory and several devices (or several
// contexts) at once: Broadcast sends the same host data to every device,
// Gather brings every device's data to the host. Each device has its own
// Copier, with staging memory allocated for that device (so on a
// multi-socket host it is placed on the device's NUMA node); every call
// copies on the devices' Copiers' lanes. Broadcast stages through the
// first device's Copier's stages, which are pinned portable, so that every
// context can copy from them. Its methods are safe for concurrent use;
// Broadcasts run one at a time.
//
// A Multi dropped without Close is reported (track: "multi") and its
// Copiers, streams, events, staging memory and goroutines are released by
// the garbage collector's cleanup; until then they stay allocated.
type Multi struct {
	*multi
	cleanup runtime.Cleanup
}

// multi is a Multi's state; it never refers back to the Multi.
type multi struct {
	devs []*multiDev
	o    options
	// ring is held by the Broadcast in progress (and the copies it left
	// queued): the devices' Broadcast events are its.
	ring chan struct{}

	gate // calls and abandoned drains in progress
	rel  releaser

	pinned pinnedSet // AddPinned
}

// multiDev is one context's share of a Multi.
type multiDev struct {
	cp *Copier
	// evs: one per stage of a Broadcast, recorded behind the device's
	// copy out of it; the stage is refilled once every device's ran.
	evs []*cuda.Event
}

// MultiStats describe one multi-device transfer.
type MultiStats struct {
	Direction Direction
	Devices   int           // devices the transfer served
	Bytes     int64         // bytes per device
	Wall      time.Duration // from the call to the last device finishing
	Staged    bool          // the host side went through pinned stages
	CopyCPU   time.Duration // CPU time spent copying between Go memory and stages (WithStats(true); zero otherwise)
	// PerDevice holds each device's own Stats for Gather and Scatter (nil
	// for Broadcast, whose copies share their stages).
	PerDevice []Stats
}

// GBps returns the aggregate bandwidth: the bytes moved to or from all
// devices together per second of wall time (10^9 bytes per second).
func (s MultiStats) GBps() float64 { return gbps(float64(s.Bytes)*float64(s.Devices), s.Wall) }

// NewMulti creates a Multi for the contexts ctxs (typically every device's
// primary context; one context, or two contexts of one device, work too).
// The options apply to every device's Copier; WithParallelism is the
// total number of CPU copy goroutines, shared out between the devices'
// Copiers (a Broadcast's CPU copy takes them all). WithStream is refused:
// each device needs its own stream. A refused option is a
// *pinmem.OptionError (matching cuda.ErrInvalidValue) naming it. The
// caller must Close the Multi.
func NewMulti(ctxs []*cuda.Context, opts ...Option) (*Multi, error) {
	retryOrphans()
	if len(ctxs) == 0 {
		return nil, fmt.Errorf("transfer: NewMulti without contexts: %w", cuda.ErrInvalidValue)
	}
	for i, c := range ctxs {
		if c == nil {
			return nil, fmt.Errorf("transfer: NewMulti: context %d is nil: %w", i, cuda.ErrInvalidValue)
		}
	}
	o, err := buildOptions("transfer.NewMulti", opts)
	if err != nil {
		return nil, err
	}
	if o.stream != nil {
		return nil, &pinmem.OptionError{Func: "transfer.NewMulti", Option: "WithStream", Value: "a stream", Reason: "each device needs its own stream"}
	}
	s, err := newMultiState(ctxs, o)
	if err != nil {
		return nil, err
	}
	m := &Multi{multi: s}
	m.cleanup = runtime.AddCleanup(m, func(s *multi) { s.dropped() }, s)
	return m, nil
}

func newMultiState(ctxs []*cuda.Context, o options) (m *multi, err error) {
	m = &multi{o: o, ring: make(chan struct{}, 1), gate: newGate()}
	m.rel.step = m.releaseStep
	defer func() {
		if err != nil {
			m.markClosed()
			err = errors.Join(err, m.rel.release())
			orphan(&m.rel)
			m = nil
		}
	}()
	co := o
	co.parallelism = max(1, o.parallelism/len(ctxs))
	for i, c := range ctxs {
		d := &multiDev{}
		m.devs = append(m.devs, d)
		// The Copiers belong to the Multi: no cleanup of their own.
		cs, err := newCopierState(c, co)
		if err != nil {
			return m, fmt.Errorf("transfer: copier of device %d: %w", i, err)
		}
		d.cp = &Copier{copier: cs}
		for range o.depth {
			ev, err := c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming)
			if err != nil {
				return m, err
			}
			d.evs = append(d.evs, ev)
		}
	}
	// Broadcast's CPU copies take the whole parallelism, with the first
	// device's copy goroutines.
	m.devs[0].cp.eng.pool.grow(min(o.parallelism, runtime.NumCPU()) - 1)
	return m, nil
}

func (m *Multi) ok() bool { return m != nil && m.multi != nil }

// Copier returns the Copier of context i, for single-device transfers,
// or nil when i is out of range. It belongs to the Multi: do not Close it.
func (m *Multi) Copier(i int) *Copier {
	if !m.ok() || i < 0 || i >= len(m.devs) {
		return nil
	}
	return m.devs[i].cp
}

// AddPinned tells the Multi (and every device's Copier) that b is pinned:
// b must be Portable to be copied directly to or from every context.
// Broadcasting a source that lies entirely inside b then copies it
// directly to every device, without staging. Portable buffers pinmem
// pinned (pinmem.Alloc, pinmem.Register, pool blocks) are recognised
// without it (pinmem.Lookup). The returned function forgets
// b again; call it before freeing b. A nil Multi or buffer is ignored.
func (m *Multi) AddPinned(b *pinmem.Buffer) (remove func()) {
	if !m.ok() || b == nil {
		return func() {}
	}
	rms := []func(){m.pinned.add(b)}
	for _, d := range m.devs {
		rms = append(rms, d.cp.pinned.add(b))
	}
	return func() {
		for _, rm := range rms {
			rm() // each removes once
		}
	}
}

// Fence waits, bounded by ctx, until no copy left queued by a call of the
// Multi (or of its devices' Copiers) that returned before Fence was called
// will touch memory again: Copier.Fence for every device. Call it after an
// error before reusing pinned memory the failed call was copying.
func (m *Multi) Fence(ctx context.Context) error {
	if !m.ok() {
		return errNil("Multi")
	}
	for _, d := range m.devs {
		if err := d.cp.Fence(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the Multi (later calls return ErrClosed), waits for the calls
// in progress and for copies they left queued, and releases everything the
// Multi created, its Copiers included. The wait is bounded by ctx as
// Copier.Close's is: when ctx ends first, Close returns an error matching
// ctx.Err(), the Multi stays closed, and its resources are released in the
// background once the copies in flight finish. A release the driver fails
// keeps the object held (and counted by pinmem and cuda) and returns the
// error; a later Close waits again for what an earlier one left (bounded by
// its own ctx) and retries those releases. Once everything is released, a
// further Close returns ErrClosed.
func (m *Multi) Close(ctx context.Context) error {
	if !m.ok() {
		return errNil("Multi")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	first := m.markClosed()
	return closeOwner(ctx, "Multi", first, &m.rel, &m.cleanup, m.idle)
}

// dropped is the cleanup of a Multi that became unreachable without Close.
func (m *multi) dropped() {
	if !m.markClosed() {
		return
	}
	track.Dropped("multi", "devices", len(m.devs))
	go func() { <-m.idle; _ = m.rel.release() }()
}

// releaseStep frees whatever newMultiState created (rel.step).
func (m *multi) releaseStep() (left int, err error) {
	var errs []error
	for _, d := range m.devs {
		for i := range d.evs {
			errs = append(errs, destroyEvent(&d.evs[i], &left))
		}
		if d.cp != nil {
			d.cp.markClosed()
			<-d.cp.idle
			errs = append(errs, d.cp.rel.release())
			if !d.cp.rel.released() {
				left++
			}
		}
	}
	return left, errors.Join(errs...)
}

// enter checks the receiver and the context of a blocking call and
// registers it; the caller must call m.end() when enter returned nil.
func (m *Multi) enter(ctx context.Context) error {
	if !m.ok() {
		return errNil("Multi")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return m.begin()
}

// checkBufs checks one device buffer per context, each on its context's
// device.
func (m *multi) checkBufs(op string, bufs []*cuda.DeviceBuffer) error {
	if len(bufs) != len(m.devs) {
		return fmt.Errorf("transfer: %s with %d device buffers for %d devices: %w", op, len(bufs), len(m.devs), cuda.ErrInvalidValue)
	}
	for i, b := range bufs {
		if err := checkBuf(b, m.devs[i].cp.cctx.Device(), fmt.Sprintf("%s device buffer %d", op, i)); err != nil {
			return err
		}
	}
	return nil
}

// directSpans returns host's registrations, in order, when host is pinned
// for every context: it lies in buffers made known with AddPinned, or in
// Portable buffers pinmem pinned (with a single context, any buffer
// pinmem pinned). ok is false when part of host is not.
func (m *multi) directSpans(host []byte) (spans []span, ok bool) {
	spans, cuts := m.pinned.spans(host, nil, nil)
	spans, cuts = lookupSpansIf(host, spans, cuts, func(b *pinmem.Buffer) bool {
		return len(m.devs) == 1 || b.Flags()&pinmem.Portable != 0
	})
	spans = splitAtCuts(normalize(spans), cuts)
	return spans, covers(spans, len(host))
}

// Broadcast copies src to the start of every device buffer dsts[i] (one per
// context, in NewMulti's order) and returns when the data is on every
// device. The host data is staged once per chunk into a portable stage of
// the first device's Copier; each chunk is then queued on a lane of every
// device's Copier, so the copies to different devices run concurrently
// and in step: a device never waits for another device's copy, only, when
// the stages are all in use, for the slowest device to finish with a
// stage before it is refilled. A src pinned for every context (see
// AddPinned) is copied directly, one copy per registration it spans.
//
// Cancellation stops issuing chunks and returns an error matching
// ctx.Err() without waiting for the copies already queued (see the package
// documentation); the device buffers then hold partial data, and the
// Multi's next call waits for those copies.
func (m *Multi) Broadcast(ctx context.Context, dsts []*cuda.DeviceBuffer, src []byte) (MultiStats, error) {
	st := MultiStats{Direction: HostToDevice, Bytes: int64(len(src))}
	if err := m.enter(ctx); err != nil {
		return st, err
	}
	defer m.end()
	st.Devices = len(m.devs)
	if err := m.checkBufs("broadcast", dsts); err != nil {
		return st, err
	}
	for i, d := range dsts {
		if len(src) > d.Size() {
			return st, &SizeError{Op: fmt.Sprintf("broadcast to device %d", i), Need: len(src), Have: d.Size()}
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if len(src) == 0 {
		return st, nil
	}
	start := time.Now()
	select {
	case m.ring <- struct{}{}:
	case <-ctx.Done():
		return st, ctx.Err()
	}
	b, err := m.startBroadcast(ctx)
	if err == nil {
		if spans, ok := m.directSpans(src); ok {
			err = b.direct(dsts, src, spans)
		} else {
			st.Staged = true
			err = b.staged(ctx, dsts, src, &st)
		}
		err = b.finish(ctx, err)
	}
	st.Wall = time.Since(start)
	if err != nil {
		return st, fmt.Errorf("transfer: broadcast of %d bytes to %d devices: %w", len(src), len(m.devs), err)
	}
	return st, nil
}

// broadcast is a Broadcast in progress: a lane of every device's Copier
// (each ordered after the copies earlier calls left queued on that
// device) and the stages it borrowed from the first device's engine.
type broadcast struct {
	m      *multi
	lanes  []*lane
	stages []*stage
}

// startBroadcast takes a lane of every device's Copier, bounded by ctx.
// On an error it gives back the lanes taken (nothing is queued) and the
// ring.
func (m *multi) startBroadcast(ctx context.Context) (*broadcast, error) {
	b := &broadcast{m: m}
	for i, d := range m.devs {
		l, err := d.cp.acquire(ctx)
		if err != nil {
			for j, l := range b.lanes {
				m.devs[j].cp.releaseLane(l)
			}
			<-m.ring
			return nil, fmt.Errorf("device %d: %w", i, err)
		}
		b.lanes = append(b.lanes, l)
	}
	return b, nil
}

// direct queues the copies of a src pinned for every context: one per
// registration (a copy must not span two) and device.
func (b *broadcast) direct(dsts []*cuda.DeviceBuffer, src []byte, spans []span) error {
	for i, l := range b.lanes {
		for _, sp := range spans {
			if err := l.stream.CopyHtoD(dsts[i], sp.lo, src[sp.lo:sp.hi]); err != nil {
				return fmt.Errorf("device %d: %w", i, err)
			}
		}
	}
	return nil
}

// staged copies src chunk by chunk into the borrowed stages in turn and
// queues each chunk's copy out of its stage on every device's lane, with
// the device's event for that stage behind it; a stage is refilled once
// every device's copy out of it ran.
func (b *broadcast) staged(ctx context.Context, dsts []*cuda.DeviceBuffer, src []byte, st *MultiStats) error {
	m := b.m
	c0 := m.devs[0].cp
	chunk := c0.chunkSize(len(src))
	ss, err := c0.eng.take(ctx, min((len(src)+chunk-1)/chunk, len(m.devs[0].evs)))
	if err != nil {
		return err
	}
	b.stages = ss
	for k, off := 0, 0; off < len(src); k, off = k+1, off+chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(chunk, len(src)-off)
		s := ss[k%len(ss)]
		if k >= len(ss) {
			for i, l := range b.lanes {
				if err := l.w.wait(ctx, m.devs[i].evs[k%len(ss)]); err != nil {
					return err
				}
			}
		}
		st.CopyCPU += c0.eng.pool.copyN(m.o.parallelism, c0.o.tune.subPieces, s.mem[:n], src[off:off+n])
		for i, l := range b.lanes {
			if err := s.htod(l.stream, dsts[i], off, 0, n); err != nil {
				return fmt.Errorf("device %d: %w", i, err)
			}
			if err := m.devs[i].evs[k%len(ss)].Record(l.stream); err != nil {
				return fmt.Errorf("device %d: %w", i, err)
			}
		}
	}
	return nil
}

// finish ends the Broadcast on every device as a Copier's transfer ends
// (copier.finish): it waits, bounded by ctx, for the device's copies and
// gives its lane back, or, once the Broadcast stopped early (first) or ctx
// ended, hands the lane and its copies to the device's Copier's fence. The
// stages and the ring are given back once every device's copies ran. It
// returns first, else the first error of a device.
func (b *broadcast) finish(ctx context.Context, first error) error {
	m := b.m
	var left sync.WaitGroup
	left.Add(len(b.lanes))
	for i, l := range b.lanes {
		var st Stats
		if err := m.devs[i].cp.finish(ctx, l, nil, true, first, &st, left.Done); err != nil && first == nil {
			first = fmt.Errorf("device %d: %w", i, err)
		}
	}
	give := func() {
		m.devs[0].cp.eng.give(b.stages)
		<-m.ring
	}
	if first == nil {
		give() // every device's lane came back: its copies ran
		return nil
	}
	m.hold()
	go func() {
		defer m.end()
		left.Wait() // the drains handed off above end; this only waits for them
		give()
	}()
	return first
}

// Gather copies, from every device at once, len(dsts[i]) bytes at the start
// of srcs[i] into dsts[i] (one pair per context, in NewMulti's order), and
// returns when all of them are in host memory. Each device copies through
// its own Copier (its own stream, staging ring and waiter), so the devices
// run concurrently. An error or the end of ctx stops every device's
// transfer and Gather returns the first error without waiting for copies
// already queued on a device (see the package documentation), but never
// before every CPU copy into dsts has stopped; a device's error names the
// device. The Multi's next call is ordered after the queued copies; for
// pinned dsts, Fence waits for them.
func (m *Multi) Gather(ctx context.Context, dsts [][]byte, srcs []*cuda.DeviceBuffer) (MultiStats, error) {
	return m.each(ctx, DeviceToHost, len(dsts), srcs, func(i int, ctx context.Context) *Op {
		return m.devs[i].cp.DtoHAsync(ctx, dsts[i], srcs[i])
	}, func(i int) int64 { return int64(len(dsts[i])) })
}

// Scatter copies srcs[i] to the start of dsts[i] on every device at once
// (one pair per context, in NewMulti's order): different data to each
// device, each through its own Copier. It is Gather's mirror.
func (m *Multi) Scatter(ctx context.Context, dsts []*cuda.DeviceBuffer, srcs [][]byte) (MultiStats, error) {
	return m.each(ctx, HostToDevice, len(srcs), dsts, func(i int, ctx context.Context) *Op {
		return m.devs[i].cp.HtoDAsync(ctx, dsts[i], srcs[i])
	}, func(i int) int64 { return int64(len(srcs[i])) })
}

// each runs one asynchronous transfer per device and waits for all.
func (m *Multi) each(ctx context.Context, dir Direction, nHost int, devBufs []*cuda.DeviceBuffer, start func(int, context.Context) *Op, size func(int) int64) (MultiStats, error) {
	st := MultiStats{Direction: dir}
	if err := m.enter(ctx); err != nil {
		return st, err
	}
	defer m.end()
	st.Devices = len(m.devs)
	if nHost != len(m.devs) {
		return st, fmt.Errorf("transfer: %s with %d host buffers for %d devices: %w", dir, nHost, len(m.devs), cuda.ErrInvalidValue)
	}
	if err := m.checkBufs(dir.String(), devBufs); err != nil {
		return st, err
	}
	for i := range m.devs {
		st.Bytes = max(st.Bytes, size(i))
	}
	// One failure stops the other devices too.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	ts := make([]*Op, len(m.devs))
	for i := range m.devs {
		ts[i] = start(i, cctx)
	}
	// Report the error that stopped the others, not the cancellation it
	// caused in them. An Op is done once its copies no longer touch its
	// memory, which on a hung device is never: the wait is bounded by the
	// caller's ctx.
	var first, cancelled error
	for i, t := range ts {
		s, err := t.Wait(ctx)
		st.PerDevice = append(st.PerDevice, s)
		st.CopyCPU += s.CopyCPU
		st.Staged = st.Staged || s.StagedBytes > 0
		if err == nil {
			continue
		}
		cancel()
		err = fmt.Errorf("device %d: %w", i, err)
		if errors.Is(err, context.Canceled) && cancelled == nil {
			cancelled = err
		} else if !errors.Is(err, context.Canceled) && first == nil {
			first = err
		}
	}
	if first == nil {
		first = cancelled
	}
	// A Wait that ended with ctx left its Op running: stop every Op and
	// return only once each one's own call has, so that no CPU copy of
	// this call reads or writes the caller's memory after it returns.
	// The calls are bounded by cctx; copies they left queued on a device
	// are ordered before the Multi's next call by each Copier's fence.
	cancel()
	for _, t := range ts {
		<-t.returned
	}
	st.Wall = time.Since(t0)
	if first != nil {
		return st, fmt.Errorf("transfer: %s with %d devices: %w", dir, len(m.devs), first)
	}
	return st, nil
}
