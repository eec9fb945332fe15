package pinmem

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// checkBooks checks that the ledger, the budget and the registry hold, over
// base, exactly what the fake driver still holds.
func checkBooks(t *testing.T, d *fakedrv.Driver, base LedgerStats, buffers int64, claims int) {
	t.Helper()
	c := d.Live()
	driver := int64(c.HostAllocBytes + c.RegisteredBytes)
	s := Stats()
	if got := s.Pinned.Bytes - base.Pinned.Bytes; got != driver {
		t.Errorf("ledger counts %d bytes pinned, the driver holds %d", got, driver)
	}
	if got := s.Pinned.Buffers - base.Pinned.Buffers; got != buffers {
		t.Errorf("ledger counts %d buffers, want %d", got, buffers)
	}
	if got := reserved.Load() - base.Reserved; got != driver {
		t.Errorf("budget charged with %d bytes, the driver holds %d", got, driver)
	}
	if got := regCount(); got != claims {
		t.Errorf("registry: %d ranges claimed, want %d", got, claims)
	}
}

func hasCode(err error, code cudadrv.Result) bool {
	var de *cuda.Error
	return errors.As(err, &de) && de.Code == cuda.Result(code)
}

// TestFreeUnregisterFailsGoSlice: a registered Go slice whose
// cuMemHostUnregister fails once on one of its chunks. Free returns
// the error, the slice stays pinned (the driver still holds part of it),
// the books count what the driver holds, the garbage collector runs
// after the buffer is dropped without aborting the process on the pinned
// pointer, and a second Free releases the rest.
func TestFreeUnregisterFailsGoSlice(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	base := Stats()
	mem := make([]byte, 3<<20+5)
	b, err := Register(mem, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FailOn("cuMemHostUnregister", 2, cudadrv.ErrorIllegalAddress); err != nil {
		t.Fatal(err)
	}
	err = b.Free()
	if !hasCode(err, cudadrv.ErrorIllegalAddress) {
		t.Fatalf("Free with a failing unregister: %v", err)
	}
	if c := d.Live(); c.Registrations != 1 || c.RegisteredBytes != 1<<20 {
		t.Fatalf("driver holds %+v, want one chunk of 1 MiB", c)
	}
	checkBooks(t, d, base, 1, 1)
	if got := b.Pinned(); got != 1<<20 {
		t.Errorf("Pinned after a failed Free: %d, want the 1 MiB the driver holds", got)
	}
	if _, err := Register(mem[1<<20:], 0); !errors.Is(err, cuda.ErrAlreadyRegistered) {
		t.Errorf("Register of a range still held after a failed Free: %v, want ErrAlreadyRegistered", err)
	}
	if _, err := b.DevicePtr(); !errors.Is(err, ErrFreed) {
		t.Errorf("DevicePtr after Free: %v", err)
	}
	for range 3 {
		runtime.GC()
	}
	if err := b.Free(); err != nil {
		t.Fatalf("Free again: %v", err)
	}
	checkBooks(t, d, base, 0, 0)
	if got := b.Pinned(); got != 0 {
		t.Errorf("Pinned after Free: %d", got)
	}
	if err := b.Free(); !errors.Is(err, ErrFreed) {
		t.Errorf("third Free: %v, want ErrFreed", err)
	}
	mem = nil
	for range 3 {
		runtime.GC()
	}
}

// TestFreeFailedThenDropped drops a registered Go slice's Buffer after a
// failed Free: the runtime.Pinner that still pins the slice must stay
// reachable (the garbage collector aborts the process on an unreachable
// pinned Pinner), and the buffer is counted as dropped.
func TestFreeFailedThenDropped(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	base := Stats()
	func() {
		b, err := Register(make([]byte, 64<<10), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.FailOn("cuMemHostUnregister", 1, cudadrv.ErrorDeinitialized); err != nil {
			t.Fatal(err)
		}
		if err := b.Free(); err == nil {
			t.Fatal("Free with a failing unregister succeeded")
		}
	}()
	// Nothing signals that the garbage collector ran a cleanup: poll,
	// bounded, collecting between looks.
	deadline := time.Now().Add(5 * time.Second)
	for Stats().Dropped == base.Dropped && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if Stats().Dropped != base.Dropped+1 {
		t.Fatal("a buffer dropped after a failed Free was not counted as dropped")
	}
	for range 3 {
		runtime.GC()
	}
	checkBooks(t, d, base, 1, 1)
	if err := freeDropped(); err != nil {
		t.Fatal(err)
	}
	checkBooks(t, d, base, 0, 0)
}

// TestFreeFailureKeepsBooks, for the other kinds: a failed
// cuMemFreeHost or cuMemHostUnregister leaves the memory counted (ledger,
// budget, registry) and the mapping mapped, and Free can be retried.
func TestFreeFailureKeepsBooks(t *testing.T) {
	for _, tc := range []struct {
		name, op string
		method   Method
	}{
		{"hostalloc", "cuMemFreeHost", MethodHostAlloc},
		{"mmap-register", "cuMemHostUnregister", MethodMmapRegister},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testutil.UseFake(t, fakedrv.Options{})
			base := Stats()
			maps := liveMappings.Load()
			b, err := Alloc(1<<20, 0, WithMethod(tc.method))
			if err != nil {
				t.Fatal(err)
			}
			if err := d.FailOn(tc.op, 1, cudadrv.ErrorUnknown); err != nil {
				t.Fatal(err)
			}
			if err := b.Free(); !hasCode(err, cudadrv.ErrorUnknown) {
				t.Fatalf("Free: %v", err)
			}
			checkBooks(t, d, base, 1, 1)
			if got := b.Pinned(); got != 1<<20 {
				t.Errorf("Pinned after a failed Free: %d", got)
			}
			if tc.method == MethodMmapRegister && liveMappings.Load() != maps+1 {
				t.Error("a mapping the driver still pins was unmapped")
			}
			if s := Stats(); s.Frees != base.Frees {
				t.Errorf("a failed Free was counted as a free")
			}
			if err := b.Free(); err != nil {
				t.Fatalf("Free again: %v", err)
			}
			checkBooks(t, d, base, 0, 0)
			if s := Stats(); s.Frees != base.Frees+1 {
				t.Errorf("frees %d, want %d", s.Frees, base.Frees+1)
			}
		})
	}
}

