package cudatest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/track"
)

// ErrInstalled is matched by the error Start returns, and Install reports,
// while a fake driver installed by another test is active.
var ErrInstalled = errors.New("cudatest: a fake CUDA driver is already installed")

// ErrLeak is matched by the error Leaks and Close return when objects are
// left.
var ErrLeak = errors.New("cudatest: driver objects leaked")

// Driver is an installed fake CUDA driver. Its methods are safe for
// concurrent use. Once it is closed, those that act on the fake (FailOn,
// FailAsync, HoldStream, ReleaseStream, WaitBlocked, RegisterKernel)
// return an error matching cuda.ErrInvalidValue.
type Driver struct {
	fake      *fakedrv.Driver
	restore   func()
	leakCheck bool

	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
}

// ledger keeps, for each installed Driver, pinmem's ledger as it was at
// install, less what nested fakes closed since left pinned: a Driver's
// leaks are its own.
var ledger struct {
	sync.Mutex
	base  map[*Driver]pinmem.Usage
	stack []*Driver // installed now, innermost last
}

// Install installs a fake driver configured by opts as the process's CUDA
// driver: every pinmem package uses it until t ends. At cleanup, after the
// cleanups registered later (Close of the objects the test made, say), it
// fails t if objects are left (see Leaks; WithoutLeakCheck turns that off) and
// puts back the driver that was there before. An invalid option fails t, and
// so does an Install while a fake installed by another test is active:
// tests that install one must not run in parallel. A subtest may install
// its own over its parent's, and any test over one from Start.
func Install(t testing.TB, opts ...Option) *Driver {
	t.Helper()
	d, err := start(t.Name(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		t.Helper()
		if d.closed.Load() {
			return // the test closed it and had the leaks reported by Close
		}
		if err := d.Close(); err != nil && d.leakCheck {
			t.Error(err)
		}
	})
	return d
}

// Start installs a fake driver configured by opts for code without a
// testing.TB, such as a TestMain or an example; Close uninstalls it. Tests
// may Install their own fakes over it. Start fails with an error matching
// ErrInstalled while a test's fake is installed, and with one matching
// cuda.ErrInvalidValue for an invalid option. For a whole test binary:
//
//	func TestMain(m *testing.M) {
//		d, err := cudatest.Start()
//		if err != nil {
//			log.Fatal(err)
//		}
//		code := m.Run()
//		if err := d.Close(); err != nil { // leaks
//			log.Print(err)
//			code = 1
//		}
//		os.Exit(code)
//	}
func Start(opts ...Option) (*Driver, error) { return start("", opts) }

func start(owner string, opts []Option) (*Driver, error) {
	cfg, fo, err := build(opts)
	if err != nil {
		return nil, err
	}
	fake := fakedrv.New(fo)
	// Leak reports name the code that created each object.
	track.EnableStacks(true)
	restore, err := fakedrv.Install(fake, owner)
	if err != nil {
		_ = fake.Close()
		var ie *fakedrv.InstalledError
		if errors.As(err, &ie) {
			return nil, fmt.Errorf("%w by %s, so %s cannot install one (tests that install one must not run in parallel)", ErrInstalled, fakedrv.OwnerName(ie.By), fakedrv.OwnerName(ie.Owner))
		}
		return nil, fmt.Errorf("cudatest: %w", err)
	}
	d := &Driver{fake: fake, restore: restore, leakCheck: !cfg.noLeaks}
	ledger.Lock()
	if ledger.base == nil {
		ledger.base = map[*Driver]pinmem.Usage{}
	}
	ledger.base[d] = pinmem.Stats().Pinned
	ledger.stack = append(ledger.stack, d)
	ledger.Unlock()
	return d, nil
}

// pinnedSince returns how far pinmem's ledger moved while d was installed,
// leaving out what nested fakes left.
func (d *Driver) pinnedSince() (now, base pinmem.Usage) {
	ledger.Lock()
	defer ledger.Unlock()
	return pinmem.Stats().Pinned, ledger.base[d]
}

