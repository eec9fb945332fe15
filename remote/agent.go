package remote

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/remote/internal/ucx"
)

// DefaultMaxRegistration is the largest single registration an Agent makes
// unless WithMaxRegistration says otherwise: a region larger than it is
// registered in pieces (some RDMA NICs refuse one memory region over 2 GiB).
const DefaultMaxRegistration = 2 << 30

// Option configures NewAgent.
type Option func(*config) error

type config struct {
	maxReg int64
	ucx    map[string]string
}

// WithMaxRegistration splits registrations at n bytes (a positive multiple
// of 4096; DefaultMaxRegistration by default).
func WithMaxRegistration(n int64) Option {
	return func(c *config) error {
		if n <= 0 || n%4096 != 0 {
			return &Error{Op: "remote.NewAgent", Kind: cuda.ErrInvalidValue, Detail: fmt.Sprintf("WithMaxRegistration(%d): not a positive multiple of 4096", n)}
		}
		c.maxReg = n
		return nil
	}
}

// WithUCX sets a UCX configuration variable for this agent only, over the
// environment's (name without the UCX_ prefix: "TLS", "NET_DEVICES" ...).
// A value UCX refuses makes NewAgent fail with cuda.ErrInvalidValue.
// Without it UCX reads its variables (UCX_TLS ...) from the environment.
func WithUCX(name, value string) Option {
	return func(c *config) error {
		if name == "" {
			return &Error{Op: "remote.NewAgent", Kind: cuda.ErrInvalidValue, Detail: "WithUCX: empty name"}
		}
		c.ucx[name] = value
		return nil
	}
}

// Agent is one endpoint of the transport: a UCX context and worker, the
// registrations of local memory, and the connections to other agents. All
// its UCX calls are made by one goroutine locked to its OS thread, which
// also progresses the worker (serving other agents' puts and gets to this
// one's memory) until Close. Its methods are safe for concurrent use.
type Agent struct {
	lib    *ucx.Lib
	uctx   ucx.Context
	w      ucx.Worker
	efd    int // the worker's event descriptor
	wake   int // eventfd that wakes the thread for a job; -1 once closed (under mu)
	addr   []byte
	id     uint64
	maxReg int64

	mu     sync.Mutex
	jobs   []func()
	closed bool
	slabs  map[uintptr]*slab // registrations by base address
	peers  map[string]*peer  // connections by worker address
	nextID uint64

	stopping atomic.Bool
	abandon  atomic.Bool   // Close's ctx ended: tear down with transfers in flight
	done     chan struct{} // the thread ended
	ops      []*op         // transfers in flight: thread only
	cut      int           // transfers teardown found in flight (read once done is closed)
}

// agents are the live agents of the process by id, so that a key of one of
// them used in this process is checked against its regions.
var agents sync.Map // uint64 -> *Agent

// NewAgent loads UCX (an error matching ErrUnavailable without it) and
// starts an agent: a UCP context with RMA, one worker, and its progress
// thread. UCX chooses its transports (UCX_TLS, or WithUCX("TLS", ...)).
func NewAgent(opts ...Option) (*Agent, error) {
	const op = "remote.NewAgent"
	c := config{maxReg: DefaultMaxRegistration, ucx: map[string]string{}}
	for _, o := range opts {
		if o == nil {
			return nil, &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: "nil option"}
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	lib, err := ucx.Open()
	if err != nil {
		return nil, &Error{Op: op, Kind: ErrUnavailable, Err: err}
	}
	a := &Agent{lib: lib, maxReg: c.maxReg, slabs: map[uintptr]*slab{}, peers: map[string]*peer{}, done: make(chan struct{}), efd: -1, wake: -1}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	a.id = binary.LittleEndian.Uint64(idb[:]) | 1
	started := make(chan error, 1)
	go a.loop(c, started)
	if err := <-started; err != nil {
		return nil, err
	}
	agents.Store(a.id, a)
	return a, nil
}

// start creates the UCX objects on the agent's thread.
func (a *Agent) start(c config) error {
	const op = "remote.NewAgent"
	var err error
	if a.uctx, err = a.lib.Init("pinmem", c.ucx); err != nil {
		if errors.Is(err, ucx.ErrConfig) { // a WithUCX setting: the caller's argument
			return &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: "WithUCX", Err: err}
		}
		return &Error{Op: op, Kind: ErrUnavailable, Detail: "UCX could not start", Err: err}
	}
	if a.w, err = a.lib.WorkerCreate(a.uctx); err != nil {
		a.lib.Cleanup(a.uctx)
		return &Error{Op: op, Kind: ErrUnavailable, Detail: "UCX could not start a worker", Err: err}
	}
	fail := func(e error) error {
		a.lib.WorkerDestroy(a.w)
		a.lib.Cleanup(a.uctx)
		if a.wake >= 0 {
			unix.Close(a.wake)
		}
		return e
	}
	if a.addr, err = a.lib.WorkerAddress(a.w); err != nil {
		return fail(&Error{Op: op, Kind: ErrUnavailable, Err: err})
	}
	if a.efd, err = a.lib.EventFD(a.w); err != nil {
		a.efd = -1 // no events: the thread polls with short sleeps
	}
	if a.wake, err = newWake(); err != nil {
		a.wake = -1
		return fail(&Error{Op: op, Kind: ErrUnavailable, Detail: "eventfd", Err: err})
	}
	return nil
}

