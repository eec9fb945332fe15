package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/transfer"
)

func primary(t *testing.T) *cuda.Context {
	t.Helper()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	return ctx
}

// newCopier returns a Copier on ctx that is closed, and its Close checked,
// when t ends (before Install's leak check, which was registered earlier).
func newCopier(t *testing.T, ctx *cuda.Context) *transfer.Copier {
	t.Helper()
	c, err := transfer.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("closing the Copier: %v", err)
		}
	})
	return c
}

// kernelFunc registers body as the fake kernel name taking nargs
// arguments and returns its Function, looked up in a module unloaded when
// t ends.
func kernelFunc(t *testing.T, d *cudatest.Driver, ctx *cuda.Context, name string, nargs int, body func(*cudatest.Kernel) error) *cuda.Function {
	t.Helper()
	if err := d.RegisterKernel(name, nargs, body); err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule([]byte("// fake PTX\n"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mod.Destroy() })
	fn, err := mod.Function(name)
	if err != nil {
		t.Fatal(err)
	}
	return fn
}

// newStream returns a stream of ctx destroyed when t ends.
func newStream(t *testing.T, ctx *cuda.Context, flags cuda.StreamFlags) *cuda.Stream {
	t.Helper()
	s, err := ctx.NewStream(flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s
}

// deviceBuf returns n bytes of device memory of ctx freed when t ends.
func deviceBuf(t *testing.T, ctx *cuda.Context, n int) *cuda.DeviceBuffer {
	t.Helper()
	buf, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	return buf
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// TestRoundTrip: pinned memory, device memory and a Copier work on the
// fake, bytes included, and the calls are counted.
func TestRoundTrip(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	c := newCopier(t, ctx)
	dst, err := ctx.Alloc(3<<20 + 5)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	in := pattern(dst.Size(), 1)
	out := make([]byte, len(in))
	if _, err := c.HtoD(context.Background(), dst, in); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DtoH(context.Background(), out, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("the round trip through the Copier changed the bytes")
	}

	buf, err := pinmem.Alloc(1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.Bytes(), pattern(1<<20, 2))
	if _, err := dst.WriteAt(buf.Bytes(), 0); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 1<<20)
	if _, err := dst.ReadAt(back, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, buf.Bytes()) {
		t.Fatal("the copy from pinned memory changed the bytes")
	}
	if err := buf.Free(); err != nil {
		t.Fatal(err)
	}
	if n := d.Calls("cuMemAlloc_v2"); n != 1 {
		t.Errorf("Calls(cuMemAlloc_v2) = %d, want 1", n)
	}
	if n := d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2"); n < 1 {
		t.Errorf("%d calls pinned memory, want at least 1", n)
	}
}

// TestDeviceOptions: devices, their names, memory and attributes, and the
// driver version are what the options say.
func TestDeviceOptions(t *testing.T) {
	cudatest.Install(t, cudatest.WithDriverVersion(12040),
		cudatest.WithDevice(cudatest.DeviceSpec{}),
		cudatest.WithDevice(cudatest.DeviceSpec{
			Name:       "Fake Orin",
			Memory:     8 << 30,
			PCIBusID:   "0000:02:00.0",
			Attributes: map[cuda.Attribute]int{cuda.AttrIntegrated: 1, cuda.AttrCanMapHostMemory: 0},
		}),
	)
	if v, err := cuda.DriverVersion(); err != nil || v != 12040 {
		t.Errorf("DriverVersion = %d, %v; want 12040", v, err)
	}
	if n, err := cuda.DeviceCount(); err != nil || n != 2 {
		t.Fatalf("DeviceCount = %d, %v; want 2", n, err)
	}
	dev, err := cuda.GetDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := dev.Properties()
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "Fake Orin" || p.TotalMemory != 8<<30 || !p.Integrated || p.CanMapHostMemory || !strings.Contains(p.PCIBusID, "02:00.0") {
		t.Errorf("device 1: %+v", p)
	}
	if p0, err := cuda.GetDevice(0); err != nil {
		t.Fatal(err)
	} else if props, _ := p0.Properties(); props.Integrated || !props.CanMapHostMemory || props.TotalMemory != 16<<30 {
		t.Errorf("default device: %+v", props)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctx.Alloc(9 << 30); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("allocating more than the device's memory: %v, want ErrOutOfMemory", err)
	}
}

