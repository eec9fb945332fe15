package testutil

import (
	"strings"
	"sync"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/track"
)

// UseFake is the way into the fake driver for pinmem's own tests (users'
// tests call cudatest.Install, which installs the same fake by the same
// mechanism): it installs a new fake configured by opts as the process's
// driver (cudadrv.Get returns it) until t ends. At cleanup, after the
// cleanups t registered later (a Copier's Close, say), it fails t when the
// fake still holds a stream, event, module, created context, device or
// pinned allocation, registration or queued work, naming the code that
// created each object pinmem recorded; then it puts back the driver that
// was there before and closes the fake. A test that leaves objects on
// purpose calls AllowLeaks.
//
// A second install while one is active fails t unless it comes from the
// same test or one of its subtests, which nest: tests that use a fake must
// not run in parallel with each other or with tests that use another
// driver. As on a GPU, code under test must make a context current on a
// locked OS thread before the calls that need one.
func UseFake(t testing.TB, opts fakedrv.Options) *fakedrv.Driver {
	t.Helper()
	d := fakedrv.New(opts)
	track.EnableStacks(true)
	restore, err := fakedrv.Install(d, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	fakeChecks.Lock()
	var checks []func()
	for _, start := range fakeChecks.start {
		checks = append(checks, start(t, d))
	}
	fakeChecks.Unlock()
	t.Cleanup(func() {
		defer func() {
			restore()
			_ = d.Close()
		}()
		if allowed(d) {
			return
		}
		if parts, stacks := d.LeakReport(false); len(parts) > 0 {
			t.Errorf("the fake driver still holds %s%s", strings.Join(parts, ", "), stacks)
		}
		for _, check := range checks {
			if check != nil {
				check()
			}
		}
	})
	return d
}

var fakeChecks struct {
	sync.Mutex
	start []func(testing.TB, *fakedrv.Driver) func()
}

// OnFake adds, for the rest of the test binary, a check of what only the
// package under test can see (pinmem's ledger and budget, say) to every
// fake UseFake installs: UseFake calls start when it installs the fake,
// and the function start returned at the fake's cleanup, after the leak
// check (unless AllowLeaks turned that off). Call it from TestMain, before
// Main.
func OnFake(start func(t testing.TB, d *fakedrv.Driver) (check func())) {
	fakeChecks.Lock()
	defer fakeChecks.Unlock()
	fakeChecks.start = append(fakeChecks.start, start)
}

// CheckPinned adds to every fake UseFake installs, by OnFake, a check that
// pinned returns at the fake's cleanup what it returned at its install,
// so that a test that leaves memory pinned fails. pinned reads pinmem's
// ledger (pinmem.Stats().Pinned, say): it is a parameter because testutil
// cannot import pinmem, whose own tests import testutil. Call it from
// TestMain, before Main.
func CheckPinned[T comparable](pinned func() T) {
	OnFake(func(t testing.TB, _ *fakedrv.Driver) func() {
		pinned0 := pinned()
		return func() {
			if p := pinned(); p != pinned0 {
				t.Errorf("pinmem ledger: %+v pinned at the end, %+v at the start", p, pinned0)
			}
		}
	})
}

// AllowLeaks turns off the leak check of UseFake for d, for a test that
// leaves driver objects behind on purpose.
func AllowLeaks(d *fakedrv.Driver) {
	leaky.Lock()
	defer leaky.Unlock()
	if leaky.m == nil {
		leaky.m = map[*fakedrv.Driver]bool{}
	}
	leaky.m[d] = true
}

func allowed(d *fakedrv.Driver) bool {
	leaky.Lock()
	defer leaky.Unlock()
	ok := leaky.m[d]
	delete(leaky.m, d)
	return ok
}

var leaky struct {
	sync.Mutex
	m map[*fakedrv.Driver]bool
}
