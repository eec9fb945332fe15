package pinmem

import (
	"runtime"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestLookup: Lookup finds the buffer of every kind from any slice that
// overlaps its memory, the lowest one first, and nothing for pageable
// memory, empty slices, freed and dropped buffers.
func TestLookup(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	host, err := Alloc(64<<10, 0, WithMethod(MethodHostAlloc))
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, host)
	mm, err := Alloc(1<<20, 0, WithMethod(MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, mm)
	goMem := make([]byte, 3*int(pageSize))
	page := int((pageSize - hostptr.AddrOf(goMem)%pageSize) % pageSize)
	// Registered: one page in the middle of a Go slice.
	reg, err := Register(goMem[page:page+int(pageSize)-10], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mustFree(t, reg)

	for _, tc := range []struct {
		name string
		p    []byte
		want *Buffer
	}{
		{"host alloc", host.Bytes(), host},
		{"host alloc tail", host.Bytes()[64<<10-1:], host},
		{"mmap middle", mm.Bytes()[1000:2000], mm},
		{"registered", reg.Bytes(), reg},
		{"around the registration", goMem, reg},
		{"before the registration", goMem[:page], nil},
		// The claimed page goes on past the buffer's end; the bytes there are not the buffer's.
		{"after the registration, same page", goMem[page+int(pageSize)-10 : page+int(pageSize)], nil},
		{"pageable", make([]byte, 4096), nil},
		{"empty", mm.Bytes()[:0], nil},
		{"nil", nil, nil},
	} {
		b, ok := Lookup(tc.p)
		if ok != (tc.want != nil) || b != tc.want {
			t.Errorf("%s: Lookup = %v, %v; want %v", tc.name, b, ok, tc.want)
		}
	}

	// Freed: not found.
	f, err := Alloc(64<<10, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem := f.Bytes()
	if b, ok := Lookup(mem); !ok || b != f {
		t.Fatalf("before Free: %v %v", b, ok)
	}
	mustFree(t, f)
	if b, ok := Lookup(mem); ok {
		t.Fatalf("after Free: %v", b)
	}
}

// TestLookupDropped: a buffer dropped without Free is not returned (and
// Lookup does not keep it reachable: its drop is still detected).
func TestLookupDropped(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	mem := make([]byte, 1<<20)
	base := Stats().Dropped
	func() {
		b, err := Register(mem, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := Lookup(mem); !ok || got != b {
			t.Fatalf("live: %v %v", got, ok)
		}
	}()
	// The drop is detected (Lookup does not keep the buffer reachable)...
	// Nothing signals that the garbage collector ran a cleanup: poll,
	// bounded, collecting between looks.
	deadline := time.Now().Add(5 * time.Second)
	for Stats().Dropped == base && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if Stats().Dropped != base+1 {
		t.Fatal("the dropped buffer was not detected")
	}
	// ...and the buffer, still pinned until freeDropped, is not returned.
	if b, ok := Lookup(mem); ok {
		t.Fatalf("dropped buffer returned: %v", b)
	}
	if err := freeDropped(); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(mem)
}
