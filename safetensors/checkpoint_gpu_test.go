package safetensors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
)

// TestGPULoadCheckpoint loads a sharded checkpoint of 1 GiB (64 MiB with
// -short) onto the GPU by each read path, every tensor into its own
// allocation, checks every byte, and logs the rate and when the first
// tensor was on the device.
func TestGPULoadCheckpoint(t *testing.T) {
	ctx := testutil.GPUContext(t)
	total, hidden := int64(1<<30), int64(4096)
	if testing.Short() {
		total, hidden = 64<<20, 1024
	}
	ck := writeCheckpoint(t, 4, total, hidden)
	bufs := map[string]*cuda.DeviceBuffer{}
	for name, s := range ck.specs {
		if _, n, _ := byteLen(s.Shape, s.DType); n > 0 {
			b, err := ctx.Alloc(int(n))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Free() })
			bufs[name] = b
		}
	}
	for _, mode := range []load.Mode{load.ModeBuffered, load.ModeMapped, load.ModeDirect} {
		l, err := load.New(ctx, load.WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bufs {
			if err := b.Memset(0); err != nil {
				t.Fatal(err)
			}
		}
		var first atomic.Int64
		t0 := time.Now()
		st, err := LoadCheckpoint(context.Background(), l, ck.index, Whole(Into(bufs)), func(Tensor) {
			first.CompareAndSwap(0, int64(time.Since(t0)))
		})
		if cerr := l.Close(context.Background()); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		t.Logf("%v: %d bytes in %v, %.2f GB/s, mode %v, fallback %q, first tensor after %v",
			mode, st.Bytes, st.Wall, st.GBps(), st.Mode, st.Fallback, time.Duration(first.Load()))
		for name, b := range bufs {
			back := make([]byte, b.Size())
			if _, err := b.ReadAt(back, 0); err != nil {
				t.Fatal(err)
			}
			testutil.CheckBytes(t, tensorData(ck.seed[name], int64(b.Size())), back)
		}
	}
}
