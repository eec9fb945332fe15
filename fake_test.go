package pinmem

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

// checkNothingPinned fails t unless nothing is left pinned since base: not
// in the fake, not in the ledger, not in the budget, not in pinmem's
// registry or mappings.
func checkNothingPinned(t testing.TB, d *fakedrv.Driver, base LedgerStats) {
	t.Helper()
	s := Stats()
	if s.Pinned != base.Pinned {
		t.Errorf("ledger: pinned %+v at the end, %+v at the start", s.Pinned, base.Pinned)
	}
	for k, u := range s.ByKind {
		if u != base.ByKind[k] {
			t.Errorf("ledger: %s %+v at the end, %+v at the start", k, u, base.ByKind[k])
		}
	}
	if r := reserved.Load(); r != base.Reserved {
		t.Errorf("budget: %d bytes reserved at the end, %d at the start", r, base.Reserved)
	}
	if d != nil {
		c := d.Live()
		if c.HostAllocs != 0 || c.Registrations != 0 {
			t.Errorf("fake driver: %d host allocations (%d bytes), %d registrations (%d bytes) still live",
				c.HostAllocs, c.HostAllocBytes, c.Registrations, c.RegisteredBytes)
		}
	}
	if n := regCount(); n != 0 {
		t.Errorf("registry: %d ranges still claimed", n)
	}
	if n := liveMappings.Load(); n != 0 {
		t.Errorf("%d mappings still mapped", n)
	}
	if n, b := track.Count(track.HostAlloc); n != 0 {
		t.Errorf("track: %d host allocations (%d bytes) live", n, b)
	}
	if n, b := track.Count(track.Registration); n != 0 {
		t.Errorf("track: %d registrations (%d bytes) live", n, b)
	}
}

func setChunk(t *testing.T, n uintptr) {
	old := regChunk
	regChunk = n
	t.Cleanup(func() { regChunk = old })
}

// setSplit sets the size above which a refused chunk is retried in pieces,
// and the size of the pieces.
func setSplit(t *testing.T, above, piece uintptr) {
	oldAbove, oldPiece := regSplitAbove, regSplitChunk
	regSplitAbove, regSplitChunk = above, piece
	t.Cleanup(func() { regSplitAbove, regSplitChunk = oldAbove, oldPiece })
}

// checkSegments checks that b's segments are its registrations, in order,
// that they concatenate to Bytes, and that each one's capacity ends at its end.
func checkSegments(t *testing.T, b *Buffer, want []int) {
	t.Helper()
	segs := b.Segments()
	got := make([]int, len(segs))
	mem := b.Bytes()
	off := 0
	for i, sg := range segs {
		got[i] = len(sg)
		if len(sg) == 0 || cap(sg) != len(sg) || off+len(sg) > len(mem) || &sg[0] != &mem[off] {
			t.Errorf("segment %d: %d bytes, cap %d, not at offset %d of Bytes", i, len(sg), cap(sg), off)
		}
		off += len(sg)
	}
	if off != len(mem) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("segments %v (%d bytes), want %v (%d bytes)", got, off, want, len(mem))
	}
}

func mustFree(t *testing.T, b *Buffer) {
	t.Helper()
	if err := b.Free(); err != nil {
		t.Fatalf("Free(%v): %v", b, err)
	}
}

func pinCalls(d *fakedrv.Driver) int {
	return d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2")
}

func TestAllocHostAllocFlags(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	for _, f := range []Flags{0, Portable, Mapped, WriteCombined, Portable | Mapped, Portable | Mapped | WriteCombined, Mapped | WriteCombined} {
		t.Run(f.String(), func(t *testing.T) {
			b, err := Alloc(64<<10, f, WithMethod(MethodHostAlloc))
			if err != nil {
				t.Fatal(err)
			}
			defer mustFree(t, b)
			if b.Kind() != KindHostAlloc || b.Flags() != f || b.Len() != 64<<10 || b.Pinned() != 64<<10 {
				t.Errorf("got %v, pinned %d", b, b.Pinned())
			}
			if d.Live().HostAllocs != 1 {
				t.Errorf("fake has %d host allocations", d.Live().HostAllocs)
			}
			checkSegments(t, b, []int{64 << 10})
			mem := b.Bytes()
			copy(mem, "hello")
			if string(b.Bytes()[:5]) != "hello" {
				t.Error("bytes not kept")
			}
			flags, err := d.MemHostGetFlags(unsafe.Pointer(&mem[0]))
			if err != nil || flags != f.hostAllocFlags() {
				t.Errorf("cuMemHostGetFlags = %#x, %v; want %#x", flags, err, f.hostAllocFlags())
			}
			dp, err := b.DevicePtr()
			if f&Mapped != 0 {
				if err != nil || uintptr(dp) != uintptr(unsafe.Pointer(&mem[0])) {
					t.Errorf("DevicePtr = %#x, %v", dp, err)
				}
			} else if !errors.Is(err, ErrNotMapped) {
				t.Errorf("DevicePtr of unmapped buffer: %v, want ErrNotMapped", err)
			}
		})
	}
}