// uninstalled forgets d's ledger baseline and moves those of the drivers
// it was nested in by what d left pinned, so that it counts as theirs
// neither.
func (d *Driver) uninstalled() {
	ledger.Lock()
	defer ledger.Unlock()
	now, base := pinmem.Stats().Pinned, ledger.base[d]
	delete(ledger.base, d)
	i := slices.Index(ledger.stack, d)
	if i < 0 {
		return
	}
	ledger.stack = slices.Delete(ledger.stack, i, i+1)
	for _, outer := range ledger.stack[:i] {
		b := ledger.base[outer]
		b.Bytes += now.Bytes - base.Bytes
		b.Buffers += now.Buffers - base.Buffers
		ledger.base[outer] = b
	}
}

// Close uninstalls the fake, putting back the driver that was there before
// Install or Start, and releases the memory the fake holds. It returns what
// Leaks returned just before. Calls to the fake after Close fail with
// CUDA_ERROR_DEINITIALIZED. A second Close returns the first one's result.
// Install closes the driver at cleanup and reports the leaks; a test that
// calls Close itself gets them from Close instead.
func (d *Driver) Close() error {
	if d == nil {
		return invalid("Close of a nil Driver")
	}
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		d.closeErr = d.Leaks()
		d.uninstalled()
		d.restore()
		_ = d.fake.Close()
	})
	return d.closeErr
}

// usable refuses a nil Driver, and one closed, for the method what.
func (d *Driver) usable(what string) error {
	switch {
	case d == nil:
		return invalid("%s of a nil Driver", what)
	case d.closed.Load():
		return invalid("%s of a closed Driver", what)
	}
	return nil
}

// When says which calls of a driver function an injected fault hits: make
// one with Once, Nth or Always. The zero When is refused by FailOn.
type When struct {
	n      int // Nth's n
	always bool
	set    bool
	sticky bool
}

// Once is the next call: Nth(1).
func Once() When { return Nth(1) }

// Nth is the nth call from now on (1 is the next one), once. FailOn refuses
// n < 1.
func Nth(n int) When { return When{n: n, set: true} }

// Always is every call from now on, until ClearFaults.
func Always() When { return When{always: true, set: true} }

// Sticky returns w with a sticky fault: once the fault happened (at the
// failing call for FailOn, when the work runs for FailAsync), every later
// call in the same context fails with its code too, as after a kernel's
// CUDA_ERROR_ILLEGAL_ADDRESS on a GPU, until ClearFaults (which stands for
// a reset of the context). Calls that release an object (frees, destroys,
// unregistrations, unloads) still succeed, so that the test can clean up.
// The context is the one current on the calling thread for FailOn, and
// the one the work runs in for FailAsync.
func (w When) Sticky() When {
	w.sticky = true
	return w
}

// Operation classes, which FailOn, FailAsync and Calls take in place of a
// driver function to mean every call of the class, so that a test does not
// depend on the path (synchronous, asynchronous or batched copy) a size or
// an option sends the code under test down.
const (
	// AnyHtoD is any host-to-device copy: cuMemcpyHtoD_v2,
	// cuMemcpyHtoDAsync_v2, and a batch copy (cuMemcpyBatchAsync_v2) with a
	// copy from host to device memory. A kernel that copies (as a
	// blocks.Copier given WithKernel does) is a launch: AnyLaunch.
	AnyHtoD = "any host-to-device copy"
	// AnyDtoH is any device-to-host copy: cuMemcpyDtoH_v2,
	// cuMemcpyDtoHAsync_v2, and a batch copy with a copy from device to
	// host memory.
	AnyDtoH = "any device-to-host copy"
	// AnyLaunch is any kernel launch (cuLaunchKernel).
	AnyLaunch = "any kernel launch"
	// AnyAlloc is any allocation of device or pinned host memory:
	// cuMemAlloc_v2, cuMemHostAlloc and cuMemHostRegister_v2.
	AnyAlloc = "any allocation"
)

