package cuda_test

import (
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
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

// TestHotPathAllocs checks that issuing an async copy, recording an event
// or issuing a reused Batch through the public package allocates nothing on
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
	batch := ctx.NewBatch()
	for name, fn := range map[string]func() error{
		"Stream.CopyHtoD": func() error { return s.CopyHtoD(mem, 0, host) },
		"Stream.CopyDtoH": func() error { return s.CopyDtoH(host, mem, 0) },
		"Event.Record":    func() error { return ev.Record(s) },
		"Batch of 8": func() error {
			for range 8 {
				batch.CopyHtoD(s, mem.Ptr(), host)
			}
			_, err := batch.Issue()
			return err
		},
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
