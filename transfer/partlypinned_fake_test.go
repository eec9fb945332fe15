package transfer

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// partlyPinned returns n bytes of Go memory whose middle part is pinned
// (with flags), and the pinned part's bounds in it; the test frees it.
func partlyPinned(t *testing.T, n int, flags pinmem.Flags, seed uint64) (host []byte, lo, hi int) {
	t.Helper()
	mem := make([]byte, n+int(pageSize))
	base := int((pageSize - addr(mem)%pageSize) % pageSize)
	host = mem[base : base+n]
	lo, hi = n/4&^int(pageSize-1), 3*n/4&^int(pageSize-1)
	b, err := pinmem.Register(host[lo:hi], flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	copy(host, testutil.RandomBytes(n, seed))
	return host, lo, hi
}

// TestFakePartlyPinnedPipeline: a Pipeline Run over partly pinned input
// and output follows the Copier's rule (hostspan.Parts): every chunk's
// pinned parts are copied directly and only the rest is staged, so a
// chunk across a pinned part's edge takes more than one copy each way;
// every byte arrives and no asynchronous copy touches pageable memory.
func TestFakePartlyPinnedPipeline(t *testing.T) {
	const chunk = 64 << 10
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: chunk, Streams: 2, InFlight: 4})
	n := 10*chunk + 4096 + 777
	in, _, _ := partlyPinned(t, n, 0, 31)
	out, _, _ := partlyPinned(t, n, 0, 32)
	pageable0 := e.d.PageableAsyncCopies()
	before := e.d.CallCounts()
	st, err := p.Run(context.Background(), in, out)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, in, out)
	after := e.d.CallCounts()
	chunks := (n + chunk - 1) / chunk
	up, down := after["cuMemcpyHtoDAsync_v2"]-before["cuMemcpyHtoDAsync_v2"], after["cuMemcpyDtoHAsync_v2"]-before["cuMemcpyDtoHAsync_v2"]
	if !st.StagedIn || !st.StagedOut || up <= chunks || down <= chunks {
		t.Errorf("staged in %v out %v, %d copies in and %d out for %d chunks: want both staged and the chunks at a pinned part's edge split",
			st.StagedIn, st.StagedOut, up, down, chunks)
	}
	if k := e.d.PageableAsyncCopies() - pageable0; k != 0 {
		t.Errorf("%d asynchronous copies from or to pageable memory", k)
	}
}

// TestFakePartlyPinnedBroadcast: a Broadcast of a partly pinned source
// (Portable: pinned for every device) copies the pinned part directly, one
// copy per device, and stages only the rest; every device gets every byte.
func TestFakePartlyPinnedBroadcast(t *testing.T) {
	const n = 1 << 20
	e := useMultiFake(t, 2, n)
	m, err := NewMulti(e.ctxs, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	src, lo, hi := partlyPinned(t, n, pinmem.Portable, 33)
	pageable0 := e.d.PageableAsyncCopies()
	before := e.d.CallCounts()
	st, err := m.Broadcast(context.Background(), e.bufs, src)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Staged {
		t.Errorf("%+v: want the pageable part staged", st)
	}
	for _, b := range e.bufs {
		testutil.CheckBytes(t, src, e.deviceBytes(t, b)[:n])
	}
	if k := e.d.PageableAsyncCopies() - pageable0; k != 0 {
		t.Errorf("%d asynchronous copies from or to pageable memory", k)
	}
	// Per device: one direct copy of the pinned part, and the two gaps
	// around it in chunks of the size the staged bytes give.
	ch := m.devs[0].cp.chunkSize(n - (hi - lo))
	per := 1 + (lo+ch-1)/ch + (n-hi+ch-1)/ch
	if got := e.d.CallCounts()["cuMemcpyHtoDAsync_v2"] - before["cuMemcpyHtoDAsync_v2"]; got != 2*per {
		t.Errorf("%d copies, want %d: the pinned part directly and the rest in chunks of %d", got, 2*per, ch)
	}
}
