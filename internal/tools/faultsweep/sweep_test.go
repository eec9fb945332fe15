// Package faultsweep_test fails every driver call that each public
// operation of pinmem makes, one at a time, once and then for good
// ("sticky", as after CUDA_ERROR_ILLEGAL_ADDRESS), and checks that the
// operation returns a typed error or succeeds, never panics or hangs, and
// that afterwards the driver's live objects, pinmem's ledger, the object
// tracker and the goroutines are back where they were. Under -short each
// call is failed in one of the two ways, alternating (see modes).
package faultsweep_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

// TestMain prints the sweeps' totals after every test ran.
func TestMain(m *testing.M) { testutil.Main(m, sweepTotals.print) }

// env is what an operation runs against. Cleanups registered with
// defer_ run after the faults are cleared, as a caller's retry would:
// every release an operation made under a fault must succeed then.
type env struct {
	t        *testing.T
	fd       *fakedrv.Driver
	ctx      *cuda.Context
	cleanups []func() error
}

func (e *env) defer_(f func() error) { e.cleanups = append(e.cleanups, f) }

// op is one public operation: its whole life (acquire, use, release), as
// a careful caller writes it. It returns the first error it met.
//
// The calls of an operation made on one goroutine come in the same order
// every run, so a fault is aimed at the i-th call and the sweep checks
// that the call failed is the one the trace names there. An operation
// that calls the driver from several goroutines at once (Multi's
// per-device transfers) is concurrent: their calls interleave differently
// from run to run, so a fault is aimed at the k-th call of the traced
// name instead, and the sweep checks that the run made that call.
type op struct {
	name       string
	run        func(e *env) error
	concurrent bool
}

// benign errors are what a release repeated after success may answer.
func benign(err error) bool {
	return err == nil || errors.Is(err, pinmem.ErrFreed) || errors.Is(err, cuda.ErrInvalidHandle) || isClosed(err)
}

var closedErrs []error // ErrClosed sentinels of the packages, added by the files that use them

func isClosed(err error) bool {
	for _, c := range closedErrs {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// typed reports whether err is one a caller can act on with errors.Is or
// errors.As: a driver error, or one of pinmem's sentinels.
func typed(err error) bool {
	var ce *cuda.Error
	if errors.As(err, &ce) {
		return true
	}
	for _, s := range []error{
		cuda.ErrNoDriver, cuda.ErrNoDevice, cuda.ErrNotSupported, cuda.ErrOutOfMemory, cuda.ErrInvalidValue,
		cuda.ErrNotReady, cuda.ErrAlreadyRegistered, cudadrv.ErrNotRegistered, cuda.ErrInvalidHandle,
		cuda.ErrKernelImage, cuda.ErrLaunchFailed, pinmem.ErrBudget, pinmem.ErrFreed, pinmem.ErrNotMapped,
		context.DeadlineExceeded, context.Canceled,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return isClosed(err)
}

// baseline is the state an operation must leave behind. Besides the live
// objects and the books it holds the fake's count of asynchronous errors
// (queued work that touched released memory) and of asynchronous copies
// from pageable memory (pinned memory used after its release): no run may
// add to them.
type baseline struct {
	live      fakedrv.Counts
	tracked   int
	pinned    int64
	asyncErrs int
	pageable  int
}

func snapshot(fd *fakedrv.Driver) baseline {
	return baseline{live: fd.Live(), tracked: len(track.Live()), pinned: pinmem.Stats().Pinned.Bytes,
		asyncErrs: len(fd.AsyncErrors()), pageable: fd.PageableAsyncCopies()}
}

// dropped returns how many buffers and owners were dropped without their
// release so far.
func dropped() int64 {
	s := pinmem.Stats()
	n := s.Dropped
	for _, c := range s.DroppedOwners {
		n += c
	}
	return n
}

// faultCode is what an injected failure answers: an error no caller
// treats specially.
const faultCode = cudadrv.ErrorUnknown

// result of one run of an operation.
type result struct {
	took     time.Duration
	err      error
	panicked any
	cleanup  error
	hung     bool
}

const runTimeout = 20 * time.Second

// runOnce runs o with the hook h installed (nil: no faults) and returns
// what happened; the faults are cleared before the cleanups run.
func runOnce(t *testing.T, fd *fakedrv.Driver, ctx *cuda.Context, o op, h func(string) cudadrv.Result) result {
	e := &env{t: t, fd: fd, ctx: ctx}
	// The fake has one current context for all threads: a run whose
	// restoring cuCtxSetCurrent failed leaves its context current, and the
	// next run would skip a switch the trace has. Every run starts on a
	// thread with no context current, as the first did.
	if err := fd.CtxSetCurrent(0); err != nil {
		t.Fatalf("clearing the current context: %v", err)
	}
	start := time.Now()
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panicked = p
			}
			done <- r
		}()
		fd.SetHook(h)
		r.err = o.run(e)
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(runTimeout):
		fd.SetHook(nil)
		fd.Resume()
		return result{hung: true}
	}
	fd.SetHook(nil)
	fd.ClearFaults()
	var errs []error
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		if err := e.cleanups[i](); !benign(err) {
			errs = append(errs, err)
		}
	}
	r.cleanup = errors.Join(errs...)
	r.took = time.Since(start)
	return r
}

