package transfer

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// callDelta returns how many times each op was called while f ran.
func callDelta(d *fakedrv.Driver, f func(), ops ...string) map[string]int {
	before := d.CallCounts()
	f()
	after := d.CallCounts()
	out := map[string]int{}
	for _, op := range ops {
		out[op] = after[op] - before[op]
	}
	return out
}

// TestFakeAdaptive: below the thresholds a pageable transfer that one
// stage holds goes through one stage, never to the driver's synchronous
// copy; at and above the thresholds it is staged through one stage when
// it fits in one (oneStage), else through the ring; the data is right
// either way.
func TestFakeAdaptive(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, WithStageSize(4<<20))
	dev := e.devbuf(t, 16<<20)
	ops := []string{"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuEventRecord"}
	const single, ring = "single", "ring"
	for _, tc := range []struct {
		n      int
		up, dn string
	}{
		{1, single, single},
		{64 << 10, single, single},
		{64<<10 + 1, single, single},
		{256 << 10, single, single},
		{1<<20 - 1, single, single},
		{1 << 20, single, single}, // in 4 pieces host to device
		{2<<20 - 1, single, single},
		{2 << 20, single, single},
		{4<<20 - 1, single, single},
		{4 << 20, single, single}, // at the threshold device to host: one stage still holds it
		{4<<20 + 1, ring, ring},
		{8<<20 - 1, ring, ring}, // over the stage: no single stage holds it
		{8 << 20, ring, ring},
		{9 << 20, ring, ring},
	} {
		src := testutil.RandomBytes(tc.n, uint64(tc.n))
		var up, down Stats
		var err error
		calls := callDelta(e.d, func() { up, err = c.HtoD(context.Background(), dev, src) }, ops...)
		if err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, src, e.deviceBytes(t, dev)[:tc.n])
		checkPath(t, "HtoD", tc.n, tc.up, up, calls["cuMemcpyHtoD_v2"], calls["cuMemcpyHtoDAsync_v2"], calls["cuEventRecord"])
		dst := make([]byte, tc.n)
		testutil.Poison(dst)
		calls = callDelta(e.d, func() { down, err = c.DtoH(context.Background(), dst, dev) }, ops...)
		if err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, src, dst)
		checkPath(t, "DtoH", tc.n, tc.dn, down, calls["cuMemcpyDtoH_v2"], calls["cuMemcpyDtoHAsync_v2"], calls["cuEventRecord"])
	}
}

// checkPath checks that a transfer of n pageable bytes took the path
// want ("single" or "ring"), from its Stats and the driver
// calls it made: synchronous copies, asynchronous copies, event records.
func checkPath(t *testing.T, op string, n int, want string, st Stats, syncCopies, asyncCopies, records int) {
	t.Helper()
	ok := false
	switch want {
	case "single":
		ok = st.StagedBytes == int64(n) && st.Stages == 1 && syncCopies == 0 && asyncCopies >= 1
	case "ring":
		ok = st.StagedBytes == int64(n) && syncCopies == 0 && asyncCopies >= 1 && records >= 1
	}
	if !ok {
		t.Errorf("%s %d bytes: %v, %d sync copies, %d async, %d event records; want the %s path", op, n, st, syncCopies, asyncCopies, records, want)
	}
}

