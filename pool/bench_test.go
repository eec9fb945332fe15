package pool

import (
	"context"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// BenchmarkGetPut1MiB compares, on the GPU, taking and returning 1 MiB of
// pinned memory: a pool hit with a plain Put ("pool-hit"), a pool hit with
// a stream-ordered Put (an event recorded on an idle stream at Put, found
// complete by the next Get: "pool-hit-stream-ordered"), and pinning and
// unpinning with cuMemHostAlloc + cuMemFreeHost ("hostalloc-free", through
// pinmem.Alloc with MethodHostAlloc). The ratio of hostalloc-free's ns/op
// to pool-hit's is the saving.
func BenchmarkGetPut1MiB(b *testing.B) {
	testutil.RequireGPU(b)
	const size = 1 << 20
	newBenchPool := func(b *testing.B) *Pool {
		p, err := New()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := p.Close(context.Background()); err != nil {
				b.Error(err)
			}
		})
		mustPut(b, p, mustGet(b, p, size)) // warm: the timed Gets hit
		return p
	}
	b.Run("pool-hit", func(b *testing.B) {
		p := newBenchPool(b)
		b.ReportAllocs()
		for b.Loop() {
			blk, err := p.Get(context.Background(), size)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Put(blk); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportPool(b, p)
	})
	b.Run("pool-hit-stream-ordered", func(b *testing.B) {
		p := newBenchPool(b)
		_, s := newStream(b)
		b.ReportAllocs()
		for b.Loop() {
			blk, err := p.Get(context.Background(), size)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Put(blk, s); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportPool(b, p)
	})
	b.Run("hostalloc-free", func(b *testing.B) {
		for b.Loop() {
			buf, err := pinmem.Alloc(size, 0, pinmem.WithMethod(pinmem.MethodHostAlloc))
			if err != nil {
				b.Fatal(err)
			}
			if err := buf.Free(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func reportPool(b *testing.B, p *Pool) {
	st := p.Stats()
	b.ReportMetric(100*st.hitRate(), "hit%")
	b.ReportMetric(float64(st.EventsCreated), "events-created")
	b.ReportMetric(float64(st.DriverTime.Nanoseconds())/float64(max(st.Gets, 1)), "driver-ns/get")
}
