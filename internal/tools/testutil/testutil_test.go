package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/track"
)

func TestMain(m *testing.M) { Main(m) }

// envHelper selects, in a re-executed test binary, which helper test body runs.
const envHelper = "PINMEM_TESTUTIL_HELPER"

// child runs this test binary again with only TestHelper and returns its
// output and whether it exited 0.
func child(t *testing.T, helper string, env ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelper+"="+helper, cudadrv.EnvLibrary+"=/nonexistent/libcuda.so.1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("running child: %v", err)
		}
		return string(out), false
	}
	return string(out), true
}

// TestHelper is the body run in child processes; it does nothing otherwise.
func TestHelper(t *testing.T) {
	switch os.Getenv(envHelper) {
	case "":
		t.Skip("only runs in a child process")
	case "requiregpu":
		RequireGPU(t)
		t.Log("RequireGPU returned")
	case "requiregpu-fake":
		UseFake(t, fakedrv.Options{})
		RequireGPU(t)
	case "notsupported":
		SkipIfNotSupported(t, fmt.Errorf("wrapped: %w", cudadrv.ErrNotSupported))
	case "othererror":
		SkipIfNotSupported(t, errors.New("something else"))
	case "skipfeature":
		SkipFeature(t, "device lacks write-combined memory")
	case "leakobject":
		track.Add(track.Stream, 0x1234, 0)
	case "leakgoroutine":
		ch := make(chan struct{})
		go func() { <-ch }()
	case "pinnedleak", "pinnedkept":
		var pinned int
		CheckPinned(func() int { return pinned })
		UseFake(t, fakedrv.Options{})
		if os.Getenv(envHelper) == "pinnedleak" {
			pinned++ // as if the test left memory pinned
		}
		t.Log("test done")
	case "fakeleak", "fakeleak-allowed":
		d := UseFake(t, fakedrv.Options{})
		if os.Getenv(envHelper) == "fakeleak-allowed" {
			AllowLeaks(d)
		}
		ctx, err := d.DevicePrimaryCtxRetain(0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.DevicePrimaryCtxRelease(0)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := d.CtxSetCurrent(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := d.StreamCreate(0); err != nil {
			t.Fatal(err)
		}
		t.Log("stream left")
	}
}

// TestUseFakeLeakCheck: UseFake fails a test that leaves a driver object
// in its fake, unless the test allowed it; the checks a package added with
// OnFake run at the fake's cleanup.
func TestUseFakeLeakCheck(t *testing.T) {
	out, ok := child(t, "fakeleak")
	if ok || !strings.Contains(out, "the fake driver still holds 1 stream(s)") {
		t.Errorf("a test leaving a stream in its fake: ok=%v, want a failure naming the stream:\n%s", ok, out)
	}
	if out, ok := child(t, "fakeleak-allowed"); !ok || !strings.Contains(out, "stream left") {
		t.Errorf("a test that allowed its leaks: ok=%v, want a pass:\n%s", ok, out)
	}
	var started, checked int
	OnFake(func(testing.TB, *fakedrv.Driver) func() {
		started++
		return func() { checked++ }
	})
	t.Cleanup(func() { fakeChecks.start = fakeChecks.start[:len(fakeChecks.start)-1] })
	t.Run("fake", func(t *testing.T) {
		UseFake(t, fakedrv.Options{})
		if started != 1 || checked != 0 {
			t.Errorf("during the test: OnFake's start ran %d times, its check %d; want 1 and 0", started, checked)
		}
	})
	if checked != 1 {
		t.Errorf("OnFake's check ran %d times at the fake's cleanup, want 1", checked)
	}
}

// TestCheckPinned: CheckPinned fails a test whose fake's cleanup finds
// the ledger changed since the fake was installed, and only such a test.
func TestCheckPinned(t *testing.T) {
	out, ok := child(t, "pinnedleak")
	if ok || !strings.Contains(out, "pinmem ledger: 1 pinned at the end, 0 at the start") {
		t.Errorf("a test leaving memory pinned: ok=%v, want a failure naming the ledger:\n%s", ok, out)
	}
	if out, ok := child(t, "pinnedkept"); !ok || !strings.Contains(out, "test done") {
		t.Errorf("a test leaving the ledger as it found it: ok=%v, want a pass:\n%s", ok, out)
	}
}

func TestRequireGPUSkipsWithoutDriver(t *testing.T) {
	out, ok := child(t, "requiregpu", EnvRequireGPU+"=")
	if !ok || !strings.Contains(out, "--- SKIP") || strings.Contains(out, "RequireGPU returned") {
		t.Fatalf("want a skip, got ok=%v:\n%s", ok, out)
	}
}

func TestRequireGPUFailsWhenRequired(t *testing.T) {
	out, ok := child(t, "requiregpu", EnvRequireGPU+"=1")
	if ok || !strings.Contains(out, "--- FAIL") || !strings.Contains(out, EnvRequireGPU+"=1") {
		t.Fatalf("want a failure naming %s, got ok=%v:\n%s", EnvRequireGPU, ok, out)
	}
}

func TestRequireGPURejectsFake(t *testing.T) {
	out, ok := child(t, "requiregpu-fake", EnvRequireGPU+"=1")
	if ok || !strings.Contains(out, "fake") {
		t.Fatalf("want a failure for a fake driver, got ok=%v:\n%s", ok, out)
	}
	out, ok = child(t, "requiregpu-fake", EnvRequireGPU+"=")
	if !ok || !strings.Contains(out, "--- SKIP") {
		t.Fatalf("want a skip for a fake driver, got ok=%v:\n%s", ok, out)
	}
}

func TestFeatureSkipsAllowedAndListed(t *testing.T) {
	for _, h := range []string{"notsupported", "skipfeature"} {
		out, ok := child(t, h, EnvRequireGPU+"=1")
		if !ok || !strings.Contains(out, "--- SKIP") || !strings.Contains(out, "FEATURE SKIPS: TestHelper: ") {
			t.Fatalf("%s: want a listed feature skip, got ok=%v:\n%s", h, ok, out)
		}
	}
}

func TestSkipIfNotSupportedFailsOnOtherErrors(t *testing.T) {
	out, ok := child(t, "othererror")
	if ok || !strings.Contains(out, "something else") || strings.Contains(out, "FEATURE SKIPS") {
		t.Fatalf("want a failure, got ok=%v:\n%s", ok, out)
	}
}

func TestMainFailsOnLeakedObject(t *testing.T) {
	out, ok := child(t, "leakobject")
	if ok || !strings.Contains(out, "still live") || !strings.Contains(out, "stream 0x1234") || !strings.Contains(out, "testutil_test.go") {
		t.Fatalf("want a leak report with a creation stack, got ok=%v:\n%s", ok, out)
	}
}

func TestMainFailsOnLeakedGoroutine(t *testing.T) {
	out, ok := child(t, "leakgoroutine")
	if ok || !strings.Contains(out, "leaked goroutines") {
		t.Fatalf("want a goroutine leak failure, got ok=%v:\n%s", ok, out)
	}
}

func TestUseFakeRestores(t *testing.T) {
	var fake *fakedrv.Driver
	t.Run("inner", func(t *testing.T) {
		fake = UseFake(t, fakedrv.Options{DeviceCount: 2})
		d, err := cudadrv.Get()
		if err != nil || d != cudadrv.Driver(fake) {
			t.Fatalf("Get = %v, %v; want the fake", d, err)
		}
	})
	d, _ := cudadrv.Get()
	if d == cudadrv.Driver(fake) {
		t.Fatal("fake still installed after the test")
	}
}

func TestBytes(t *testing.T) {
	a, b := RandomBytes(1003, 7), RandomBytes(1003, 7)
	if FirstMismatch(a, b) != -1 {
		t.Fatal("same seed, different bytes")
	}
	if FirstMismatch(a, RandomBytes(1003, 8)) == -1 {
		t.Fatal("different seeds, same bytes")
	}
	c := append([]byte(nil), a...)
	c[517] ^= 1
	if off := FirstMismatch(a, c); off != 517 {
		t.Fatalf("mismatch at %d", off)
	}
	if off := FirstMismatch(a, a[:10]); off != 10 {
		t.Fatalf("prefix mismatch at %d", off)
	}
	Poison(c)
	for _, x := range c {
		if x != PoisonByte {
			t.Fatal("not poisoned")
		}
	}
	CheckBytes(t, a, b)
}
