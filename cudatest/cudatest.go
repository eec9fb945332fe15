package cudatest

import (
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
// concurrent use.
type Driver struct {
	fake      *fakedrv.Driver
	restore   func()
	before    map[trackKey]bool // pinmem's tracked objects live at install
	pinned    pinmem.Usage      // pinmem's ledger at install
	leakCheck bool

	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
}

type trackKey struct {
	kind track.Kind
	id   uint64
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
	before := map[trackKey]bool{}
	for _, o := range track.Live() {
		before[trackKey{o.Kind, o.ID}] = true
	}
	restore, err := fakedrv.Install(fake, owner)
	if err != nil {
		_ = fake.Close()
		var ie *fakedrv.InstalledError
		if errors.As(err, &ie) {
			return nil, fmt.Errorf("%w by %s, so %s cannot install one (tests that install one must not run in parallel)", ErrInstalled, fakedrv.OwnerName(ie.By), fakedrv.OwnerName(ie.Owner))
		}
		return nil, fmt.Errorf("cudatest: %w", err)
	}
	return &Driver{fake: fake, restore: restore, before: before, pinned: pinmem.Stats().Pinned, leakCheck: !cfg.noLeaks}, nil
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
		d.restore()
		_ = d.fake.Close()
	})
	return d.closeErr
}

// When says which calls of a driver function an injected fault hits: make
// one with Once, Nth or Always. The zero When is refused by FailOn.
type When struct {
	n      int // Nth's n
	always bool
	set    bool
}

// Once is the next call: Nth(1).
func Once() When { return Nth(1) }

// Nth is the nth call from now on (1 is the next one), once. FailOn refuses
// n < 1.
func Nth(n int) When { return When{n: n, set: true} }

// Always is every call from now on, until ClearFaults.
func Always() When { return When{always: true, set: true} }

// Ops returns, sorted, the driver functions the fake implements, by the
// names FailOn, FailAsync and Calls take: the CUDA driver API symbols as
// libcuda exports them, e.g. "cuMemAlloc_v2", "cuMemHostAlloc",
// "cuStreamCreate", "cuMemcpyHtoDAsync_v2".
func Ops() []string { return fakedrv.Ops() }

