package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// ErrInvalid is matched (errors.Is) by every error this package returns for
// bad input: a nil context or session, a closed session, a configuration
// field out of range, an unknown kind, direction or method, an unparsable
// size or list. The message names the field and the value.
var ErrInvalid = errors.New("bench: invalid argument")

// invalidError is bad input: its message says what and why; it matches
// ErrInvalid.
type invalidError struct {
	msg     string
	wrapped error // the cause, when another package found it (units)
}

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }
func (e *invalidError) Unwrap() error        { return e.wrapped }

// invalid returns an error matching ErrInvalid with the formatted message.
func invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// MaxSamples bounds every configuration's Samples field.
const MaxSamples = 1000

// checkSamples validates a Samples field (0 means def).
func checkSamples(field string, n *int, def int) error {
	switch {
	case *n == 0:
		*n = def
	case *n < 0 || *n > MaxSamples:
		return invalid("%s %d: want 1 to %d (0: the default, %d)", field, *n, MaxSamples, def)
	}
	return nil
}

// checkWarmup validates a Warmup field: 0 means one untimed sample, -1
// none, otherwise 1 to 100.
func checkWarmup(field string, n *int) error {
	switch {
	case *n == 0:
		*n = 1
	case *n == -1:
		*n = 0
	case *n < -1 || *n > 100:
		return invalid("%s %d: want 1 to 100 (0: the default, 1; -1: none)", field, *n)
	}
	return nil
}

// checkSizes validates a list of sizes (empty means def).
func checkSizes(field string, sizes *[]int64, def []int64) error {
	if len(*sizes) == 0 {
		*sizes = def
		return nil
	}
	for _, n := range *sizes {
		if n < 1 || n > MaxSize {
			return invalid("%s: size %d: want 1 byte to %s", field, n, FormatSize(MaxSize))
		}
	}
	return nil
}

// checkNames validates a list of names against the known ones, in any
// order (empty means all).
func checkNames(field string, names *[]string, all []string) error {
	if len(*names) == 0 {
		*names = all
		return nil
	}
	for _, n := range *names {
		if !contains(all, n) {
			return invalid("%s: unknown %q (want one of %s)", field, n, strings.Join(all, ", "))
		}
	}
	return nil
}

// SessionConfig configures Open. The zero value is the default.
type SessionConfig struct {
	// Progress, when not nil, receives one line per finished measurement,
	// its summary (Result.String); the CLI counts them for its progress
	// bar, and bench all shows them. Reports leave it out.
	Progress io.Writer `json:"-"`
	// SpinTimeout bounds how long spin_wait holds a stream (0: 10 s; at
	// most 10 minutes); a hold that times out is reported in the result's
	// note.
	SpinTimeout time.Duration `json:"spin_timeout_ns"`
	// NoSpin times copies with plain events even when the kernels load.
	NoSpin bool `json:"no_spin"`
}

// Validate reports the first field of c that Open would refuse, as an
// error matching ErrInvalid; c is not changed. Open validates its
// configuration itself: calling Validate first finds the error before any
// GPU work (the CLI checks its flags this way).
func (c SessionConfig) Validate() error { return c.resolve() }

// resolve fills in the defaults of c's zero fields and checks the others.
func (c *SessionConfig) resolve() error {
	switch {
	case c.SpinTimeout == 0:
		c.SpinTimeout = 10 * time.Second
	case c.SpinTimeout < 0 || c.SpinTimeout > 10*time.Minute:
		return invalid("SessionConfig.SpinTimeout %v: want more than 0 and at most 10m (0: the default, 10s)", c.SpinTimeout)
	}
	return nil
}