func TestAllocMmapChunks(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	size := 5<<20 + 123
	for _, f := range []Flags{0, Portable, Mapped, Portable | Mapped, ReadOnly, Mapped | ReadOnly} {
		t.Run(f.String(), func(t *testing.T) {
			b, err := Alloc(size, f, WithMethod(MethodMmapRegister), WithThreads(3))
			if err != nil {
				t.Fatal(err)
			}
			want := int64(roundUp(uintptr(size), pageSize))
			if b.Kind() != KindMmapRegister || b.Len() != size || b.Pinned() != want {
				t.Errorf("got %v pinned %d", b, b.Pinned())
			}
			if c := d.Live(); c.Registrations != 6 || c.RegisteredBytes != uint64(want) {
				t.Errorf("fake: %d registrations of %d bytes, want 6 chunks of %d bytes", c.Registrations, c.RegisteredBytes, want)
			}
			checkSegments(t, b, []int{1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 123})
			mem := b.Bytes()
			for i, v := range mem {
				if v != 0 {
					t.Fatalf("byte %d = %d, want 0", i, v)
				}
			}
			mem[len(mem)-1] = 7
			if f&Mapped != 0 {
				dp, err := b.DevicePtr()
				if err != nil || uintptr(dp) != uintptr(unsafe.Pointer(&mem[0])) {
					t.Errorf("DevicePtr = %#x, %v", dp, err)
				}
			}
			mustFree(t, b)
			if c := d.Live(); c.Registrations != 0 {
				t.Errorf("after Free, fake has %d registrations", c.Registrations)
			}
			if segs := b.Segments(); segs != nil {
				t.Errorf("Segments after Free: %d segments", len(segs))
			}
		})
	}
}

func TestAutoMethod(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	for _, tc := range []struct {
		size  int
		flags Flags
		want  Kind
	}{
		{4096, 0, KindHostAlloc},
		{AutoMmapThreshold - 1, Mapped, KindHostAlloc},
		{AutoMmapThreshold, 0, KindMmapRegister},
		{AutoMmapThreshold, Portable | Mapped, KindMmapRegister},
		{64 << 20, WriteCombined, KindHostAlloc},
		{4096, ReadOnly, KindMmapRegister},
	} {
		b, err := Alloc(tc.size, tc.flags)
		if err != nil {
			t.Fatalf("Alloc(%d, %s): %v", tc.size, tc.flags, err)
		}
		if b.Kind() != tc.want {
			t.Errorf("Alloc(%d, %s) kind %s, want %s", tc.size, tc.flags, b.Kind(), tc.want)
		}
		mustFree(t, b)
	}
}

// A cuMemHostRegister failing in the middle of a chunked registration must
// leave nothing pinned or mapped.
func TestRegisterFailsMidChunk(t *testing.T) {
	for _, code := range []cudadrv.Result{cudadrv.ErrorOutOfMemory, cudadrv.ErrorInvalidValue, cudadrv.ErrorNotPermitted} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			d := testutil.UseFake(t, fakedrv.Options{})
			setChunk(t, 1<<20)
			if err := d.FailOn("cuMemHostRegister_v2", 3, code); err != nil {
				t.Fatal(err)
			}
			before := Stats()
			b, err := Alloc(8<<20, Portable, WithMethod(MethodMmapRegister))
			if err == nil {
				mustFree(t, b)
				t.Fatal("Alloc succeeded despite the injected fault")
			}
			t.Logf("error: %v", err)
			if got := d.Calls("cuMemHostRegister_v2"); got != 3 {
				t.Errorf("%d register calls, want 3", got)
			}
			if got := d.Calls("cuMemHostUnregister"); got != 2 {
				t.Errorf("%d unregister calls, want 2", got)
			}
			var oom *OutOfMemoryError
			if code == cudadrv.ErrorOutOfMemory {
				if !errors.As(err, &oom) || !errors.Is(err, cuda.ErrOutOfMemory) || oom.Requested != 8<<20 || oom.Limit != Budget() {
					t.Errorf("want *OutOfMemoryError with figures, got %#v", err)
				}
			} else if errors.As(err, &oom) {
				t.Errorf("non-OOM failure reported as OOM: %v", err)
			}
			if s := Stats(); s.Failures != before.Failures+1 || s.Allocs != before.Allocs {
				t.Errorf("failures %d->%d allocs %d->%d", before.Failures, s.Failures, before.Allocs, s.Allocs)
			}
		})
	}
}

func TestMappedChunksMustBeContiguous(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	// Make the second chunk's device pointer query fail: pinmem must fall
	// back to one registration for the whole mapped range.
	n := 0
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemHostGetDevicePointer_v2" {
			n++
			if n == 2 {
				return cudadrv.ErrorInvalidValue
			}
		}
		return cudadrv.Success
	})
	b, err := Alloc(4<<20, Mapped, WithMethod(MethodMmapRegister))
	d.SetHook(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := d.Live(); c.Registrations != 1 || c.RegisteredBytes != 4<<20 {
		t.Errorf("fake: %d registrations of %d bytes, want one of 4 MiB", c.Registrations, c.RegisteredBytes)
	}
	checkSegments(t, b, []int{4 << 20})
	if _, err := b.DevicePtr(); err != nil {
		t.Error(err)
	}
	mustFree(t, b)
}