func TestNoDevice(t *testing.T) {
	cudatest.Install(t, cudatest.WithDevices(0))
	if _, err := cuda.GetDevice(0); !errors.Is(err, cuda.ErrNoDevice) {
		t.Errorf("GetDevice with no device: %v, want ErrNoDevice", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []cudatest.Option
		want string
	}{
		{"negative count", []cudatest.Option{cudatest.WithDevices(-1)}, "Devices(-1)"},
		{"count and specs", []cudatest.Option{cudatest.WithDevices(2), cudatest.WithDevice(cudatest.DeviceSpec{})}, "cannot be combined"},
		{"attribute", []cudatest.Option{cudatest.WithDevice(cudatest.DeviceSpec{Attributes: map[cuda.Attribute]int{0: 1}})}, "attribute 0"},
		{"version", []cudatest.Option{cudatest.WithDriverVersion(0)}, "DriverVersion(0)"},
		{"timeout", []cudatest.Option{cudatest.WithWaitTimeout(-time.Second)}, "WaitTimeout(-1s)"},
		{"nil", []cudatest.Option{nil}, "nil Option"},
	} {
		d, err := cudatest.Start(tc.opts...)
		if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), tc.want) || d != nil {
			t.Errorf("%s: Start = %v, %v; want an ErrInvalidValue naming %q", tc.name, d, err, tc.want)
			if d != nil {
				d.Close()
			}
		}
	}
}

// TestInstallRestores: a subtest's fake is used within the subtest only,
// and the parent's comes back after it.
func TestInstallRestores(t *testing.T) {
	cudatest.Install(t, cudatest.WithDevices(3))
	t.Run("nested", func(t *testing.T) {
		cudatest.Install(t, cudatest.WithDevices(2))
		if n, _ := cuda.DeviceCount(); n != 2 {
			t.Errorf("DeviceCount in the subtest = %d, want 2", n)
		}
	})
	if n, _ := cuda.DeviceCount(); n != 3 {
		t.Errorf("DeviceCount after the subtest = %d, want the parent's 3", n)
	}
}

// recorder is a testing.TB whose failures and cleanups the test inspects.
type recorder struct {
	testing.TB
	name     string
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recorder) Name() string { return r.name }
func (r *recorder) Helper()      {}
func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}
func (r *recorder) Error(args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, strings.TrimSpace(sprint(args)))
	r.mu.Unlock()
}
func (r *recorder) Fatal(args ...any) { r.Error(args...); runtime.Goexit() }

func sprint(args []any) string {
	var b strings.Builder
	for _, a := range args {
		if e, ok := a.(error); ok {
			b.WriteString(e.Error())
		} else if s, ok := a.(string); ok {
			b.WriteString(s)
		}
		b.WriteString(" ")
	}
	return b.String()
}

// run calls f with r on its own goroutine (so that Fatal can end it) and
// then r's cleanups, last first.
func (r *recorder) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestConcurrentInstallRefused: while one test's fake is installed,
// another test's Install fails that test and Start fails, both naming the
// owner; the installed fake stays in place.
func TestConcurrentInstallRefused(t *testing.T) {
	cudatest.Install(t, cudatest.WithDevices(2))
	other := &recorder{TB: t, name: "TestOther"}
	other.run(func(tb testing.TB) { cudatest.Install(tb) })
	if len(other.errs) != 1 || !strings.Contains(other.errs[0], "already installed by "+t.Name()) {
		t.Errorf("another test's Install reported %q, want one error naming %s", other.errs, t.Name())
	}
	if d, err := cudatest.Start(); !errors.Is(err, cudatest.ErrInstalled) || d != nil {
		t.Errorf("Start over a test's fake: %v, %v; want ErrInstalled", d, err)
	}
	if n, _ := cuda.DeviceCount(); n != 2 {
		t.Errorf("DeviceCount = %d after the refused installs, want 2", n)
	}
}

// TestStart: a fake from Start (as a TestMain would make) is used until
// Close, tests may install over it, and Close reports leaks.
func TestStart(t *testing.T) {
	d, err := cudatest.Start(cudatest.WithDevices(4))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := cuda.DeviceCount(); n != 4 {
		t.Errorf("DeviceCount = %d, want 4", n)
	}
	t.Run("over", func(t *testing.T) {
		cudatest.Install(t, cudatest.WithDevices(1))
		if n, _ := cuda.DeviceCount(); n != 1 {
			t.Errorf("DeviceCount in a test over Start = %d, want 1", n)
		}
	})
	buf, err := primary(t).Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Close()
	if !errors.Is(err, cudatest.ErrLeak) || !strings.Contains(err.Error(), "1 device allocation(s) (100 bytes)") {
		t.Errorf("Close with a device allocation left: %v", err)
	}
	if again := d.Close(); again != err {
		t.Errorf("second Close = %v, want the first one's %v", again, err)
	}
	if n, err := cuda.DeviceCount(); n == 4 {
		t.Errorf("DeviceCount = %d, %v after Close: the fake is still installed", n, err)
	}
	_ = buf // the fake that held it is closed
}

