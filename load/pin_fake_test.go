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
// stages exceed pinmem's budget is made; its first load returns the
// *pinmem.BudgetError, having read nothing and leaving nothing pinned; a
// load once the budget allows pins the stages (depth x stage size) and
// delivers every byte, and Close unpins them.
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
	if st.ReadBytes != 0 || st.Bytes != 0 {
		t.Errorf("the load that could not pin read %d and delivered %d bytes", st.ReadBytes, st.Bytes)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 || l.PinnedBytes() != 0 {
		t.Errorf("%d bytes pinned after the failed pinning (PinnedBytes %d), want 0", got, l.PinnedBytes())
	}
	if z := make([]byte, len(data)); testutil.FirstMismatch(z, e.deviceBytes(t, dst, len(data))) >= 0 {
		t.Error("the load that could not pin wrote device memory")
	}
	pinmem.SetBudget(prev)
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatalf("load once the budget allows: %v", err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if got := pinmem.Stats().Pinned.Bytes - before; got != depth*stage || l.PinnedBytes() != depth*stage {
		t.Errorf("%d bytes pinned after the load (PinnedBytes %d), want %d", got, l.PinnedBytes(), depth*stage)
	}
	if !l.aligned {
		t.Error("pinmem's page-aligned stages are not marked aligned for direct I/O")
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 {
		t.Errorf("%d bytes pinned after Close, want 0", got)
	}
}

// TestFakePinFailsPartWay: pinning fails at the third stage (the
// driver's cuMemHostAlloc refuses): the load returns the driver's error
// and the two stages it had pinned are freed; the next load pins all.
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
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 || e.d.Live().HostAllocs != hostAllocs {
		t.Errorf("after the failed pinning: %d bytes pinned, %d host allocations live (%d before)", got, e.d.Live().HostAllocs, hostAllocs)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if l.PinnedBytes() != 4*64<<10 {
		t.Errorf("PinnedBytes %d after the load, want 4 x 64 KiB", l.PinnedBytes())
	}
}

// TestFakeFirstLoadsAtOnce: loads started at once on a Loader that never
// loaded pin its stages once (they take turns), and every byte arrives;
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
	if got, pins := pinmem.Stats().Pinned.Bytes-before, pinmem.Stats().Allocs-allocs; got != depth*stage || pins != depth {
		t.Errorf("6 first loads at once: %d bytes pinned in %d buffers, want %d in %d", got, pins, depth*stage, depth)
	}

	idle, err := New(e.ctx, WithStageSize(stage), WithDepth(depth))
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(context.Background()); err != nil {
		t.Errorf("Close of a Loader that never loaded: %v", err)
	}
}

// TestFakePinStopsWhenCanceled: a first load whose context ends while it
// pins the stages (here at the second stage's cuMemHostAlloc) pins no
// further stage: it returns an error matching ctx.Err(), having read
// nothing and leaving nothing pinned, and the next load pins them all.
// Pinning is the first load's longest step (a ring of up to 64 GiB), so
// a cancel must not wait for all of it.
func TestFakePinStopsWhenCanceled(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 33)
	const depth = 8
	l := e.loader(t, WithDepth(depth))
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
	if pins := e.d.Calls("cuMemHostAlloc") - allocs; pins > 2 {
		t.Errorf("the canceled load pinned %d of %d stages, want at most 2 (none after the cancel)", pins, depth)
	}
	if got := pinmem.Stats().Pinned.Bytes - before; got != 0 || l.PinnedBytes() != 0 || st.ReadBytes != 0 {
		t.Errorf("after the canceled pinning: %d bytes pinned (PinnedBytes %d), %d read; want none", got, l.PinnedBytes(), st.ReadBytes)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if l.PinnedBytes() != depth*64<<10 {
		t.Errorf("PinnedBytes %d after the next load, want %d", l.PinnedBytes(), depth*64<<10)
	}
}