// The default chunk is 4 GiB: a buffer up to 4 GiB is one registration and
// one segment, made by one register call.
func TestDefaultChunk(t *testing.T) {
	if regChunk != 4<<30 || regSplitAbove != 2<<30 || regSplitChunk != 1<<30 {
		t.Fatalf("regChunk %d, regSplitAbove %d, regSplitChunk %d; want 4 GiB, 2 GiB, 1 GiB", regChunk, regSplitAbove, regSplitChunk)
	}
	d := testutil.UseFake(t, fakedrv.Options{})
	b, err := Alloc(64<<20+1, Mapped, WithMethod(MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Calls("cuMemHostRegister_v2"); got != 1 {
		t.Errorf("%d register calls, want 1", got)
	}
	checkSegments(t, b, []int{64<<20 + 1})
	mustFree(t, b)
	mem := make([]byte, 3<<20+5)
	r, err := Register(mem, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkSegments(t, r, []int{len(mem)})
	mustFree(t, r)
}

// A chunk above regSplitAbove that the driver refuses with
// CUDA_ERROR_INVALID_VALUE or CUDA_ERROR_OUT_OF_MEMORY (a kernel capping a
// single pin) is retried as regSplitChunk pieces, and so is the rest of the
// buffer; other errors, and chunks not above the threshold, fail at once.
// Scaled down: chunks of 4 MiB, split above 2 MiB into 1 MiB pieces.
func TestRegisterSplitsOnCap(t *testing.T) {
	mib := 1 << 20
	for _, tc := range []struct {
		name      string
		chunk     uintptr
		size      int
		faults    map[int]cudadrv.Result // nth register call -> code
		wantErr   error                  // nil: success
		calls     int                    // register calls
		unregs    int                    // unregister calls before Free
		wantSegs  []int
		wantSplit bool
	}{
		{name: "invalid value", chunk: 4 << 20, size: 10 << 20, faults: map[int]cudadrv.Result{1: cudadrv.ErrorInvalidValue},
			calls: 11, wantSegs: []int{mib, mib, mib, mib, mib, mib, mib, mib, mib, mib}},
		{name: "out of memory", chunk: 4 << 20, size: 9<<20 + 7, faults: map[int]cudadrv.Result{1: cudadrv.ErrorOutOfMemory},
			calls: 11, wantSegs: []int{mib, mib, mib, mib, mib, mib, mib, mib, mib, 7}},
		{name: "second chunk refused", chunk: 4 << 20, size: 10 << 20, faults: map[int]cudadrv.Result{2: cudadrv.ErrorInvalidValue},
			calls: 8, wantSegs: []int{4 * mib, mib, mib, mib, mib, mib, mib}},
		{name: "not permitted", chunk: 4 << 20, size: 10 << 20, faults: map[int]cudadrv.Result{1: cudadrv.ErrorNotPermitted},
			wantErr: cuda.ErrNotSupported, calls: 1},
		{name: "piece refused", chunk: 4 << 20, size: 10 << 20, faults: map[int]cudadrv.Result{1: cudadrv.ErrorInvalidValue, 4: cudadrv.ErrorOutOfMemory},
			wantErr: cuda.ErrOutOfMemory, calls: 4, unregs: 2},
		{name: "small chunk", chunk: 2 << 20, size: 10 << 20, faults: map[int]cudadrv.Result{2: cudadrv.ErrorInvalidValue},
			wantErr: cuda.ErrInvalidValue, calls: 2, unregs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testutil.UseFake(t, fakedrv.Options{})
			setChunk(t, tc.chunk)
			setSplit(t, 2<<20, 1<<20)
			for nth, code := range tc.faults {
				if err := d.FailOn("cuMemHostRegister_v2", nth, code); err != nil {
					t.Fatal(err)
				}
			}
			b, err := Alloc(tc.size, Portable, WithMethod(MethodMmapRegister))
			if got := d.Calls("cuMemHostRegister_v2"); got != tc.calls {
				t.Errorf("%d register calls, want %d", got, tc.calls)
			}
			if got := d.Calls("cuMemHostUnregister"); got != tc.unregs {
				t.Errorf("%d unregister calls, want %d", got, tc.unregs)
			}
			if tc.wantErr != nil {
				if err == nil {
					mustFree(t, b)
					t.Fatal("Alloc succeeded despite the injected faults")
				}
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("error %v, want one matching %v", err, tc.wantErr)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkSegments(t, b, tc.wantSegs)
			if c := d.Live(); c.Registrations != len(tc.wantSegs) || c.RegisteredBytes != uint64(b.Pinned()) {
				t.Errorf("fake: %d registrations of %d bytes, want %d of %d", c.Registrations, c.RegisteredBytes, len(tc.wantSegs), b.Pinned())
			}
			mustFree(t, b)
		})
	}
}

func TestBadInput(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	SetBudget(16 << 20)
	good, err := Alloc(1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 1<<20)
	reg, err := Register(mem, 0)
	if err != nil {
		t.Fatal(err)
	}
	freed, err := Alloc(4096, Mapped)
	if err != nil {
		t.Fatal(err)
	}
	mustFree(t, freed)
	calls := pinCalls(d)
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"size 0", func() error { _, err := Alloc(0, 0); return err }, cuda.ErrInvalidValue},
		{"negative size", func() error { _, err := Alloc(-1, 0); return err }, cuda.ErrInvalidValue},
		{"absurd size", func() error { _, err := Alloc(1<<49, 0); return err }, cuda.ErrInvalidValue},
		{"over budget", func() error { _, err := Alloc(32<<20, 0); return err }, ErrBudget},
		{"unknown flags", func() error { _, err := Alloc(4096, 1<<9); return err }, cuda.ErrInvalidValue},
		{"write-combined read-only", func() error { _, err := Alloc(4096, WriteCombined|ReadOnly); return err }, cuda.ErrInvalidValue},
		{"read-only hostalloc", func() error { _, err := Alloc(4096, ReadOnly, WithMethod(MethodHostAlloc)); return err }, cuda.ErrInvalidValue},
		{"write-combined mmap", func() error {
			_, err := Alloc(4096, WriteCombined, WithMethod(MethodMmapRegister))
			return err
		}, cuda.ErrInvalidValue},
		{"unknown method", func() error { _, err := Alloc(4096, 0, WithMethod(9)); return err }, cuda.ErrInvalidValue},
		{"register empty", func() error { _, err := Register(nil, 0); return err }, cuda.ErrInvalidValue},
		{"register write-combined", func() error { _, err := Register(make([]byte, 4096), WriteCombined); return err }, cuda.ErrInvalidValue},
		{"register twice", func() error { _, err := Register(mem, 0); return err }, cuda.ErrAlreadyRegistered},
		{"register overlapping", func() error { _, err := Register(mem[4096:8192], 0); return err }, cuda.ErrAlreadyRegistered},
		{"register pinned memory", func() error { _, err := Register(good.Bytes()[100:200], 0); return err }, cuda.ErrAlreadyRegistered},
		{"device pointer of unmapped", func() error { _, err := good.DevicePtr(); return err }, ErrNotMapped},
		{"double free", freed.Free, ErrFreed},
		{"device pointer after free", func() error { _, err := freed.DevicePtr(); return err }, ErrFreed},
		{"view after free", func() error { _, err := View[uint32](freed); return err }, ErrFreed},
		{"query after free", func() error { _, err := queryPointer(freed, nil); return err }, ErrFreed},
		{"free nil", (*Buffer)(nil).Free, cuda.ErrInvalidValue},
	} {
		err := tc.call()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// Every refused option is an *OptionError of the function given it,
	// naming the option and its value.
	dev0, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	alloc := func(opts ...Option) func() error {
		return func() error { _, err := Alloc(8<<20, 0, opts...); return err }
	}
	register := func(opts ...Option) func() error {
		return func() error { _, err := Register(make([]byte, 4096), 0, opts...); return err }
	}
	for _, tc := range []struct {
		fn, option, value string
		call              func() error
	}{
		{"pinmem.Alloc", "WithThreads", "-1", alloc(WithThreads(-1))},
		{"pinmem.Alloc", "WithThreads", "0", alloc(WithThreads(0))},
		{"pinmem.Alloc", "WithThreads", "65537", alloc(WithThreads(1<<16 + 1))},
		{"pinmem.Register", "WithThreads", "-1", register(WithThreads(-1))},
		{"pinmem.Alloc", "WithNUMANode", "-7", alloc(WithNUMANode(-7))},
		{"pinmem.Register", "WithNUMANode", "-3", register(WithNUMANode(-3))},
		{"pinmem.Alloc", "WithDevice", "nil", alloc(WithDevice(nil))},
		{"pinmem.Register", "WithDevice", "nil", register(WithDevice(nil))},
		{"pinmem.Alloc", "WithMethod", "9", alloc(WithMethod(9))},
		{"pinmem.Register", "WithMethod", "9", register(WithMethod(9))},
		{"pinmem.Alloc", "Option", "nil", alloc(WithThreads(1), nil)},
		{"pinmem.Register", "Option", "nil", register(nil)},
		{"pinmem.Alloc", "WithThreads", "0", alloc(WithDevice(nil), WithThreads(0), WithDevice(dev0))}, // an option's last value counts
	} {
		err := tc.call()
		var oe *OptionError
		if !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &oe) || oe.Func != tc.fn || oe.Option != tc.option || oe.Value != tc.value || oe.Reason == "" {
			t.Errorf("%s: %s(%s): got %v (%#v), want an *OptionError naming the option", tc.fn, tc.option, tc.value, err, oe)
			continue
		}
		if want := tc.fn + ": " + tc.option + "(" + tc.value + "): "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("message %q does not start with %q", err, want)
		}
	}
	if got := pinCalls(d); got != calls {
		t.Errorf("bad input reached the driver: %d pin calls, want %d", got, calls)
	}
	if freed.Bytes() != nil || freed.Len() != 0 {
		t.Error("freed buffer still has bytes")
	}
	for _, ok := range []Option{WithThreads(1), WithNUMANode(NUMANone), WithNUMANode(NUMAAuto), WithNUMANode(3)} {
		b, err := Alloc(4096, 0, ok)
		if err != nil {
			t.Errorf("a valid option: %v", err)
			continue
		}
		mustFree(t, b)
	}
	mustFree(t, reg)
	mustFree(t, good)
}