func (d *Driver) fault(what, op string, when When, code cuda.Result, async bool) error {
	if err := d.usable(what); err != nil {
		return err
	}
	if !slices.Contains(fakedrv.Ops(), op) && !slices.Contains(fakedrv.Classes(), op) {
		return invalid("%s(%q): neither a driver function the fake implements (by its libcuda symbol name, e.g. cuMemAlloc_v2) nor an operation class", what, op)
	}
	nth := when.n
	switch {
	case !when.set:
		return invalid("%s(%q): the zero When (use Once, Nth or Always)", what, op)
	case when.always:
		nth = 0
	case nth < 1:
		return invalid("%s(%q, Nth(%d)): n must be at least 1", what, op, nth)
	}
	if code == cuda.ResultSuccess {
		return invalid("%s(%q): cuda.ResultSuccess is not a failure", what, op)
	}
	if async && !fakedrv.QueuesWork(op) {
		return invalid("%s(%q): the call queues no work on a stream, so no asynchronous fault can hit it (use FailOn)", what, op)
	}
	return d.fake.AddRule(op, nth, cudadrv.Result(code), async, when.sticky)
}

// FailOn makes the calls of driver function op (or of an operation class,
// such as AnyHtoD) that when selects fail with code, without effect, as
// the driver fails a call. The error pinmem then returns is a *cuda.Error
// with that code and matches the code's cuda sentinel
// (cuda.ResultOutOfMemory matches cuda.ErrOutOfMemory). Any CUresult may
// be given, with or without a constant in package cuda. Rules add up: each
// counts the calls of its op from the moment it was made. FailOn returns
// an error matching cuda.ErrInvalidValue for an op that is neither a
// driver function the fake implements (by its libcuda symbol name, as
// "cuMemAlloc_v2" or "cuMemcpyHtoDAsync_v2") nor a class, a zero When or cuda.ResultSuccess; FailAsync also for an op that
// queues no work (AnyAlloc, cuStreamCreate, ...).
func (d *Driver) FailOn(op string, when When, code cuda.Result) error {
	return d.fault("FailOn", op, when, code, false)
}

// FailAsync is FailOn for asynchronous work (a copy, memset or kernel
// launch on a stream: AnyHtoD, AnyDtoH, AnyLaunch or a cuMemcpy*,
// cuMemset* or cuLaunchKernel symbol): the call succeeds, and the work
// fails when it runs, as device work faults on a GPU. A synchronous copy
// or memset reports the fault itself. A call refused before it queued its
// work (an argument the driver rejects) takes no fault: the next call's
// work does. The fault is reported once, by the first
// of these that observes it: a query or synchronization of an event
// recorded on the work's stream after the work, a query or synchronization
// of that stream, a synchronization of its context. With When.Sticky it
// also fails every later call in the context.
func (d *Driver) FailAsync(op string, when When, code cuda.Result) error {
	return d.fault("FailAsync", op, when, code, true)
}

// ClearFaults removes every rule made by FailOn and FailAsync, and resets
// the contexts a sticky fault broke: their calls work again, and the
// faults of their work not reported yet are forgotten.
func (d *Driver) ClearFaults() {
	if d != nil {
		d.fake.ClearFaults()
	}
}

// Calls returns how many times the driver function op, or the calls of an
// operation class, were called since the fake was installed, including
// calls that failed.
func (d *Driver) Calls(op string) int {
	if d == nil {
		return 0
	}
	return d.fake.Calls(op)
}

// HoldStream keeps the work queued on s (and work queued later) from
// running until ReleaseStream, as if the GPU were busy with it: queries
// report not ready, and synchronizing calls block until another goroutine
// releases the stream, or fail with CUDA_ERROR_LAUNCH_TIMEOUT after the
// wait timeout (WithWaitTimeout). A stream from WrapStream with handle 0
// is the legacy default stream; Streams returns the streams of code under
// test, such as a transfer.Copier's. A nil s, or one unknown to this
// driver, is an error matching cuda.ErrInvalidValue.
func (d *Driver) HoldStream(s *cuda.Stream) error {
	return d.hold("HoldStream", s, true)
}

// ReleaseStream undoes HoldStream. It may be called from any goroutine.
// Released work runs before ReleaseStream returns, on the calling
// goroutine, in this order: stream by stream in the order the streams were
// created (the legacy default stream first), each stream's work in the
// order it was queued as far as it can run, and again from the first
// stream while any work could run. Work that waits for an event or for the
// legacy default stream runs once what it waits for has run.
func (d *Driver) ReleaseStream(s *cuda.Stream) error {
	return d.hold("ReleaseStream", s, false)
}

