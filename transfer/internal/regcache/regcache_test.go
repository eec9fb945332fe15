package regcache

import (
	"slices"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/hostspan"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestShare: a request overlapping a busy registration shares it and
// registers the gaps; busy registrations are neither reclaimed nor freed
// by Forget until their last Release; Close frees what is left.
func TestShare(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	testutil.PrimaryContext(t)
	c := New(0, 4096)
	ps := int(pageSize)
	big := make([]byte, 64*ps)
	base := (ps - int(hostptr.AddrOf(big))%ps) % ps
	mid := big[base+10*ps : base+20*ps]
	spans, h1 := c.Acquire(mid)
	if !slices.Equal(spans, []hostspan.Span{{Lo: 0, Hi: len(mid)}}) {
		t.Fatalf("spans %v", spans)
	}
	for _, b := range []*pinmem.Buffer{lookup(t, mid)} {
		if !Owns(b) {
			t.Fatal("a registration of the cache is not Owned")
		}
	}
	spans, h2 := c.Acquire(big)
	if cs := c.Stats(); cs.Entries != 3 || cs.Merges != 0 || cs.Hits != 0 || cs.Misses != 2 {
		t.Fatalf("shared: %+v", cs)
	}
	if got := hostspan.Normalize(spans); len(got) != 1 || got[0].Lo != base || got[0].Hi < len(big)-ps {
		t.Fatalf("shared spans %v (base %d, len %d)", got, base, len(big))
	}
	if cuts := h2.Cuts(hostptr.AddrOf(big), nil); len(cuts) != 6 {
		t.Fatalf("cuts of three registrations: %v", cuts)
	}
	if n := c.Reclaim(1 << 30); n != 0 {
		t.Fatalf("reclaimed %d bytes of busy registrations", n)
	}
	if n := c.Forget(mid); n != 0 {
		t.Fatalf("Forget freed %d bytes of a busy registration", n)
	}
	c.Release(h1)
	c.Release(h2)
	if cs := c.Stats(); cs.Entries != 2 {
		t.Fatalf("after release: %+v", cs)
	}
	if n := c.Reclaim(1); n == 0 || c.Stats().Entries != 1 {
		t.Fatalf("Reclaim(1) freed %d, %+v", n, c.Stats())
	}
	if d.Live().Registrations != 1 {
		t.Fatalf("fake has %d registrations", d.Live().Registrations)
	}
	if left, err := c.Close(); left != 0 || err != nil {
		t.Fatalf("Close: %d left, %v", left, err)
	}
	if cs := c.Stats(); d.Live().Registrations != 0 || cs.Entries != 0 || cs.Registrations != 3 || cs.Evictions != 1 {
		t.Fatalf("after Close: %d registrations, %+v", d.Live().Registrations, c.Stats())
	}
	if spans, h := c.Acquire(big); spans != nil || h != nil {
		t.Fatal("a closed cache registered")
	}
}

// TestMergeAndLimit: a request over idle registrations replaces them with
// one of the union; a limit evicts the least recently used idle one and
// refuses a range larger than itself.
func TestMergeAndLimit(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	testutil.PrimaryContext(t)
	ps := int(pageSize)
	c := New(int64(24*ps), 4096)
	defer c.Close()
	big := make([]byte, 64*ps)
	base := (ps - int(hostptr.AddrOf(big))%ps) % ps
	a, b := big[base:base+8*ps], big[base+8*ps:base+16*ps]
	for _, p := range [][]byte{a, b} {
		_, h := c.Acquire(p)
		c.Release(h)
	}
	_, h := c.Acquire(big[base : base+20*ps])
	c.Release(h)
	if cs := c.Stats(); cs.Merges != 1 || cs.Entries != 1 || cs.Bytes != int64(20*ps) {
		t.Fatalf("merge: %+v", cs)
	}
	other := make([]byte, 10*ps+ps)
	ob := (ps - int(hostptr.AddrOf(other))%ps) % ps
	_, h = c.Acquire(other[ob : ob+10*ps])
	c.Release(h)
	if cs := c.Stats(); cs.Evictions != 1 || cs.Entries != 1 || cs.Bytes != int64(10*ps) {
		t.Fatalf("limit: %+v", cs)
	}
	if spans, _ := c.Acquire(make([]byte, 30*ps)); spans != nil {
		t.Fatal("a range over the limit was registered")
	}
}

// TestPendingNotAHit: a request over a registration still being made
// gets no span for it (its bytes are staged) and counts as a miss, not a
// hit (a request fully served by existing registrations).
func TestPendingNotAHit(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	testutil.PrimaryContext(t)
	ps := int(pageSize)
	c := New(0, 4096)
	big := make([]byte, 17*ps)
	base := (ps - int(hostptr.AddrOf(big))%ps) % ps
	p := big[base : base+16*ps]
	entered, end := make(chan struct{}), make(chan struct{})
	d.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemHostRegister_v2" {
			close(entered)
			<-end
		}
		return cudadrv.Success
	})
	defer d.SetHook(nil)
	first := make(chan *Hold, 1)
	go func() {
		_, h := c.Acquire(p)
		first <- h
	}()
	<-entered
	spans, h := c.Acquire(p)
	cs := c.Stats()
	close(end)
	c.Release(<-first)
	c.Release(h)
	if spans != nil {
		t.Errorf("spans %v of a registration still being made", spans)
	}
	if cs.Hits != 0 || cs.Misses != 2 {
		t.Errorf("a request over a registration being made: %d hits, %d misses, want 0 and 2", cs.Hits, cs.Misses)
	}
	if left, err := c.Close(); left != 0 || err != nil {
		t.Fatalf("Close: %d left, %v", left, err)
	}
}

// lookup returns the pinmem buffer holding p.
func lookup(t *testing.T, p []byte) *pinmem.Buffer {
	t.Helper()
	b, ok := pinmem.Lookup(p)
	if !ok {
		t.Fatal("no buffer holds the registered slice")
	}
	return b
}