func TestDeviceContradictions(t *testing.T) {
	spec := func(attrs map[cudadrv.DeviceAttribute]int) fakedrv.Options {
		return fakedrv.Options{Devices: []fakedrv.DeviceSpec{{Attrs: attrs}}}
	}
	t.Run("no mapping", func(t *testing.T) {
		testutil.UseFake(t, spec(map[cudadrv.DeviceAttribute]int{cudadrv.AttrCanMapHostMemory: 0}))
		if _, err := Alloc(4096, Mapped); !errors.Is(err, cuda.ErrNotSupported) {
			t.Errorf("Mapped: %v", err)
		}
		if _, err := Register(make([]byte, 8192), Mapped); !errors.Is(err, cuda.ErrNotSupported) {
			t.Errorf("Register Mapped: %v", err)
		}
	})
	t.Run("no registration", func(t *testing.T) {
		testutil.UseFake(t, spec(map[cudadrv.DeviceAttribute]int{cudadrv.AttrHostRegisterSupported: 0}))
		_, err := Register(make([]byte, 8192), 0)
		if !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "HostRegisterSupported=0") {
			t.Errorf("Register: %v", err)
		}
		if _, err := Alloc(8<<20, 0, WithMethod(MethodMmapRegister)); !errors.Is(err, cuda.ErrNotSupported) {
			t.Errorf("MethodMmapRegister: %v", err)
		}
		b, err := Alloc(8<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		if b.Kind() != KindHostAlloc {
			t.Errorf("auto without registration: %s", b.Kind())
		}
		mustFree(t, b)
	})
	t.Run("no read-only", func(t *testing.T) {
		testutil.UseFake(t, spec(map[cudadrv.DeviceAttribute]int{cudadrv.AttrReadOnlyHostRegisterSupported: 0}))
		if _, err := Alloc(8<<20, ReadOnly); !errors.Is(err, cuda.ErrNotSupported) {
			t.Errorf("ReadOnly: %v", err)
		}
	})
	t.Run("integrated", func(t *testing.T) {
		testutil.UseFake(t, spec(map[cudadrv.DeviceAttribute]int{cudadrv.AttrIntegrated: 1}))
		b, err := Alloc(64<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		if b.Kind() != KindHostAlloc || b.Flags() != Mapped {
			t.Errorf("integrated auto: %v", b)
		}
		if _, err := b.DevicePtr(); err != nil {
			t.Error(err)
		}
		mustFree(t, b)
	})
}

func TestRegisterGoSlice(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	mem := testutil.RandomBytes(3<<20+5, 1)
	want := append([]byte(nil), mem...)
	b, err := Register(mem, Portable|Mapped)
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind() != KindGoRegister || &b.Bytes()[0] != &mem[0] || b.Len() != len(mem) {
		t.Errorf("got %v", b)
	}
	if c := d.Live(); c.Registrations != 4 {
		t.Errorf("%d registrations, want 4 chunks", c.Registrations)
	}
	checkSegments(t, b, []int{1 << 20, 1 << 20, 1 << 20, 5})
	if dp, err := b.DevicePtr(); err != nil || uintptr(dp) != uintptr(unsafe.Pointer(&mem[0])) {
		t.Errorf("DevicePtr %#x %v", dp, err)
	}
	runtime.GC() // the slice is pinned: it must neither move nor be freed
	mustFree(t, b)
	testutil.CheckBytes(t, want, mem)
	// Registering again after Free works.
	b, err = Register(mem[1:], 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := View[uint64](b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("View of a misaligned slice: %v", err)
	}
	mustFree(t, b)
}

// Memory registered by other code is the driver's 712, still cuda.ErrAlreadyRegistered.
func TestRegisterDriverAlreadyRegistered(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	mem := make([]byte, 64<<10)
	var pin runtime.Pinner
	pin.Pin(&mem[0])
	defer pin.Unpin()
	// The other code registers from a thread with a context current, as it must.
	if err := testutil.PrimaryContext(t).Do(func() error {
		return d.MemHostRegister(unsafe.Pointer(&mem[0]), uint64(len(mem)), 0)
	}); err != nil {
		t.Fatal(err)
	}
	defer d.MemHostUnregister(unsafe.Pointer(&mem[0]))
	_, err := Register(mem, 0)
	var de *cuda.Error
	if !errors.Is(err, cuda.ErrAlreadyRegistered) || !errors.As(err, &de) || de.Code != cuda.ResultHostMemoryAlreadyRegistered {
		t.Errorf("got %v, want the driver's 712", err)
	}
}

func TestBudgetError(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	SetBudget(3 << 20)
	a, err := Alloc(2<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, a)
	before := Stats()
	calls := pinCalls(d)
	_, err = Alloc(2<<20, 0)
	var be *BudgetError
	if !errors.As(err, &be) || !errors.Is(err, ErrBudget) {
		t.Fatalf("got %v, want *BudgetError", err)
	}
	if be.Requested != 2<<20 || be.Pinned != 2<<20 || be.Limit != 3<<20 {
		t.Errorf("figures %+v", be)
	}
	for _, s := range []string{"2097152 bytes", "3145728 bytes", "pinned", "limit"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err, s)
		}
	}
	if pinCalls(d) != calls {
		t.Error("the driver was called for a request over the budget")
	}
	s := Stats()
	if s.BudgetRejections != before.BudgetRejections+1 || s.Failures != before.Failures+1 {
		t.Errorf("rejections %d->%d failures %d->%d", before.BudgetRejections, s.BudgetRejections, before.Failures, s.Failures)
	}
}

