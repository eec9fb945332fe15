package cudatest_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

// What the driver does and a kinder fake would hide, seen through the
// public API as a user meets it.

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// The driver places small cuMemHostAlloc requests 512 bytes apart in pages
// it pinned already (two Alloc(12) on an H100 with driver 580 came back at
// 0x...be00000 and 0x...be00200). Every such allocation is a buffer of its
// own: none is refused as overlapping another, Lookup tells them apart, a
// pool pins its slabs beside them, and their bytes stay their own.
func TestSmallPinnedAllocationsDoNotCollide(t *testing.T) {
	cudatest.Install(t)
	ctx := primary(t)
	before := pinmem.Stats().Pinned // earlier tests may have left buffers dropped, still pinned
	var bufs []*pinmem.Buffer
	for _, n := range []int{12, 12, 100, 512, 1000, 4096} {
		b, err := pinmem.Alloc(n, 0, pinmem.WithMethod(pinmem.MethodHostAlloc))
		if err != nil {
			t.Fatalf("Alloc(%d) after %d small allocations: %v", n, len(bufs), err)
		}
		bufs = append(bufs, b)
	}
	page := uintptr(os.Getpagesize())
	if a, b := addr(bufs[0].Bytes()), addr(bufs[1].Bytes()); b-a != 512 || a/page != b/page {
		t.Errorf("two Alloc(12) at %#x and %#x: the fake must place them 512 bytes apart in one page, as the driver does", a, b)
	}
	for i, b := range bufs {
		mem := b.Bytes()
		for j := range mem {
			mem[j] = byte(i + 1)
		}
		for _, j := range []int{0, len(mem) - 1} {
			if got, ok := pinmem.Lookup(mem[j : j+1]); !ok || got != b {
				t.Errorf("Lookup of byte %d of buffer %d (%d bytes at %#x): %v %v", j, i, len(mem), addr(mem), got, ok)
			}
		}
	}
	// A pool pins its slabs beside them.
	p, err := pool.New()
	if err != nil {
		t.Fatal(err)
	}
	var blocks []*pool.Block
	for range 3 {
		blk, err := p.Get(context.Background(), 4096)
		if err != nil {
			t.Fatalf("pool Get(4096) beside small buffers: %v", err)
		}
		clear(blk.Bytes())
		blocks = append(blocks, blk)
	}
	// A copier round trip from one small buffer into another, copied directly.
	c, err := transfer.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := ctx.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	src, dst := bufs[4].Bytes(), make([]byte, 1000)
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DtoH(context.Background(), bufs[3].Bytes()[:0], dev); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DtoH(context.Background(), dst, dev); err != nil {
		t.Fatal(err)
	}
	for i, b := range bufs {
		for j, v := range b.Bytes() {
			if v != byte(i+1) {
				t.Fatalf("buffer %d byte %d = %d, want %d: a neighbour wrote into it", i, j, v, i+1)
			}
		}
	}
	for j, v := range dst {
		if v != 5 {
			t.Fatalf("round trip byte %d = %d, want 5", j, v)
		}
	}
	for _, blk := range blocks {
		if err := p.Put(blk); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := len(bufs) - 1; i >= 0; i -= 2 { // every other one first
		if err := bufs[i].Free(); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(bufs) - 2; i >= 0; i -= 2 {
		if err := bufs[i].Free(); err != nil {
			t.Fatal(err)
		}
	}
	if s := pinmem.Stats(); s.Pinned != before {
		t.Errorf("pinned after freeing everything: %+v, want %+v as before", s.Pinned, before)
	}
}

// The driver registers memory that shares a page with a registered range
// but no byte (seen on an H100, driver 580), so pinmem does too: two
// Registers of neighbouring bytes of one page both hold, Lookup tells them
// apart, and only a range with a byte pinned already is refused, with an
// *OverlapError.
func TestRegisterSharingAPageButNoByte(t *testing.T) {
	cudatest.Install(t)
	page := os.Getpagesize()
	mem := make([]byte, 3*page)
	o := int(-addr(mem) & uintptr(page-1)) // the first page boundary in mem
	a, err := pinmem.Register(mem[o:o+100], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	b, err := pinmem.Register(mem[o+200:o+300], 0)
	if err != nil {
		t.Fatalf("Register of bytes sharing a page with a registered range: %v", err)
	}
	defer b.Free()
	if got, ok := pinmem.Lookup(mem[o+250 : o+260]); !ok || got != b {
		t.Errorf("Lookup inside the second range: %v %v, want it", got, ok)
	}
	if got, ok := pinmem.Lookup(mem[o+50 : o+60]); !ok || got != a {
		t.Errorf("Lookup inside the first range: %v %v, want it", got, ok)
	}
	var oe *pinmem.OverlapError
	_, err = pinmem.Register(mem[o+250:o+page], 0)
	if !errors.Is(err, cuda.ErrAlreadyRegistered) || !errors.As(err, &oe) {
		t.Errorf("Register of bytes registered already: %v, want an *OverlapError", err)
	}
}

// On the driver an asynchronous copy that faults (here: into pinned memory
// freed before the copy ran) breaks the context: cuStreamQuery reports the
// fault again on every call, and so does every other call in the context,
// until the process starts over (in tests: ClearFaults).
func TestStreamQueryReportsAnEarlierCopyFaultAgain(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, err := ctx.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	dev, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	b, err := pinmem.Alloc(1<<20, 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.HoldStream(s); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoH(b.Bytes(), dev, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil { // too early: the copy has not run
		t.Fatal(err)
	}
	if err := d.ReleaseStream(s); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := s.Query(); !isCode(err, cuda.ResultIllegalAddress) {
			t.Fatalf("Query %d after the copy faulted: %v, want CUDA_ERROR_ILLEGAL_ADDRESS every time", i+1, err)
		}
	}
	if _, err := ctx.Alloc(64); !isCode(err, cuda.ResultIllegalAddress) {
		t.Errorf("Alloc in the broken context: %v, want CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
	d.ClearFaults()
	if done, err := s.Query(); !done || err != nil {
		t.Errorf("Query after ClearFaults: %v %v", done, err)
	}
}

// The driver refuses a registration sharing a page with another when one
// of the two is read-only and the other not (CUDA_ERROR_INVALID_VALUE on an
// H100, driver 580). pinmem refuses it first, saying why, with an error
// matching cuda.ErrInvalidValue; the same pair in pages of their own
// registers.
func TestRegisterReadOnlyBesideWritableInAPage(t *testing.T) {
	cudatest.Install(t)
	page := os.Getpagesize()
	mem := make([]byte, 3*page)
	o := int(-addr(mem) & uintptr(page-1))
	a, err := pinmem.Register(mem[o:o+100], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	_, err = pinmem.Register(mem[o+200:o+300], pinmem.ReadOnly)
	if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("Register read-only beside a writable registration in one page: %v, want an error matching cuda.ErrInvalidValue that says read-only", err)
	}
	b, err := pinmem.Register(mem[o+page:o+page+100], pinmem.ReadOnly)
	if err != nil {
		t.Fatalf("Register read-only in a page of its own: %v", err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}
