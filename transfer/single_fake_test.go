package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// lentStages is the number of the engine's stages, of either class, lent
// to transfers.
func lentStages(e *engine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ring.all) - len(e.ring.idle) + len(e.small.all) - len(e.small.idle)
}

// lendAllStages pins the ring stages c's engine may hold and borrows every
// idle one, as transfers holding them would; the caller gives them back
// with c.eng.give.
func lendAllStages(t *testing.T, c *Copier) []*stage {
	t.Helper()
	if err := c.eng.fill(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	c.eng.mu.Lock()
	idle := len(c.eng.ring.idle)
	c.eng.mu.Unlock()
	all, err := c.eng.take(context.Background(), idle)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// waitIdle waits until c has nothing in progress (abandoned copies, and
// driver copies left running, finished).
func waitIdle(t *testing.T, c *Copier) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if c.gate.Active() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the copies left in the background never finished")
		}
	}
}

// TestFakeSingleStageDeadline: a transfer on the single-stage path is
// bounded by its context on a hung device, either way and under every
// wait mode; its lane and stage stay held until the device ran its copy,
// then go back, and the next transfers move every byte.
func TestFakeSingleStageDeadline(t *testing.T) {
	for _, mode := range []WaitMode{WaitHybrid, WaitPoll, WaitSleep} {
		for _, d := range []Direction{HostToDevice, DeviceToHost} {
			t.Run(mode.String()+"/"+d.String(), func(t *testing.T) {
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, WithWait(mode))
				const n = 16 << 10
				dev := e.devbuf(t, n)
				src := testutil.RandomBytes(n, 21)
				dst := make([]byte, n)
				release := holdLanes(t, e, c)
				ctx, cancel := deadline200ms()
				within(t, "single-stage "+d.String(), 700*time.Millisecond, func() error {
					var err error
					if d == HostToDevice {
						_, err = c.HtoD(ctx, dev, src)
					} else {
						_, err = c.DtoH(ctx, dst, dev)
					}
					return err
				})
				cancel()
				if got := lentStages(c.eng); got != 1 {
					t.Errorf("%d stages lent while the copy is queued, want 1", got)
				}
				release()
				waitIdle(t, c)
				if got := lentStages(c.eng); got != 0 {
					t.Errorf("%d stages lent after the drain, want 0", got)
				}
				bg := context.Background()
				if st, err := c.HtoD(bg, dev, src); err != nil || st.Stages != 1 {
					t.Fatalf("HtoD after the drain: %v %v", st, err)
				}
				testutil.Poison(dst)
				if st, err := c.DtoH(bg, dst, dev); err != nil || st.Stages != 1 {
					t.Fatalf("DtoH after the drain: %v %v", st, err)
				}
				testutil.CheckBytes(t, src, dst)
			})
		}
	}
}

// TestFakeSingleStageStagedBusy: a transfer at the threshold that one
// stage would hold, made while every stage is lent, waits for the ring
// (bounded by its context) rather than falling back to the driver's
// copy; once stages come back it is staged, in both directions, and
// right to the byte.
func TestFakeSingleStageStagedBusy(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	const n = 16 << 20
	dev := e.devbuf(t, n)
	src := testutil.RandomBytes(n, 23)
	bg := context.Background()
	for _, dir := range []Direction{HostToDevice, DeviceToHost} {
		all := lendAllStages(t, c)
		short, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		dst := make([]byte, n)
		move := func(ctx context.Context) (Stats, error) {
			if dir == HostToDevice {
				return c.HtoD(ctx, dev, src)
			}
			return c.DtoH(ctx, dst, dev)
		}
		st, err := move(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s with every stage lent: %v %v, want to wait for a stage until the deadline", dir, st, err)
		}
		type result struct {
			st  Stats
			err error
		}
		done := make(chan result, 1)
		go func() {
			st, err := move(bg)
			done <- result{st, err}
		}()
		awaitWaiters(t, c.eng, 1, fmt.Sprintf("%s: the transfer waiting for a stage", dir))
		c.eng.give(all)
		r := <-done
		if r.err != nil || r.st.StagedBytes != n {
			t.Fatalf("%s once stages came back: %v %v, want it staged", dir, r.st, r.err)
		}
		if dir == HostToDevice {
			testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
		} else {
			testutil.CheckBytes(t, src, dst)
		}
	}
	waitIdle(t, c)
}

