package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// roundTrip copies host to dev and back through c and checks the data.
func (e fakeEnv) roundTrip(t *testing.T, c *Copier, host []byte) (Stats, Stats) {
	t.Helper()
	dev := e.devbuf(t, len(host))
	copy(host, testutil.RandomBytes(len(host), uint64(len(host))))
	want := append([]byte(nil), host...)
	up, err := c.HtoD(context.Background(), dev, host)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, want, e.deviceBytes(t, dev))
	testutil.Poison(host)
	down, err := c.DtoH(context.Background(), host, dev)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, want, host)
	return up, down
}

func TestFakeRegCache(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, append(smallRing(), WithRegistrationCache(0), WithRegistrationMin(64<<10))...)
	rc := c.Cache()
	big := make([]byte, 1<<20+3*int(pageSize))
	s := big[100 : 100+1<<20]
	up, down := e.roundTrip(t, c, s)
	head := int(pageSize) - int((addr(s))%pageSize)
	if head == int(pageSize) {
		head = 0
	}
	tail := int((addr(s) + uintptr(len(s))) % pageSize)
	for _, st := range []Stats{up, down} {
		if st.DirectBytes != int64(len(s)-head-tail) || st.StagedBytes != int64(head+tail) {
			t.Fatalf("first copy: %+v, want %d direct and %d staged", st, len(s)-head-tail, head+tail)
		}
	}
	cs := rc.Stats()
	if cs.Misses != 1 || cs.Hits != 1 || cs.Registrations != 1 || cs.Entries != 1 || cs.Bytes != int64(len(s)-head-tail) {
		t.Fatalf("after the first round trip: %+v", cs)
	}
	// A part of it is a hit.
	e.roundTrip(t, c, s[200_000:900_000])
	if cs = rc.Stats(); cs.Hits != 3 || cs.Registrations != 1 {
		t.Fatalf("a sub-slice: %+v", cs)
	}
	// The whole slice overlaps the idle entry: merged into one.
	up, _ = e.roundTrip(t, c, big)
	if cs = rc.Stats(); cs.Merges != 1 || cs.Entries != 1 || cs.Bytes != int64(len(big)&^int(pageSize-1)) && cs.Bytes != int64(len(big)) {
		t.Fatalf("after a merge: %+v (len %d)", cs, len(big))
	}
	if up.DirectBytes < int64(len(big)-2*int(pageSize)) {
		t.Fatalf("merged copy: %+v", up)
	}
	if n := rc.Forget(big); n == 0 || rc.Stats().Entries != 0 {
		t.Fatalf("Forget freed %d, stats %+v", n, rc.Stats())
	}
	// Forgotten: copied through the stages again... then registered again.
	up, _ = e.roundTrip(t, c, s)
	if rc.Stats().Registrations != 3 || up.DirectBytes == 0 {
		t.Fatalf("after Forget: %+v, %+v", rc.Stats(), up)
	}
}

func TestFakeRegCacheLimit(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, append(smallRing(), WithRegistrationCache(3<<19), WithRegistrationMin(4096))...)
	rc := c.Cache()
	a := make([]byte, 1<<20)
	b := make([]byte, 1<<20)
	e.roundTrip(t, c, a)
	e.roundTrip(t, c, b)
	cs := rc.Stats()
	if cs.Evictions != 1 || cs.Entries != 1 || cs.Bytes > 3<<19 {
		t.Fatalf("over the limit: %+v", cs)
	}
	// Larger than the limit: staged, never registered.
	huge := make([]byte, 2<<20)
	up, _ := e.roundTrip(t, c, huge)
	if up.DirectBytes != 0 {
		t.Fatalf("a slice over the cache limit was registered: %+v", up)
	}
}

// TestFakeRegCacheBudget: pinmem's budget asks the cache for memory back,
// and a registration refused by the budget falls back to staging.
func TestFakeRegCacheBudget(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, append(smallRing(), WithRegistrationCache(0), WithRegistrationMin(4096))...)
	rc := c.Cache()
	a := make([]byte, 1<<20)
	e.roundTrip(t, c, a)
	pinned := pinmem.Stats().Reserved
	prev := pinmem.SetBudget(pinned + 512<<10)
	defer pinmem.SetBudget(prev)
	buf, err := pinmem.Alloc(768<<10, 0)
	if err != nil {
		t.Fatalf("Alloc that needs the cache's memory: %v", err)
	}
	defer buf.Free()
	if cs := rc.Stats(); cs.Entries != 0 || cs.Reclaimed < 1<<19 {
		t.Fatalf("after the budget asked: %+v", cs)
	}
	// No room: the copy is staged, and correct.
	up, _ := e.roundTrip(t, c, a)
	if up.DirectBytes != 0 || rc.Stats().Failures == 0 {
		t.Fatalf("over the budget: %+v, %+v", up, rc.Stats())
	}
}

// TestFakeRegCacheForeign: memory pinmem pinned for someone else is
// recognised (pinmem.Lookup) and copied directly without the cache; a
// slice overlapping it only in part has its other pages registered by the
// cache, and the cache never registers the foreign pages again.
func TestFakeRegCacheForeign(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, append(smallRing(), WithRegistrationCache(0), WithRegistrationMin(4096))...)
	big := make([]byte, 2<<20+int(pageSize))
	base := int((pageSize - addr(big)%pageSize) % pageSize)
	a := big[base : base+1<<20]
	b, err := pinmem.Register(a, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	up, _ := e.roundTrip(t, c, a)
	if up.DirectBytes != int64(len(a)) || c.Cache().Stats() != (CacheStats{}) {
		t.Fatalf("%+v %+v", up, c.Cache().Stats())
	}
	whole := big[base : base+2<<20]
	up, _ = e.roundTrip(t, c, whole)
	if up.DirectBytes != int64(len(whole)) || c.Cache().Stats().Failures != 0 || c.Cache().Stats().Bytes != 1<<20 {
		t.Fatalf("partly foreign: %+v %+v", up, c.Cache().Stats())
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HtoD(context.Background(), nil, a); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}
