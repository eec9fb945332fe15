package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// Copier moves data between host memory and the device memory of one CUDA
// context, staging pageable Go memory through a ring of pinned buffers and
// copying pinned memory directly. Its methods are safe for concurrent use;
// transfers through one Copier run one at a time, in the order they
// acquire its ring (asynchronous transfers queue).
type Copier struct {
	cctx      *cuda.Context
	o         options
	stream    *cuda.Stream
	ownStream bool
	stages    []*stage
	pool      *copyPool
	w         *waiter
	cache     *RegCache
	done      *cuda.Event // end of a transfer (blocking sync, no timing)
	near      *cuda.Event // all but the transfer's last piece (see waitLast)
	nearSet   bool        // near is recorded for the transfer in progress
	t0, t1    *cuda.Event // timing of a transfer
	ring      chan struct{}

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup

	pinMu  sync.RWMutex
	pinned map[*pinmem.Buffer]struct{}
}

type stage struct {
	buf  *pinmem.Buffer
	mem  []byte
	ev   *cuda.Event
	used bool // ev has been recorded
}

// New creates a Copier for the context c: its stream, events, staging
// ring (depth x stage size of pinned memory, from pinmem.Alloc) and copy
// goroutines. The caller must Close it.
func New(c *cuda.Context, opts ...Option) (cp *Copier, err error) {
	if c == nil {
		return nil, fmt.Errorf("transfer: nil context: %w", cuda.ErrInvalidValue)
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	cp = &Copier{cctx: c, o: o, ring: make(chan struct{}, 1), pinned: map[*pinmem.Buffer]struct{}{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, cp.release())
			cp = nil
		}
	}()
	if o.stream != nil {
		cp.stream = o.stream
	} else {
		if cp.stream, err = c.NewStream(cuda.StreamNonBlocking); err != nil {
			return cp, fmt.Errorf("transfer: creating the copy stream: %w", err)
		}
		cp.ownStream = true
	}
	if cp.done, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
		return cp, err
	}
	if cp.near, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
		return cp, err
	}
	if cp.t0, err = c.NewEvent(cuda.EventDefault); err != nil {
		return cp, err
	}
	if cp.t1, err = c.NewEvent(cuda.EventDefault); err != nil {
		return cp, err
	}
	popts := append([]pinmem.Option{pinmem.WithDevice(c.Device())}, o.stageOpts...)
	flags := o.stageFlags | pinmem.Portable
	for i := 0; i < o.depth; i++ {
		s := &stage{}
		cp.stages = append(cp.stages, s)
		if s.ev, err = c.NewEvent(cuda.EventBlockingSync | cuda.EventDisableTiming); err != nil {
			return cp, err
		}
		if s.buf, err = pinmem.Alloc(o.stageSize, flags, popts...); err != nil {
			return cp, fmt.Errorf("transfer: allocating staging buffer %d of %d bytes: %w", i, o.stageSize, err)
		}
		s.mem = s.buf.Bytes()
	}
	cp.w = newWaiter()
	cp.pool = newCopyPool(o.parallelism, o.threadCPU)
	if o.cacheOn {
		cp.cache = newRegCache(o.cacheLimit, o.cacheMin, pinmem.WithDevice(c.Device()))
	}
	return cp, nil
}

// Context returns the Copier's CUDA context.
func (c *Copier) Context() *cuda.Context { return c.cctx }

// Stream returns the stream the Copier issues its copies on.
func (c *Copier) Stream() *cuda.Stream { return c.stream }

// StageSize returns the size of each staging buffer.
func (c *Copier) StageSize() int { return c.o.stageSize }

// Depth returns the number of staging buffers.
func (c *Copier) Depth() int { return c.o.depth }

// Parallelism returns the number of goroutines a CPU copy is split over.
func (c *Copier) Parallelism() int { return c.o.parallelism }

// Cache returns the registration cache, or nil when it is off.
func (c *Copier) Cache() *RegCache { return c.cache }