// trace runs o once without faults and returns the driver calls it made.
func trace(t *testing.T, fd *fakedrv.Driver, ctx *cuda.Context, o op) ([]string, result) {
	var mu sync.Mutex
	var calls []string
	r := runOnce(t, fd, ctx, o, func(name string) cudadrv.Result {
		mu.Lock()
		calls = append(calls, name)
		mu.Unlock()
		return cudadrv.Success
	})
	return calls, r
}

// settled returns the state once it equals base, or after the cleanups
// of dropped objects (which run after a garbage collection) have had a
// few chances to release what they hold. Nothing signals that a cleanup
// ran, so this is a short bounded poll.
func settled(fd *fakedrv.Driver, base baseline) baseline {
	now := snapshot(fd)
	for i := 0; i < 4 && now != base; i++ {
		runtime.GC()
		time.Sleep(time.Duration(1<<i) * time.Millisecond)
		now = snapshot(fd)
	}
	return now
}

func (b baseline) diff(fd *fakedrv.Driver, now baseline) string {
	var d []string
	if now.live != b.live {
		d = append(d, fmt.Sprintf("driver live %+v, was %+v", now.live, b.live))
	}
	if now.tracked != b.tracked {
		d = append(d, fmt.Sprintf("%d tracked objects, was %d:\n%s", now.tracked, b.tracked, track.Report()))
	}
	if now.pinned != b.pinned {
		d = append(d, fmt.Sprintf("ledger %d pinned bytes, was %d", now.pinned, b.pinned))
	}
	if now.asyncErrs != b.asyncErrs {
		d = append(d, fmt.Sprintf("queued work failed: %v", fd.AsyncErrors()[b.asyncErrs:]))
	}
	if now.pageable != b.pageable {
		d = append(d, fmt.Sprintf("%d asynchronous copies from pageable memory", now.pageable-b.pageable))
	}
	return fmt.Sprint(d)
}