func (d *Driver) hold(what string, s *cuda.Stream, on bool) error {
	if err := d.usable(what); err != nil {
		return err
	}
	if s == nil {
		return invalid("%s(nil)", what)
	}
	h := cudadrv.Stream(s.Handle())
	var err error
	if on {
		err = d.fake.HoldStream(h)
	} else {
		err = d.fake.ReleaseStream(h)
	}
	if err != nil {
		return invalid("%s: stream %#x is not a live stream of this fake driver", what, s.Handle())
	}
	return nil
}

// HoldAll keeps all queued work, on every stream, from running until
// ReleaseAll: a hung GPU.
func (d *Driver) HoldAll() {
	if d != nil {
		d.fake.Pause()
	}
}

// ReleaseAll undoes HoldAll; streams held one by one stay held. It may be
// called from any goroutine. Released work runs as ReleaseStream says.
func (d *Driver) ReleaseAll() {
	if d != nil {
		d.fake.Resume()
	}
}

// Streams returns the streams live in the fake, in the order they were
// created: those of the test and those of the code under test alike. A
// test takes the streams an object made from the ones it adds:
//
//	before := len(d.Streams())
//	pl, err := copier.NewPipeline( /* two streams */ )
//	// ...
//	second := d.Streams()[before+1] // the Pipeline's second stream
//	d.HoldStream(second)
//
// The streams it returns are for HoldStream, ReleaseStream and
// WaitBlocked; code must not destroy them.
func (d *Driver) Streams() []*cuda.Stream {
	if d == nil {
		return nil
	}
	var out []*cuda.Stream
	for _, si := range d.fake.Streams() {
		dev, err := cuda.GetDevice(int(si.Device))
		if err != nil {
			continue // a device of another driver: not this fake's
		}
		out = append(out, cuda.WrapStream(cuda.WrapContext(dev, uintptr(si.Ctx)), uintptr(si.Handle)))
	}
	return out
}

// WaitBlocked waits until a call of the code under test waits for work
// queued on s that a hold keeps from running (any stream when s is nil):
// a synchronizing call blocked on it, or a query that found it not ready
// after WaitBlocked was called (code that polls, as a Synchronize with a
// context that can end does, queries again and again).
// It returns the driver function of that call, such as
// "cuStreamSynchronize" or "cuEventQuery", so that a test can release the
// work knowing the code reached its wait, with no sleep standing in for
// it; or ctx's error when ctx ends first. A stream unknown to this driver,
// and a Driver closed before or during the wait, are errors matching
// cuda.ErrInvalidValue.
func (d *Driver) WaitBlocked(ctx context.Context, s *cuda.Stream) (string, error) {
	if err := d.usable("WaitBlocked"); err != nil {
		return "", err
	}
	var h cudadrv.Stream
	if s != nil {
		h = cudadrv.Stream(s.Handle())
	}
	for seen := -1; ; {
		if err := d.usable("WaitBlocked"); err != nil {
			return "", err // closed while waiting
		}
		changed := d.fake.Changed()
		op, polls, err := d.fake.Blocked(h, s == nil, seen)
		if err != nil {
			return "", invalid("WaitBlocked: stream %#x is not a live stream of this fake driver", s.Handle())
		}
		if op != "" {
			return op, nil
		}
		seen = polls
		select {
		case <-changed:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Leaks returns nil when nothing this driver made is left: no stream,
// event, module, created context, device allocation, pinned allocation or
// registration is live in it, no queued work is still waiting, and
// pinmem's ledger (pinmem.Stats().Pinned) is back where it was at install.
// Otherwise it returns an error matching ErrLeak that lists what is left
// and, for the objects pinmem made, the stack that created each. Only this
// driver's objects count: not those of a fake installed before it, nor
// those a nested fake (a subtest's) left. Primary contexts do not count:
// package cuda keeps them for the life of the process.
func (d *Driver) Leaks() error {
	if d == nil {
		return invalid("Leaks of a nil Driver")
	}
	parts, stacks := d.fake.LeakReport(false)
	if p, base := d.pinnedSince(); p != base {
		parts = append(parts, fmt.Sprintf("pinmem's ledger counts %d bytes pinned in %d buffer(s), %d bytes in %d at install", p.Bytes, p.Buffers, base.Bytes, base.Buffers))
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s%s", ErrLeak, strings.Join(parts, ", "), stacks)
}