// Session is an open GPU with what the benches need: its primary context,
// the loaded kernels (when they load) and the mapped flag spin_wait polls.
// A Session is not safe for concurrent use; Close releases everything.
//
// Every measurement takes a context: when it is canceled or its deadline
// passes, the measurement stops after the sample in progress and returns
// the results finished so far with an error matching ctx.Err(). A sample
// waits for the GPU work it queued, so a hung GPU is not interrupted.
type Session struct {
	Dev   *cuda.Device
	Ctx   *cuda.Context
	Props cuda.Properties

	cfg     SessionConfig
	closed  bool
	mod     *cuda.Module
	fns     map[string]*cuda.Function
	kernErr error // why the kernels are unavailable (nil when they load)

	flagBuf   *pinmem.Buffer // mapped: word 0 is the flag, word 16 the status
	flagWords []uint32
	flagDev   cuda.DevicePtr
	spinErr   error // why spin-wait timing is unavailable

	budget sampleBudget // SetSampleBudget
}

// sampleBudget bounds the time of one measurement (SetSampleBudget).
type sampleBudget struct {
	perRow     time.Duration // 0: no bound
	minSamples int
}

// SetSampleBudget bounds the time of each later measurement of s (one
// result row) that takes its samples in a loop (bandwidth, copier,
// concurrency, blocks): once a row has run for perRow, its warm-up
// included, it takes no further sample beyond minSamples (at least 1), and
// its note says so; its figures are those of the samples taken. perRow 0
// removes the bound. bench all sets it from each test's share of its time
// budget, so that a run fits the time it was given without losing a row.
func (s *Session) SetSampleBudget(perRow time.Duration, minSamples int) {
	s.budget = sampleBudget{perRow: max(perRow, 0), minSamples: max(minSamples, 1)}
}

// budgetSpent reports whether a row that started at start and has taken
// done samples takes no more (SetSampleBudget), and if so the note that
// says why.
func (s *Session) budgetSpent(done, want int, start time.Time) (string, bool) {
	b := s.budget
	if b.perRow <= 0 || done < b.minSamples || done >= want || time.Since(start) < b.perRow {
		return "", false
	}
	return fmt.Sprintf("%d of %d samples: the row's share of the time budget (%v) was spent", done, want, b.perRow.Round(time.Millisecond)), true
}

// check validates a measurement's receiver and context.
func (s *Session) check(ctx context.Context) error {
	switch {
	case s == nil:
		return invalid("nil *Session")
	case ctx == nil:
		return invalid("nil context")
	case s.closed:
		return invalid("session is closed")
	}
	return ctx.Err()
}

// flag layout in the mapped flag buffer, in 32-bit words.
const (
	flagWord   = 0
	statusWord = 16 // a separate 64-byte line
	flagBufLen = 4096
)

// Open opens GPU device (an ordinal) and prepares the kernels and the
// spin-wait flag. Without a driver or device the error matches
// cuda.ErrNoDriver or cuda.ErrNoDevice; a nil ctx, a negative device or a
// bad cfg field gives an error matching ErrInvalid. Kernels that cannot
// load are not an error: the session falls back to plain event timing and
// the kernel benches are skipped (KernelError says why).
func Open(ctx context.Context, device int, cfg SessionConfig) (*Session, error) {
	if ctx == nil {
		return nil, invalid("nil context")
	}
	if device < 0 {
		return nil, invalid("device %d: want an ordinal from 0", device)
	}
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dev, err := cuda.GetDevice(device)
	if err != nil {
		return nil, err
	}
	cctx, err := dev.PrimaryContext()
	if err != nil {
		return nil, err
	}
	props, err := dev.Properties()
	if err != nil {
		return nil, err
	}
	s := &Session{Dev: dev, Ctx: cctx, Props: props, cfg: cfg, fns: map[string]*cuda.Function{}}
	s.loadKernels()
	switch {
	case cfg.NoSpin:
		s.spinErr = errors.New("spin-wait disabled")
	case s.kernErr != nil:
		s.spinErr = s.kernErr
	default:
		s.flagBuf, err = pinmem.Alloc(flagBufLen, pinmem.Mapped, pinmem.WithDevice(dev), pinmem.WithMethod(pinmem.MethodHostAlloc))
		if err == nil {
			s.flagDev, err = s.flagBuf.DevicePtr()
		}
		if err == nil {
			s.flagWords, err = pinmem.View[uint32](s.flagBuf)
		}
		if err != nil {
			s.spinErr = fmt.Errorf("mapped flag: %w", err)
			if s.flagBuf != nil {
				_ = s.flagBuf.Free()
				s.flagBuf = nil
			}
		}
	}
	return s, nil
}

