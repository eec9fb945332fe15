package cuda_test

import (
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// hotNopDriver is the fake driver with the hot calls made free, so that
// what is measured is the cuda package's own work.
type hotNopDriver struct{ cudadrv.Driver }

func (hotNopDriver) MemcpyHtoDAsync(cudadrv.DevicePtr, unsafe.Pointer, uint64, cudadrv.Stream) error {
	return nil
}

func (hotNopDriver) MemcpyDtoHAsync(unsafe.Pointer, cudadrv.DevicePtr, uint64, cudadrv.Stream) error {
	return nil
}

func (hotNopDriver) EventRecord(cudadrv.Event, cudadrv.Stream) error { return nil }

// TestHotPathAllocs checks that issuing an async copy or recording an event
// through the public package allocates nothing on
// the Go heap (the binding
// below allocates nothing either: internal/cudadrv's TestStubLibraryNoAllocs).
func TestHotPathAllocs(t *testing.T) {
	fd := testutil.UseFake(t, fakedrv.Options{})
	defer cudadrv.Swap(hotNopDriver{fd})()
	ctx := testutil.PrimaryContext(t)
	s, ev := streamAndEvent(t, ctx)
	mem, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	host := make([]byte, 4096)
	for name, fn := range map[string]func() error{
		"Stream.CopyHtoD": func() error { return s.CopyHtoD(mem, 0, host) },
		"Stream.CopyDtoH": func() error { return s.CopyDtoH(host, mem, 0) },
		"Event.Record":    func() error { return ev.Record(s) },
	} {
		if n := testing.AllocsPerRun(200, func() {
			if err := fn(); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s allocates %.1f times per call, want 0", name, n)
		}
	}
}

// streamAndEvent returns a non-blocking stream and an event without timing
// in ctx, destroyed when t ends.
func streamAndEvent(t *testing.T, ctx *cuda.Context) (*cuda.Stream, *cuda.Event) {
	t.Helper()
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Destroy(); err != nil {
			t.Error(err)
		}
	})
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ev.Destroy(); err != nil {
			t.Error(err)
		}
	})
	return s, ev
}