// loop is the agent's thread: it runs jobs, progresses the worker, checks
// the transfers in flight, and sleeps on the worker's event descriptor
// when there is nothing to do.
func (a *Agent) loop(c config, started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(a.done)
	if err := a.start(c); err != nil {
		started <- err
		return
	}
	started <- nil
	fds := []unix.PollFd{{Fd: int32(a.wake), Events: unix.POLLIN}, {Fd: int32(a.efd), Events: unix.POLLIN}}
	if a.efd < 0 {
		fds = fds[:1]
	}
	var buf [8]byte
	active := time.Now() // the last time there was work
	for {
		a.mu.Lock()
		jobs := a.jobs
		a.jobs = nil
		a.mu.Unlock()
		for _, j := range jobs {
			j()
		}
		n := a.lib.Progress(a.w)
		n += uint32(a.checkOps())
		if a.stopping.Load() && (len(a.ops) == 0 || a.abandon.Load()) && len(jobs) == 0 {
			a.mu.Lock()
			left := len(a.jobs)
			a.mu.Unlock()
			if left == 0 {
				break
			}
		}
		if n > 0 || len(jobs) > 0 {
			active = time.Now()
			continue
		}
		// Keep polling for a while after the last work: a transfer's next
		// fragments and acknowledgements (this agent's, or another's to
		// this one's memory) come within microseconds.
		idle := time.Since(active)
		if len(a.ops) > 0 {
			if idle < spinBusy {
				yield(idle)
				continue
			}
			// A transfer in flight, and no work for spinBusy: nap, longer
			// as the wait goes on.
			d := min(max(idle/10, napMin), napMax)
			nap(fds, d)
			_, _ = unix.Read(a.wake, buf[:])
			continue
		}
		if idle < spinIdle {
			yield(idle)
			continue
		}
		timeout := pollIdle
		if a.efd < 0 {
			timeout = int(napMax / time.Millisecond)
		} else if a.lib.Arm(a.w) == ucx.ErrBusy {
			continue // events to progress
		}
		_, _ = unix.Poll(fds, timeout)
		_, _ = unix.Read(a.wake, buf[:])
	}
	a.teardown()
}

// How the agent's thread waits. With a transfer of its own in flight it
// polls the worker without pause for spinBusy after the last work, as UCX's
// own benchmarks do (the caller waits for the transfer anyway; a sleep
// gives the CPU away, and not every UCX transport signals the event
// descriptor for every completion: cma, a shared-memory FIFO that drains),
// then naps between polls (a tenth of the time since the last work, from
// napMin to napMax: a transfer stuck on a peer that died over shared
// memory, which UCX never reports, costs a few wake-ups a second).
// Otherwise it polls for spinIdle after the last work (another agent's
// transfer to this one's memory), then sleeps on the worker's event
// descriptor and its wake-up descriptor for at most pollIdle milliseconds.
const (
	spinBusy = 100 * time.Millisecond
	spinIdle = 1 * time.Millisecond
	napMin   = 50 * time.Microsecond
	napMax   = 5 * time.Millisecond
	pollIdle = 10 // milliseconds
)

// yield gives the CPU to another thread that is ready to run, once a spin
// has gone on for a few microseconds: on a host with fewer cores than
// busy threads, the other side of a shared-memory transfer may be waiting
// for this one's core.
func yield(spun time.Duration) {
	if spun > 5*time.Microsecond {
		yieldCPU()
	}
}

// post queues f to run on the agent's thread; false once the agent closed
// (internal: Close's own jobs, queued while the thread still runs).
func (a *Agent) post(f func(), internal bool) bool {
	a.mu.Lock()
	if a.closed && !internal {
		a.mu.Unlock()
		return false
	}
	a.jobs = append(a.jobs, f)
	if a.wake >= 0 { // -1 once teardown closed it: the number may be another file's now
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(a.wake, one[:])
	}
	a.mu.Unlock()
	return true
}

// jobWait bounds the wait for a short job (a registration, an unpack) that
// already started on the agent's thread: its UCX calls return by
// themselves, so this only guards against a wedged library.
const jobWait = 30 * time.Second

