package load

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestFakeFirstLoadPinsUnderBudget: New pins nothing, so a Loader whose
// stages exceed pinmem's budget is made; its first load pins stages as
// its reads take them and returns the *pinmem.BudgetError of the first
// stage over the budget, the stages it pinned kept by the Loader (within
// the budget); a load once the budget allows pins the rest (depth x stage
// size) and delivers every byte, and Close unpins them.
func TestFakeFirstLoadPinsUnderBudget(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 31)
	const depth, stage = 8, 64 << 10
	before := pinmem.Stats().Pinned.Bytes
	prev := pinmem.SetBudget(pinmem.Stats().Reserved + 200<<10) // 3 stages, not 8
	defer pinmem.SetBudget(prev)
	l, err := New(e.ctx, WithStageSize(stage), WithDepth(depth), WithParallelism(4))
	if err != nil {
		t.Fatalf("New under a budget smaller than its stages: %v (it pins nothing)", err)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 {
		t.Errorf("New pinned %d bytes, want 0", got)
	}
	dst := e.devbuf(t, len(data))
	st, err := l.LoadFile(context.Background(), path, dst)
	var be *pinmem.BudgetError
	if !errors.Is(err, pinmem.ErrBudget) || !errors.As(err, &be) || be.Requested != stage {
		t.Fatalf("first load of 8 stages of 64 KiB under a 200 KiB budget: %v, want the *pinmem.BudgetError", err)
	}
	if st.Bytes == int64(len(data)) {
		t.Errorf("the load that could not pin its stages delivered all %d bytes", st.Bytes)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != l.PinnedBytes() || got > 3*stage {
		t.Errorf("%d bytes pinned after the budget refused a stage (PinnedBytes %d), want the Loader's stages within the budget", got, l.PinnedBytes())
	}
	pinmem.SetBudget(prev)
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatalf("load once the budget allows: %v", err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if got := pinmem.Stats().Pinned.Bytes - before; got != depth*stage || l.PinnedBytes() != depth*stage {
		t.Errorf("%d bytes pinned after the load (PinnedBytes %d), want %d", got, l.PinnedBytes(), depth*stage)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 {
		t.Errorf("%d bytes pinned after Close, want 0", got)
	}
}

// TestFakePinFailsPartWay: pinning fails at the third stage (the
// driver's cuMemHostAlloc refuses): the load returns the driver's error,
// the stages it had pinned stay with the Loader (nothing else is left
// pinned), and the next load pins the rest, none twice.
func TestFakePinFailsPartWay(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 32)
	l := e.loader(t, WithDepth(4))
	dst := e.devbuf(t, len(data))
	before := pinmem.Stats().Pinned.Bytes
	hostAllocs := e.d.Live().HostAllocs
	if err := e.d.FailOn("cuMemHostAlloc", 3, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("load whose third stage cannot be pinned: %v, want the driver's ErrOutOfMemory", err)
	}
	e.d.ClearFaults()
	if got, live := pinmem.Stats().Pinned.Bytes-before, e.d.Live().HostAllocs-hostAllocs; got != l.PinnedBytes() || int64(live)*64<<10 != got || live > 3 {
		t.Errorf("after the failed pinning: %d bytes pinned in %d host allocations, PinnedBytes %d; want the Loader's stages, at most 3", got, live, l.PinnedBytes())
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if l.PinnedBytes() != 4*64<<10 || e.d.Live().HostAllocs-hostAllocs != 4 {
		t.Errorf("PinnedBytes %d after the load in %d host allocations, want 4 x 64 KiB in 4", l.PinnedBytes(), e.d.Live().HostAllocs-hostAllocs)
	}
}

// TestFakeFirstLoadsAtOnce: loads started at once on a Loader that never
// loaded pin each stage once (they take turns), and every byte arrives;
// a load of no bytes pins nothing, and Close with nothing pinned works.
func TestFakeFirstLoadsAtOnce(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	const depth, stage = 6, 64 << 10
	before, allocs := pinmem.Stats().Pinned.Bytes, pinmem.Stats().Allocs
	l := e.loader(t)
	if st, err := l.LoadFiles(context.Background(), nil, nil); err != nil || st.Bytes != 0 {
		t.Fatalf("load of no ranges: %+v, %v", st, err)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 {
		t.Errorf("a load of no bytes pinned %d bytes", got)
	}
	var wg sync.WaitGroup
	for g := range 6 {
		path, data := tempFile(t, 300000+g*4096, uint64(40+g))
		dst := e.devbuf(t, len(data))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
				t.Error(err)
				return
			}
			if off := testutil.FirstMismatch(data, e.deviceBytes(t, dst, len(data))); off >= 0 {
				t.Errorf("goroutine %d: differs at %d", g, off)
			}
		}()
	}
	wg.Wait()
	if got, pins := pinmem.Stats().Pinned.Bytes-before, pinmem.Stats().Allocs-allocs; pins == 0 || pins > depth || got != pins*stage || got != l.PinnedBytes() {
		t.Errorf("6 first loads at once: %d bytes pinned in %d buffers (PinnedBytes %d), want 1 to %d stages of %d, each pinned once", got, pins, l.PinnedBytes(), depth, stage)
	}

	idle, err := New(e.ctx, WithStageSize(stage), WithDepth(depth))
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(context.Background()); err != nil {
		t.Errorf("Close of a Loader that never loaded: %v", err)
	}
}

// TestFakePinStopsWhenCanceled: a first load whose context ends while its
// readers pin stages (here at the second stage's cuMemHostAlloc) pins no
// further stage than those its readers were already pinning: it returns
// an error matching ctx.Err(), the stages pinned kept by the Loader, and
// the next load pins the rest. A ring can take seconds to pin (up to 64
// GiB), so a cancel must not wait for all of it.
func TestFakePinStopsWhenCanceled(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 33)
	const depth = 8
	l := e.loader(t, WithDepth(depth), WithParallelism(2))
	dst := e.devbuf(t, len(data))
	before, allocs := pinmem.Stats().Pinned.Bytes, e.d.Calls("cuMemHostAlloc")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int32
	e.d.SetHook(func(op string) cudadrv.Result {
		if op == "cuMemHostAlloc" && n.Add(1) == 2 {
			cancel()
		}
		return cudadrv.Success
	})
	st, err := l.LoadFile(ctx, path, dst)
	e.d.SetHook(nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("load canceled while pinning: %v, want context.Canceled", err)
	}
	// The first stage, the second (whose pinning cancels), and the other
	// reader's if it was about to pin: none begun after the cancel.
	if pins := e.d.Calls("cuMemHostAlloc") - allocs; pins > 3 {
		t.Errorf("the canceled load pinned %d of %d stages, want at most 3 (none begun after the cancel)", pins, depth)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != l.PinnedBytes() || st.Bytes == int64(len(data)) {
		t.Errorf("after the canceled load: %d bytes pinned (PinnedBytes %d), %d delivered; want the Loader's stages and not every byte", got, l.PinnedBytes(), st.Bytes)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if l.PinnedBytes() != depth*64<<10 {
		t.Errorf("PinnedBytes %d after the next load, want %d", l.PinnedBytes(), depth*64<<10)
	}
}

// TestFakeLoadPinsTheStagesItUses: a load pins a stage when a read first
// takes it, not the whole ring before its first read: a Loader of 8
// stages whose first load is one 4 KiB read pins one stage (as a
// transfer.Copier that moves 4 KiB pins 1 MiB, not its ring), and its
// first range waits for that stage alone; later small loads take that
// stage again rather than pin another. A larger load pins the rest.
func TestFakeLoadPinsTheStagesItUses(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	const depth, stage = 8, 64 << 10
	small, sdata := tempFile(t, 4096, 34)
	big, bdata := tempFile(t, 1<<20, 35)
	l := e.loader(t, WithDepth(depth))
	dst := e.devbuf(t, len(bdata))
	before := pinmem.Stats().Pinned.Bytes
	st, err := l.LoadFile(context.Background(), small, dst)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, sdata, e.deviceBytes(t, dst, len(sdata)))
	if got := pinmem.Stats().Pinned.Bytes - before; st.Reads != 1 || got != stage || l.PinnedBytes() != stage {
		t.Errorf("a first load of %d read(s) of 4 KiB pinned %d bytes (PinnedBytes %d), want one stage of %d", st.Reads, got, l.PinnedBytes(), stage)
	}
	for i := range 2 * depth { // later small loads reuse that stage
		if _, err := l.LoadFile(context.Background(), small, dst); err != nil {
			t.Fatal(err)
		}
		if l.PinnedBytes() != stage {
			t.Fatalf("small load %d: PinnedBytes %d, want the one stage of %d", i+2, l.PinnedBytes(), stage)
		}
	}
	testutil.CheckBytes(t, sdata, e.deviceBytes(t, dst, len(sdata)))
	if _, err := l.LoadFile(context.Background(), big, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, bdata, e.deviceBytes(t, dst, len(bdata)))
	if got := pinmem.Stats().Pinned.Bytes - before; got != depth*stage {
		t.Errorf("after a load of 16 stages' worth: %d bytes pinned, want the ring's %d", got, depth*stage)
	}
}