// sweep is the test body shared by every group of operations.
//
// Each operation first runs once without faults, so that what is cached
// for the life of the process (device properties, the primary context)
// is cached before the trace; the trace is then the calls every later
// run makes in the same order, until the fault. Each faulted run checks
// that the call it failed is the one the trace names there: a mismatch
// means the operation is not deterministic and the sweep would test
// something other than what it reports.
func sweep(t *testing.T, ops []op) {
	// Two devices, for Multi; device 1's primary context is retained by
	// the first operation that uses it, for the life of the process.
	fd := testutil.UseFake(t, fakedrv.Options{DeviceCount: 2, WaitTimeout: 100 * time.Millisecond})
	registerKernels(fd)
	ctx := testutil.PrimaryContext(t)
	var nCalls, nRuns int
	for _, o := range ops {
		t.Run(o.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			dropped0 := dropped()
			if _, r := trace(t, fd, ctx, o); r.err != nil || r.panicked != nil || r.hung || r.cleanup != nil {
				t.Fatalf("without faults (warm-up): err %v, panic %v, hung %v, cleanup %v", r.err, r.panicked, r.hung, r.cleanup)
			}
			// What the warm-up cached for the life of the process (device
			// properties, a primary context) is part of the baseline.
			base := settled(fd, snapshot(fd))
			calls, r := trace(t, fd, ctx, o)
			if r.err != nil || r.panicked != nil || r.hung || r.cleanup != nil {
				t.Fatalf("without faults: err %v, panic %v, hung %v, cleanup %v", r.err, r.panicked, r.hung, r.cleanup)
			}
			if d := base.diff(fd, settled(fd, base)); d != "[]" {
				t.Fatalf("without faults the operation leaks: %s", d)
			}
			verbose := testing.Verbose() && os.Getenv("SWEEP_TRACE") != ""
			if verbose {
				for i, c := range calls {
					t.Logf("call %d: %s", i+1, c)
				}
			}
			nCalls += len(calls)
			var opRuns int     // faulted runs of this operation
			var failedRuns int // faulted runs whose operation returned an error
			var moved int      // faulted runs whose fault landed on another call than the traced one
			for i, name := range calls {
				for _, sticky := range modes(i) {
					nRuns++
					opRuns++
					// The target: the i-th call, or, for a concurrent
					// operation, the k-th call named name.
					k := 0
					for _, c := range calls[:i+1] {
						if c == name {
							k++
						}
					}
					var r result
					var faulted string // the call failed first
					for attempt := 0; attempt < 3; attempt++ {
						n, named, hit := 0, 0, false
						faulted = ""
						var mu sync.Mutex
						r = runOnce(t, fd, ctx, o, func(op string) cudadrv.Result {
							mu.Lock()
							defer mu.Unlock()
							n++
							if op == name {
								named++
							}
							if !hit && ((!o.concurrent && n == i+1) || (o.concurrent && op == name && named == k)) {
								hit, faulted = true, op
								return faultCode
							}
							if sticky && hit {
								return faultCode
							}
							return cudadrv.Success
						})
						if faulted == name || r.hung {
							break
						}
						// A concurrent operation's polls may make fewer calls
						// of a name in one run, and on a loaded machine a
						// background release of an earlier run may still be
						// calling the driver: try again.
						if now := settled(fd, base); now != base {
							break
						}
					}
					what := fmt.Sprintf("call %d (%s) failing %s", i+1, name, map[bool]string{false: "once", true: "from then on"}[sticky])
					if o.concurrent {
						what = fmt.Sprintf("call %d of %s (call %d in the trace) failing %s", k, name, i+1, map[bool]string{false: "once", true: "from then on"}[sticky])
					}
					if verbose {
						t.Logf("%s: took %v; err %v; cleanup %v; live %+v", what, r.took, r.err, r.cleanup, fd.Live())
					}
					if r.hung {
						t.Fatalf("%s: hung for %v", what, runTimeout)
					}
					if faulted != name {
						// The fault landed on another call: on a loaded
						// machine a concurrent operation's polls and context
						// switches vary from run to run. The run is still
						// checked below (it met a fault), and the share of
						// such runs is bounded after the sweep.
						moved++
					}
					switch {
					case r.panicked != nil:
						t.Errorf("%s: panic: %v", what, r.panicked)
					case r.err != nil && !typed(r.err):
						t.Errorf("%s: untyped error %T: %v", what, r.err, r.err)
					case r.cleanup != nil:
						t.Errorf("%s: releasing after the fault cleared failed: %v", what, r.cleanup)
					}
					if r.err != nil {
						failedRuns++
					}
					if now := settled(fd, base); now != base {
						t.Errorf("%s: not back to baseline: %s", what, base.diff(fd, now))
						// Start the next run from the state this one left.
						base = snapshot(fd)
					}
				}
			}
			// A sweep whose faults never reach the operation (a hook not
			// wired, a trace of other calls) would pass without testing
			// anything.
			if len(calls) == 0 || failedRuns == 0 {
				t.Errorf("%d driver calls traced, %d faulted runs returned an error: the faults did not reach the operation", len(calls), failedRuns)
			}
			t.Logf("%d driver calls, %d faulted runs, %d returned an error, %d hit another call than the traced one (after three tries)", len(calls), opRuns, failedRuns, moved)
			// An object dropped without its release (a Buffer, a Pool) is
			// counted once a garbage collection has run its cleanup;
			// nothing signals that cleanups ran, so they get a moment.
			runtime.GC()
			time.Sleep(time.Millisecond)
			runtime.GC()
			if n := dropped() - dropped0; n != 0 {
				t.Errorf("%d objects were dropped without their release (pinmem.Stats: %v)", n, pinmem.Stats())
			}
			if err := goleak.Find(ignore); err != nil {
				t.Errorf("goroutines left after the sweep: %v", err)
			}
		})
	}
	t.Logf("fault sweep: %d operations, %d driver calls traced, %d faulted runs", len(ops), nCalls, nRuns)
	sweepTotals.add(len(ops), nCalls, nRuns)
}

// modes returns how the i-th traced call (from 0) is failed: once and
// then for good ("sticky"); under -short only one of the two, alternating
// from call to call, so that every call is still failed and both modes
// are still met, in half the runs.
func modes(i int) []bool {
	if testing.Short() {
		return []bool{i%2 == 1}
	}
	return []bool{false, true}
}

func registerKernels(fd *fakedrv.Driver) {
	// sweep_inc(ptr, n) adds one to each of the n bytes at ptr.
	fd.RegisterKernel("sweep_inc", []int{8, 4}, func(k *fakedrv.KernelCall) error {
		mem, err := k.Mem(k.Ptr(0), uint64(k.Uint32(1)))
		if err != nil {
			return err
		}
		for i := range mem {
			mem[i]++
		}
		return nil
	})
	// sweep_fill(ptr, v) sets the 16 bytes at ptr to v.
	fd.RegisterKernel("sweep_fill", []int{8, 4}, func(k *fakedrv.KernelCall) error {
		mem, err := k.Mem(k.Ptr(0), 16)
		if err != nil {
			return err
		}
		for i := range mem {
			mem[i] = byte(k.Uint32(1))
		}
		return nil
	})
}