// TestRegisterErrorKeepsSliceAlive: when Register fails
// with its range claimed, the slice must not be collected (and its address
// reused by another slice, whose Register would fail with a spurious
// OverlapError) before the claim is withdrawn.
func TestRegisterErrorKeepsSliceAlive(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	SetBudget(64 << 10)
	collected := make(chan struct{}, 1)
	early := false
	registerFailedHook = func() {
		for range 5 {
			runtime.GC()
			select {
			case <-collected:
				early = true
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	defer func() { registerFailedHook = nil }()
	func() {
		mem := make([]byte, 1<<20)
		runtime.AddCleanup(&mem[0], func(ch chan struct{}) { ch <- struct{}{} }, collected)
		if _, err := Register(mem, 0); !errors.Is(err, ErrBudget) {
			t.Fatalf("Register over the budget: %v", err)
		}
	}()
	if early {
		t.Fatal("the slice was collected while its range was still claimed")
	}
}

// TestNilBuffer: methods on a nil or
// zero Buffer return a typed error or a zero value, never panic, and a nil
// Reclaimer is refused quietly.
func TestNilBuffer(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, b := range []*Buffer{nil, {}} {
		if err := b.Free(); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%v.Free: %v", b, err)
		}
		if _, err := b.DevicePtr(); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%v.DevicePtr: %v", b, err)
		}
		if _, err := View[uint32](b); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("View(%v): %v", b, err)
		}
		if b.Bytes() != nil || b.Segments() != nil || b.Len() != 0 || b.Pinned() != 0 || b.Flags() != 0 ||
			b.Kind() != 0 || b.Device() != nil || b.HugePages() || b.Placement().Node != -1 || b.String() == "" {
			t.Errorf("%v: a nil or zero buffer reports something", b)
		}
	}
	remove := AddReclaimer(nil)
	defer remove()
	SetBudget(8192)
	held, err := Alloc(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, held)
	// Within the budget alone, over it with what is held: the reclaimers are asked.
	if _, err := Alloc(8192, 0); !errors.Is(err, ErrBudget) {
		t.Errorf("Alloc over the budget with a nil reclaimer registered: %v", err)
	}
}

// TestPinUndoFails fails a registration part-way and then the cleanup
// unregistration of one chunk: the driver still holds that chunk, so the
// slice must stay pinned (its Pinner reachable), a mapping must stay
// mapped, and the books must count what the driver holds, as a dropped
// buffer, until it is released.
func TestPinUndoFails(t *testing.T) {
	for _, kind := range []Kind{KindGoRegister, KindMmapRegister} {
		t.Run(kind.String(), func(t *testing.T) {
			d := testutil.UseFake(t, fakedrv.Options{})
			setChunk(t, 1<<20)
			base := Stats()
			maps := liveMappings.Load()
			if err := d.FailOn("cuMemHostRegister_v2", 3, cudadrv.ErrorOutOfMemory); err != nil {
				t.Fatal(err)
			}
			if err := d.FailOn("cuMemHostUnregister", 1, cudadrv.ErrorUnknown); err != nil {
				t.Fatal(err)
			}
			func() {
				var err error
				if kind == KindGoRegister {
					_, err = Register(make([]byte, 3<<20), 0)
				} else {
					_, err = Alloc(3<<20, 0, WithMethod(MethodMmapRegister))
				}
				if !errors.Is(err, cuda.ErrOutOfMemory) || !strings.Contains(fmt.Sprint(err), "cuMemHostUnregister") {
					t.Fatalf("pin with a failing undo: %v", err)
				}
			}()
			if c := d.Live(); c.Registrations != 1 || c.RegisteredBytes != 1<<20 {
				t.Fatalf("driver holds %+v, want one chunk", c)
			}
			checkBooks(t, d, base, 1, 0)
			if got := Stats().Dropped; got != base.Dropped+1 {
				t.Errorf("dropped %d, want %d", got, base.Dropped+1)
			}
			if kind == KindMmapRegister && liveMappings.Load() != maps+1 {
				t.Error("a mapping the driver still pins was unmapped")
			}
			for range 3 {
				runtime.GC()
			}
			if err := freeDropped(); err != nil {
				t.Fatal(err)
			}
			checkBooks(t, d, base, 0, 0)
		})
	}
}
