package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
)

func TestGetPutHit(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithName("hit"))
	for _, size := range []int{1, 100, 4000, 100 << 10, 1 << 20, 5<<20 + 3, HugeThreshold + 1} {
		b := mustGet(t, p, size)
		fill(b.Bytes(), 7)
		mem := b.Bytes()
		mustPut(t, p, b)
		if b.Bytes() != nil {
			t.Errorf("Bytes after Put is not nil")
		}
		calls := d.CallCounts()
		b2 := mustGet(t, p, size)
		if !sameMem(mem, b2.Bytes()) {
			t.Errorf("size %d: a Get after Put did not reuse the block", size)
		}
		mustPut(t, p, b2)
		if after := d.CallCounts(); !equalCounts(calls, after) {
			t.Errorf("size %d: a hit and a plain Put called the driver: %v -> %v", size, calls, after)
		}
	}
	s := p.Stats()
	if s.Hits != 7 || s.Misses != 7 || s.Gets != 14 || s.Puts != 14 || s.InUseBlocks != 0 || s.EventsCreated != 0 {
		t.Errorf("stats: %v", s)
	}
	if s.PinnedBytes != pinmem.Stats().Pinned.Bytes {
		t.Errorf("pool says %d bytes pinned, the ledger %d", s.PinnedBytes, pinmem.Stats().Pinned.Bytes)
	}
	if s.PeakRequestedBytes != HugeThreshold+1 {
		t.Errorf("peak requested %d", s.PeakRequestedBytes)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestSlabCarving(t *testing.T) {
	d := useFake(t)
	p := newPool(t)
	const size = 1000 // class 1024
	n, slabBytes := slabLayout(classOf(size))
	var blocks []*Block
	seen := map[*byte]bool{}
	for i := range 2*n + 1 {
		b := mustGet(t, p, size)
		fill(b.Bytes(), byte(i))
		if seen[&b.Bytes()[0]] {
			t.Fatalf("block %d handed out twice", i)
		}
		seen[&b.Bytes()[0]] = true
		blocks = append(blocks, b)
	}
	for i, b := range blocks {
		for _, v := range b.Bytes() {
			if v != byte(i) {
				t.Fatalf("block %d overwritten: blocks overlap", i)
			}
		}
	}
	s := p.Stats()
	if s.Pins != 3 || s.Slabs != 3 || s.PinnedBytes != 3*int64(slabBytes) || d.Calls("cuMemHostAlloc") != 3 {
		t.Errorf("%d blocks: %d pins, %d slabs, %d bytes pinned (slab %d); stats %v", len(blocks), s.Pins, s.Slabs, s.PinnedBytes, slabBytes, s)
	}
	if s.CachedBlocks != int64(3*n-len(blocks)) || s.Misses != 3 {
		t.Errorf("cached %d blocks, misses %d", s.CachedBlocks, s.Misses)
	}
	if s.WastedBytes != int64(len(blocks)*(1024-size)) {
		t.Errorf("wasted %d", s.WastedBytes)
	}
	for _, b := range blocks {
		mustPut(t, p, b)
	}
	freed, err := p.Trim(context.Background())
	if err != nil || freed != 3*int64(slabBytes) {
		t.Errorf("Trim freed %d (%v)", freed, err)
	}
	if s := p.Stats(); s.PinnedBytes != 0 || s.Slabs != 0 || s.CachedBytes != 0 || s.CachedBlocks != 0 {
		t.Errorf("after Trim: %v", s)
	}
}

func TestHugeBlocks(t *testing.T) {
	useFake(t)
	p := newPool(t, WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	const size = 40 << 20
	b := mustGet(t, p, size+1)
	if b.Cap() != size+pageSize {
		t.Errorf("huge block capacity %d, want %d", b.Cap(), size+pageSize)
	}
	mem := b.Bytes()
	mustPut(t, p, b)
	b2 := mustGet(t, p, size-size/10) // within 1/8: reuse
	if !sameMem(mem, b2.Bytes()) {
		t.Error("a huge block was not reused for a request 1/10 smaller")
	}
	mustPut(t, p, b2)
	b3 := mustGet(t, p, HugeThreshold+1<<20) // far smaller: a new block (and the old one released)
	if sameMem(mem, b3.Bytes()) {
		t.Error("a huge block was reused for a much smaller request")
	}
	if s := p.Stats(); s.PinnedBytes != int64(b3.Cap()) || s.Evictions != 1 {
		t.Errorf("the idle huge block was not released on the miss: %v", s)
	}
	mustPut(t, p, b3)
}

func TestTrim(t *testing.T) {
	useFake(t)
	p := newPool(t)
	keep := mustGet(t, p, 3000)
	var bs []*Block
	for _, n := range []int{3000, 1 << 20, 2 << 20, 9 << 20} {
		bs = append(bs, mustGet(t, p, n))
	}
	for _, b := range bs {
		mustPut(t, p, b)
	}
	before := p.Stats()
	freed, err := p.Trim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := p.Stats()
	_, slabBytes := slabLayout(classOf(3000))
	if s.PinnedBytes != int64(slabBytes) || freed != before.PinnedBytes-int64(slabBytes) {
		t.Errorf("Trim freed %d: %v", freed, s)
	}
	// The slab of the block still out stays, with its idle blocks cached.
	if s.Slabs != 1 || s.CachedBlocks == 0 || s.InUseBlocks != 1 {
		t.Errorf("after Trim: %v", s)
	}
	if pinmem.Stats().Pinned.Bytes != int64(slabBytes) {
		t.Errorf("ledger %d bytes pinned", pinmem.Stats().Pinned.Bytes)
	}
	mustPut(t, p, keep)
	if _, err := p.Trim(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.PinnedBytes != 0 {
		t.Errorf("after the last Trim: %v", s)
	}
}

func TestMaxCached(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithMaxCached(5<<20), WithRetainOnMiss(true))
	var bs []*Block
	for range 8 {
		bs = append(bs, mustGet(t, p, 1<<20))
	}
	first := bs[0].Bytes()
	last := bs[7].Bytes()
	calls := d.CallCounts()
	for _, b := range bs {
		mustPut(t, p, b)
		if s := p.Stats(); s.CachedBytes > 5<<20 {
			t.Fatalf("cached %d bytes over the cap", s.CachedBytes)
		}
	}
	// Puts over the cap make no driver call: unpinning may synchronize
	// the device, so it is deferred to the next miss (or Trim, Reclaim, Close).
	if after := d.CallCounts(); !equalCounts(calls, after) {
		t.Errorf("Puts over the cap called the driver: %v -> %v", calls, after)
	}
	s := p.Stats()
	if s.CachedBytes != 5<<20 || s.Evictions != 3 || s.PinnedBytes != 8<<20 || s.DeferredUnpins != 3 || s.DeferredBytes != 3<<20 || s.Unpins != 0 {
		t.Errorf("after 8 Puts under a 5 MiB cap: %v", s)
	}
	// Least recently released go first: the first block is gone, the last is the next hit.
	b := mustGet(t, p, 1<<20)
	if !sameMem(b.Bytes(), last) || sameMem(b.Bytes(), first) {
		t.Error("the cap did not evict least recently released blocks first")
	}
	mustPut(t, p, b)
	// Slab blocks count as cached but a slab is released only whole. The
	// miss unpins what the cap evicted.
	small := mustGet(t, p, 512)
	if s := p.Stats(); s.DeferredUnpins != 0 || s.DeferredBytes != 0 || s.Unpins != 3 || s.PinnedBytes > 5<<20+int64(slabTarget) {
		t.Errorf("after a miss: %v", s)
	}
	if got := pinmem.Stats().Pinned.Bytes; got != p.Stats().PinnedBytes {
		t.Errorf("ledger %d bytes pinned, the pool says %d", got, p.Stats().PinnedBytes)
	}
	if s := p.Stats(); s.CachedBytes > 5<<20+int64(slabTarget) {
		t.Errorf("%v", s)
	}
	mustPut(t, p, small)
	if s := p.Stats(); s.CachedBytes > 5<<20 {
		t.Errorf("cap exceeded after the slab became idle: %v", s)
	}
}

func TestReleaseOnMiss(t *testing.T) {
	for _, retain := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "retain"}[retain], func(t *testing.T) {
			useFake(t)
			p := newPool(t, WithRetainOnMiss(retain))
			a := mustGet(t, p, 8<<20)
			mustPut(t, p, a)
			b := mustGet(t, p, 2<<20)
			s := p.Stats()
			wantPinned, wantPeak := int64(2<<20), int64(8<<20) // the idle 8 MiB paid for the miss
			if retain {
				wantPinned, wantPeak = 10<<20, 10<<20
			}
			if s.PinnedBytes != wantPinned || s.PeakPinnedBytes != wantPeak {
				t.Errorf("pinned %d (want %d), peak %d (want %d)", s.PinnedBytes, wantPinned, s.PeakPinnedBytes, wantPeak)
			}
			mustPut(t, p, b)
		})
	}
}

