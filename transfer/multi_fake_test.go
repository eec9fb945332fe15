package transfer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// multiEnv is a fake driver with n devices, their primary contexts and a
// device buffer of size bytes on each.
type multiEnv struct {
	fakeEnv
	ctxs []*cuda.Context
	bufs []*cuda.DeviceBuffer
}

func useMultiFake(t *testing.T, n, size int) multiEnv {
	t.Helper()
	e := multiEnv{fakeEnv: useFake(t, fakedrv.Options{DeviceCount: n})}
	devs, err := allDevices()
	if err != nil || len(devs) != n {
		t.Fatalf("%d devices (%v), want %d", len(devs), err, n)
	}
	for _, d := range devs {
		c, err := d.PrimaryContext()
		if err != nil {
			t.Fatal(err)
		}
		e.ctxs = append(e.ctxs, c)
		b, err := c.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.Free(); err != nil {
				t.Errorf("freeing device buffer: %v", err)
			}
		})
		e.bufs = append(e.bufs, b)
	}
	return e
}

func (e multiEnv) multi(t *testing.T, ctxs []*cuda.Context, opts ...Option) *Multi {
	t.Helper()
	m, err := NewMulti(ctxs, append(smallRing(), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

func views(t *testing.T, bufs []*cuda.DeviceBuffer, n int) []*cuda.DeviceBuffer {
	t.Helper()
	out := make([]*cuda.DeviceBuffer, len(bufs))
	for i, b := range bufs {
		v, err := b.Slice(0, n)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

func TestFakeMultiBroadcastGatherScatter(t *testing.T) {
	for _, ndev := range []int{1, 4} {
		t.Run(fmt.Sprintf("%ddevices", ndev), func(t *testing.T) {
			const size = 1<<20 + 4096
			e := useMultiFake(t, ndev, size)
			m := e.multi(t, e.ctxs)
			if m.Devices() != ndev {
				t.Fatalf("Devices() = %d", m.Devices())
			}
			for _, n := range []int{1, 4095, 64<<10 - 1, 3*64<<10 + 17, size} {
				for _, b := range e.bufs {
					if err := b.Memset(0x5a); err != nil {
						t.Fatal(err)
					}
				}
				src := testutil.RandomBytes(n, uint64(n))
				st, err := m.Broadcast(context.Background(), views(t, e.bufs, n), src)
				if err != nil {
					t.Fatalf("Broadcast %d bytes: %v", n, err)
				}
				if st.Bytes != int64(n) || st.Devices != ndev || !st.Staged || st.Direction != HostToDevice || st.GBps() <= 0 {
					t.Fatalf("Broadcast stats %+v", st)
				}
				for i, b := range e.bufs {
					got := e.deviceBytes(t, b)
					testutil.CheckBytes(t, src, got[:n])
					if n < size && got[n] != 0x5a {
						t.Fatalf("device %d: Broadcast wrote past %d bytes", i, n)
					}
				}
				// Gather into poisoned host memory, each device its own data.
				for i, b := range e.bufs {
					if _, err := b.WriteAt(testutil.RandomBytes(n, uint64(1000*i+n)), 0); err != nil {
						t.Fatal(err)
					}
				}
				dsts := make([][]byte, ndev)
				for i := range dsts {
					dsts[i] = make([]byte, n+8)
					testutil.Poison(dsts[i])
				}
				trimmed := make([][]byte, ndev)
				for i := range dsts {
					trimmed[i] = dsts[i][:n]
				}
				gs, err := m.Gather(context.Background(), trimmed, e.bufs)
				if err != nil {
					t.Fatalf("Gather %d bytes: %v", n, err)
				}
				if len(gs.PerDevice) != ndev || gs.Bytes != int64(n) || gs.Direction != DeviceToHost {
					t.Fatalf("Gather stats %+v", gs)
				}
				for i := range dsts {
					testutil.CheckBytes(t, testutil.RandomBytes(n, uint64(1000*i+n)), dsts[i][:n])
					for _, b := range dsts[i][n:] {
						if b != testutil.PoisonByte {
							t.Fatalf("device %d: Gather wrote past %d bytes", i, n)
						}
					}
				}
				// Scatter: different data to each device.
				srcs := make([][]byte, ndev)
				for i := range srcs {
					srcs[i] = testutil.RandomBytes(n, uint64(7*i+n+1))
				}
				if _, err := m.Scatter(context.Background(), e.bufs, srcs); err != nil {
					t.Fatalf("Scatter: %v", err)
				}
				for i, b := range e.bufs {
					testutil.CheckBytes(t, srcs[i], e.deviceBytes(t, b)[:n])
				}
			}
		})
	}
}

// TestFakeMultiPinnedAndSecondContext: a portable pinned source is copied
// directly to every context, including a second context on device 0.
func TestFakeMultiPinnedAndSecondContext(t *testing.T) {
	const n = 256 << 10
	e := useMultiFake(t, 2, n)
	dev0, _ := cuda.GetDevice(0)
	c2, err := cuda.NewContext(dev0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c2.Destroy(); err != nil {
			t.Error(err)
		}
	})
	b2, err := c2.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Free()
	ctxs := append(append([]*cuda.Context(nil), e.ctxs...), c2)
	bufs := append(append([]*cuda.DeviceBuffer(nil), e.bufs...), b2)
	m := e.multi(t, ctxs)
	pb, err := pinmem.Alloc(n, pinmem.Portable)
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Free()
	remove := m.AddPinned(pb)
	defer remove()
	src := pb.Bytes()
	copy(src, testutil.RandomBytes(n, 99))
	st, err := m.Broadcast(context.Background(), bufs, src)
	if err != nil {
		t.Fatal(err)
	}
	if st.Staged || st.Devices != 3 {
		t.Fatalf("pinned broadcast stats %+v", st)
	}
	for _, b := range bufs {
		testutil.CheckBytes(t, src, e.deviceBytes(t, b))
	}
	// A Portable pinmem buffer is recognised without AddPinned; one that
	// is not Portable is pinned for its own context only and is staged.
	remove()
	if st, err := m.Broadcast(context.Background(), bufs, src[:1000]); err != nil || st.Staged {
		t.Fatalf("after remove: %+v, %v", st, err)
	}
	np, err := pinmem.Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer np.Free()
	copy(np.Bytes(), src)
	if st, err := m.Broadcast(context.Background(), bufs, np.Bytes()); err != nil || !st.Staged {
		t.Fatalf("not portable: %+v, %v", st, err)
	}
	for _, b := range bufs {
		testutil.CheckBytes(t, src, e.deviceBytes(t, b))
	}
}

func TestFakeMultiCancel(t *testing.T) {
	const n = 1 << 20
	e := useMultiFake(t, 4, n)
	m := e.multi(t, e.ctxs)
	src := testutil.RandomBytes(n, 5)
	// Hold device 2's stream: Broadcast fills the ring and blocks on it.
	h := cudadrv.Stream(multiStreams(m)[2].Handle())
	if err := e.d.HoldStream(h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(30 * time.Millisecond)
		cancel()
		time.Sleep(30 * time.Millisecond)
		released <- time.Now()
		if err := e.d.ReleaseStream(h); err != nil {
			t.Error(err)
		}
	}()
	_, err := m.Broadcast(ctx, e.bufs, src)
	end := time.Now()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Broadcast: %v", err)
	}
	if rel := <-released; !end.Before(rel) {
		t.Fatal("cancelled Broadcast waited for the held device instead of returning")
	}
	// Already cancelled: nothing starts.
	if _, err := m.Broadcast(ctx, e.bufs, src); !errors.Is(err, context.Canceled) {
		t.Fatalf("Broadcast with a cancelled context: %v", err)
	}
	dsts := make([][]byte, 4)
	for i := range dsts {
		dsts[i] = make([]byte, n)
	}
	if _, err := m.Gather(ctx, dsts, e.bufs); !errors.Is(err, context.Canceled) {
		t.Fatalf("Gather with a cancelled context: %v", err)
	}
	// Still usable afterwards.
	if _, err := m.Broadcast(context.Background(), e.bufs, src); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.bufs {
		testutil.CheckBytes(t, src, e.deviceBytes(t, b))
	}
}

func TestFakeMultiErrors(t *testing.T) {
	const n = 64 << 10
	e := useMultiFake(t, 4, n)
	if _, err := NewMulti(nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("NewMulti(nil): %v", err)
	}
	if _, err := NewMulti([]*cuda.Context{e.ctxs[0], nil}); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("NewMulti with a nil context: %v", err)
	}
	s, err := e.ctxs[0].NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if _, err := NewMulti(e.ctxs, WithStream(s)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("NewMulti with WithStream: %v", err)
	}
	m := e.multi(t, e.ctxs)
	ctx := context.Background()
	if _, err := m.Broadcast(ctx, e.bufs[:3], make([]byte, 10)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Broadcast to 3 of 4: %v", err)
	}
	var se *SizeError
	if _, err := m.Broadcast(ctx, e.bufs, make([]byte, n+1)); !errors.As(err, &se) || !strings.Contains(se.Op, "device 0") {
		t.Errorf("Broadcast too large: %v", err)
	}
	if _, err := m.Broadcast(ctx, []*cuda.DeviceBuffer{e.bufs[0], nil, e.bufs[2], e.bufs[3]}, make([]byte, 10)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Broadcast to nil: %v", err)
	}
	if _, err := m.Gather(ctx, make([][]byte, 2), e.bufs); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("Gather with 2 destinations: %v", err)
	}
	big := [][]byte{make([]byte, 10), make([]byte, n+1), make([]byte, 10), make([]byte, 10)}
	if _, err := m.Gather(ctx, big, e.bufs); !errors.As(err, &se) || !strings.Contains(err.Error(), "device 1") {
		t.Errorf("Gather too large: %v", err)
	}
	// An asynchronous copy failure on one device is reported, after draining.
	if err := e.d.FailAsync("cuMemcpyHtoDAsync_v2", 3, cudadrv.ErrorIllegalAddress); err != nil {
		t.Fatal(err)
	}
	_, err = m.Broadcast(ctx, e.bufs, testutil.RandomBytes(n, 1))
	e.d.ClearFaults()
	if err == nil || !strings.Contains(err.Error(), "device") {
		t.Errorf("Broadcast with a failing copy: %v", err)
	}
	if st := e.d.Live(); st.PendingOps != 0 {
		t.Errorf("%d operations still queued after a failed Broadcast", st.PendingOps)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Broadcast(ctx, e.bufs, []byte{1}); !errors.Is(err, ErrClosed) {
		t.Errorf("Broadcast after Close: %v", err)
	}
	if _, err := m.Gather(ctx, make([][]byte, 4), e.bufs); !errors.Is(err, ErrClosed) {
		t.Errorf("Gather after Close: %v", err)
	}
	if err := m.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestFakeMultiNewFailureReleases: a failure part-way through NewMulti
// leaves nothing behind (the fake's leak check runs at the end).
func TestFakeMultiNewFailureReleases(t *testing.T) {
	e := useMultiFake(t, 4, 4096)
	for _, op := range []string{"cuStreamCreate", "cuEventCreate", "cuMemHostAlloc"} {
		for _, nth := range []int{1, 3, 7, 15} {
			if err := e.d.FailOn(op, nth, cudadrv.ErrorOutOfMemory); err != nil {
				t.Fatal(err)
			}
			m, err := NewMulti(e.ctxs, smallRing()...)
			e.d.ClearFaults()
			if err == nil {
				if err := m.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if m != nil {
				t.Fatalf("NewMulti failed (%v) but returned a Multi", err)
			}
		}
	}
}