// TestFakeSingleStageConcurrent: many goroutines moving small slices at
// once, each through whichever path it finds free (one stage, the
// driver's copy, the ring), with one shared Copier: every byte arrives,
// and afterwards every stage of the engine is idle, every lane free and
// no driver copy counted.
func TestFakeSingleStageConcurrent(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t)
	bg := context.Background()
	sizes := []int{4 << 10, 64 << 10, 1 << 20, 2 << 20, 16 << 20}
	const workers, rounds = 8, 6
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			n := sizes[w%len(sizes)]
			dev, err := e.ctx.Alloc(n)
			if err != nil {
				errc <- err
				return
			}
			defer func() {
				if err := dev.Free(); err != nil {
					errc <- err
				}
			}()
			for r := range rounds {
				src := testutil.RandomBytes(n, uint64(w*rounds+r))
				if _, err := c.HtoD(bg, dev, src); err != nil {
					errc <- err
					return
				}
				dst := make([]byte, n)
				if _, err := c.DtoH(bg, dst, dev); err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(dst, src) {
					errc <- fmt.Errorf("worker %d round %d: %d bytes came back different", w, r, n)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	waitIdle(t, c)
	if lent := lentStages(c.eng); lent != 0 || len(c.free) != len(c.lanes) {
		t.Errorf("%d stages lent, %d of %d lanes free at the end", lent, len(c.free), len(c.lanes))
	}
}

// TestFakeSingleStageEndedContext: a context that has already ended
// copies nothing, either way and under every wait mode.
func TestFakeSingleStageEndedContext(t *testing.T) {
	for _, mode := range []WaitMode{WaitHybrid, WaitPoll, WaitSleep} {
		for _, d := range []Direction{HostToDevice, DeviceToHost} {
			t.Run(mode.String()+"/"+d.String(), func(t *testing.T) {
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, WithWait(mode))
				const n = 16 << 10
				dev := e.devbuf(t, n)
				zero := make([]byte, n)
				if _, err := c.HtoD(context.Background(), dev, zero); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				src := testutil.RandomBytes(n, 1)
				dst := testutil.RandomBytes(n, 2)
				want := append([]byte(nil), dst...)
				var st Stats
				var err error
				if d == HostToDevice {
					st, err = c.HtoD(ctx, dev, src)
				} else {
					st, err = c.DtoH(ctx, dst, dev)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("ended context: %v, %v; want context.Canceled", st, err)
				}
				testutil.CheckBytes(t, zero, e.deviceBytes(t, dev))
				testutil.CheckBytes(t, want, dst)
			})
		}
	}
}

// TestFakeSingleStageRetry: a small transfer that timed out on one stage
// leaves its copy queued on a lane; its retry, on the other lane, is
// queued behind it on the device (it does not take the driver's copy,
// which would not be), so the device ends up with the retry's bytes.
func TestFakeSingleStageRetry(t *testing.T) {
	for _, n := range []int{16 << 10, 256 << 10} { // one stage first; the driver's copy first
		e := useFake(t, fakedrv.Options{})
		c := e.copier(t)
		dev := e.devbuf(t, n)
		first, retry := testutil.RandomBytes(n, 1), testutil.RandomBytes(n, 2)
		release := holdLanes(t, e, c)
		ctx, cancel := deadline200ms()
		st, err := c.HtoD(ctx, dev, first)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d bytes, first attempt: %v %v", n, st, err)
		}
		done := make(chan error, 1)
		go func() {
			st, err := c.HtoD(context.Background(), dev, retry)
			if err == nil && st.StagedBytes != st.Bytes {
				err = fmt.Errorf("the retry was not staged: %v", st)
			}
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		release()
		if err := <-done; err != nil {
			t.Fatalf("%d bytes, retry: %v", n, err)
		}
		waitIdle(t, c)
		testutil.CheckBytes(t, retry, e.deviceBytes(t, dev))
	}
}