// AddPinned tells the Copier that b is pinned: copies from or to any part
// of b.Bytes() then go directly, without staging. The returned function
// forgets b again; call it before freeing b.
func (c *Copier) AddPinned(b *pinmem.Buffer) (remove func()) {
	c.pinMu.Lock()
	c.pinned[b] = struct{}{}
	c.pinMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.pinMu.Lock()
			delete(c.pinned, b)
			c.pinMu.Unlock()
		})
	}
}

// Close waits for the transfers in progress, then releases the stream, the
// events, the staging ring, the registration cache and the copy
// goroutines. A second Close returns ErrClosed.
func (c *Copier) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	c.mu.Unlock()
	c.active.Wait()
	return c.release()
}

// release frees whatever New created.
func (c *Copier) release() error {
	var errs []error
	if c.w != nil {
		c.w.close()
	}
	if c.pool != nil {
		c.pool.close()
	}
	if c.cache != nil {
		errs = append(errs, c.cache.Close())
	}
	if c.stream != nil && c.ownStream {
		// Nothing is queued any more, but be exact: the stages must outlive their DMA.
		errs = append(errs, c.stream.Synchronize())
	}
	for _, s := range c.stages {
		if s.buf != nil {
			errs = append(errs, s.buf.Free())
		}
		if s.ev != nil {
			errs = append(errs, s.ev.Destroy())
		}
	}
	for _, e := range []*cuda.Event{c.done, c.near, c.t0, c.t1} {
		if e != nil {
			errs = append(errs, e.Destroy())
		}
	}
	if c.stream != nil && c.ownStream {
		errs = append(errs, c.stream.Destroy())
	}
	return errors.Join(errs...)
}

// begin registers a transfer in progress, or fails after Close.
func (c *Copier) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.active.Add(1)
	return nil
}

