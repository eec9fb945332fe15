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
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/lifecycle"
	"github.com/pinmem/pinmem/transfer/internal/regcache"
)

// Multi moves data between host memory and several contexts at once,
// each through a Copier of its own (see the package documentation,
// "Several GPUs"). Its methods are safe for concurrent use; Broadcasts
// run one at a time.
type Multi struct {
	*multi
	cleanup runtime.Cleanup
}

// multi is a Multi's state; it never refers back to the Multi.
type multi struct {
	devs   []*multiDev
	o      options
	ring   chan struct{}   // held by the Broadcast in progress and the copies it left queued
	gate   *lifecycle.Gate // calls and abandoned drains in progress
	rel    *lifecycle.Releaser
	pinned pinnedSet // AddPinned
}

// multiDev is one context's share of a Multi.
type multiDev struct {
	cp  *Copier
	evs []*cuda.Event // per Broadcast stage: recorded behind the device's copy out of it
}

// MultiStats describe one multi-device transfer.
type MultiStats struct {
	Direction Direction
	Devices   int           // devices the transfer served
	Bytes     int64         // bytes per device
	Wall      time.Duration // from the call to the last device finishing
	Staged    bool          // the host side, or its parts not pinned, went through pinned stages
	CopyCPU   time.Duration // CPU time spent copying between Go memory and stages (WithStats(true); zero otherwise)
	// PerDevice holds each device's own Stats for Gather and Scatter (nil
	// for Broadcast, whose copies share their stages).
	PerDevice []Stats
}

// GBps returns the aggregate bandwidth: the bytes moved to or from all
// devices together per second of wall time (10^9 bytes per second).
func (s MultiStats) GBps() float64 { return gbps(float64(s.Bytes)*float64(s.Devices), s.Wall) }

// NewMulti creates a Multi for the contexts ctxs. The options apply to
// every device's Copier; WithParallelism is the total number of CPU copy
// goroutines, shared out between the Copiers (a Broadcast's CPU copy takes
// them all). WithStream is refused: each device needs its own stream. A
// refused option is a *pinmem.OptionError (matching cuda.ErrInvalidValue)
// naming it. The caller must Close the Multi.
func NewMulti(ctxs []*cuda.Context, opts ...Option) (*Multi, error) {
	lifecycle.RetryOrphans()
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

// newMultiState creates a Copier (without a cleanup of its own) and the
// Broadcast events per context; on an error it releases what it made.
func newMultiState(ctxs []*cuda.Context, o options) (m *multi, err error) {
	m = &multi{o: o, ring: make(chan struct{}, 1), gate: lifecycle.NewGate(ErrClosed)}
	m.rel = lifecycle.NewReleaser(m.releaseStep)
	defer func() {
		if err != nil {
			m.gate.MarkClosed()
			err = errors.Join(err, m.rel.Release())
			m.rel.Orphan()
			m = nil
		}
	}()
	co := o
	co.parallelism = max(1, o.parallelism/len(ctxs))
	for i, c := range ctxs {
		d := &multiDev{}
		m.devs = append(m.devs, d)
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
	// Broadcast's CPU copies run on the first device's copy goroutines.
	m.devs[0].cp.eng.pool.Grow(min(o.parallelism, runtime.NumCPU()) - 1)
	return m, nil
}

// ok reports whether m may be used: not nil.
func (m *Multi) ok() bool { return m != nil && m.multi != nil }

// Copier returns the Copier of context i, for single-device transfers,
// or nil when i is out of range. It belongs to the Multi: do not Close it.
func (m *Multi) Copier(i int) *Copier {
	if !m.ok() || i < 0 || i >= len(m.devs) {
		return nil
	}
	return m.devs[i].cp
}

// AddPinned tells the Multi and every device's Copier that b, which must
// be Portable, is pinned (pinmem's own Portable buffers are recognised
// without it). The returned function forgets b; call it before freeing
// b. A nil Multi or buffer is ignored.
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
			rm()
		}
	}
}

// Fence is Copier.Fence of every device's Copier, bounded by ctx.
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

