package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// closeRetries checks the Close of an owner whose release the driver
// failed once (op failing its first call from now on): the first Close
// returns the driver's error and leaves objects in the driver, a second
// Close releases them, and a third says ErrClosed.
func closeRetries(t *testing.T, d *fakedrv.Driver, base fakedrv.Counts, op string, closeFn func(context.Context) error) {
	t.Helper()
	if err := d.FailOn(op, 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if err := closeFn(bg); !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("Close with %s failing: %v", op, err)
	}
	if d.Live() == base {
		t.Fatalf("Close with %s failing released everything", op)
	}
	if err := closeFn(bg); err != nil {
		t.Fatalf("second Close: %v (it must retry the release, not say ErrClosed)", err)
	}
	if c := d.Live(); c != base {
		t.Errorf("after the second Close the driver holds %+v, %+v before", c, base)
	}
	if err := closeFn(bg); !errors.Is(err, ErrClosed) {
		t.Errorf("third Close: %v, want ErrClosed", err)
	}
}

// TestCopierCloseRetriesRelease: a Copier whose event destruction failed
// at Close destroys it at the next Close.
func TestCopierCloseRetriesRelease(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := e.d.Live()
	c, err := New(e.ctx, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	closeRetries(t, e.d, base, "cuEventDestroy_v2", c.Close)
}

// TestPipelineCloseRetriesRelease: a Pipeline whose device memory could
// not be freed at Close frees it at the next Close.
func TestPipelineCloseRetriesRelease(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	base := e.d.Live()
	p, err := c.NewPipeline(WithChunkSize(64<<10), WithStreams(2), WithInFlight(2))
	if err != nil {
		t.Fatal(err)
	}
	closeRetries(t, e.d, base, "cuMemFree_v2", p.Close)
}

// TestMultiCloseRetriesRelease: a Multi whose stream destruction failed
// at Close destroys it at the next Close.
func TestMultiCloseRetriesRelease(t *testing.T) {
	e := useMultiFake(t, 2, 1<<20)
	base := e.d.Live()
	m, err := NewMulti(e.ctxs, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	closeRetries(t, e.d, base, "cuStreamDestroy_v2", m.Close)
}

// TestFailedNewReleasedByNextNew: when New fails and releasing what it
// had created fails too, the next New releases it.
func TestFailedNewReleasedByNextNew(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := e.d.Live()
	if err := e.d.FailOn("cuEventCreate", 2, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if err := e.d.FailOn("cuStreamDestroy_v2", 0, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	if c, err := New(e.ctx, smallRing()...); c != nil || !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("New with the second event failing: %v, %v", c, err)
	}
	if e.d.Live().Streams != base.Streams+1 {
		t.Fatalf("the failed New's stream is not held: %+v", e.d.Live())
	}
	e.d.ClearFaults()
	c, err := New(e.ctx, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.d.Live(); got != base {
		t.Errorf("after the next New and its Close the driver holds %+v, %+v before", got, base)
	}
}

// TestRunMappedKeepsUndestroyedEvent: RunMapped's own event, when its
// destruction fails, is destroyed by Close.
func TestRunMappedKeepsUndestroyedEvent(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := e.d.Live()
	c, err := New(e.ctx, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pinmem.Alloc(4096, pinmem.Mapped)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := e.d.FailOn("cuEventDestroy_v2", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	err = c.RunMapped(context.Background(), nil, b, func(*cuda.Stream, cuda.DevicePtr, int) error { return nil })
	if !errors.Is(err, cudadrv.ErrLaunchFailed) {
		t.Fatalf("RunMapped with cuEventDestroy failing: %v", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.d.Live(); got.Events != base.Events {
		t.Errorf("after Close the driver holds %d events, %d before", got.Events, base.Events)
	}
}

// TestRegCacheKeepsUnreleasedRegistration: a registration the cache
// failed to release when it forgot it is released when the Copier
// closes.
func TestRegCacheKeepsUnreleasedRegistration(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := e.d.Live()
	c, err := New(e.ctx, append(smallRing(), WithRegistrationCache(0), WithRegistrationMin(64<<10))...)
	if err != nil {
		t.Fatal(err)
	}
	dev := e.devbuf(t, 256<<10)
	src := make([]byte, 256<<10)
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	if e.d.Live().Registrations == base.Registrations {
		t.Fatal("the cache registered nothing")
	}
	if err := e.d.FailOn("cuMemHostUnregister", 1, cudadrv.ErrorLaunchFailed); err != nil {
		t.Fatal(err)
	}
	c.Cache().Forget(src)
	if e.d.Live().Registrations == base.Registrations {
		t.Fatal("the registration was released although its release failed")
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.d.Live(); got.Registrations != base.Registrations {
		t.Errorf("after Close the driver holds %+v, %+v before", got, base)
	}
}