func TestPrewarm(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithPrewarm(1<<20, 8<<20))
	s := p.Stats()
	if s.CachedBytes != 8<<20 || s.Gets != 0 || s.PinnedBytes != 8<<20 {
		t.Fatalf("after prewarm: %v", s)
	}
	calls := d.Calls("cuMemHostAlloc")
	var bs []*Block
	for range 8 {
		bs = append(bs, mustGet(t, p, 1<<20-5))
	}
	if d.Calls("cuMemHostAlloc") != calls || p.Stats().Hits != 8 {
		t.Errorf("prewarmed Gets pinned: %v", p.Stats())
	}
	for _, b := range bs {
		mustPut(t, p, b)
	}
}

func TestBudget(t *testing.T) {
	useFake(t)
	pinmem.SetBudget(10 << 20)
	p := newPool(t, WithRetainOnMiss(true))
	// The pool's own retry: withdraw it from pinmem's reclaimers so that
	// only the pool's budget path can free its idle memory.
	p.s.removeReclaimer()
	a := mustGet(t, p, 6<<20)
	mustPut(t, p, a)
	b := mustGet(t, p, 5<<20) // 6 idle + 5 > 10: release idle, retry
	s := p.Stats()
	if s.BudgetRetries != 1 || s.PinnedBytes != 5<<20 || s.CachedBytes != 0 {
		t.Errorf("after the budget retry: %v", s)
	}
	_, err := p.Get(context.Background(), 6<<20) // 5 in use + 6 > 10 with nothing idle
	var be *pinmem.BudgetError
	if !errors.Is(err, pinmem.ErrBudget) || !errors.As(err, &be) || be.Limit != 10<<20 {
		t.Fatalf("over the budget with nothing idle: %v", err)
	}
	if !strings.Contains(err.Error(), "pool ") {
		t.Errorf("error does not name the pool: %v", err)
	}
	if s := p.Stats(); s.BudgetErrors != 1 || s.BudgetRetries != 2 || s.Gets != 2 {
		t.Errorf("after the budget error: %v", s)
	}
	mustPut(t, p, b)
}

