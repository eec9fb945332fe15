package cuda_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// TestFakeBatch: a batch issues its copies and records in order, moves the
// right bytes, stops at the first failing operation (reporting how many
// were queued) and rejects bad arguments before calling the driver.
func TestFakeBatch(t *testing.T) {
	fd, ctx := fakeContext(t)
	s, ev := streamAndEvent(t, ctx)
	dev, err := ctx.Alloc(3 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	src := testutil.RandomBytes(2<<10, 7)
	var mu sync.Mutex
	var calls []string
	fd.SetHook(func(op string) cudadrv.Result {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, op)
		return cudadrv.Success
	})
	defer fd.SetHook(nil)

	b := ctx.NewBatch()
	b.CopyHtoD(s, dev.Ptr(), src[:1024]).
		CopyHtoD(s, dev.Ptr()+1024, src[1024:]).
		CopyDtoD(s, dev.Ptr()+2048, dev.Ptr(), 1024).
		Record(ev, s).
		CopyHtoD(s, dev.Ptr(), nil) // empty: adds nothing
	if b.Len() != 4 {
		t.Fatalf("Len = %d, want 4", b.Len())
	}
	if n, err := b.Issue(); n != 4 || err != nil {
		t.Fatalf("Issue = %d, %v", n, err)
	}
	if b.Len() != 0 {
		t.Fatalf("Len after Issue = %d", b.Len())
	}
	mu.Lock()
	got := slices.Clone(calls)
	calls = nil
	mu.Unlock()
	want := []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoDAsync_v2", "cuEventRecord"}
	if !slices.Equal(got, want) {
		t.Fatalf("driver calls %v, want %v", got, want)
	}
	out := make([]byte, 3<<10)
	b.CopyDtoH(s, out, dev.Ptr())
	if _, err := b.Issue(); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, src, out[:2048])
	testutil.CheckBytes(t, src[:1024], out[2048:])

	// The second of three operations fails: one queued, the error says which.
	fd.SetHook(nil)
	if err := fd.FailOn("cuEventRecord", 1, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	n, err := ctx.NewBatch().CopyHtoD(s, dev.Ptr(), src[:16]).Record(ev, s).CopyHtoD(s, dev.Ptr(), src[:16]).Issue()
	fd.ClearFaults()
	if n != 1 || !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("Issue with the record failing = %d, %v; want 1 and ErrOutOfMemory", n, err)
	}
	var de *cuda.Error
	if !errors.As(err, &de) || de.Op != "cuEventRecord" {
		t.Fatalf("error %v does not name cuEventRecord", err)
	}
	// A rejection that means "wrong context current" is retried in the
	// stream's context from the operation that failed, as Stream calls are.
	if err := fd.FailOn("cuEventRecord", 1, cudadrv.ErrorInvalidContext); err != nil {
		t.Fatal(err)
	}
	n, err = ctx.NewBatch().CopyHtoD(s, dev.Ptr(), src[:16]).Record(ev, s).CopyHtoD(s, dev.Ptr(), src[:16]).Issue()
	fd.ClearFaults()
	if n != 3 || err != nil {
		t.Fatalf("Issue with the record rejected once for its context = %d, %v; want 3 queued", n, err)
	}

	// Bad arguments: nothing reaches the driver, the batch is reset.
	gone, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Destroy(); err != nil {
		t.Fatal(err)
	}
	fd.SetHook(func(op string) cudadrv.Result {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, op)
		return cudadrv.Success
	})
	mu.Lock()
	calls = nil
	mu.Unlock()
	for name, bad := range map[string]*cuda.Batch{
		"nil stream":       ctx.NewBatch().CopyHtoD(nil, dev.Ptr(), src[:8]),
		"destroyed stream": ctx.NewBatch().CopyHtoD(s, dev.Ptr(), src[:8]).CopyHtoD(gone, dev.Ptr(), src[:8]),
		"nil event":        ctx.NewBatch().Record(nil, s),
		"negative size":    ctx.NewBatch().CopyDtoD(s, dev.Ptr(), dev.Ptr(), -1),
	} {
		n, err := bad.Issue()
		if n != 0 || !errors.Is(err, cuda.ErrInvalidValue) && !errors.Is(err, cuda.ErrInvalidHandle) {
			t.Errorf("%s: Issue = %d, %v; want 0 and an invalid-value or -handle error", name, n, err)
		}
		if bad.Len() != 0 {
			t.Errorf("%s: batch not emptied", name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 0 {
		t.Errorf("bad batches reached the driver: %v", calls)
	}
}

// TestGPUBatchRoundTrip moves 40 chunks of random bytes (odd sizes) to the
// GPU and back with batches (more than one crossing each, with an event
// recorded per chunk) into a poisoned buffer, and checks every byte.
func TestGPUBatchRoundTrip(t *testing.T) {
	ctx := gpuContext(t)
	s, ev := streamAndEvent(t, ctx)
	const chunk, chunks = 4099, 40
	n := chunk * chunks
	in := pinnedHost(t, ctx, n)
	out := pinnedHost(t, ctx, n)
	copy(in, testutil.RandomBytes(n, 11))
	testutil.Poison(out)
	dev, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free()
	b := ctx.NewBatch()
	for i := range chunks {
		off := i * chunk
		b.CopyHtoD(s, dev.Ptr()+cuda.DevicePtr(off), in[off:off+chunk]).Record(ev, s)
	}
	if q, err := b.Issue(); q != 2*chunks || err != nil {
		t.Fatalf("H2D batch: %d queued, %v", q, err)
	}
	for i := range chunks {
		off := i * chunk
		b.CopyDtoH(s, out[off:off+chunk], dev.Ptr()+cuda.DevicePtr(off))
	}
	b.Record(ev, s)
	if q, err := b.Issue(); q != chunks+1 || err != nil {
		t.Fatalf("D2H batch: %d queued, %v", q, err)
	}
	if err := ev.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, in, out)
}

// streamAndEvent returns a non-blocking stream and an event without timing
// in ctx, destroyed when t ends.
func streamAndEvent(t *testing.T, ctx *cuda.Context) (*cuda.Stream, *cuda.Event) {
	t.Helper()
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Destroy(); err != nil {
			t.Error(err)
		}
	})
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ev.Destroy(); err != nil {
			t.Error(err)
		}
	})
	return s, ev
}