func (s *Session) loadKernels() {
	if err := kernels.Check(); err != nil {
		s.kernErr = err
		return
	}
	mod, err := s.Ctx.LoadModule(kernels.Image())
	if err != nil {
		s.kernErr = err
		return
	}
	for _, name := range []string{kernels.KernelSpinWait, kernels.KernelReadSum, kernels.KernelFill, kernels.KernelAdd} {
		f, err := mod.Function(name)
		if err != nil {
			_ = mod.Destroy()
			s.kernErr = err
			return
		}
		s.fns[name] = f
	}
	s.mod = mod
}

// Close frees the session's flag and unloads its kernels. Later
// measurements fail with ErrInvalid; a second Close returns nil.
func (s *Session) Close() error {
	if s == nil || s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.flagBuf != nil {
		errs = append(errs, s.flagBuf.Free())
		s.flagBuf = nil
	}
	if s.mod != nil {
		errs = append(errs, s.mod.Destroy())
		s.mod = nil
	}
	return errors.Join(errs...)
}

// KernelError returns why the kernels could not be loaded, or nil.
func (s *Session) KernelError() error { return s.kernErr }

// SpinError returns why copies are not timed with spin-wait, or nil.
func (s *Session) SpinError() error { return s.spinErr }

// Meta returns the report metadata for this session and command.
func (s *Session) Meta(command string) Meta {
	m := Meta{Schema: SchemaVersion, Command: command, Device: fmt.Sprintf("%s (device %d", s.Props.Name, s.Dev.Ordinal()),
		Host: HostFacts(), Devices: []DeviceInfo{deviceInfo(s.Props)}}
	if s.Props.PCIBusID != "" {
		m.Device += ", PCI " + s.Props.PCIBusID
	}
	m.Device += ")"
	if v, err := cuda.DriverVersion(); err == nil {
		m.Driver = fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10)
	}
	if s.spinErr == nil {
		m.Timing = sessionSpinTiming
	} else {
		m.Timing = sessionEventsTiming + " (" + s.spinErr.Error() + ")"
	}
	m.Time = time.Now().UTC().Format(time.RFC3339)
	if IsFakeDevice(s.Props.Name) {
		m.Note = FakeNote
	}
	return m
}

// The session's own timing, as Meta states it; TimingOf replaces it by
// the rows' method where every row was timed another way.
const (
	sessionSpinTiming   = "spin-wait kernel holds the stream while the copies are queued, then events (nvbandwidth's method)"
	sessionEventsTiming = "plain events, launch overhead may be included"
)

// FakeNote is the note of every report measured on the fake driver.
const FakeNote = "measured on the fake driver (memmove in one process): these figures show the logic, never a GPU's speed; do not publish them"

// IsFakeDevice reports whether a device name is the fake driver's.
func IsFakeDevice(name string) bool { return strings.HasPrefix(name, "Fake ") }

func (s *Session) progress(r Result) {
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "%s\n", r)
	}
}

// grid returns the launch shape for the grid-stride kernels: a few blocks
// per SM of 256 threads.
func (s *Session) grid() (cuda.Dim3, cuda.Dim3) {
	sms := max(s.Props.Multiprocessors, 1)
	return cuda.D1(sms * 4), cuda.D1(256)
}

// lane is one stream's share of a timed measurement: op queues one unit of
// work (a copy, a kernel) on the stream.
type lane struct {
	s  *cuda.Stream
	op func(st *cuda.Stream, rep int) error
}

// timing is what timeLanes measured.
type timing struct {
	span    time.Duration   // from the first lane's start event to the last end event
	perLane []time.Duration // each lane's own start to end
	method  string          // TimingSpin, TimingEvents
	note    string          // e.g. a spin-wait timeout
}