// TestFakeAdaptiveDefaults: a default Copier copies pageable memory
// through one stage up to 32 MiB (in two pieces from 16 MiB, where the
// thresholds stage it) and through the ring above 32 MiB, both ways;
// pinned memory goes directly whatever its size.
func TestFakeAdaptiveDefaults(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	dev := e.devbuf(t, 33<<20)
	// The path from its Stats: one stage or the ring.
	path := func(st Stats) string {
		switch {
		case st.StagedBytes == st.Bytes && st.Stages == 1:
			return "single"
		case st.StagedBytes == st.Bytes:
			return "ring"
		}
		return "?"
	}
	for _, tc := range []struct {
		n        int
		want     string
		wantBack string
	}{
		{4 << 10, "single", "single"}, {64 << 10, "single", "single"}, {256 << 10, "single", "single"},
		{1 << 20, "single", "single"}, {2 << 20, "single", "single"}, {16<<20 - 1, "single", "single"},
		{16 << 20, "single", "single"}, {32<<20 - 1, "single", "single"}, {32 << 20, "single", "single"},
		{32<<20 + 1, "ring", "ring"}, {33 << 20, "ring", "ring"},
	} {
		n := tc.n
		src := testutil.RandomBytes(n, 5)
		up, err := c.HtoD(context.Background(), dev, src)
		if err != nil {
			t.Fatal(err)
		}
		if path(up) != tc.want {
			t.Errorf("%d bytes: %v, want the %s path", n, up, tc.want)
		}
		testutil.CheckBytes(t, src, e.deviceBytes(t, dev)[:n])
		back := make([]byte, n)
		down, err := c.DtoH(context.Background(), back, dev)
		if err != nil {
			t.Fatal(err)
		}
		if path(down) != tc.wantBack {
			t.Errorf("%d bytes back: %v, want the %s path", n, down, tc.wantBack)
		}
		testutil.CheckBytes(t, src, back)
	}
	b, err := pinmem.Alloc(4<<10, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if st, err := c.HtoD(context.Background(), dev, b.Bytes()); err != nil || st.DirectBytes != 4<<10 {
		t.Fatalf("small pinned: %v %v", st, err)
	}
}

// TestFakeAdaptiveMixed: a slice partly pinned copies the pinned part
// directly and stages the pageable rest, however small (queued on the
// stream, the driver's copy of pageable memory would wait for the device
// beyond the reach of ctx): no asynchronous copy touches pageable memory.
func TestFakeAdaptiveMixed(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	mem := make([]byte, 1<<20+3*int(pageSize))
	base := int((pageSize - addr(mem)%pageSize) % pageSize)
	lo, hi := base+int(pageSize), base+int(pageSize)+512<<10
	b, err := pinmem.Register(mem[lo:hi], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	host := mem[100:]
	dev := e.devbuf(t, len(host))
	c := e.copier(t, WithStageSize(64<<10))
	copy(host, testutil.RandomBytes(len(host), 8))
	want := append([]byte(nil), host...)
	pageable0 := e.d.PageableAsyncCopies()
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
	rest := int64(len(host) - (hi - lo))
	for _, st := range []Stats{up, down} {
		if st.DirectBytes != int64(hi-lo) || st.StagedBytes != rest {
			t.Errorf("%v, want %d direct and %d staged", st, hi-lo, rest)
		}
	}
	if n := e.d.PageableAsyncCopies() - pageable0; n != 0 {
		t.Errorf("%d asynchronous copies from or to pageable memory", n)
	}
}

// TestFakeAdaptiveOtherDevice: memory pinmem pinned for another device's
// context without Portable is pageable for this Copier (the driver would
// copy it as such): it is staged, small or large; a Portable buffer is
// copied directly.
func TestFakeAdaptiveOtherDevice(t *testing.T) {
	e := useMultiFake(t, 2, 2<<20)
	c, err := New(e.ctxs[1], WithStageSize(256<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	other, err := pinmem.Alloc(2<<20, 0, pinmem.WithDevice(e.ctxs[0].Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Free()
	portable, err := pinmem.Alloc(2<<20, pinmem.Portable, pinmem.WithDevice(e.ctxs[0].Device()))
	if err != nil {
		t.Fatal(err)
	}
	defer portable.Free()
	for _, tc := range []struct {
		name           string
		host           []byte
		staged, direct int
	}{
		{"other small", other.Bytes()[:256<<10], 256 << 10, 0},
		{"other large", other.Bytes(), 2 << 20, 0},
		{"portable small", portable.Bytes()[:256<<10], 0, 256 << 10},
	} {
		copy(tc.host, testutil.RandomBytes(len(tc.host), 31))
		st, err := c.HtoD(context.Background(), e.bufs[1], tc.host)
		if err != nil {
			t.Fatal(err)
		}
		if st.StagedBytes != int64(tc.staged) || st.DirectBytes != int64(tc.direct) {
			t.Errorf("%s: %v", tc.name, st)
		}
		testutil.CheckBytes(t, tc.host, e.deviceBytes(t, e.bufs[1])[:len(tc.host)])
	}
}

// TestFakeAdaptiveSecondContext: a buffer pinmem pinned (in the primary
// context) without Portable is pageable for a Copier on a second context
// of the same device; a Portable one is pinned for it.
func TestFakeAdaptiveSecondContext(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c2, err := cuda.NewContext(e.ctx.Device(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c2.Destroy(); err != nil {
			t.Error(err)
		}
	}()
	c, err := New(c2, WithStageSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	dev, err := c2.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	for _, tc := range []struct {
		flags  pinmem.Flags
		direct bool
	}{{0, false}, {pinmem.Portable, true}} {
		b, err := pinmem.Alloc(64<<10, tc.flags)
		if err != nil {
			t.Fatal(err)
		}
		copy(b.Bytes(), testutil.RandomBytes(64<<10, 41))
		st, err := c.HtoD(context.Background(), dev, b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if tc.direct != (st.DirectBytes == 64<<10) || !tc.direct && st.StagedBytes != 64<<10 {
			t.Errorf("flags %v: %v", tc.flags, st)
		}
		got := make([]byte, 64<<10)
		if _, err := dev.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, b.Bytes(), got)
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
}