func TestReclaimer(t *testing.T) {
	useFake(t)
	pinmem.SetBudget(10 << 20)
	idle := newPool(t, WithName("idle"))
	busy := newPool(t, WithName("busy"))
	var bs []*Block
	for range 3 {
		bs = append(bs, mustGet(t, idle, 2<<20))
	}
	for _, b := range bs {
		mustPut(t, idle, b)
	}
	// 6 MiB idle in one pool; the other needs 8: the budget asks the first.
	b := mustGet(t, busy, 8<<20)
	if s := idle.Stats(); s.Reclaimed < 4<<20 || s.PinnedBytes > 2<<20 {
		t.Errorf("idle pool after the budget's request: %v", s)
	}
	mustPut(t, busy, b)
	if got := idle.s.Reclaim(1); got != 0 && idle.Stats().PinnedBytes != 0 {
		t.Errorf("Reclaim(1) freed %d", got)
	}
}

func TestCloseReportsOutstanding(t *testing.T) {
	useFake(t)
	p, err := New(WithName("leaky"), WithStacks(true))
	if err != nil {
		t.Fatal(err)
	}
	a := mustGet(t, p, 100)
	b := mustGet(t, p, 3<<20)
	c := mustGet(t, p, 5000)
	mustPut(t, p, c)
	err = p.Close(context.Background())
	var oe *OutstandingError
	if !errors.Is(err, ErrOutstanding) || !errors.As(err, &oe) {
		t.Fatalf("Close with blocks out: %v", err)
	}
	if len(oe.Blocks) != 2 || oe.Blocks[0].ID != a.ID() || oe.Blocks[0].Size != 100 || oe.Blocks[1].Size != 3<<20 || oe.Blocks[1].Cap != b.Cap() {
		t.Errorf("outstanding: %+v", oe.Blocks)
	}
	if !strings.Contains(oe.Blocks[0].Stack, "TestCloseReportsOutstanding") || !strings.Contains(err.Error(), "leaky") {
		t.Errorf("report lacks the Get site or the pool's name:\n%v", err)
	}
	// Blocks out stay usable until Put, which then unpins them.
	fill(a.Bytes(), 1)
	fill(b.Bytes(), 2)
	if s := p.Stats(); s.PinnedBytes == 0 || s.InUseBlocks != 2 {
		t.Errorf("after Close: %v", s)
	}
	if _, err := p.Get(context.Background(), 10); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := p.Trim(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Trim after Close: %v", err)
	}
	if err := p.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	mustPut(t, p, a)
	mustPut(t, p, b)
	if s := p.Stats(); s.PinnedBytes != 0 || s.Slabs != 0 {
		t.Errorf("after the last Put: %v", s)
	}
}