// timeLanes queues reps units of every lane's work between a start and an
// end event per lane. With hold (and spin-wait available) the first
// stream is held by spin_wait while everything is queued and the other
// streams wait for it through an event, so all lanes start together when
// the flag is released.
func (s *Session) timeLanes(lanes []lane, reps int, hold bool) (timing, error) {
	t := timing{method: TimingEvents}
	hold = hold && s.spinErr == nil
	var ev laneEvents
	defer ev.destroy()
	released := false
	release := func() {
		if hold && !released {
			atomic.StoreUint32(&s.flagWords[flagWord], 1)
			released = true
		}
	}
	defer release()
	if hold {
		if err := s.holdStream(lanes[0].s); err != nil {
			return t, err
		}
		t.method = TimingSpin
	}
	if err := ev.create(s.Ctx, len(lanes)); err != nil {
		return t, err
	}
	if err := ev.queue(lanes, reps); err != nil {
		return t, err
	}
	release()
	for _, e := range ev.ends {
		if err := e.Synchronize(context.Background()); err != nil {
			return t, err
		}
	}
	if hold {
		if st := atomic.LoadUint32(&s.flagWords[statusWord]); st != kernels.SpinReleased {
			t.method = TimingEvents
			t.note = fmt.Sprintf("spin-wait timed out after %v while queueing (status %d): queueing time included", s.cfg.SpinTimeout, st)
		}
	}
	err := ev.times(&t)
	return t, err
}

// holdStream queues spin_wait on st: st's later work waits until the
// session's flag is set (or the spin timeout passes).
func (s *Session) holdStream(st *cuda.Stream) error {
	atomic.StoreUint32(&s.flagWords[flagWord], 0)
	atomic.StoreUint32(&s.flagWords[statusWord], 0)
	return s.fns[kernels.KernelSpinWait].Launch(st, cuda.D1(1), cuda.D1(1), 0,
		s.flagDev.Add(4*flagWord), uint64(s.cfg.SpinTimeout.Nanoseconds()), s.flagDev.Add(4*statusWord))
}

// laneEvents are the start and end events of each lane of timeLanes.
type laneEvents struct {
	starts, ends []*cuda.Event
}

// create makes a start and an end event for each of n lanes.
func (ev *laneEvents) create(ctx *cuda.Context, n int) error {
	for range n {
		start, err := ctx.NewEvent(cuda.EventDefault)
		if err != nil {
			return err
		}
		ev.starts = append(ev.starts, start)
		end, err := ctx.NewEvent(cuda.EventDefault)
		if err != nil {
			return err
		}
		ev.ends = append(ev.ends, end)
	}
	return nil
}

func (ev *laneEvents) destroy() {
	for _, e := range append(ev.starts, ev.ends...) {
		_ = e.Destroy()
	}
}

// queue queues reps units of every lane's work between its start and end
// events; lane 0's start event is the gate the other lanes wait for.
func (ev *laneEvents) queue(lanes []lane, reps int) error {
	if err := ev.starts[0].Record(lanes[0].s); err != nil {
		return err
	}
	for i := 1; i < len(lanes); i++ {
		if err := lanes[i].s.WaitEvent(ev.starts[0]); err != nil {
			return err
		}
		if err := ev.starts[i].Record(lanes[i].s); err != nil {
			return err
		}
	}
	// Interleave the lanes' work so that no lane's queue runs ahead.
	for r := range reps {
		for _, l := range lanes {
			if err := l.op(l.s, r); err != nil {
				return err
			}
		}
	}
	for i, l := range lanes {
		if err := ev.ends[i].Record(l.s); err != nil {
			return err
		}
	}
	return nil
}

// times sets t's per-lane times and its span, from lane 0's start to the
// last end.
func (ev *laneEvents) times(t *timing) error {
	for i, end := range ev.ends {
		d, err := end.Elapsed(ev.starts[i])
		if err != nil {
			return err
		}
		t.perLane = append(t.perLane, d)
		d0, err := end.Elapsed(ev.starts[0])
		if err != nil {
			return err
		}
		t.span = max(t.span, d0)
	}
	return nil
}
