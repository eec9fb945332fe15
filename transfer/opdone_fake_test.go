package transfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// The tests of this file check when an HtoDAsync or DtoHAsync Op whose
// transfer stopped early is done, on a hung device (cudatest.HoldAll):
// for a Go slice as soon as its CPU copies stopped, since the copies it
// left queued touch only pinmem's stages; for pinned memory copied
// directly only once those copies ran, or with the error of a wait
// bounded by the Op's context.

// opEnv is a fake driver and a Copier on its device 0.
type opEnv struct {
	d    *cudatest.Driver
	cctx *cuda.Context
	c    *transfer.Copier
}

func newOpEnv(t *testing.T, opts ...transfer.Option) opEnv {
	t.Helper()
	d := cudatest.Install(t, cudatest.WithWaitTimeout(time.Minute))
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	c, err := transfer.New(cctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.ReleaseAll() // the device runs again: Close waits for the drains
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return opEnv{d: d, cctx: cctx, c: c}
}

func (e opEnv) devBuf(t *testing.T, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := e.cctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// start starts the Op of direction dir on host, and returns once the
// Copier waits for the held device.
func (e opEnv) start(t *testing.T, ctx context.Context, dir transfer.Direction, host []byte, dev *cuda.DeviceBuffer) *transfer.Op {
	t.Helper()
	var op *transfer.Op
	if dir == transfer.HostToDevice {
		op = e.c.HtoDAsync(ctx, dev, host)
	} else {
		op = e.c.DtoHAsync(ctx, host, dev)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.d.WaitBlocked(wctx, nil); err != nil {
		t.Fatalf("the Op never waited for the held device: %v", err)
	}
	return op
}

// A Go slice's Op is done within 2 s of its context ending on a hung
// device, with an error matching context.Canceled, for every path (one
// stage, the ring) both ways.
func TestOpGoSliceDoneOnHungDevice(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		opts []transfer.Option
	}{
		{"stage", 256 << 10, nil},
		{"ring", 1 << 20, []transfer.Option{transfer.WithStageSize(64 << 10), transfer.WithDepth(2)}},
	} {
		for _, dir := range []transfer.Direction{transfer.HostToDevice, transfer.DeviceToHost} {
			t.Run(tc.name+"/"+dir.String(), func(t *testing.T) {
				e := newOpEnv(t, tc.opts...)
				dev := e.devBuf(t, tc.n)
				e.d.HoldAll()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				op := e.start(t, ctx, dir, make([]byte, tc.n), dev)
				cancel()
				select {
				case <-op.Done():
				case <-time.After(2 * time.Second):
					t.Fatal("the Op of a Go slice not done 2 s after its context ended, the device hung")
				}
				if _, err := op.Wait(context.Background()); !errors.Is(err, context.Canceled) {
					t.Fatalf("Op of a cancelled transfer: %v, want context.Canceled", err)
				}
			})
		}
	}
}

// An Op of pinned memory copied directly is done, once its context ended
// on a hung device, with the error of the bounded wait for its copies,
// which says that Fence waits for them; Fence then waits until the device
// ran them.
func TestOpPinnedBoundedWaitOnHungDevice(t *testing.T) {
	for _, dir := range []transfer.Direction{transfer.HostToDevice, transfer.DeviceToHost} {
		t.Run(dir.String(), func(t *testing.T) {
			e := newOpEnv(t)
			const n = 256 << 10
			dev := e.devBuf(t, n)
			host := pinned(t, n)
			e.d.HoldAll()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			op := e.start(t, ctx, dir, host.Bytes(), dev)
			cancel()
			select {
			case <-op.Done():
			case <-time.After(2 * time.Second):
				t.Fatal("the Op of pinned memory not done 2 s after its context ended: its wait is not bounded by it")
			}
			_, err := op.Wait(context.Background())
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "Fence") {
				t.Fatalf("Op of cancelled pinned memory on a hung device: %v, want the bounded wait's error naming Fence", err)
			}
			fctx, fcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer fcancel()
			if err := e.c.Fence(fctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Fence while the pinned copies are held: %v, want a deadline error", err)
			}
			e.d.ReleaseAll()
			if err := e.c.Fence(context.Background()); err != nil {
				t.Fatalf("Fence once the device ran: %v", err)
			}
		})
	}
}

// An Op of pinned memory whose transfer failed while its context lives is
// done only once the device ran the copies it left queued.
func TestOpPinnedDoneAfterDeviceRan(t *testing.T) {
	e := newOpEnv(t)
	// Two direct copies: a long direct copy is cut before its last 8 MiB.
	const n = 16 << 20
	dev := e.devBuf(t, n)
	src := pinned(t, n)
	if err := e.d.FailOn(cudatest.AnyHtoD, cudatest.Nth(2), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	e.d.HoldAll()
	op := e.c.HtoDAsync(context.Background(), dev, src.Bytes())
	deadline := time.Now().Add(30 * time.Second)
	for e.d.Calls(cudatest.AnyHtoD) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the Op never issued its second copy")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-op.Done():
		t.Fatal("the Op of pinned memory done while its first copy, reading it, is held")
	case <-time.After(200 * time.Millisecond):
	}
	e.d.ReleaseAll()
	select {
	case <-op.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the Op not done 10 s after the device ran its copies")
	}
	if _, err := op.Wait(context.Background()); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("Op with a failed enqueue: %v, want the enqueue's error", err)
	}
}

// pinned returns n bytes pinned by pinmem, freed at the end of the test.
func pinned(t *testing.T, n int) *pinmem.Buffer {
	t.Helper()
	b, err := pinmem.Alloc(n, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	})
	return b
}