// TestFailOn: Nth, Once and Always pick the calls, the error is the
// driver's, and invalid rules are refused.
func TestFailOn(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	alloc := func() error {
		b, err := ctx.Alloc(256)
		if err == nil {
			err = b.Free()
		}
		return err
	}
	if err := d.FailOn("cuMemAlloc_v2", cudatest.Nth(2), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	var got []bool
	for range 4 {
		got = append(got, errors.Is(alloc(), cuda.ErrOutOfMemory))
	}
	if want := []bool{false, true, false, false}; !equal(got, want) {
		t.Errorf("Nth(2): allocations failed %v, want %v", got, want)
	}

	if err := d.FailOn("cuMemAlloc_v2", cudatest.Once(), cuda.ResultInvalidValue); err != nil {
		t.Fatal(err)
	}
	err := alloc()
	var ce *cuda.Error
	if !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &ce) || ce.Code != cuda.ResultInvalidValue || ce.Name != "CUDA_ERROR_INVALID_VALUE" {
		t.Errorf("Once with code 1: %v, want a *cuda.Error CUDA_ERROR_INVALID_VALUE", err)
	}
	if err := alloc(); err != nil {
		t.Errorf("after Once: %v", err)
	}

	if err := d.FailOn("cuMemAlloc_v2", cudatest.Always(), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := alloc(); !errors.Is(err, cuda.ErrOutOfMemory) {
			t.Errorf("Always, call %d: %v", i, err)
		}
	}
	d.ClearFaults()
	if err := alloc(); err != nil {
		t.Errorf("after ClearFaults: %v", err)
	}

	for i, err := range []error{
		d.FailOn("cuMemAlloc", cudatest.Once(), cuda.ResultOutOfMemory),
		d.FailOn("cuMemAlloc_v2", cudatest.When{}, cuda.ResultOutOfMemory),
		d.FailOn("cuMemAlloc_v2", cudatest.Nth(0), cuda.ResultOutOfMemory),
		d.FailOn("cuMemAlloc_v2", cudatest.Once(), cuda.ResultSuccess),
	} {
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("invalid rule %d: %v, want ErrInvalidValue", i, err)
		}
	}
	if err := alloc(); err != nil {
		t.Errorf("a refused rule took effect: %v", err)
	}
	if n := d.Calls("cuMemAlloc_v2"); n != 11 {
		t.Errorf("Calls(cuMemAlloc_v2) = %d, want 11 (failed calls count)", n)
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFailAsync: the call succeeds and the next synchronization reports
// the fault; the copy's destination is untouched.
func TestFailAsync(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	buf, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := d.FailAsync("cuMemsetD8Async", cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(buf, 0, 9, 64); err != nil {
		t.Fatalf("the failing memset's call: %v, want success", err)
	}
	if err := s.Synchronize(context.Background()); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Errorf("Synchronize after the failed memset: %v, want ErrLaunchFailed", err)
	}
	got := make([]byte, 64)
	if _, err := buf.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte{9}) {
		t.Error("the failed memset wrote memory")
	}
}

// TestFailAsyncRefusesCallsWithoutWork: FailAsync refuses the calls that
// queue no work, whose rule would be used up by a call and never fire.
func TestFailAsyncRefusesCallsWithoutWork(t *testing.T) {
	d := cudatest.Install(t)
	for _, op := range []string{cudatest.AnyAlloc, "cuMemAlloc_v2", "cuStreamCreate", "cuEventRecord"} {
		if err := d.FailAsync(op, cudatest.Once(), cuda.ResultLaunchFailed); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("FailAsync(%q) = %v, want an error matching ErrInvalidValue", op, err)
		}
	}
	for _, op := range []string{cudatest.AnyHtoD, cudatest.AnyDtoH, cudatest.AnyLaunch, "cuMemcpyHtoD_v2", "cuMemsetD8Async", "cuLaunchKernel"} {
		if err := d.FailAsync(op, cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
			t.Errorf("FailAsync(%q) = %v", op, err)
		}
	}
	d.ClearFaults()
}