// TestFakeSingleStageFaults: each driver call of the single-stage path
// failing once, on its first to fourth call, with a context that can end,
// WithStats, every wait mode, host to device in 4 pieces and device to
// host in two halves (paths the fault sweep's background contexts do not
// reach): every call returns an error or the right bytes, and every lane
// and stage goes back.
func TestFakeSingleStageFaults(t *testing.T) {
	ops := []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuEventRecord", "cuStreamQuery", "cuStreamSynchronize", "cuEventSynchronize", "cuEventQuery", "cuEventElapsedTime", "cuStreamWaitEvent"}
	modes := []WaitMode{WaitHybrid, WaitPoll, WaitSleep}
	for mi, mode := range modes {
		for oi, op := range ops {
			for nth := 1; nth <= 4; nth++ {
				if testing.Short() && (oi+nth)%len(modes) != mi {
					continue // -short: every op and call once, the wait modes in turn
				}
				e := useFake(t, fakedrv.Options{})
				c := e.copier(t, WithWait(mode), WithStats(true), WithStageSize(1<<20))
				const n = 1 << 20
				dev := e.devbuf(t, n)
				src := testutil.RandomBytes(n, uint64(nth))
				ctx, cancel := context.WithCancel(context.Background())
				if err := e.d.FailOn(op, nth, cudadrv.ErrorLaunchFailed); err != nil {
					t.Fatal(err)
				}
				c.tune().stagePieces = 4
				if _, err := c.htod(ctx, dev, src, forceShort); err == nil {
					testutil.CheckBytes(t, src, e.deviceBytes(t, dev)[:n])
				}
				c.tune().stagePieces = 2
				dst := make([]byte, n)
				_, err := c.dtoh(ctx, dst, dev, forceShort)
				e.d.ClearFaults()
				if err == nil {
					testutil.CheckBytes(t, e.deviceBytes(t, dev)[:n], dst)
				}
				cancel()
				waitIdle(t, c)
				if got := lentStages(c.eng); got != 0 || len(c.free) != len(c.lanes) {
					t.Errorf("%v, %s failing on call %d: %d stages lent, %d of %d lanes free", mode, op, nth, got, len(c.free), len(c.lanes))
				}
			}
		}
	}
}

