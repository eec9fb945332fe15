package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// fakeEnv is a fake driver with a primary context.
type fakeEnv struct {
	d   *fakedrv.Driver
	ctx *cuda.Context
}

// useFake installs a fake driver and checks at the end of the test that
// nothing is left: no pinned memory, device memory, stream or event.
func useFake(t *testing.T, opts fakedrv.Options) fakeEnv {
	t.Helper()
	d := testutil.UseFake(t, opts)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	pinned0 := pinmem.Stats().Pinned
	t.Cleanup(func() {
		c := d.Live()
		if c.HostAllocs != 0 || c.Registrations != 0 || c.DeviceAllocs != 0 || c.Streams != 0 || c.Events != 0 || c.Modules != 0 {
			t.Errorf("fake driver objects left at the end: %+v", c)
		}
		if p := pinmem.Stats().Pinned; p != pinned0 {
			t.Errorf("pinmem ledger: %+v pinned at the end, %+v at the start", p, pinned0)
		}
	})
	return fakeEnv{d, ctx}
}

func (e fakeEnv) copier(t *testing.T, opts ...Option) *Copier {
	t.Helper()
	c, err := New(e.ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func (e fakeEnv) devbuf(t *testing.T, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := e.ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Errorf("freeing device buffer: %v", err)
		}
	})
	return b
}

// deviceBytes returns the fake device memory of b.
func (e fakeEnv) deviceBytes(t *testing.T, b *cuda.DeviceBuffer) []byte {
	t.Helper()
	m, err := e.d.DeviceBytes(cudadrv.DevicePtr(b.Ptr()), uint64(b.Size()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func smallRing() []Option {
	return []Option{WithStageSize(64 << 10), WithDepth(3), WithParallelism(4)}
}

func TestFakeRoundTrip(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 1<<20+4096)
	for _, n := range []int{1, 7, 4095, 4096, 64<<10 - 1, 64 << 10, 64<<10 + 1, 3*64<<10 + 17, 1<<20 + 4096} {
		for _, off := range []int{0, 1, 13} {
			if off+n > dev.Size() {
				continue
			}
			src := testutil.RandomBytes(off+n, uint64(n*31+off))[off:]
			view, err := dev.Slice(0, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := dev.Memset(0x5a); err != nil {
				t.Fatal(err)
			}
			st, err := c.HtoD(context.Background(), view, src)
			if err != nil {
				t.Fatalf("HtoD %d bytes: %v", n, err)
			}
			if st.Bytes != int64(n) || st.StagedBytes != int64(n) || st.Direction != HostToDevice {
				t.Fatalf("HtoD %d bytes: stats %+v", n, st)
			}
			got := e.deviceBytes(t, dev)
			testutil.CheckBytes(t, src, got[:n])
			if n < dev.Size() && got[n] != 0x5a {
				t.Fatalf("HtoD %d bytes wrote past the end", n)
			}
			back := make([]byte, n+off+5)
			testutil.Poison(back)
			st, err = c.DtoH(context.Background(), back[off:off+n], view)
			if err != nil {
				t.Fatalf("DtoH %d bytes: %v", n, err)
			}
			if st.Bytes != int64(n) || st.Direction != DeviceToHost {
				t.Fatalf("DtoH stats %+v", st)
			}
			testutil.CheckBytes(t, src, back[off:off+n])
			for i, b := range append(back[:off:off], back[off+n:]...) {
				if b != testutil.PoisonByte {
					t.Fatalf("DtoH %d bytes at offset %d wrote outside its destination (byte %d)", n, off, i)
				}
			}
		}
	}
}