func TestPutMisuse(t *testing.T) {
	useFake(t)
	p := newPool(t)
	q := newPool(t)
	b := mustGet(t, p, 64)
	if err := q.Put(b); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Put into another pool: %v", err)
	}
	if err := p.Put(nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Put(nil): %v", err)
	}
	if err := p.Put(b, nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Put with a nil stream: %v", err)
	}
	mustPut(t, p, b) // still out after the refused Puts
	if err := p.Put(b); !errors.Is(err, pinmem.ErrFreed) {
		t.Errorf("second Put: %v", err)
	}
	if _, err := b.DevicePtr(); !errors.Is(err, pinmem.ErrFreed) {
		t.Errorf("DevicePtr after Put: %v", err)
	}
	for _, n := range []int{0, -5, maxSize + 1} {
		if _, err := p.Get(context.Background(), n); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Get(%d): %v", n, err)
		}
	}
	if s := p.Stats(); s.Puts != 1 || s.InUseBlocks != 0 {
		t.Errorf("%v", s)
	}
}

func TestMappedDevicePtr(t *testing.T) {
	useFake(t)
	p := newPool(t, WithFlags(pinmem.Mapped|pinmem.Portable))
	if p.Flags() != pinmem.Mapped|pinmem.Portable {
		t.Errorf("flags %v", p.Flags())
	}
	a, b := mustGet(t, p, 256), mustGet(t, p, 256)
	pa, err := a.DevicePtr()
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.DevicePtr()
	if err != nil || pb-pa != 256 && pa-pb != 256 {
		t.Errorf("slab blocks at %#x and %#x (%v)", pa, pb, err)
	}
	big := mustGet(t, p, 2<<20)
	if _, err := big.DevicePtr(); err != nil {
		t.Error(err)
	}
	mustPut(t, p, a)
	mustPut(t, p, b)
	mustPut(t, p, big)

	u := newPool(t)
	c := mustGet(t, u, 2<<20)
	if _, err := c.DevicePtr(); !errors.Is(err, pinmem.ErrNotMapped) {
		t.Errorf("DevicePtr of an unmapped pool's block: %v", err)
	}
	mustPut(t, u, c)
}

// TestFaultsLeaveNothingPinned injects driver failures into each step of
// a miss: nothing stays pinned, the pool's accounts are unchanged, and the
// pool works again once the fault is gone.
func TestFaultsLeaveNothingPinned(t *testing.T) {
	cases := []struct {
		name, op string
		size     int
		flags    pinmem.Flags
	}{
		{"slab-hostalloc", "cuMemHostAlloc", 1000, 0},
		{"slab-devptr", "cuMemHostGetDevicePointer_v2", 1000, pinmem.Mapped}, // fails after the slab is pinned
		{"large-hostalloc", "cuMemHostAlloc", 1 << 20, pinmem.WriteCombined}, // write-combined memory only comes from cuMemHostAlloc
		{"large-register", "cuMemHostRegister_v2", 8 << 20, 0},
		{"huge-register", "cuMemHostRegister_v2", HugeThreshold + 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := useFake(t)
			p := newPool(t, WithFlags(tc.flags))
			base := pinmem.Stats().Pinned
			if err := d.FailOn(tc.op, 1, cudadrv.ErrorOutOfMemory); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Get(context.Background(), tc.size); err == nil || !strings.Contains(err.Error(), p.Name()) {
				t.Fatalf("Get with %s failing: %v", tc.op, err)
			}
			if d.Calls(tc.op) == 0 {
				t.Fatalf("%s was never called", tc.op)
			}
			if got := pinmem.Stats().Pinned; got != base {
				t.Errorf("ledger %+v after the failure, %+v before", got, base)
			}
			if c := d.Live(); c.HostAllocs != 0 || c.Registrations != 0 {
				t.Errorf("live in the driver: %+v", c)
			}
			if s := p.Stats(); s.PinnedBytes != 0 || s.CachedBlocks != 0 || s.Slabs != 0 || s.Gets != 0 || s.InUseBlocks != 0 {
				t.Errorf("pool after the failure: %v", s)
			}
			d.ClearFaults()
			b := mustGet(t, p, tc.size)
			mustPut(t, p, b)
		})
	}
}

