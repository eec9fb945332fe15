package cuda_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

func fakeContext(t *testing.T) (*fakedrv.Driver, *cuda.Context) {
	t.Helper()
	fd := testutil.UseFake(t, fakedrv.Options{})
	return fd, testutil.PrimaryContext(t)
}

// A failing driver call returns the typed error and leaves nothing tracked.
func TestFakeFailuresAreTypedAndReleaseNothing(t *testing.T) {
	fd, ctx := fakeContext(t)
	cases := []struct {
		op   string
		code cudadrv.Result
		want error
		do   func() error
	}{
		{"cuStreamCreate", cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory, func() error { _, err := ctx.NewStream(cuda.StreamNonBlocking); return err }},
		{"cuEventCreate", cudadrv.ErrorInvalidContext, cuda.ErrInvalidHandle, func() error { _, err := ctx.NewEvent(cuda.EventDefault); return err }},
		{"cuMemAlloc_v2", cudadrv.ErrorOutOfMemory, cuda.ErrOutOfMemory, func() error { _, err := ctx.Alloc(1 << 20); return err }},
		{"cuModuleLoadData", cudadrv.ErrorUnsupportedPTXVersion, cuda.ErrKernelImage, func() error { _, err := ctx.LoadModule([]byte("// ptx")); return err }},
		{"cuCtxSetCurrent", cudadrv.ErrorInvalidContext, cuda.ErrInvalidHandle, func() error { _, err := ctx.NewStream(0); return err }},
	}
	for _, c := range cases {
		before := len(track.Live())
		if err := fd.FailOn(c.op, 1, c.code); err != nil {
			t.Fatal(err)
		}
		err := c.do()
		if !errors.Is(err, c.want) {
			t.Errorf("%s failing with %d: got %v, want %v", c.op, c.code, err, c.want)
		}
		var de *cuda.Error
		if !errors.As(err, &de) || de.Op != c.op || de.Code != cuda.Result(c.code) || de.Name == "" {
			t.Errorf("%s: error %v does not carry op, code and name", c.op, err)
		}
		if after := len(track.Live()); after != before {
			t.Errorf("%s: %d objects tracked before, %d after a failed call", c.op, before, after)
		}
		fd.ClearFaults()
	}
}

func TestFakeAsyncFailureAndDestroyOrder(t *testing.T) {
	fd, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	// A persistent failure comes back typed.
	must(t, fd.FailOn("cuMemcpyHtoDAsync_v2", 0, cudadrv.ErrorInvalidValue))
	if err := s.CopyHtoD(b, 0, make([]byte, 16)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("failing async copy = %v", err)
	}
	fd.ClearFaults()
	// A rejection for the wrong current context is retried once, with the
	// stream's context made current, and then succeeds; the context that was
	// current before is put back (two switches).
	before := fd.Calls("cuCtxSetCurrent")
	must(t, fd.FailOn("cuMemcpyHtoDAsync_v2", 1, cudadrv.ErrorInvalidContext))
	if err := s.CopyHtoD(b, 0, make([]byte, 16)); err != nil {
		t.Errorf("async copy after a wrong-context rejection = %v, want success", err)
	}
	if got := fd.Calls("cuCtxSetCurrent") - before; got != 2 {
		t.Errorf("%d cuCtxSetCurrent calls for the retry, want 2", got)
	}
	// The fast path makes no context switch at all.
	before = fd.Calls("cuCtxSetCurrent")
	must(t, s.CopyHtoD(b, 0, make([]byte, 16)))
	must(t, s.Synchronize(context.Background()))
	if got := fd.Calls("cuCtxSetCurrent") - before; got != 0 {
		t.Errorf("%d cuCtxSetCurrent calls on the fast path, want 0", got)
	}
	must(t, b.Free())
	must(t, s.Destroy())
	if n := fd.Live(); n.Streams != 0 || n.DeviceAllocs != 0 {
		t.Errorf("fake driver still holds %+v", n)
	}
}

func TestLoadModuleErrorNamesDriverVersion(t *testing.T) {
	fd, ctx := fakeContext(t)
	must(t, fd.FailOn("cuModuleLoadData", 1, cudadrv.ErrorUnsupportedPTXVersion))
	_, err := ctx.LoadModule([]byte("// ptx"))
	if err == nil || !strings.Contains(err.Error(), "CUDA 13.0") {
		t.Errorf("error %v should name the driver's CUDA version", err)
	}
}

func TestLaunchRejectsBadArguments(t *testing.T) {
	_, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	m, err := ctx.LoadModule([]byte("// ptx"))
	must(t, err)
	defer m.Destroy()
	if _, err := m.Function("missing"); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("missing kernel = %v", err)
	}
}

func TestNoDriverIsTyped(t *testing.T) {
	restore := cudadrv.Swap(nil)
	defer restore()
	t.Setenv(cudadrv.EnvLibrary, "/nonexistent/libcuda.so.1")
	if _, err := cuda.DeviceCount(); !errors.Is(err, cuda.ErrNoDriver) {
		t.Errorf("DeviceCount without a driver = %v, want ErrNoDriver", err)
	}
}
