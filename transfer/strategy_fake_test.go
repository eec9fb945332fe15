package transfer

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
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

// TestFakeAdaptive: below the thresholds a pageable transfer is one
// synchronous driver copy (no ring, no event, no stream copy), except in
// the single-stage bands, where it is one asynchronous copy through one
// stage (singleBand); at and above the thresholds it is staged through
// one stage when it fits in one (oneStage), else through the ring; the
// data is right either way.
func TestFakeAdaptive(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, WithStageSize(4<<20), WithThresholds(Thresholds{HtoD: 8 << 20, DtoH: 4 << 20}))
	dev := e.devbuf(t, 16<<20)
	ops := []string{"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuEventRecord"}
	const driver, single, ring = "driver", "single", "ring"
	for _, tc := range []struct {
		n      int
		up, dn string
	}{
		{1, single, single},
		{64 << 10, single, single},
		{64<<10 + 1, driver, single},
		{256 << 10, driver, single},
		{1<<20 - 1, driver, single},
		{1 << 20, single, single}, // in 4 pieces host to device
		{2<<20 - 1, single, single},
		{2 << 20, single, single},
		{4<<20 - 1, single, single},
		{4 << 20, single, single}, // at the threshold device to host: one stage still holds it
		{4<<20 + 1, driver, ring},
		{8<<20 - 1, driver, ring}, // over the stage: no single stage holds it
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
// want ("driver", "single" or "ring"), from its Stats and the driver
// calls it made: synchronous copies, asynchronous copies, event records.
func checkPath(t *testing.T, op string, n int, want string, st Stats, syncCopies, asyncCopies, records int) {
	t.Helper()
	ok := false
	switch want {
	case "driver":
		ok = st.PageableBytes == int64(n) && st.StagedBytes == 0 && syncCopies == 1 && asyncCopies == 0 && records == 0
	case "single":
		ok = st.StagedBytes == int64(n) && st.Stages == 1 && st.PageableBytes == 0 && syncCopies == 0 && asyncCopies >= 1
	case "ring":
		ok = st.StagedBytes == int64(n) && st.PageableBytes == 0 && syncCopies == 0 && asyncCopies >= 1 && records >= 1
	}
	if !ok {
		t.Errorf("%s %d bytes: %v, %d sync copies, %d async, %d event records; want the %s path", op, n, st, syncCopies, asyncCopies, records, want)
	}
}

// TestFakeAdaptiveDefaults: a default Copier copies pageable memory
// through one stage up to 32 MiB (in two pieces from 16 MiB, where the
// thresholds stage it), except host to device between 64 KiB and 1 MiB,
// where the driver copies it, and through the ring above 32 MiB, both
// ways; pinned memory goes directly whatever its size.
func TestFakeAdaptiveDefaults(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	if DefaultThresholds != (Thresholds{HtoD: 16 << 20, DtoH: 16 << 20}) {
		t.Fatalf("DefaultThresholds %+v", DefaultThresholds)
	}
	dev := e.devbuf(t, 33<<20)
	// The path from its Stats: the driver's copy, one stage, or the ring.
	path := func(st Stats) string {
		switch {
		case st.PageableBytes == st.Bytes:
			return "driver"
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
		{4 << 10, "single", "single"}, {64 << 10, "single", "single"}, {256 << 10, "driver", "single"},
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
		if st.DirectBytes != int64(hi-lo) || st.StagedBytes != rest || st.PageableBytes != 0 {
			t.Errorf("%v, want %d direct and %d staged", st, hi-lo, rest)
		}
	}
	if n := e.d.PageableAsyncCopies() - pageable0; n != 0 {
		t.Errorf("%d asynchronous copies from or to pageable memory", n)
	}
}

// TestFakeAdaptiveStream: with WithStream the driver's pageable copy is
// ordered after the caller's work on that stream: with the stream held,
// the transfer waits, bounded by its context, and runs once the stream
// is released.
func TestFakeAdaptiveStream(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	c := e.copier(t, WithStream(s))
	dev := e.devbuf(t, 256<<10)
	src := testutil.RandomBytes(256<<10, 3)
	sh := cudadrv.Stream(s.Handle())
	if err := e.d.HoldStream(sh); err != nil {
		t.Fatal(err)
	}
	// The caller's work: a memset queued on the held stream.
	if err := s.Memset(dev, 0, 0, dev.Size()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := deadline200ms()
	within(t, "HtoD behind the caller's held stream", 700*time.Millisecond, func() error {
		_, err := c.HtoD(ctx, dev, src)
		return err
	})
	cancel()
	if err := e.d.ReleaseStream(sh); err != nil {
		t.Fatal(err)
	}
	// The interrupted copy finishes in the background; wait for it.
	waitIdle(t, c)
	calls := callDelta(e.d, func() {
		if st, err := c.HtoD(context.Background(), dev, src); err != nil || st.PageableBytes != int64(len(src)) {
			t.Fatalf("%v %v", st, err)
		}
	}, "cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2", "cuStreamSynchronize")
	if calls["cuMemcpyHtoD_v2"] != 1 || calls["cuMemcpyHtoDAsync_v2"] != 0 || calls["cuStreamSynchronize"] == 0 {
		t.Fatalf("calls %v, want a wait for the caller's stream and one synchronous copy", calls)
	}
	// The memset ran first: the copy's bytes are what the device holds.
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
}

// TestFakeAdaptiveBounded: the driver's pageable copy cannot be
// interrupted, yet a transfer on a hung device returns when its context
// ends; Close waits for the copy left running; with context.Background
// the copy runs on the caller's goroutine.
func TestFakeAdaptiveBounded(t *testing.T) {
	// The driver's copy, not one stage (TestFakeSingleStageDeadline).
	singleOff.Store(true)
	defer singleOff.Store(false)
	e := useFake(t, fakedrv.Options{})
	c, err := New(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev := e.devbuf(t, 1<<20)
	src := testutil.RandomBytes(1<<20, 4)
	dst := make([]byte, 1<<20)
	for _, tc := range []struct {
		name string
		f    func(ctx context.Context) (Stats, error)
	}{
		{"HtoD", func(ctx context.Context) (Stats, error) { return c.HtoD(ctx, dev, src) }},
		{"DtoH", func(ctx context.Context) (Stats, error) { return c.DtoH(ctx, dst, dev) }},
		{"HtoDAsync", func(ctx context.Context) (Stats, error) {
			return c.HtoDAsync(ctx, dev, src).Wait(context.Background())
		}},
	} {
		e.d.Pause()
		ctx, cancel := deadline200ms()
		within(t, tc.name, 700*time.Millisecond, func() error { _, err := tc.f(ctx); return err })
		cancel()
		closed := make(chan error, 1)
		if tc.name == "DtoH" {
			// Close waits for the copy left running (bounded by its context).
			cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			if err := c.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Close with a driver copy running: %v", err)
			}
			ccancel()
			go func() { closed <- c.Close(context.Background()) }()
		}
		e.d.Resume()
		if tc.name == "DtoH" {
			// nil, or ErrClosed when the timed-out Close's background
			// release finished before this Close began (both documented).
			if err := <-closed; err != nil && !errors.Is(err, ErrClosed) {
				t.Fatalf("Close after the device ran again: %v", err)
			}
			if c, err = New(e.ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// While the copy left running is in the driver, a new small
		// transfer stages (engine.claimDriver); once it returned, the
		// next one takes the driver's copy again.
		waitDriverIdle(t, c)
		if st, err := tc.f(context.Background()); err != nil || st.PageableBytes != 1<<20 {
			t.Errorf("%s after the device ran again: %v %v", tc.name, st, err)
		}
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitDriverIdle waits until no transfer of c's engine is in the driver's
// pageable copy.
func waitDriverIdle(t *testing.T, c *Copier) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.eng.driverCopies.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a driver copy never returned")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestThresholdsOption: negative thresholds are refused with an
// *OptionError matching cuda.ErrInvalidValue; Thresholds round-trip
// through JSON.
func TestThresholdsOption(t *testing.T) {
	for _, thr := range []Thresholds{{HtoD: -1}, {DtoH: -1}, {HtoD: math.MinInt64, DtoH: 5}} {
		_, err := buildOptions([]Option{WithThresholds(thr)})
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Option != "WithThresholds" || !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("WithThresholds(%+v): %v", thr, err)
		}
	}
	for _, thr := range []Thresholds{{}, DefaultThresholds, {HtoD: math.MaxInt64, DtoH: 1}} {
		o, err := buildOptions([]Option{WithThresholds(thr)})
		if err != nil || o.thr != thr {
			t.Errorf("WithThresholds(%+v): %+v %v", thr, o.thr, err)
		}
		j, err := json.Marshal(thr)
		if err != nil {
			t.Fatal(err)
		}
		var back Thresholds
		if err := json.Unmarshal(j, &back); err != nil || back != thr {
			t.Errorf("JSON %s: %+v %v", j, back, err)
		}
	}
	if j, _ := json.Marshal(Thresholds{HtoD: 1, DtoH: 2}); string(j) != `{"htod_bytes":1,"dtoh_bytes":2}` {
		t.Errorf("JSON %s", j)
	}
}

// TestFakeCalibrate: Calibrate measures both strategies and returns
// thresholds among the values it documents; a bad size or option is
// refused; it leaves nothing behind (useFake checks).
func TestFakeCalibrate(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	calls := callDelta(e.d, func() {
		thr, err := Calibrate(context.Background(), e.ctx, 1<<20, WithStageSize(256<<10))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []int64{thr.HtoD, thr.DtoH} {
			if v != 0 && v != 2<<20 && v != 256<<10 && v != 1<<20 {
				t.Errorf("threshold %d is not a measured size, 0 or 2*max", v)
			}
		}
		c := e.copier(t, WithThresholds(thr))
		_ = c
	}, "cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2")
	for op, n := range calls {
		if n == 0 {
			t.Errorf("Calibrate never called %s: %v", op, calls)
		}
	}
	for _, n := range []int{-1, 1000, 17 << 30} {
		if _, err := Calibrate(context.Background(), e.ctx, n); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Calibrate(%d): %v", n, err)
		}
	}
	if _, err := Calibrate(context.Background(), e.ctx, 0, WithThresholds(Thresholds{HtoD: -1})); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Calibrate with a bad option: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Calibrate(ctx, e.ctx, 1<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("Calibrate with an ended context: %v", err)
	}
}

// TestFakeAdaptiveOtherDevice: memory pinmem pinned for another device's
// context without Portable is pageable for this Copier (the driver would
// copy it as such): small transfers of it go to the driver's copy (or
// one stage), large ones are staged; a Portable buffer is copied directly.
func TestFakeAdaptiveOtherDevice(t *testing.T) {
	e := useMultiFake(t, 2, 2<<20)
	c, err := New(e.ctxs[1], WithStageSize(256<<10), WithThresholds(Thresholds{HtoD: 1 << 20, DtoH: 1 << 20}))
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
		name                     string
		host                     []byte
		pageable, staged, direct int
	}{
		{"other small", other.Bytes()[:256<<10], 256 << 10, 0, 0},
		{"other large", other.Bytes(), 0, 2 << 20, 0},
		{"portable small", portable.Bytes()[:256<<10], 0, 0, 256 << 10},
	} {
		copy(tc.host, testutil.RandomBytes(len(tc.host), 31))
		st, err := c.HtoD(context.Background(), e.bufs[1], tc.host)
		if err != nil {
			t.Fatal(err)
		}
		if st.PageableBytes != int64(tc.pageable) || st.StagedBytes != int64(tc.staged) || st.DirectBytes != int64(tc.direct) {
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
		if tc.direct != (st.DirectBytes == 64<<10) || !tc.direct && st.PageableBytes+st.StagedBytes != 64<<10 {
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

// TestFakeStageWhenDriverBusy: a small host-to-device transfer outside
// the single-stage bands takes the driver's pageable copy only while no
// other transfer of its engine is in it; otherwise it stages. Turning
// stageWhenDriverBusy off gives the driver every such transfer. Device to
// host it goes through one stage either way. Every byte is checked.
func TestFakeStageWhenDriverBusy(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	other := e.copier(t) // another Copier of the same engine
	if c.eng != other.eng {
		t.Fatal("two default Copiers of one context have different engines")
	}
	const n = 256 << 10
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 9)
	dst := make([]byte, n)
	bg := context.Background()
	check := func(name string, wantPageable bool) {
		t.Helper()
		clear(dst)
		hs, err := c.HtoD(bg, dev, src)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := c.DtoH(bg, dst, dev)
		if err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, src, dst)
		if pageable := hs.PageableBytes == n; pageable != wantPageable || (!pageable && hs.StagedBytes != n) {
			t.Errorf("%s: %v: want the driver's copy %v", name, hs, wantPageable)
		}
		if ds.StagedBytes != n || ds.Stages != 1 {
			t.Errorf("%s: %v: want one stage", name, ds)
		}
	}
	check("driver idle", true)
	other.eng.driverCopies.Add(1) // a transfer of the other Copier is in the driver's copy
	check("driver busy", false)
	stageWhenDriverBusy.Store(false)
	check("driver busy, staging off", true)
	stageWhenDriverBusy.Store(true)
	other.eng.driverCopies.Add(-1)
	check("driver idle again", true)
	if got := c.eng.driverCopies.Load(); got != 0 {
		t.Errorf("%d driver copies counted after the transfers returned", got)
	}
}

// TestFakeDriverBusyRingTaken: a small transfer that finds the driver's
// copy busy does not stage behind a transfer that holds the Copier's ring,
// nor behind those that hold every stage of the engine: it takes the
// driver's copy too.
func TestFakeDriverBusyRingTaken(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	const n = 1 << 20
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 10)
	c.eng.driverCopies.Add(1) // another transfer is in the driver's copy
	defer c.eng.driverCopies.Add(-1)
	var taken []*lane // and staged transfers hold every lane
	for range c.lanes {
		taken = append(taken, <-c.free)
	}
	done := make(chan Stats, 1)
	go func() {
		st, err := c.HtoD(context.Background(), dev, src)
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()
	select {
	case st := <-done:
		if st.PageableBytes != n {
			t.Errorf("%v: want the driver's copy", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a small transfer waited for the ring held by another transfer")
	}
	for _, l := range taken {
		c.free <- l
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
	if st, err := c.HtoD(context.Background(), dev, src); err != nil || st.StagedBytes != n {
		t.Errorf("ring free, driver busy: %v %v, want staging", st, err)
	}
	// Nor behind the transfers that hold every stage of the engine: all
	// lent, the small transfer takes the driver's copy too.
	lent, err := c.eng.take(context.Background(), c.eng.depth)
	if err != nil {
		t.Fatal(err)
	}
	for c.eng.stageFree() {
		more, err := c.eng.take(context.Background(), c.eng.depth)
		if err != nil {
			t.Fatal(err)
		}
		lent = append(lent, more...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := c.HtoD(ctx, dev, src)
	cancel()
	c.eng.give(lent)
	if err != nil || st.PageableBytes != n {
		t.Errorf("every stage lent, driver busy: %v %v, want the driver's copy", st, err)
	}
}
