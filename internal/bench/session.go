package bench

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
)

// Options configure a Session.
type Options struct {
	// Device is the ordinal of the GPU to measure (default 0).
	Device int
	// Progress, when not nil, receives one line per finished measurement
	// (the CLI passes stderr unless --quiet).
	Progress io.Writer
	// SpinTimeout bounds how long spin_wait holds a stream (default 10 s);
	// a hold that times out is reported in the result's note.
	SpinTimeout time.Duration
	// NoSpin times copies with plain events even when the kernels load.
	NoSpin bool
}

// Session is an open GPU with what the benches need: its primary context,
// the loaded kernels (when they load) and the mapped flag spin_wait polls.
// A Session is not safe for concurrent use; Close releases everything.
type Session struct {
	Dev   *cuda.Device
	Ctx   *cuda.Context
	Props cuda.Properties

	opts    Options
	mod     *cuda.Module
	fns     map[string]*cuda.Function
	kernErr error // why the kernels are unavailable (nil when they load)

	flagBuf   *pinmem.Buffer // mapped: word 0 is the flag, word 16 the status
	flagWords []uint32
	flagDev   cuda.DevicePtr
	spinErr   error // why spin-wait timing is unavailable
}

// flag layout in the mapped flag buffer, in 32-bit words.
const (
	flagWord   = 0
	statusWord = 16 // a separate 64-byte line
	flagBufLen = 4096
)

// Open opens device opts.Device and prepares the kernels and the spin-wait
// flag. Without a driver or device the error matches cuda.ErrNoDriver or
// cuda.ErrNoDevice. Kernels that cannot load are not an error: the session
// falls back to plain event timing and the kernel benches are skipped
// (KernelError says why).
func Open(opts Options) (*Session, error) {
	if opts.SpinTimeout <= 0 {
		opts.SpinTimeout = 10 * time.Second
	}
	dev, err := cuda.GetDevice(opts.Device)
	if err != nil {
		return nil, err
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return nil, err
	}
	props, err := dev.Properties()
	if err != nil {
		return nil, err
	}
	s := &Session{Dev: dev, Ctx: ctx, Props: props, opts: opts, fns: map[string]*cuda.Function{}}
	s.loadKernels()
	switch {
	case opts.NoSpin:
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
			_ = mod.Unload()
			s.kernErr = err
			return
		}
		s.fns[name] = f
	}
	s.mod = mod
}

// Close frees the session's flag and unloads its kernels.
func (s *Session) Close() error {
	var errs []error
	if s.flagBuf != nil {
		errs = append(errs, s.flagBuf.Free())
		s.flagBuf = nil
	}
	if s.mod != nil {
		errs = append(errs, s.mod.Unload())
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
	m := Meta{Command: command, Device: fmt.Sprintf("%s (device %d", s.Props.Name, s.Dev.Ordinal())}
	if s.Props.PCIBusID != "" {
		m.Device += ", PCI " + s.Props.PCIBusID
	}
	m.Device += ")"
	if v, err := cuda.DriverVersion(); err == nil {
		m.Driver = fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10)
	}
	if s.spinErr == nil {
		m.Timing = "spin-wait kernel holds the stream while the copies are queued, then events (nvbandwidth's method)"
	} else {
		m.Timing = "plain events, launch overhead may be included (" + s.spinErr.Error() + ")"
	}
	m.Time = time.Now().UTC().Format(time.RFC3339)
	return m
}

func (s *Session) progress(r Result) {
	if s.opts.Progress != nil {
		fmt.Fprintf(s.opts.Progress, "pinmem: %s\n", r)
	}
}

func (s *Session) progressf(format string, args ...any) {
	if s.opts.Progress != nil {
		fmt.Fprintf(s.opts.Progress, "pinmem: "+format+"\n", args...)
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
	var evs []*cuda.Event
	defer func() {
		for _, e := range evs {
			_ = e.Destroy()
		}
	}()
	newEv := func() (*cuda.Event, error) {
		e, err := s.Ctx.NewEvent(cuda.EventDefault)
		if err == nil {
			evs = append(evs, e)
		}
		return e, err
	}
	released := false
	release := func() {
		if hold && !released {
			atomic.StoreUint32(&s.flagWords[flagWord], 1)
			released = true
		}
	}
	defer release()
	if hold {
		atomic.StoreUint32(&s.flagWords[flagWord], 0)
		atomic.StoreUint32(&s.flagWords[statusWord], 0)
		err := s.fns[kernels.KernelSpinWait].Launch(lanes[0].s, cuda.D1(1), cuda.D1(1), 0,
			s.flagDev.Add(4*flagWord), uint64(s.opts.SpinTimeout.Nanoseconds()), s.flagDev.Add(4*statusWord))
		if err != nil {
			return t, err
		}
		t.method = TimingSpin
	}
	starts := make([]*cuda.Event, len(lanes))
	ends := make([]*cuda.Event, len(lanes))
	for i, l := range lanes {
		var err error
		if starts[i], err = newEv(); err != nil {
			return t, err
		}
		if ends[i], err = newEv(); err != nil {
			return t, err
		}
		_ = l
	}
	// Lane 0's start event is the gate the other lanes wait for.
	if err := starts[0].Record(lanes[0].s); err != nil {
		return t, err
	}
	for i := 1; i < len(lanes); i++ {
		if err := lanes[i].s.WaitEvent(starts[0]); err != nil {
			return t, err
		}
		if err := starts[i].Record(lanes[i].s); err != nil {
			return t, err
		}
	}
	// Interleave the lanes' work so that no lane's queue runs ahead.
	for r := range reps {
		for _, l := range lanes {
			if err := l.op(l.s, r); err != nil {
				return t, err
			}
		}
	}
	for i, l := range lanes {
		if err := ends[i].Record(l.s); err != nil {
			return t, err
		}
	}
	release()
	for _, e := range ends {
		if err := e.Synchronize(); err != nil {
			return t, err
		}
	}
	if hold {
		if st := atomic.LoadUint32(&s.flagWords[statusWord]); st != kernels.SpinReleased {
			t.method = TimingEvents
			t.note = fmt.Sprintf("spin-wait timed out after %v while queueing (status %d): queueing time included", s.opts.SpinTimeout, st)
		}
	}
	for i := range lanes {
		d, err := ends[i].Elapsed(starts[i])
		if err != nil {
			return t, err
		}
		t.perLane = append(t.perLane, d)
		d0, err := ends[i].Elapsed(starts[0])
		if err != nil {
			return t, err
		}
		t.span = max(t.span, d0)
	}
	return t, nil
}