// Close closes the Multi and releases everything it created, its Copiers
// included, as the package documentation's Close contract says.
func (m *Multi) Close(ctx context.Context) error {
	if !m.ok() {
		return errNil("Multi")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return lifecycle.Close(ctx, "transfer: closing the Multi", m.gate, m.rel, &m.cleanup)
}

// dropped is the cleanup of a Multi dropped without Close.
func (m *multi) dropped() {
	lifecycle.Dropped(m.gate, m.rel, "multi", "devices", len(m.devs))
}

// releaseStep frees whatever newMultiState created (rel.step).
func (m *multi) releaseStep() (left int, err error) {
	var errs []error
	for _, d := range m.devs {
		for i := range d.evs {
			errs = append(errs, destroyEvent(&d.evs[i], &left))
		}
		if d.cp != nil {
			d.cp.gate.MarkClosed()
			<-d.cp.gate.Idle()
			errs = append(errs, d.cp.rel.Release())
			if !d.cp.rel.Released() {
				left++
			}
		}
	}
	return left, errors.Join(errs...)
}

// enter checks the receiver and ctx of a blocking call and registers it;
// the caller calls m.gate.End() when it returned nil.
func (m *Multi) enter(ctx context.Context) error {
	if !m.ok() {
		return errNil("Multi")
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return m.gate.Begin()
}

// checkBufs checks one device buffer per context, on its context's device.
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

// directSpans returns host's registrations, in order, and whether they
// cover it, counting only buffers pinned for every context (AddPinned,
// Portable, or any with a single context).
func (m *multi) directSpans(host []byte) (spans []span, ok bool) {
	var set hostspan.Set
	m.pinned.addTo(&set, host)
	set.AddLookup(host, func(b *pinmem.Buffer) bool {
		return !regcache.Owns(b) && (len(m.devs) == 1 || b.Flags()&pinmem.Portable != 0)
	})
	spans = set.Split()
	return spans, hostspan.Covers(spans, len(host))
}

// Broadcast copies src to the start of every device buffer dsts[i] (one
// per context, in NewMulti's order) and returns when the data is on every
// device. The parts of src pinned for every context (see AddPinned) are
// copied directly, the rest staged (see the package documentation). An early exit leaves the device buffers with partial data.
func (m *Multi) Broadcast(ctx context.Context, dsts []*cuda.DeviceBuffer, src []byte) (MultiStats, error) {
	st := MultiStats{Direction: HostToDevice, Bytes: int64(len(src))}
	if err := m.enter(ctx); err != nil {
		return st, err
	}
	defer m.gate.End()
	st.Devices = len(m.devs)
	if err := m.checkBufs("broadcast", dsts); err != nil {
		return st, err
	}
	for i, d := range dsts {
		if len(src) > d.Size() {
			return st, &SizeError{Op: fmt.Sprintf("broadcast to device %d", i), Need: len(src), Have: d.Size()}
		}
	}
	if err := ctx.Err(); err != nil || len(src) == 0 {
		return st, err
	}
	start := time.Now()
	select {
	case m.ring <- struct{}{}:
	case <-ctx.Done():
		return st, ctx.Err()
	}
	b, err := m.startBroadcast(ctx)
	if err == nil {
		spans, covered := m.directSpans(src)
		err = b.direct(dsts, src, spans)
		if err == nil && !covered {
			st.Staged = true
			err = b.staged(ctx, dsts, src, spans, &st)
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
// and the stages it borrowed from the first device's engine.
type broadcast struct {
	m      *multi
	lanes  []*lane
	stages []*stage
}

// startBroadcast takes a lane of every device's Copier, bounded by ctx; on
// an error it gives back the lanes taken and the ring.
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

// direct queues one copy per registration of src (a copy must not span
// two) and device.
func (b *broadcast) direct(dsts []*cuda.DeviceBuffer, src []byte, spans []span) error {
	for i, l := range b.lanes {
		for _, sp := range spans {
			if err := l.stream.CopyHtoD(dsts[i], sp.Lo, src[sp.Lo:sp.Hi]); err != nil {
				return fmt.Errorf("device %d: %w", i, err)
			}
		}
	}
	return nil
}

// staged copies src chunk by chunk into the borrowed stages of a ring with
// a lane per device (each device's events its own, on its context) and
// queues each chunk's copy on every device's lane; the ring refills a
// stage once every device's copy out of it ran.
func (b *broadcast) staged(ctx context.Context, dsts []*cuda.DeviceBuffer, src []byte, spans []span, st *MultiStats) error {
	m := b.m
	c0 := m.devs[0].cp
	staged := len(src)
	for _, s := range spans {
		staged -= s.Hi - s.Lo
	}
	chunk := c0.chunkSize(staged)
	ss, err := c0.eng.take(ctx, min((staged+chunk-1)/chunk, len(m.devs[0].evs)))
	if err != nil {
		return err
	}
	b.stages = ss
	r := ring{lanes: b.lanes, evs: make([][]*cuda.Event, len(m.devs)), wait: waitBroadcast}
	for i, d := range m.devs {
		r.evs[i] = d.evs
	}
	r.reset(ss)
	// The gaps between the pinned parts (hostspan.Parts), chunk by chunk.
	return hostspan.Parts(spans, 0, len(src), func(lo, hi int, pinned bool) error {
		for off := lo; off < hi && !pinned; off += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := r.next(ctx)
			if err != nil {
				return err
			}
			n := min(chunk, hi-off)
			st.CopyCPU += c0.eng.pool.Copy(m.o.parallelism, c0.o.tune.subPieces, s.mem[:n], src[off:off+n])
			for i, l := range b.lanes {
				if err := r.queued(i, false, s.htod(l.stream, dsts[i], off, 0, n)); err != nil {
					return fmt.Errorf("device %d: %w", i, err)
				}
			}
		}
		return nil
	})
}

// waitBroadcast is the wait of a Broadcast's ring: asleep in the lane's
// waiter.
func waitBroadcast(ctx context.Context, l *lane, ev *cuda.Event, _ bool) error {
	return l.w.wait(ctx, ev)
}

// finish ends the Broadcast on every device as copier.finish ends a
// transfer, and gives the stages and the ring back once every device's
// copies ran (in the background after an early exit). It returns first,
// else the first device's error.
func (b *broadcast) finish(ctx context.Context, first error) error {
	m := b.m
	var left sync.WaitGroup
	left.Add(len(b.lanes))
	for i, l := range b.lanes {
		var st Stats
		if _, err := m.devs[i].cp.finish(ctx, l, nil, true, first, &st, left.Done); err != nil && first == nil {
			first = fmt.Errorf("device %d: %w", i, err)
		}
	}
	give := func() {
		m.devs[0].cp.eng.give(b.stages)
		<-m.ring
	}
	if first == nil {
		give() // every lane came back: its copies ran
		return nil
	}
	m.gate.Hold()
	go func() {
		defer m.gate.End()
		left.Wait() // ends with the drains handed to the fences
		give()
	}()
	return first
}

// Gather copies, from every device at once, len(dsts[i]) bytes at the
// start of srcs[i] into dsts[i] (one pair per context, in NewMulti's
// order), each device through its own Copier, and returns when all of
// them are in host memory. An error or the end of ctx stops every
// device's transfer; Gather returns the first error, naming the device,
// once every CPU copy into dsts has stopped.
func (m *Multi) Gather(ctx context.Context, dsts [][]byte, srcs []*cuda.DeviceBuffer) (MultiStats, error) {
	return m.each(ctx, DeviceToHost, dsts, srcs)
}

// Scatter is Gather's mirror: it copies srcs[i] to the start of dsts[i]
// on every device at once.
func (m *Multi) Scatter(ctx context.Context, dsts []*cuda.DeviceBuffer, srcs [][]byte) (MultiStats, error) {
	return m.each(ctx, HostToDevice, srcs, dsts)
}

// each runs one transfer per device in direction dir, at once, and waits
// for all.
func (m *Multi) each(ctx context.Context, dir Direction, hosts [][]byte, devs []*cuda.DeviceBuffer) (MultiStats, error) {
	st := MultiStats{Direction: dir}
	if err := m.enter(ctx); err != nil {
		return st, err
	}
	defer m.gate.End()
	st.Devices = len(m.devs)
	if len(hosts) != len(m.devs) {
		return st, fmt.Errorf("transfer: %s with %d host buffers for %d devices: %w", dir, len(hosts), len(m.devs), cuda.ErrInvalidValue)
	}
	if err := m.checkBufs(dir.String(), devs); err != nil {
		return st, err
	}
	cctx, cancel := context.WithCancel(ctx) // one failure stops every device
	defer cancel()
	t0 := time.Now()
	errs := make([]error, len(m.devs))
	st.PerDevice = make([]Stats, len(m.devs))
	var wg sync.WaitGroup
	for i, d := range m.devs {
		st.Bytes = max(st.Bytes, int64(len(hosts[i])))
		wg.Go(func() {
			// Bounded by cctx; the copies an early exit leaves queued go
			// to the device's fence, and no CPU copy outlives the call.
			if st.PerDevice[i], _, errs[i] = d.cp.move(cctx, dir, hosts[i], devs[i], byRoute); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	var first error
	for i, s := range st.PerDevice {
		st.CopyCPU += s.CopyCPU
		st.Staged = st.Staged || s.StagedBytes > 0
		// Report the error that stopped the others, not the cancellation
		// it caused in them.
		if err := errs[i]; err != nil && (first == nil || errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = fmt.Errorf("device %d: %w", i, err)
		}
	}
	st.Wall = time.Since(t0)
	if first != nil {
		return st, fmt.Errorf("transfer: %s with %d devices: %w", dir, len(m.devs), first)
	}
	return st, nil
}
