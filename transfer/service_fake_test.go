package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// TestServiceUse uses the public API as a Go service does, on the fake
// driver: 16 goroutines move random sizes from 1 B to 64 MiB both ways
// through one Copier with random deadlines, retrying until they succeed,
// while the device stalls at random; a Pipeline whose Done callback
// panics once; a Multi over the one device broadcasting, gathering and
// scattering with deadlines. Every byte is checked, and pinmem's ledger
// is at 0 at the end. About 15 s: not under -short.
func TestServiceUse(t *testing.T) {
	if testing.Short() {
		t.Skip("about 15 s of random transfers; not under -short")
	}
	drv := cudatest.Install(t, cudatest.WithWaitTimeout(time.Minute))
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, err := d.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	// A device that stalls at random, as a busy GPU does.
	serviceUse(t, cctx, 8, func(stop <-chan struct{}) {
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				drv.ReleaseAll()
				return
			case <-time.After(time.Duration(r.IntN(20)) * time.Millisecond):
			}
			drv.HoldAll()
			select {
			case <-stop:
			case <-time.After(time.Duration(r.IntN(40)) * time.Millisecond):
			}
			drv.ReleaseAll()
		}
	})
}

// serviceUse runs the service program on cctx: 16 Copier workers of
// rounds round trips each, a Pipeline worker and a Multi worker, with
// stall running beside them until they are done (nil: none). It checks
// every byte, and that pinmem's ledger is back where it was at the start.
func serviceUse(t *testing.T, cctx *cuda.Context, rounds int, stall func(stop <-chan struct{})) {
	before := pinmem.Stats().Pinned
	c, err := transfer.New(cctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := transfer.NewMulti([]*cuda.Context{cctx})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	if stall != nil {
		chaos.Go(func() { stall(stop) })
	}
	var devs []*cuda.DeviceBuffer
	for range 17 {
		b, err := cctx.Alloc(maxSize)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, b)
	}
	timeouts.Store(0)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { errs <- worker(i, c, devs[i], rounds) })
	}
	wg.Go(func() { errs <- pipelineWorker(c) })
	wg.Go(func() { errs <- multiWorker(m, devs[16]) })
	wg.Wait()
	close(stop)
	chaos.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := errors.Join(c.Close(ctx), m.Close(ctx)); err != nil {
		t.Error(err)
	}
	for _, b := range devs {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	}
	if p := pinmem.Stats().Pinned; p.Bytes != before.Bytes || p.Buffers != before.Buffers {
		t.Errorf("pinmem ledger at the end: %+v, before: %+v", p, before)
	}
	t.Logf("%d transfers retried after their deadline", timeouts.Load())
}

const maxSize = 64 << 20

var timeouts atomic.Int64

// retry runs f with a random deadline until it succeeds.
func retry(r *rand.Rand, f func(ctx context.Context) error) error {
	for i := 0; ; i++ {
		d := time.Duration(r.IntN(30)+1) * time.Millisecond
		if i > 50 {
			d = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := f(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		timeouts.Add(1)
	}
}

func size(r *rand.Rand) int {
	// log-uniform from 1 B to 64 MiB
	return min(maxSize, max(1, int(math.Exp2(r.Float64()*26))))
}

func worker(id int, c *transfer.Copier, dev *cuda.DeviceBuffer, rounds int) error {
	r := rand.New(rand.NewPCG(uint64(id), 7))
	for round := range rounds {
		n := size(r)
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		if err := retry(r, func(ctx context.Context) error { _, err := c.HtoD(ctx, dev, src); return err }); err != nil {
			return fmt.Errorf("worker %d round %d HtoD %d: %w", id, round, n, err)
		}
		dst := make([]byte, n)
		if err := retry(r, func(ctx context.Context) error { _, err := c.DtoH(ctx, dst, dev); return err }); err != nil {
			return fmt.Errorf("worker %d round %d DtoH %d: %w", id, round, n, err)
		}
		if !bytes.Equal(dst, src) {
			return fmt.Errorf("worker %d round %d: %d bytes came back different", id, round, n)
		}
	}
	return nil
}

func pipelineWorker(c *transfer.Copier) error {
	panicked := false
	p, err := c.NewPipeline(transfer.WithChunkSize(1<<20), transfer.WithStreams(2),
		transfer.WithWork(func(s *cuda.Stream, ch transfer.Chunk) error { return nil }),
		transfer.WithDone(func(ch transfer.Chunk) error {
			if !panicked && ch.Index == 2 {
				panicked = true
				panic("callback panics once")
			}
			return nil
		}))
	if err != nil {
		return err
	}
	defer p.Close(context.Background())
	in := make([]byte, 8<<20+123)
	for i := range in {
		in[i] = byte(i * 7)
	}
	out := make([]byte, len(in))
	got := func() (v any) {
		defer func() { v = recover() }()
		_, err := p.Run(context.Background(), in, out)
		return err
	}()
	if got != "callback panics once" {
		return fmt.Errorf("Run with a panicking callback: %v", got)
	}
	r := rand.New(rand.NewPCG(99, 1))
	for range 5 {
		clear(out)
		if err := retry(r, func(ctx context.Context) error { _, err := p.Run(ctx, in, out); return err }); err != nil {
			return err
		}
		if !bytes.Equal(in, out) {
			return errors.New("pipeline output differs")
		}
	}
	return nil
}

func multiWorker(m *transfer.Multi, dev *cuda.DeviceBuffer) error {
	r := rand.New(rand.NewPCG(5, 5))
	for round := range 10 {
		n := size(r)
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		view, _ := dev.Slice(0, n)
		if err := retry(r, func(ctx context.Context) error {
			_, err := m.Broadcast(ctx, []*cuda.DeviceBuffer{view}, src)
			return err
		}); err != nil {
			return err
		}
		dst := make([]byte, n)
		if err := retry(r, func(ctx context.Context) error {
			_, err := m.Gather(ctx, [][]byte{dst}, []*cuda.DeviceBuffer{view})
			return err
		}); err != nil {
			return err
		}
		if !bytes.Equal(dst, src) {
			return fmt.Errorf("multi round %d: %d bytes came back different", round, n)
		}
		src2 := make([]byte, n)
		for i := range src2 {
			src2[i] = byte(r.Uint32())
		}
		if err := retry(r, func(ctx context.Context) error {
			_, err := m.Scatter(ctx, []*cuda.DeviceBuffer{view}, [][]byte{src2})
			return err
		}); err != nil {
			return err
		}
		if err := retry(r, func(ctx context.Context) error {
			_, err := m.Gather(ctx, [][]byte{dst}, []*cuda.DeviceBuffer{view})
			return err
		}); err != nil {
			return err
		}
		if !bytes.Equal(dst, src2) {
			return fmt.Errorf("multi round %d: scatter then gather differs", round)
		}
	}
	return nil
}