type fakeReclaimer struct {
	mu    sync.Mutex
	bufs  []*Buffer
	asked []int64
}

func (r *fakeReclaimer) Reclaim(want int64) (freed int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, want)
	for len(r.bufs) > 0 && freed < want {
		b := r.bufs[0]
		r.bufs = r.bufs[1:]
		freed += b.Pinned()
		if err := b.Free(); err != nil {
			panic(err)
		}
	}
	return freed
}

func TestReclaim(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	SetBudget(4 << 20)
	r := &fakeReclaimer{}
	for range 3 {
		b, err := Alloc(1<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.bufs = append(r.bufs, b)
	}
	idle := &fakeReclaimer{} // has nothing to give
	removeIdle := AddReclaimer(idle)
	defer removeIdle()
	remove := AddReclaimer(r)
	b, err := Alloc(2<<20+4096, 0) // 3 MiB pinned + 2 MiB > 4 MiB: needs 1 MiB + 4 KiB back
	if err != nil {
		t.Fatal(err)
	}
	if len(r.bufs) != 1 {
		t.Errorf("reclaimer kept %d buffers, want 1 (asked %v)", len(r.bufs), r.asked)
	}
	if len(r.asked) != 1 || r.asked[0] != 1<<20+4096 {
		t.Errorf("reclaimer asked for %v, want [%d]", r.asked, 1<<20+4096)
	}
	remove()
	remove() // idempotent
	if _, err := Alloc(2<<20, 0); !errors.Is(err, ErrBudget) {
		t.Errorf("after removing the reclaimer: %v", err)
	}
	if len(idle.asked) == 0 {
		t.Error("the idle reclaimer was never asked")
	}
	mustFree(t, b)
	for _, x := range r.bufs {
		mustFree(t, x)
	}
}

func TestDriverOutOfMemory(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{HostAllocLimit: 1 << 20})
	SetBudget(1 << 30)
	_, err := Alloc(2<<20, 0, WithMethod(MethodHostAlloc))
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !errors.Is(err, cuda.ErrOutOfMemory) || errors.Is(err, ErrBudget) {
		t.Fatalf("got %v", err)
	}
	if oom.Requested != 2<<20 || oom.Limit != 1<<30 || oom.Op != "cuMemHostAlloc" {
		t.Errorf("figures %+v", oom)
	}
	t.Log(err)
}