func (d *Driver) fault(what, op string, when When, code cuda.Result, async bool) error {
	if d == nil {
		return invalid("%s of a nil Driver", what)
	}
	if !slices.Contains(Ops(), op) {
		return invalid("%s(%q): not a driver function the fake implements (see Ops)", what, op)
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
	if async {
		return d.fake.FailAsync(op, nth, cudadrv.Result(code))
	}
	return d.fake.FailOn(op, nth, cudadrv.Result(code))
}

// FailOn makes the calls of driver function op that when selects fail with
// code, without effect, as the driver fails a call. The error pinmem then
// returns is a *cuda.Error with that code and matches the code's cuda
// sentinel (cuda.ResultOutOfMemory matches cuda.ErrOutOfMemory). Any
// CUresult may be given, with or without a constant in package cuda. Rules
// add up: each counts the calls of its op from the moment it was made.
// FailOn returns an error matching cuda.ErrInvalidValue for an op not in
// Ops, a zero When or cuda.ResultSuccess.
func (d *Driver) FailOn(op string, when When, code cuda.Result) error {
	return d.fault("FailOn", op, when, code, false)
}

// FailAsync is FailOn for asynchronous work (a copy, memset or kernel launch
// on a stream): the call succeeds, and the work fails when it runs, so the
// next synchronization of its stream or context reports code, as a GPU
// reports a fault.
func (d *Driver) FailAsync(op string, when When, code cuda.Result) error {
	return d.fault("FailAsync", op, when, code, true)
}

// ClearFaults removes every rule made by FailOn and FailAsync.
func (d *Driver) ClearFaults() {
	if d != nil {
		d.fake.ClearFaults()
	}
}

// Calls returns how many times the driver function op was called since the
// fake was installed, including calls that failed.
func (d *Driver) Calls(op string) int {
	if d == nil {
		return 0
	}
	return d.fake.Calls(op)
}

// HoldStream keeps the work queued on s (and work queued later) from
// running until ReleaseStream, as if the GPU were busy with it: queries
// report not ready, and synchronizing calls block until another goroutine
// releases the stream, or fail with CUDA_ERROR_LAUNCH_TIMEOUT after
// WaitTimeout. A stream from WrapStream with handle 0 is the legacy default
// stream. A nil s, or one unknown to this driver, is an error matching
// cuda.ErrInvalidValue.
func (d *Driver) HoldStream(s *cuda.Stream) error {
	return d.hold("HoldStream", s, true)
}

// ReleaseStream undoes HoldStream: the held work runs. It may be called
// from any goroutine.
func (d *Driver) ReleaseStream(s *cuda.Stream) error {
	return d.hold("ReleaseStream", s, false)
}

func (d *Driver) hold(what string, s *cuda.Stream, on bool) error {
	if d == nil {
		return invalid("%s of a nil Driver", what)
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
// ReleaseAll: a hung GPU, for code whose streams the test cannot name (a
// transfer.Copier's, a Pipeline's).
func (d *Driver) HoldAll() {
	if d != nil {
		d.fake.Pause()
	}
}

// ReleaseAll undoes HoldAll; streams held one by one stay held. It may be
// called from any goroutine.
func (d *Driver) ReleaseAll() {
	if d != nil {
		d.fake.Resume()
	}
}

// Objects counts the driver objects live in the fake.
type Objects struct {
	Streams         int    // streams created and not destroyed
	Events          int    // events created and not destroyed
	Modules         int    // modules loaded and not unloaded
	Contexts        int    // contexts created (cuda.NewContext) and not destroyed; primary contexts are not counted
	DeviceAllocs    int    // device memory allocations not freed
	DeviceBytes     uint64 // their bytes
	PinnedAllocs    int    // pinned host allocations (cuMemHostAlloc) not freed
	PinnedBytes     uint64 // their bytes
	Registrations   int    // host ranges registered (cuMemHostRegister) and not unregistered
	RegisteredBytes uint64 // their bytes
	PendingOps      int    // queued asynchronous operations that have not run (held, or waiting for held work)
}

// Live returns the objects live in the fake now.
func (d *Driver) Live() Objects {
	if d == nil {
		return Objects{}
	}
	c := d.fake.Live()
	return Objects{
		Streams: c.Streams, Events: c.Events, Modules: c.Modules, Contexts: c.Contexts,
		DeviceAllocs: c.DeviceAllocs, DeviceBytes: c.DeviceBytes,
		PinnedAllocs: c.HostAllocs, PinnedBytes: c.HostAllocBytes,
		Registrations: c.Registrations, RegisteredBytes: c.RegisteredBytes,
		PendingOps: c.PendingOps,
	}
}

// Leaks returns nil when nothing is left: no stream, event, module,
// created context, device allocation, pinned allocation or registration is
// live in the fake, no queued work is still waiting, pinmem's ledger
// (pinmem.Stats().Pinned) is back where it was at install, and pinmem's own
// record of the driver objects it made has none left from this driver.
// Otherwise it returns an error matching ErrLeak that lists what is left
// and, for pinmem's objects, the stack that created each. Primary contexts
// do not count: package cuda keeps them for the life of the process.
func (d *Driver) Leaks() error {
	if d == nil {
		return invalid("Leaks of a nil Driver")
	}
	c := d.Live()
	var parts []string
	add := func(n int, bytes uint64, what string) {
		switch {
		case n != 0 && bytes != 0:
			parts = append(parts, fmt.Sprintf("%d %s (%d bytes)", n, what, bytes))
		case n != 0:
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(c.Streams, 0, "stream(s)")
	add(c.Events, 0, "event(s)")
	add(c.Modules, 0, "module(s)")
	add(c.Contexts, 0, "context(s)")
	add(c.DeviceAllocs, c.DeviceBytes, "device allocation(s)")
	add(c.PinnedAllocs, c.PinnedBytes, "pinned allocation(s)")
	add(c.Registrations, c.RegisteredBytes, "registration(s)")
	add(c.PendingOps, 0, "queued operation(s) that never ran")
	if p := pinmem.Stats().Pinned; p != d.pinned {
		parts = append(parts, fmt.Sprintf("pinmem's ledger counts %d bytes pinned in %d buffer(s), %d bytes in %d at install", p.Bytes, p.Buffers, d.pinned.Bytes, d.pinned.Buffers))
	}
	var b strings.Builder
	for _, o := range track.Live() {
		if d.before[trackKey{o.Kind, o.ID}] {
			continue
		}
		fmt.Fprintf(&b, "- %s %#x", o.Kind, o.ID)
		if o.Size > 0 {
			fmt.Fprintf(&b, " (%d bytes)", o.Size)
		}
		b.WriteString(", created at:\n")
		b.WriteString(o.Stack)
	}
	if b.Len() > 0 && len(parts) == 0 {
		parts = append(parts, "objects pinmem made are still recorded as live")
	}
	if len(parts) == 0 {
		return nil
	}
	msg := strings.Join(parts, ", ")
	if b.Len() > 0 {
		msg += "\n" + strings.TrimRight(b.String(), "\n")
	}
	return fmt.Errorf("%w: %s", ErrLeak, msg)
}

// CheckLeaks fails t (without stopping it) with the report of Leaks when
// objects are left.
func (d *Driver) CheckLeaks(t testing.TB) {
	t.Helper()
	if err := d.Leaks(); err != nil {
		t.Error(err)
	}
}