// TestFakeSingleStageWithStream: with WithStream the single-stage copy is
// queued on the caller's stream after the caller's work; on a held stream
// it returns at its deadline, the next transfer is ordered after both,
// and every byte arrives, under every wait mode.
func TestFakeSingleStageWithStream(t *testing.T) {
	for _, mode := range []WaitMode{WaitHybrid, WaitPoll, WaitSleep} {
		e := useFake(t, fakedrv.Options{})
		s, err := e.ctx.NewStream(cuda.StreamNonBlocking)
		if err != nil {
			t.Fatal(err)
		}
		c := e.copier(t, WithStream(s), WithWait(mode), WithStats(true))
		const n = 16 << 10
		dev := e.devbuf(t, n)
		first, src := testutil.RandomBytes(n, 3), testutil.RandomBytes(n, 4)
		sh := cudadrv.Stream(s.Handle())
		if err := e.d.HoldStream(sh); err != nil {
			t.Fatal(err)
		}
		if err := s.Memset(dev, 0, 0, dev.Size()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := deadline200ms()
		within(t, "single-stage HtoD behind the caller's held stream", 700*time.Millisecond, func() error {
			_, err := c.HtoD(ctx, dev, first)
			return err
		})
		cancel()
		done := make(chan error, 1)
		go func() { _, err := c.HtoD(context.Background(), dev, src); done <- err }()
		time.Sleep(20 * time.Millisecond)
		if err := e.d.ReleaseStream(sh); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		waitIdle(t, c)
		testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
		dst := make([]byte, n)
		if st, err := c.DtoH(context.Background(), dst, dev); err != nil || st.Stages != 1 {
			t.Fatalf("%v %v", st, err)
		}
		testutil.CheckBytes(t, src, dst)
		c.Close(context.Background())
		if err := s.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFakeSinglePieces: a single-stage transfer cut into pieces (the DMA
// of each host-to-device piece queued after its CPU copy; device to host
// in two halves at most) moves every byte, with one asynchronous copy per
// piece, under every wait mode.
func TestFakeSinglePieces(t *testing.T) {
	for _, mode := range []WaitMode{WaitHybrid, WaitSleep} {
		e := useFake(t, fakedrv.Options{})
		c := e.copier(t, WithWait(mode), WithStats(true))
		const top = 4<<20 + 12345
		dev := e.devbuf(t, top)
		for _, k := range []int32{0, 1, 2, 4, 8} {
			c.tune().stagePieces = int(k)
			for _, n := range []int{4 << 10, 1 << 20, 2<<20 + 1, top} {
				src := testutil.RandomBytes(n, uint64(n)+uint64(k))
				var err error
				calls := callDelta(e.d, func() { _, err = c.htod(context.Background(), dev, src, forceShort) }, "cuMemcpyHtoDAsync_v2")
				if err != nil {
					t.Fatal(err)
				}
				want, _ := stagePieces(HostToDevice, n, int(k))
				if k > 0 && want != min(int(k), max(1, n/singlePieceMin)) || k == 0 && want != map[bool]int{true: 4, false: 1}[n < singleWholeMin && n >= 4*singlePieceMin] || calls["cuMemcpyHtoDAsync_v2"] != want {
					t.Errorf("%v, %d pieces, %d bytes: %d async copies to the device, want %d", mode, k, n, calls["cuMemcpyHtoDAsync_v2"], want)
				}
				testutil.CheckBytes(t, src, e.deviceBytes(t, dev)[:n])
				dst := make([]byte, n)
				testutil.Poison(dst)
				calls = callDelta(e.d, func() { _, err = c.dtoh(context.Background(), dst, dev, forceShort) }, "cuMemcpyDtoHAsync_v2")
				if err != nil {
					t.Fatal(err)
				}
				if want, _ := stagePieces(DeviceToHost, n, int(k)); calls["cuMemcpyDtoHAsync_v2"] != want || want > 2 {
					t.Errorf("%v, %d pieces, %d bytes: %d async copies to the host, want %d", mode, k, n, calls["cuMemcpyDtoHAsync_v2"], want)
				}
				testutil.CheckBytes(t, src, dst)
			}
		}
	}
}

// TestFakeSmallStageKeptUntilItsCopyRan: a small one-stage transfer
// that stopped early (its context ended, or an enqueue failed) with its
// copy still queued keeps its small stage until that copy ran: the next
// small transfer, to another device buffer, pins a stage of its own
// instead of overwriting the one the queued copy still reads, and each
// device buffer ends with its own bytes.
func TestFakeSmallStageKeptUntilItsCopyRan(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		fail bool // the second piece's enqueue fails (1 MiB: four pieces)
	}{{"deadline 4KiB", 4 << 10, false}, {"deadline 1MiB", 1 << 20, false}, {"failed enqueue 1MiB", 1 << 20, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := useFake(t, fakedrv.Options{})
			c := e.copier(t)
			n := tc.n
			devA, devB := e.devbuf(t, n), e.devbuf(t, n)
			a, b := testutil.RandomBytes(n, 1), testutil.RandomBytes(n, 2)
			sh := cudadrv.Stream(c.lanes[0].stream.Handle())
			if err := e.d.HoldStream(sh); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			if tc.fail {
				ctx = context.Background()
				if err := e.d.FailOn("cuMemcpyHtoDAsync_v2", 2, cudadrv.ErrorLaunchFailed); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.HtoD(ctx, devA, a); err == nil {
				t.Fatal("the first transfer, its stream held, did not stop early")
			}
			e.d.ClearFaults()
			// The next transfer is queued behind the first on the device:
			// release the first once it waits.
			go func() {
				time.Sleep(50 * time.Millisecond)
				_ = e.d.ReleaseStream(sh)
			}()
			if _, err := c.HtoD(context.Background(), devB, b); err != nil {
				t.Fatal(err)
			}
			if err := c.Fence(context.Background()); err != nil {
				t.Fatal(err)
			}
			ran := n // the first transfer's pieces queued before it stopped
			if tc.fail {
				ran = n / 4
			}
			testutil.CheckBytes(t, a[:ran], e.deviceBytes(t, devA)[:ran])
			testutil.CheckBytes(t, b, e.deviceBytes(t, devB))
			c.eng.mu.Lock()
			small := len(c.eng.small.all)
			c.eng.mu.Unlock()
			if small != 2 {
				t.Errorf("engine holds %d small stages, want 2 (the second pinned while the first was held)", small)
			}
		})
	}
}
