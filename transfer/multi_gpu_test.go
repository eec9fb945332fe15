package transfer

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestGPUMultiBroadcastGather broadcasts random data to every GPU present
// (plus a second context on device 0, which shows the portable staging ring
// works from a context other than the one that pinned it), checks every
// device's copy through poisoned host memory, then gathers different data
// from every device at once. With one GPU it runs on that GPU and its
// second context; with more it uses all of them.
func TestGPUMultiBroadcastGather(t *testing.T) {
	testutil.RequireGPU(t)
	devs, err := allDevices()
	if err != nil {
		t.Fatal(err)
	}
	var ctxs []*cuda.Context
	for _, d := range devs {
		c, err := d.PrimaryContext()
		if err != nil {
			t.Fatal(err)
		}
		ctxs = append(ctxs, c)
	}
	c2, err := cuda.NewContext(devs[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Destroy()
	ctxs = append(ctxs, c2)
	t.Logf("%d devices, %d contexts", len(devs), len(ctxs))
	const n = 96<<20 + 12345
	var bufs []*cuda.DeviceBuffer
	for _, c := range ctxs {
		b, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		bufs = append(bufs, b)
	}
	m, err := NewMulti(ctxs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	src := testutil.RandomBytes(n, 42)
	for _, b := range bufs {
		if err := b.Memset(0xEE); err != nil {
			t.Fatal(err)
		}
	}
	st, err := m.Broadcast(ctx, bufs, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broadcast: %d bytes to %d contexts in %v, %.1f GB/s aggregate", st.Bytes, st.Devices, st.Wall, st.GBps())
	back := make([]byte, n)
	for i, b := range bufs {
		testutil.Poison(back)
		if _, err := b.ReadAt(back, 0); err != nil {
			t.Fatal(err)
		}
		t.Logf("context %d", i)
		testutil.CheckBytes(t, src, back)
	}
	want := make([][]byte, len(bufs))
	dsts := make([][]byte, len(bufs))
	for i, b := range bufs {
		want[i] = testutil.RandomBytes(n, uint64(100+i))
		if _, err := b.WriteAt(want[i], 0); err != nil {
			t.Fatal(err)
		}
		dsts[i] = make([]byte, n)
		testutil.Poison(dsts[i])
	}
	gs, err := m.Gather(ctx, dsts, bufs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gather: %d bytes from %d contexts in %v, %.1f GB/s aggregate", gs.Bytes, gs.Devices, gs.Wall, gs.GBps())
	for i := range dsts {
		testutil.CheckBytes(t, want[i], dsts[i])
	}
	// Scatter back different data, read it on the device side.
	for i := range want {
		want[i] = testutil.RandomBytes(n, uint64(200+i))
	}
	if _, err := m.Scatter(ctx, bufs, want); err != nil {
		t.Fatal(err)
	}
	for i, b := range bufs {
		testutil.Poison(back)
		if _, err := b.ReadAt(back, 0); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, want[i], back)
	}
}