func TestBudgetConcurrent(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	const limit = 8 << 20
	SetBudget(limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var maxSeen int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				size := (g*7+i)%5*256<<10 + 4096
				b, err := Alloc(size, Flags(i%2))
				if err != nil {
					if !errors.Is(err, ErrBudget) {
						t.Error(err)
					}
					continue
				}
				mu.Lock()
				maxSeen = max(maxSeen, reserved.Load())
				mu.Unlock()
				if err := b.Free(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if maxSeen > limit {
		t.Errorf("reserved reached %d, over the limit %d", maxSeen, limit)
	}
}

func TestDefaultBudget(t *testing.T) {
	old := physMem
	defer func() { physMem = old }()
	physMem = func() (uint64, error) { return 64 << 30, nil }
	for _, tc := range []struct {
		env  string
		want int64
		err  bool
	}{
		{"", 32 << 30, false},
		{"40%", 27487790694, false},
		{"8Gi", 8 << 30, false},
		{"lots", 32 << 30, true},
	} {
		got, err := defaultBudget(tc.env)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("defaultBudget(%q) = %d, %v; want %d (error %v)", tc.env, got, err, tc.want, tc.err)
		}
	}
	physMem = func() (uint64, error) { return 0, errors.New("no /proc") }
	if got, err := defaultBudget(""); err != nil || got != 1<<63-1 {
		t.Errorf("without physical memory: %d, %v", got, err)
	}
	if _, err := defaultBudget("10%"); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("percentage without physical memory: %v", err)
	}
}