// acquire takes the ring and stream for one transfer.
func (c *Copier) acquire(ctx context.Context) error {
	select {
	case c.ring <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Copier) releaseRing() { <-c.ring }

// ---- the public transfers ----

// HtoD copies src into the device buffer dst (from offset 0; use
// dst.Slice for another offset) and returns when the data is there. dst
// must hold at least len(src) bytes, else a *SizeError.
func (c *Copier) HtoD(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) (Stats, error) {
	if err := c.begin(); err != nil {
		return Stats{Direction: HostToDevice}, err
	}
	defer c.active.Done()
	return c.htod(ctx, dst, src)
}

// DtoH copies len(dst) bytes from the start of the device buffer src into
// dst and returns when they are there. src must hold at least len(dst)
// bytes, else a *SizeError.
func (c *Copier) DtoH(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) (Stats, error) {
	if err := c.begin(); err != nil {
		return Stats{Direction: DeviceToHost}, err
	}
	defer c.active.Done()
	return c.dtoh(ctx, dst, src)
}

// HtoDAsync starts HtoD and returns at once. src must not be modified, nor
// dst used, until the Transfer is done.
func (c *Copier) HtoDAsync(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) *Transfer {
	return c.async(ctx, HostToDevice, func(ctx context.Context) (Stats, error) { return c.htod(ctx, dst, src) })
}

// DtoHAsync starts DtoH and returns at once. dst must not be used until
// the Transfer is done.
func (c *Copier) DtoHAsync(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) *Transfer {
	return c.async(ctx, DeviceToHost, func(ctx context.Context) (Stats, error) { return c.dtoh(ctx, dst, src) })
}

func (c *Copier) async(ctx context.Context, d Direction, fn func(context.Context) (Stats, error)) *Transfer {
	if ctx == nil {
		ctx = context.Background()
	}
	tctx, cancel := context.WithCancel(ctx)
	t := &Transfer{cancel: cancel, done: make(chan struct{})}
	if err := c.begin(); err != nil {
		t.finish(Stats{Direction: d}, err)
		return t
	}
	go func() {
		defer c.active.Done()
		st, err := fn(tctx)
		t.finish(st, err)
	}()
	return t
}

// Transfer is an asynchronous transfer in progress.
type Transfer struct {
	cancel context.CancelFunc
	done   chan struct{}
	stats  Stats
	err    error
}

func (t *Transfer) finish(s Stats, err error) {
	t.stats, t.err = s, err
	t.cancel()
	close(t.done)
}

// Done returns a channel closed when the transfer has finished (the data
// is in place, or it failed or was cancelled and its DMA has drained).
func (t *Transfer) Done() <-chan struct{} { return t.done }

// Wait waits until the transfer has finished and returns its result. When
// ctx is done first, Wait returns ctx.Err() and the transfer goes on (use
// Cancel to stop it).
func (t *Transfer) Wait(ctx context.Context) (Stats, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	select {
	case <-t.done:
		return t.stats, t.err
	case <-ctx.Done():
		return Stats{}, ctx.Err()
	}
}

// Cancel asks the transfer to stop: it stops issuing copies, waits for
// those in flight and then finishes with an error matching
// context.Canceled (unless it had already finished).
func (t *Transfer) Cancel() { t.cancel() }

// ---- planning ----

// op is one copy: direct (host memory pinned) or staged (at most one stage).
type op struct {
	host   []byte
	dev    cuda.DevicePtr
	direct bool
}

// span is a pinned sub-range [lo, hi) of a host slice, as offsets.
type span struct{ lo, hi int }

func addr(b []byte) uintptr { return hostptr.AddrOf(b) }

// pinnedSpans returns the parts of host known to be pinned, sorted, and a
// function that releases the registration cache's hold on them.
func (c *Copier) pinnedSpans(host []byte) ([]span, func()) {
	if len(host) == 0 {
		return nil, func() {}
	}
	lo := addr(host)
	hi := lo + uintptr(len(host))
	var spans []span
	c.pinMu.RLock()
	for b := range c.pinned {
		m := b.Bytes()
		if len(m) == 0 {
			continue
		}
		bl := addr(m)
		bh := bl + uintptr(len(m))
		if bl < hi && lo < bh {
			spans = append(spans, span{int(max(bl, lo) - lo), int(min(bh, hi) - lo)})
		}
	}
	c.pinMu.RUnlock()
	spans = normalize(spans)
	if c.cache == nil {
		return spans, func() {}
	}
	// Ask the cache about the gaps.
	var holds []*regHold
	var out []span
	prev := 0
	gap := func(a, b int) {
		if b-a < c.cache.min {
			return
		}
		got, h := c.cache.acquire(host[a:b])
		if h != nil {
			holds = append(holds, h)
		}
		for _, s := range got {
			out = append(out, span{s.lo + a, s.hi + a})
		}
	}
	for _, s := range spans {
		gap(prev, s.lo)
		prev = s.hi
	}
	gap(prev, len(host))
	spans = normalize(append(out, spans...))
	return spans, func() {
		for _, h := range holds {
			c.cache.release(h)
		}
	}
}

// normalize sorts spans and merges overlapping or touching ones.
func normalize(s []span) []span {
	if len(s) < 2 {
		return s
	}
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].lo < s[j-1].lo; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if x.lo <= last.hi {
			last.hi = max(last.hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// chunkSize is the staged piece size for n staged bytes: a stage, or less
// when the transfer is small, so that at least about four pieces overlap.
func (c *Copier) chunkSize(n int) int {
	ch := (n/4 + 65535) &^ 65535
	return max(min(ch, c.o.stageSize), min(MinChunk, c.o.stageSize))
}

// plan splits a copy between host and dev into ops.
func (c *Copier) plan(host []byte, dev cuda.DevicePtr, spans []span, st *Stats) []op {
	var ops []op
	staged := len(host)
	for _, s := range spans {
		staged -= s.hi - s.lo
	}
	chunk := c.chunkSize(staged)
	stage := func(a, b int) {
		for off := a; off < b; off += chunk {
			end := min(off+chunk, b)
			ops = append(ops, op{host: host[off:end], dev: dev.Add(off)})
			st.StagedBytes += int64(end - off)
			st.Stages++
		}
	}
	prev := 0
	for _, s := range spans {
		stage(prev, s.lo)
		ops = append(ops, op{host: host[s.lo:s.hi], dev: dev.Add(s.lo), direct: true})
		st.DirectBytes += int64(s.hi - s.lo)
		prev = s.hi
	}
	stage(prev, len(host))
	// A long direct copy at the end goes in two pieces, so that waitLast
	// sleeps through the first and polls only the last TailBytes.
	if n := len(ops); c.o.wait == WaitHybrid && n > 0 && ops[n-1].direct && len(ops[n-1].host) >= 2*TailBytes {
		last := ops[n-1]
		cut := len(last.host) - TailBytes
		ops[n-1] = op{host: last.host[:cut], dev: last.dev, direct: true}
		ops = append(ops, op{host: last.host[cut:], dev: last.dev.Add(cut), direct: true})
	}
	return ops
}

// markNear records c.near before the last of n ops (index i) is queued,
// when there is work before it: waitLast then sleeps until the rest has run
// and polls only the last piece.
func (c *Copier) markNear(i, n int) {
	if i == n-1 && n > 1 && c.o.wait == WaitHybrid {
		c.nearSet = c.near.Record(c.stream) == nil
	}
}

// waitLast waits for ev, the end of the transfer in progress: asleep in
// the driver until c.near (when recorded) and then polling for at most the
// tail spin, so that the driver's wake-up latency does not land on the
// transfer's end.
func (c *Copier) waitLast(ctx context.Context, ev *cuda.Event) error {
	if c.nearSet {
		c.nearSet = false
		if err := c.w.wait(ctx, c.near); err != nil {
			return err
		}
	}
	return c.w.waitEnd(ctx, ev, c.o.wait)
}

// ---- execution ----

func (c *Copier) htod(ctx context.Context, dst *cuda.DeviceBuffer, src []byte) (Stats, error) {
	st := Stats{Direction: HostToDevice, Bytes: int64(len(src))}
	if ctx == nil {
		ctx = context.Background()
	}
	if dst == nil {
		return st, fmt.Errorf("transfer: nil device buffer: %w", cuda.ErrInvalidValue)
	}
	if len(src) > dst.Size() {
		return st, &SizeError{Op: HostToDevice.String(), Need: len(src), Have: dst.Size()}
	}
	return c.run(ctx, &st, src, dst.Ptr())
}

func (c *Copier) dtoh(ctx context.Context, dst []byte, src *cuda.DeviceBuffer) (Stats, error) {
	st := Stats{Direction: DeviceToHost, Bytes: int64(len(dst))}
	if ctx == nil {
		ctx = context.Background()
	}
	if src == nil {
		return st, fmt.Errorf("transfer: nil device buffer: %w", cuda.ErrInvalidValue)
	}
	if len(dst) > src.Size() {
		return st, &SizeError{Op: DeviceToHost.String(), Need: len(dst), Have: src.Size()}
	}
	return c.run(ctx, &st, dst, src.Ptr())
}

// run plans and executes one copy in st.Direction.
func (c *Copier) run(ctx context.Context, st *Stats, host []byte, dev cuda.DevicePtr) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return *st, err
	}
	if len(host) == 0 {
		return *st, nil
	}
	m := startMeter()
	if err := c.acquire(ctx); err != nil {
		return *st, err
	}
	defer c.releaseRing()
	spans, release := c.pinnedSpans(host)
	defer release()
	ops := c.plan(host, dev, spans, st)
	var err error
	if st.Direction == HostToDevice {
		err = c.execHtoD(ctx, ops, st)
	} else {
		err = c.execDtoH(ctx, ops, st)
	}
	m.stop(st)
	if err != nil {
		return *st, fmt.Errorf("transfer: %s copy of %d bytes: %w", st.Direction, len(host), err)
	}
	return *st, nil
}

// stageAt returns ring stage k (mod depth).
func (c *Copier) stageAt(k int) *stage { return c.stages[k%len(c.stages)] }

// reuse waits until stage s's last queued copy has run, if it has one.
func (c *Copier) reuse(ctx context.Context, s *stage) error {
	if !s.used {
		return nil
	}
	return c.w.wait(ctx, s.ev)
}

// queued takes the result of queueing a copy into or out of stage s on
// c.stream and, if it was queued, records s's event behind it, so that s is
// reused only after that copy has run.
func (c *Copier) queued(s *stage, err error) error {
	if err != nil {
		return err
	}
	if err := s.ev.Record(c.stream); err != nil {
		return err
	}
	s.used = true
	return nil
}

func (c *Copier) execHtoD(ctx context.Context, ops []op, st *Stats) error {
	first := c.t0.Record(c.stream)
	k := 0
	for i, o := range ops {
		if first != nil {
			break
		}
		if err := ctx.Err(); err != nil {
			first = err
			break
		}
		c.markNear(i, len(ops))
		if o.direct {
			first = c.stream.CopyHtoD(o.dev, o.host)
			continue
		}
		s := c.stageAt(k)
		k++
		if err := c.reuse(ctx, s); err != nil {
			first = err
			break
		}
		n := len(o.host)
		st.CopyCPU += c.pool.copy(s.mem[:n], o.host)
		if err := c.queued(s, c.stream.CopyHtoD(o.dev, s.mem[:n])); err != nil {
			first = err
			break
		}
	}
	return c.drain(first, st)
}

func (c *Copier) execDtoH(ctx context.Context, ops []op, st *Stats) error {
	first := c.t0.Record(c.stream)
	type pending struct {
		o op
		s *stage
	}
	var q []pending
	next, k := 0, 0
	for first == nil {
		for next < len(ops) && (ops[next].direct || len(q) < len(c.stages)) {
			if err := ctx.Err(); err != nil {
				first = err
				break
			}
			o := ops[next]
			c.markNear(next, len(ops))
			next++
			if o.direct {
				if err := c.stream.CopyDtoH(o.host, o.dev); err != nil {
					first = err
					break
				}
				continue
			}
			s := c.stageAt(k)
			k++
			if err := c.queued(s, c.stream.CopyDtoH(s.mem[:len(o.host)], o.dev)); err != nil {
				first = err
				break
			}
			q = append(q, pending{o, s})
		}
		if first != nil || len(q) == 0 {
			break
		}
		h := q[0]
		q = q[1:]
		wait := c.w.wait
		if len(q) == 0 && next == len(ops) {
			wait = c.waitLast // the transfer's last piece
		}
		if err := wait(ctx, h.s.ev); err != nil {
			first = err
			break
		}
		st.CopyCPU += c.pool.copy(h.o.host, h.s.mem[:len(h.o.host)])
	}
	return c.drain(first, st)
}

// drain waits for everything the transfer queued, whatever happened, so
// that no stage or destination is still in use by the copy engine when the
// transfer returns, and reports the first error: the one that stopped the
// transfer, else an asynchronous one.
func (c *Copier) drain(first error, st *Stats) error {
	errs := []error{first}
	timed := c.t1.Record(c.stream) == nil
	defer func() { c.nearSet = false }()
	if err := c.done.Record(c.stream); err != nil {
		// Without an event to wait on, synchronize the stream (one blocked thread, rarely).
		errs = append(errs, err)
	} else if err := c.waitLast(context.Background(), c.done); err != nil {
		errs = append(errs, err)
	}
	// Collect asynchronous errors of the copies; everything is done, so this does not block.
	if err := c.stream.Synchronize(); err != nil {
		errs = append(errs, err)
	}
	if timed && first == nil {
		if d, err := c.t1.Elapsed(c.t0); err == nil {
			st.Device = d
		}
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
