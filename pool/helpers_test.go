package pool

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
)

// useFake installs a fake driver and checks, when the test ends (after
// the pools made with newPool are closed), that nothing is left pinned and
// no event is left alive.
func useFake(t *testing.T) *fakedrv.Driver {
	t.Helper()
	return useFakeOpts(t, fakedrv.Options{})
}

// useFakeOpts is useFake with a fake driver configured by opts.
func useFakeOpts(t *testing.T, opts fakedrv.Options) *fakedrv.Driver {
	t.Helper()
	base := pinmem.Stats()
	d := testutil.UseFake(t, opts)
	t.Cleanup(func() {
		pinmem.SetBudget(0)
		s := pinmem.Stats()
		if s.Pinned != base.Pinned {
			t.Errorf("ledger: %+v pinned at the end, %+v at the start", s.Pinned, base.Pinned)
		}
		if c := d.Live(); c.HostAllocs != 0 || c.Registrations != 0 {
			t.Errorf("fake driver: %d host allocations (%d bytes), %d registrations (%d bytes) live",
				c.HostAllocs, c.HostAllocBytes, c.Registrations, c.RegisteredBytes)
		}
		if n, _ := track.Count(track.Event); n != 0 {
			t.Errorf("%d events live:\n%s", n, track.Report())
		}
	})
	return d
}

// newPool makes a pool that is closed when the test ends; Close must then
// succeed (or report that the test closed it already).
func newPool(t *testing.T, opts ...Option) *Pool {
	t.Helper()
	p, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func mustGet(t testing.TB, p *Pool, size int) *Block {
	t.Helper()
	b, err := p.Get(context.Background(), size)
	if err != nil {
		t.Fatalf("Get(%d): %v", size, err)
	}
	if b.Len() != size || len(b.Bytes()) != size || b.Cap() < size || cap(b.Bytes()) != b.Cap() {
		t.Fatalf("Get(%d): Len %d, len(Bytes) %d, Cap %d, cap(Bytes) %d", size, b.Len(), len(b.Bytes()), b.Cap(), cap(b.Bytes()))
	}
	return b
}

func mustPut(t testing.TB, p *Pool, b *Block, streams ...*cuda.Stream) {
	t.Helper()
	if err := p.Put(b, streams...); err != nil {
		t.Fatalf("Put: %v", err)
	}
}

// newStream returns a stream of device 0's primary context, destroyed when the test ends.
func newStream(t testing.TB) (*cuda.Context, *cuda.Stream) {
	t.Helper()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Destroy(); err != nil {
			t.Errorf("stream Destroy: %v", err)
		}
	})
	return ctx, s
}

func fakeStream(s *cuda.Stream) cudadrv.Stream { return cudadrv.Stream(s.Handle()) }

func sameMem(a, b []byte) bool { return len(a) > 0 && len(b) > 0 && &a[0] == &b[0] }

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// Flags returns the pinmem flags of the pool's memory (see WithFlags); 0
// for a nil Pool.
func (p *Pool) Flags() pinmem.Flags {
	if p == nil || p.s == nil {
		return 0
	}
	return p.s.flags
}

// ID returns the block's sequence number in its pool, as Close's
// OutstandingError reports it.
func (b *Block) ID() uint64 {
	if b == nil {
		return 0
	}
	return b.id
}

// Name returns the pool's name (see WithName); "" for a nil Pool.
func (p *Pool) Name() string {
	if p == nil || p.s == nil {
		return ""
	}
	return p.s.name
}