func TestStats(t *testing.T) {
	useFake(t)
	p := newPool(t, WithName("stats-x"))
	b := mustGet(t, p, 1500)
	s := p.Stats()
	str := s.String()
	for _, want := range []string{"pool stats-x", "gets 1", "misses 1", "wasted 36 B", "pinned", "driver"} {
		if !strings.Contains(str, want) {
			t.Errorf("String() = %q lacks %q", str, want)
		}
	}
	if s.Name != "stats-x" || s.Gets != 1 || s.InUseBytes != 1536 || s.RequestedBytes != 1500 || s.PinnedBytes == 0 {
		t.Errorf("stats: %+v", s)
	}
	mustPut(t, p, b)
	if (Stats{}).hitRate() != 0 || (Stats{Gets: 4, Hits: 1}).hitRate() != 0.25 {
		t.Error("HitRate")
	}
}

// TestNamesNeedNotBeUnique: two open pools may share a name (the name is
// a label; nothing is published under it).
func TestNamesNeedNotBeUnique(t *testing.T) {
	useFake(t)
	a := newPool(t, WithName("dup"))
	b := newPool(t, WithName("dup"))
	mustPut(t, a, mustGet(t, a, 100))
	mustPut(t, b, mustGet(t, b, 100))
	if a.Name() != "dup" || b.Name() != "dup" {
		t.Errorf("names %q, %q", a.Name(), b.Name())
	}
}

// TestOptionErrors: New refuses bad options, its own and pinmem's given to
// WithFlags, with a *pinmem.OptionError naming the option and its value,
// matching cuda.ErrInvalidValue.
func TestOptionErrors(t *testing.T) {
	useFake(t)
	cases := []struct {
		opts        []Option
		option, arg string
	}{
		{[]Option{WithName("")}, "WithName", `""`},
		{[]Option{WithFlags(1 << 9)}, "WithFlags", "0x200"},
		// pinmem's options in WithFlags, refused as pinmem.Alloc refuses them
		{[]Option{WithFlags(0, pinmem.WithDevice(nil))}, "pinmem.WithDevice", "nil"},
		{[]Option{WithFlags(pinmem.Mapped, pinmem.WithMethod(pinmem.Method(77)))}, "pinmem.WithMethod", "77"},
		{[]Option{WithFlags(pinmem.Mapped, nil, pinmem.WithMethod(pinmem.Method(77)))}, "pinmem.Option", "nil"},
		{[]Option{WithFlags(0, pinmem.WithThreads(0))}, "pinmem.WithThreads", "0"},
		{[]Option{WithFlags(0, pinmem.WithThreads(1<<16+1))}, "pinmem.WithThreads", "65537"},
		{[]Option{WithFlags(0, pinmem.WithNUMANode(-3))}, "pinmem.WithNUMANode", "-3"},
		{[]Option{WithPrewarm(0, 1)}, "WithPrewarm", "0, 1"},
		{[]Option{WithPrewarm(maxSize+1, 1)}, "WithPrewarm", fmt.Sprintf("%d, 1", maxSize+1)},
		{[]Option{WithPrewarm(4096, -1)}, "WithPrewarm", "4096, -1"},
		{[]Option{WithPrewarm(1<<20, 8<<20), WithMaxCached(1 << 20)}, "WithPrewarm", fmt.Sprintf("%d, %d", 1<<20, 8<<20)},
		{[]Option{WithMaxCached(1 << 20), WithPrewarm(1<<20, 8<<20)}, "WithPrewarm", fmt.Sprintf("%d, %d", 1<<20, 8<<20)},
		{[]Option{nil}, "Option", "nil"},
	}
	for _, tc := range cases {
		p, err := New(tc.opts...)
		var oe *pinmem.OptionError
		if p != nil || !errors.Is(err, cuda.ErrInvalidValue) || !errors.As(err, &oe) || oe.Func != "pool.New" || oe.Option != tc.option || oe.Value != tc.arg {
			t.Errorf("%s(%s): pool %v, error %v (%#v)", tc.option, tc.arg, p, err, oe)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.option+"("+tc.arg+")") {
			t.Errorf("message %q does not name %s(%s)", msg, tc.option, tc.arg)
		}
	}
	if n := pinmem.Stats().Pinned.Buffers; n != 0 {
		t.Errorf("%d buffers pinned after refused options", n)
	}
}