// TestLeaks: Leaks and the cleanup of Install report what is left, with
// the code that made it; nothing is reported once it is released.
func TestLeaks(t *testing.T) {
	d := cudatest.Install(t, cudatest.WithoutLeakCheck())
	ctx := primary(t)
	if err := d.Leaks(); err != nil {
		t.Fatalf("Leaks before anything was made: %v", err)
	}
	s, err := ctx.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pinmem.Alloc(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Leaks()
	for _, want := range []string{"1 stream(s)", "1 buffer(s)", "TestLeaks"} {
		if !errors.Is(err, cudatest.ErrLeak) || !strings.Contains(err.Error(), want) {
			t.Errorf("Leaks = %v; want ErrLeak mentioning %q", err, want)
		}
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := d.Leaks(); err != nil {
		t.Errorf("Leaks after releasing everything: %v", err)
	}

	// Install's cleanup fails the test that leaked.
	t.Run("cleanup", func(t *testing.T) {
		rec := &recorder{TB: t, name: t.Name()}
		rec.run(func(tb testing.TB) {
			cudatest.Install(tb)
			if _, err := primary(t).Alloc(64); err != nil {
				t.Error(err)
			}
		})
		if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "1 device allocation(s) (64 bytes)") {
			t.Errorf("the cleanup reported %q, want the leaked device allocation", rec.errs)
		}
	})
	// A test that closes the fake itself gets the leaks from Close, and the
	// cleanup does not report them again.
	t.Run("closed", func(t *testing.T) {
		rec := &recorder{TB: t, name: t.Name()}
		var closeErr error
		rec.run(func(tb testing.TB) {
			d := cudatest.Install(tb)
			if _, err := primary(t).Alloc(64); err != nil {
				t.Error(err)
			}
			closeErr = d.Close()
		})
		if !errors.Is(closeErr, cudatest.ErrLeak) || len(rec.errs) != 0 {
			t.Errorf("Close = %v and the cleanup reported %q; want the leak from Close only", closeErr, rec.errs)
		}
	})
}

// TestContextPerThread: a context is current on the OS thread that
// entered it, whatever other threads enter meanwhile, as in CUDA.
func TestContextPerThread(t *testing.T) {
	cudatest.Install(t)
	ctx := primary(t)
	other, err := cuda.NewContext(ctx.Device(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy()
	aIn, bIn, checked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var got uintptr
	done := make(chan error, 2)
	go func() {
		done <- ctx.Do(func() error {
			close(aIn)
			<-bIn
			var err error
			got, err = currentContext()
			close(checked)
			return err
		})
	}()
	go func() {
		<-aIn
		done <- other.Do(func() error {
			close(bIn)
			<-checked
			return nil
		})
	}()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got != ctx.Handle() {
		t.Errorf("current context %#x while another thread has %#x entered, want %#x (the one this thread entered)", got, other.Handle(), ctx.Handle())
	}
}

// currentContext asks the installed driver which context is current on the
// calling OS thread; pinmem's API has no such question, since every call
// makes its own context current.
func currentContext() (uintptr, error) {
	d, err := cudadrv.Get()
	if err != nil {
		return 0, err
	}
	c, err := d.CtxGetCurrent()
	return uintptr(c), err
}

// leaked keeps what TestLeaksNested leaks on purpose reachable, so that no
// finalizer releases it through another test's fake.
var leaked []any

// TestLeaksNested: a nested fake reports its own leaks, and the fake it
// was nested in does not count them as its own.
func TestLeaksNested(t *testing.T) {
	outer := cudatest.Install(t)
	s, err := primary(t).NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("inner", func(t *testing.T) {
		rec := &recorder{TB: t, name: t.Name()}
		rec.run(func(tb testing.TB) {
			cudatest.Install(tb)
			ctx := primary(t)
			b, err := ctx.Alloc(64)
			if err != nil {
				t.Error(err)
			}
			s, err := ctx.NewStream(0)
			if err != nil {
				t.Error(err)
			}
			p, err := pinmem.Alloc(4096, 0)
			if err != nil {
				t.Error(err)
			}
			leaked = append(leaked, b, s, p)
		})
		if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "1 device allocation(s) (64 bytes)") || !strings.Contains(rec.errs[0], "1 stream(s)") {
			t.Errorf("the nested fake's cleanup reported %q, want its leaks", rec.errs)
		}
	})
	err = outer.Leaks()
	if !errors.Is(err, cudatest.ErrLeak) || !strings.Contains(err.Error(), "1 stream(s)") || strings.Contains(err.Error(), "allocation") || strings.Contains(err.Error(), "ledger") {
		t.Errorf("the outer fake's Leaks = %v; want its own stream only", err)
	}
	if err := s.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := outer.Leaks(); err != nil {
		t.Errorf("the outer fake's Leaks lists what a nested fake left: %v", err)
	}
}