func TestSetBudgetEnv(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	t.Setenv(EnvBudget, "3Mi")
	prev := SetBudget(0)
	defer SetBudget(prev)
	if got := Budget(); got != 3<<20 {
		t.Fatalf("Budget with %s=3Mi: %d", EnvBudget, got)
	}
	if got := SetBudget(5 << 20); got != 3<<20 || Budget() != 5<<20 {
		t.Errorf("SetBudget: prev %d now %d", got, Budget())
	}
	t.Setenv(EnvBudget, "nonsense")
	SetBudget(-1)
	if _, err := Alloc(4096, 0); !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), EnvBudget) {
		t.Errorf("with a malformed %s: %v", EnvBudget, err)
	}
	t.Setenv(EnvBudget, "")
	SetBudget(0)
}

func TestLedger(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	setChunk(t, 1<<20)
	base := Stats()
	a, err := Alloc(100_000, Portable, WithMethod(MethodHostAlloc))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Alloc(3<<20, Mapped, WithMethod(MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 50_000)
	c, err := Register(mem, Portable)
	if err != nil {
		t.Fatal(err)
	}
	s := Stats()
	wantTotal := int64(100_000 + 3<<20 + 50_000)
	if got := s.Pinned.Bytes - base.Pinned.Bytes; got != wantTotal {
		t.Errorf("pinned %d, want %d", got, wantTotal)
	}
	if got := s.Pinned.Buffers - base.Pinned.Buffers; got != 3 {
		t.Errorf("buffers %d, want 3", got)
	}
	for k, want := range map[Kind]Usage{KindHostAlloc: {100_000, 1}, KindMmapRegister: {3 << 20, 1}, KindGoRegister: {50_000, 1}} {
		got := s.ByKind[k]
		got.Bytes -= base.ByKind[k].Bytes
		got.Buffers -= base.ByKind[k].Buffers
		if got != want {
			t.Errorf("%s: %+v, want %+v", k, got, want)
		}
	}
	if got := s.ByFlags[Portable].Bytes - base.ByFlags[Portable].Bytes; got != 150_000 {
		t.Errorf("portable bytes %d", got)
	}
	if got := s.ByFlags[Mapped].Bytes - base.ByFlags[Mapped].Bytes; got != 3<<20 {
		t.Errorf("mapped bytes %d", got)
	}
	if s.PeakBytes < s.Pinned.Bytes || s.Allocs != base.Allocs+3 || s.AllocBytes != base.AllocBytes+wantTotal {
		t.Errorf("peak %d allocs %d allocbytes %d", s.PeakBytes, s.Allocs, s.AllocBytes)
	}
	if s.PinTime <= base.PinTime || s.LastPinTime <= 0 || s.Reserved < s.Pinned.Bytes {
		t.Errorf("pin time %v last %v reserved %d", s.PinTime, s.LastPinTime, s.Reserved)
	}
	table := s.String()
	for _, w := range []string{"hostalloc", "mmap-register", "go-register", "flags portable", "flags mapped", "peak", "budget"} {
		if !strings.Contains(table, w) {
			t.Errorf("table lacks %q:\n%s", w, table)
		}
	}
	t.Logf("\n%s", table)
	for _, x := range []*Buffer{a, b, c} {
		mustFree(t, x)
	}
	e := Stats()
	if e.Frees != base.Frees+3 || e.UnpinTime <= base.UnpinTime || e.PeakBytes < s.Pinned.Bytes {
		t.Errorf("after frees: %+v", e)
	}
}

func TestDroppedBuffer(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	out := newSyncBuffer()
	prev := SetLogger(slog.New(slog.NewTextHandler(out, nil)))
	defer SetLogger(prev)
	before := Stats().Dropped
	func() {
		b, err := Alloc(4096, Portable)
		if err != nil {
			t.Fatal(err)
		}
		b.Bytes()[0] = 1
	}()
	// Nothing signals that the garbage collector ran a cleanup: poll,
	// bounded, collecting between looks.
	deadline := time.Now().Add(5 * time.Second)
	for Stats().Dropped == before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if Stats().Dropped != before+1 {
		t.Fatal("dropped buffer not counted")
	}
	if Stats().Pinned.Bytes == 0 {
		t.Error("a dropped buffer must stay pinned")
	}
	// The cleanup counts the drop before it logs it: wait for the line.
	for !strings.Contains(out.String(), "without Free") {
		select {
		case <-out.wrote:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("no log line about the dropped buffer; logs: %q", out.String())
		}
	}
	logs := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(logs) != 1 || !strings.Contains(logs[0], "level=WARN") || !strings.Contains(logs[0], "without Free") ||
		!strings.Contains(logs[0], "allocated_at=") || !strings.Contains(logs[0], "bytes=4096") {
		t.Errorf("logs: %q", logs)
	}
	if err := freeDropped(); err != nil {
		t.Fatal(err)
	}
	// A freed buffer that is dropped is not reported.
	func() {
		b, err := Alloc(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustFree(t, b)
	}()
	runtime.GC()
	runtime.GC()
	if Stats().Dropped != before+1 {
		t.Error("a freed buffer was counted as dropped")
	}
	if n := len(strings.Split(strings.TrimSpace(out.String()), "\n")); n != 1 {
		t.Errorf("%d reports, want 1", n)
	}
}

// syncBuffer is a bytes.Buffer safe for the cleanup goroutine's writes.
// Each Write also leaves a token in wrote, for a
// reader waiting for a line.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{wrote: make(chan struct{}, 1)} }

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestDroppedOwners checks that owners counted by package track appear in
// Stats, and that the default logger is silent.
func TestDroppedOwners(t *testing.T) {
	if l := SetLogger(nil); l != nil {
		SetLogger(l)
		t.Fatalf("default logger %v, want nil (silent)", l)
	}
	before := Stats().DroppedOwners["copier"]
	track.Dropped("copier")
	s := Stats()
	if got := s.DroppedOwners["copier"]; got != before+1 {
		t.Errorf("DroppedOwners[copier] = %d, want %d", got, before+1)
	}
	if !strings.Contains(s.String(), "dropped without Close: copier") {
		t.Errorf("table lacks the dropped owners:\n%s", s)
	}
}

func TestView(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	b, err := Alloc(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, b)
	u32, err := View[uint32](b)
	if err != nil || len(u32) != 1024 {
		t.Fatalf("View[uint32]: %d, %v", len(u32), err)
	}
	u32[1] = 0x04030201
	if b.Bytes()[4] != 1 || b.Bytes()[7] != 4 {
		t.Error("view does not alias the bytes")
	}
	type pair struct {
		A uint32
		B [3]float32
	}
	if v, err := View[pair](b); err != nil || len(v) != 256 {
		t.Errorf("View[pair]: %d %v", len(v), err)
	}
	if _, err := View[[3]byte](b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("size that does not divide: %v", err)
	}
	if _, err := View[*int](b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("pointer type: %v", err)
	}
	if _, err := View[struct{ S string }](b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("string field: %v", err)
	}
	if _, err := View[struct{}](b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("zero size: %v", err)
	}
}

func TestQueryPointerFake(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	b, err := Alloc(4096, Portable|Mapped, WithMethod(MethodHostAlloc))
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, b)
	info, err := queryPointer(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.HostFlags != cudadrv.MemHostAllocPortable|cudadrv.MemHostAllocDeviceMap {
		t.Errorf("host flags %#x", info.HostFlags)
	}
	t.Logf("%+v", info)
}

func TestFlagsString(t *testing.T) {
	for _, f := range []Flags{0, Portable, Mapped | WriteCombined, Portable | Mapped | ReadOnly} {
		g, err := parseFlags(f.String())
		if err != nil || g != f {
			t.Errorf("parseFlags(%q) = %v, %v", f.String(), g, err)
		}
	}
	if _, err := parseFlags("pinned"); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Error(err)
	}
	if Flags(1<<6).String() != "0x40" || Kind(9).String() != "kind(9)" || MethodMmapRegister.String() != "mmap-register" {
		t.Error("strings")
	}
}

// TestTouch checks the touching goroutines on a Go slice standing in for a
// mapping: every page (small pages) or every 2 MiB unit plus each small page
// of the tail (huge pages) gets its zero, and nothing else is written.
func TestTouch(t *testing.T) {
	for _, tc := range []struct {
		length  uintptr
		threads int
		huge    bool
	}{
		{3*hugePageSize + 5*pageSize, 4, true},
		{3*hugePageSize + 5*pageSize, 4, false},
		{40 << 20, 16, true},
		{40<<20 + pageSize, 3, true},
		{pageSize, 8, false},
		{pageSize, 1, true},
		{9*hugePageSize + 3*pageSize, 5, true},
		{9*hugePageSize + 3*pageSize, 2, false},
		{70 << 20, 6, true},
		{0, 4, true},
	} {
		if testing.Short() && tc.length > 32<<20 {
			continue // the byte-by-byte check of the large cases takes seconds
		}
		mem := make([]byte, tc.length)
		for i := range mem {
			mem[i] = 0xff
		}
		touch(hostptr.PtrOf(mem), tc.length, tc.threads, tc.huge)
		full := tc.length / hugePageSize * hugePageSize
		for i := uintptr(0); i < tc.length; i++ {
			want := byte(0xff)
			switch {
			case i%pageSize != 0:
			case !tc.huge || i >= full:
				want = 0
			case i%hugePageSize == 0:
				want = 0
			}
			if mem[i] != want {
				t.Fatalf("%+v: byte %d is %#x, want %#x", tc, i, mem[i], want)
			}
		}
	}
}