// TestNoLockAcrossDriverCalls checks, at the start of every driver call a
// pool makes, that the pool's mutex is free: no lock is held across a
// driver call (on any path, hits included).
func TestNoLockAcrossDriverCalls(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithMaxCached(3<<20))
	var calls, held atomic.Int64
	d.SetHook(func(op string) cudadrv.Result {
		calls.Add(1)
		if !p.s.mu.TryLock() {
			held.Add(1)
			t.Errorf("%s called with the pool's lock held", op)
		} else {
			p.s.mu.Unlock()
		}
		return cudadrv.Success
	})
	_, s := newStream(t)
	var bs []*Block
	for _, n := range []int{10, 5000, 1 << 20, 2 << 20, 6 << 20, HugeThreshold + 1} {
		bs = append(bs, mustGet(t, p, n))
	}
	for i, b := range bs {
		if i%2 == 0 {
			mustPut(t, p, b, s)
		} else {
			mustPut(t, p, b)
		}
	}
	for _, n := range []int{10, 5000, 1 << 20} {
		mustPut(t, p, mustGet(t, p, n), s)
	}
	_ = p.s.Reclaim(1 << 20)
	if _, err := p.Trim(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, p, mustGet(t, p, 1<<20), s)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.SetHook(nil)
	if calls.Load() < 10 || held.Load() != 0 {
		t.Errorf("%d driver calls, %d with the lock held", calls.Load(), held.Load())
	}
}

// TestNextClassReuse: a Get may take an idle block of a larger class when
// that still wastes at most 1/8 of the request, and never more.
func TestNextClassReuse(t *testing.T) {
	useFake(t)
	p := newPool(t)
	a := mustGet(t, p, 1100) // class 1152
	mustPut(t, p, a)
	b := mustGet(t, p, 1024) // class 1024 is empty; 1152 wastes exactly 1/8
	if b.Cap() != 1152 || p.Stats().Hits != 1 {
		t.Errorf("Get(1024): capacity %d, %v", b.Cap(), p.Stats())
	}
	c := mustGet(t, p, 1000) // 1152 would waste more than 1/8
	if c.Cap() != 1024 || p.Stats().Misses != 2 {
		t.Errorf("Get(1000): capacity %d, %v", c.Cap(), p.Stats())
	}
	if w := p.Stats().WastedBytes; w != 1152-1024+24 {
		t.Errorf("wasted %d", w)
	}
	mustPut(t, p, b)
	mustPut(t, p, c)
}

// TestSegments: a block's segments concatenate to its Bytes, each ending
// at its own end; a block over several registrations is split at their
// boundaries, up to its length.
func TestSegments(t *testing.T) {
	useFake(t)
	p := newPool(t)
	for _, n := range []int{100, 1 << 20, HugeThreshold + 1} {
		b := mustGet(t, p, n)
		segs := b.Segments()
		if len(segs) != 1 || !sameMem(segs[0], b.Bytes()) || len(segs[0]) != n || cap(segs[0]) != n {
			t.Errorf("Get(%d): %d segments (len %d, cap %d)", n, len(segs), len(segs[0]), cap(segs[0]))
		}
		mustPut(t, p, b)
		if b.Segments() != nil {
			t.Errorf("Get(%d): Segments after Put", n)
		}
	}
	// Registrations of 4, 4 and 2 units; blocks of every length.
	mem := make([]byte, 10)
	regs := [][]byte{mem[0:4:4], mem[4:8:8], mem[8:10:10]}
	for n := 1; n <= 10; n++ {
		got := splitAt(mem[:n], regs)
		total := 0
		for i, g := range got {
			if &g[0] != &mem[total] || cap(g) != len(g) || (i < len(got)-1 && len(g) != len(regs[i])) {
				t.Errorf("n=%d: piece %d at %d, len %d, cap %d", n, i, total, len(g), cap(g))
			}
			total += len(g)
		}
		if want := (n + 3) / 4; total != n || len(got) != want {
			t.Errorf("n=%d: %d pieces of %d bytes, want %d pieces", n, len(got), total, want)
		}
	}
}

// A closed pool's errors match cuda.ErrClosed, the one closed sentinel.
func TestClosedIsTheSharedSentinel(t *testing.T) {
	useFake(t)
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(context.Background(), 8); !errors.Is(err, cuda.ErrClosed) || !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v, want cuda.ErrClosed", err)
	}
}
