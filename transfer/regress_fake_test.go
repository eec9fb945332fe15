package transfer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/testutil"
)

// noPanic runs f and fails the test if it panics.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s panicked: %v", what, r)
		}
	}()
	f()
}

// TestRegressPipelineRunAfterCopierClose: Run after its Copier's Close
// returned ErrClosed instead of sending on the closed copy pool.
func TestRegressPipelineRunAfterCopierClose(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c, err := New(e.ctx, WithStageSize(64<<10), WithDepth(2), WithParallelism(4))
	if err != nil {
		t.Fatal(err)
	}
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 1 << 20, Streams: 1, InFlight: 1, PinStages: true})
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	in := testutil.RandomBytes(1<<20, 3)
	noPanic(t, "Run after Copier.Close", func() {
		if _, err := p.Run(context.Background(), in, make([]byte, len(in))); !errors.Is(err, ErrClosed) {
			t.Errorf("Run after Copier.Close: %v, want ErrClosed", err)
		}
	})
}

// TestRegressFreedDeviceBuffer: a copy into a freed device buffer is
// refused before any copy is queued.
func TestRegressFreedDeviceBuffer(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, smallRing()...)
	b, err := e.ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	calls := e.d.Calls("cuMemcpyHtoDAsync_v2") + e.d.Calls("cuMemcpyDtoHAsync_v2")
	if _, err := c.HtoD(context.Background(), b, make([]byte, 100)); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("HtoD into a freed buffer: %v, want an error matching cuda.ErrInvalidHandle", err)
	}
	if _, err := c.DtoH(context.Background(), make([]byte, 100), b); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("DtoH from a freed buffer: %v, want an error matching cuda.ErrInvalidHandle", err)
	}
	if n := e.d.Calls("cuMemcpyHtoDAsync_v2") + e.d.Calls("cuMemcpyDtoHAsync_v2") - calls; n != 0 {
		t.Errorf("%d copies queued on freed device memory", n)
	}
}

// TestRegressWrongDevice: a device-0 Copier refuses device-1 memory.
func TestRegressWrongDevice(t *testing.T) {
	e := useMultiFake(t, 2, 4096)
	c, err := New(e.ctxs[0], smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.HtoD(context.Background(), e.bufs[1], make([]byte, 100)); err == nil {
		t.Errorf("HtoD of a device-0 Copier into device-1 memory succeeded")
	}
	if _, err := c.DtoH(context.Background(), make([]byte, 100), e.bufs[1]); err == nil {
		t.Errorf("DtoH of a device-0 Copier from device-1 memory succeeded")
	}
	m := e.multi(t, e.ctxs)
	swapped := []*cuda.DeviceBuffer{e.bufs[1], e.bufs[0]}
	if _, err := m.Broadcast(context.Background(), swapped, make([]byte, 100)); err == nil {
		t.Errorf("Broadcast with buffers on the wrong devices succeeded")
	}
	if _, err := m.Gather(context.Background(), [][]byte{make([]byte, 10), make([]byte, 10)}, swapped); err == nil {
		t.Errorf("Gather with buffers on the wrong devices succeeded")
	}
}

// TestRegressNilReceivers: nil receivers and nil contexts give errors.
func TestRegressNilReceivers(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	dev := e.devbuf(t, 4096)
	var c *Copier
	var p *Pipeline
	var m *Multi
	var tr *Op
	ctx := context.Background()
	noPanic(t, "nil receivers", func() {
		if _, err := c.HtoD(ctx, dev, []byte{1}); err == nil {
			t.Error("nil Copier HtoD succeeded")
		}
		if _, err := p.Run(ctx, []byte{1}, nil); err == nil {
			t.Error("nil Pipeline Run succeeded")
		}
		if _, err := m.Broadcast(ctx, nil, []byte{1}); err == nil {
			t.Error("nil Multi Broadcast succeeded")
		}
		if _, err := tr.Wait(ctx); err == nil {
			t.Error("nil Op Wait succeeded")
		}
	})
	real := e.copier(t, smallRing()...)
	var nilCtx context.Context
	noPanic(t, "nil contexts", func() {
		if _, err := real.HtoD(nilCtx, dev, []byte{1}); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("HtoD with a nil context: %v", err)
		}
		if _, err := real.DtoH(nilCtx, []byte{1}, dev); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("DtoH with a nil context: %v", err)
		}
	})
}

// TestRegressHungHtoD: with the copy stream held (a hung GPU), HtoD with
// a 200 ms deadline returns in time with an error matching
// context.DeadlineExceeded, and the Copier works again once the stream
// runs.
func TestRegressHungHtoD(t *testing.T) {
	e := useFake(t, fakedrv.Options{WaitTimeout: 5 * time.Second})
	c := e.copier(t, smallRing()...)
	dev := e.devbuf(t, 256<<10)
	src := testutil.RandomBytes(256<<10, 9)
	s := cudadrv.Stream(c.Stream().Handle())
	if err := e.d.HoldStream(s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := c.HtoD(ctx, dev, src)
	took := time.Since(t0)
	if !errors.Is(err, context.DeadlineExceeded) || took > 700*time.Millisecond {
		t.Errorf("HtoD on a held stream: %v after %v, want context.DeadlineExceeded within 700ms", err, took)
	}
	if err := e.d.ReleaseStream(s); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatalf("HtoD after the stream ran again: %v", err)
	}
	testutil.CheckBytes(t, src, e.deviceBytes(t, dev))
}