// do runs f on the agent's thread and returns its error. A ctx that ends
// before f started cancels it; once started, f runs to its end.
func (a *Agent) do(ctx context.Context, op string, f func() error) error {
	if ctx == nil {
		return &Error{Op: op, Kind: cuda.ErrInvalidValue, Detail: "nil context"}
	}
	var state atomic.Int32 // 0 queued, 1 started, 2 abandoned
	res := make(chan error, 1)
	ok := a.post(func() {
		if !state.CompareAndSwap(0, 1) {
			return
		}
		res <- f()
	}, false)
	if !ok {
		return &Error{Op: op, Kind: ErrClosed, Detail: "the agent is closed"}
	}
	select {
	case err := <-res:
		return err
	case <-a.done:
		if state.CompareAndSwap(0, 2) {
			return &Error{Op: op, Kind: ErrClosed, Detail: "the agent closed"}
		}
	case <-ctx.Done():
		if state.CompareAndSwap(0, 2) {
			return &Error{Op: op, Kind: ctx.Err(), Err: ctx.Err()}
		}
	}
	t := time.NewTimer(jobWait)
	defer t.Stop()
	select {
	case err := <-res:
		return err
	case <-t.C:
		return &Error{Op: op, Kind: ErrBusy, Detail: fmt.Sprintf("the agent's thread did not answer in %v", jobWait)}
	}
}

// ok reports whether a is an agent NewAgent made.
func (a *Agent) ok() bool { return a != nil && a.lib != nil }

// Close stops the agent: it waits, bounded by ctx, for the transfers in
// flight, then closes every connection and remote region, drops every
// registration (the pinmem buffers stay allocated: they are the caller's),
// and releases the worker and the context. When ctx ends first, the worker
// is destroyed with the transfers still in flight (UCX cancels them: no
// byte moves into this agent's memory afterwards, though bytes of a Put
// already sent may still land at the peer) and Close returns ctx's error;
// with no transfer in flight it returns nil.
func (a *Agent) Close(ctx context.Context) error {
	if !a.ok() {
		return errNil("remote.Agent.Close", "Agent")
	}
	if ctx == nil {
		return &Error{Op: "remote.Agent.Close", Kind: cuda.ErrInvalidValue, Detail: "nil context"}
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return &Error{Op: "remote.Agent.Close", Kind: ErrClosed, Detail: "the agent is already closed"}
	}
	a.closed = true
	a.mu.Unlock()
	agents.Delete(a.id)
	a.stopping.Store(true)
	a.post(func() {}, true) // wake the thread
	var err error
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		err = &Error{Op: "remote.Agent.Close", Kind: ctx.Err(), Detail: "transfers were in flight: the worker was destroyed with them", Err: ctx.Err()}
	}
	a.abandon.Store(true)
	a.post(func() {}, true)
	<-a.done
	if a.cut == 0 {
		return nil // nothing was in flight: nothing was cut short
	}
	return err
}

// teardown releases everything, on the thread, once no transfer is left.
func (a *Agent) teardown() {
	a.mu.Lock()
	peers := a.peers
	slabs := a.slabs
	a.peers, a.slabs = map[string]*peer{}, map[uintptr]*slab{}
	a.mu.Unlock()
	for _, p := range peers {
		p.close(a)
	}
	// The worker goes first: destroying it cancels what is still in flight,
	// after which no transfer can touch the registered memory.
	a.lib.WorkerDestroy(a.w)
	a.cut = len(a.ops)
	for _, o := range a.ops {
		o.after = nil // keep the Remotes' bookkeeping out of a torn-down agent
		o.finish(a, &Error{Op: o.name, Kind: ErrClosed, Detail: "the agent closed with the transfer in flight"})
	}
	a.ops = nil
	a.mu.Lock() // Region.Key and Registrations read the slabs under it
	for _, s := range slabs {
		s.unmap(a)
	}
	a.mu.Unlock()
	a.lib.Cleanup(a.uctx)
	a.mu.Lock()
	wake := a.wake
	a.wake = -1
	a.mu.Unlock()
	unix.Close(wake)
}

// Stats are an agent's counts of what it holds.
type Stats struct {
	Registrations int   // UCX registrations (pieces of slabs)
	Bytes         int64 // bytes registered
	Connections   int   // endpoints to other agents
}

// Stats returns what the agent holds now (nothing for a nil Agent).
func (a *Agent) Stats() Stats {
	if !a.ok() {
		return Stats{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var s Stats
	for _, sl := range a.slabs {
		s.Registrations += len(sl.pieces)
		s.Bytes += int64(sl.n)
	}
	for _, p := range a.peers {
		if p.ep != 0 {
			s.Connections++
		}
	}
	return s
}
