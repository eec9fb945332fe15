package transfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/internal/track"
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

// TestRobustPipelineRunAfterCopierClose: Run after its Copier's Close
// returned ErrClosed instead of sending on the closed copy pool.
func TestRobustPipelineRunAfterCopierClose(t *testing.T) {
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

// TestRobustFreedDeviceBuffer: a copy into a freed device buffer is
// refused before any copy is queued.
func TestRobustFreedDeviceBuffer(t *testing.T) {
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
	// A view of a freed buffer is refused too.
	parent, err := e.ctx.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	view, err := parent.Slice(4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HtoD(context.Background(), view, make([]byte, 100)); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("HtoD into a view of a freed buffer: %v, want an error matching cuda.ErrInvalidHandle", err)
	}
	if _, err := c.HtoDFrom(context.Background(), view, bytes.NewReader(make([]byte, 100))); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("HtoDFrom into a view of a freed buffer: %v", err)
	}
	if _, err := c.DtoHTo(context.Background(), io.Discard, view); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("DtoHTo from a view of a freed buffer: %v", err)
	}
	if n := e.d.Calls("cuMemcpyHtoDAsync_v2") + e.d.Calls("cuMemcpyDtoHAsync_v2") - calls; n != 0 {
		t.Errorf("%d copies queued on freed device memory", n)
	}
}

// TestRobustWrongDevice: a device-0 Copier refuses device-1 memory.
func TestRobustWrongDevice(t *testing.T) {
	e := useMultiFake(t, 2, 4096)
	c, err := New(e.ctxs[0], smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.HtoD(context.Background(), e.bufs[1], make([]byte, 100)); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("HtoD of a device-0 Copier into device-1 memory: %v, want ErrWrongDevice", err)
	}
	if _, err := c.DtoH(context.Background(), make([]byte, 100), e.bufs[1]); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("DtoH of a device-0 Copier from device-1 memory: %v, want ErrWrongDevice", err)
	}
	m := e.multi(t, e.ctxs)
	swapped := []*cuda.DeviceBuffer{e.bufs[1], e.bufs[0]}
	if _, err := m.Broadcast(context.Background(), swapped, make([]byte, 100)); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("Broadcast with buffers on the wrong devices: %v, want ErrWrongDevice", err)
	}
	if _, err := m.Gather(context.Background(), [][]byte{make([]byte, 10), make([]byte, 10)}, swapped); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("Gather with buffers on the wrong devices: %v, want ErrWrongDevice", err)
	}
	if _, err := m.Scatter(context.Background(), swapped, [][]byte{make([]byte, 10), make([]byte, 10)}); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("Scatter with buffers on the wrong devices: %v, want ErrWrongDevice", err)
	}
}

// TestRobustNilReceivers: nil receivers and nil contexts give errors.
func TestRobustNilReceivers(t *testing.T) {
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

// TestRobustHungHtoD: with the copy stream held (a hung GPU), HtoD with
// a 200 ms deadline returns in time with an error matching
// context.DeadlineExceeded, and the Copier works again once the stream
// runs.
func TestRobustHungHtoD(t *testing.T) {
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

// within runs f and fails unless it returns an error matching
// context.DeadlineExceeded within limit.
func within(t *testing.T, what string, limit time.Duration, f func() error) {
	t.Helper()
	// At least ten times the 200 ms deadline the callers give (-race on a
	// loaded machine slows every call).
	limit = max(limit, 2*time.Second)
	t0 := time.Now()
	err := f()
	if took := time.Since(t0); !errors.Is(err, context.DeadlineExceeded) || took > limit {
		t.Errorf("%s on a hung device: %v after %v, want context.DeadlineExceeded within %v", what, err, took, limit)
	}
}

func deadline200ms() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 200*time.Millisecond)
}

// waitReleased waits until the fake holds no stream, event, device or host
// allocation beyond base (background releases finish after Close returns).
func waitReleased(t *testing.T, d *fakedrv.Driver, base fakedrv.Counts) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for {
		l := d.Live()
		if l.Streams == base.Streams && l.Events == base.Events && l.DeviceAllocs == base.DeviceAllocs && l.HostAllocs == base.HostAllocs && l.Registrations == base.Registrations {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("still live after 10 s: %+v, want %+v", l, base)
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRobustBoundedWaits: with every stream held (a hung GPU), each
// blocking call returns within its deadline (plus slack for a loaded
// machine) with an error matching context.DeadlineExceeded, the objects
// work again once the device runs, and Close is bounded too.
func TestRobustBoundedWaits(t *testing.T) {
	const limit = 700 * time.Millisecond
	e := useMultiFake(t, 2, 1<<20)
	base := e.d.Live()
	c, err := New(e.ctxs[0], smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.NewPipeline(WithChunkSize(64<<10), WithStreams(2), WithInFlight(2))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMulti(e.ctxs, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	src := testutil.RandomBytes(1<<20, 11)
	dst := make([]byte, 1<<20)
	run := func(what string, f func(ctx context.Context) error) {
		e.d.Pause()
		ctx, cancel := deadline200ms()
		within(t, what, limit, func() error { return f(ctx) })
		cancel()
		e.d.Resume()
		if err := f(context.Background()); err != nil {
			t.Errorf("%s after the device ran again: %v", what, err)
		}
	}
	run("HtoD", func(ctx context.Context) error { _, err := c.HtoD(ctx, e.bufs[0], src); return err })
	run("DtoH", func(ctx context.Context) error { _, err := c.DtoH(ctx, dst, e.bufs[0]); return err })
	run("HtoDAsync", func(ctx context.Context) error {
		_, err := c.HtoDAsync(ctx, e.bufs[0], src).Wait(ctx)
		return err
	})
	run("HtoDFrom", func(ctx context.Context) error {
		_, err := c.HtoDFrom(ctx, e.bufs[0], bytes.NewReader(src))
		return err
	})
	run("DtoHTo", func(ctx context.Context) error { _, err := c.DtoHTo(ctx, io.Discard, e.bufs[0]); return err })
	run("Pipeline.Run", func(ctx context.Context) error { _, err := p.Run(ctx, src, dst); return err })
	run("Broadcast", func(ctx context.Context) error { _, err := m.Broadcast(ctx, e.bufs, src); return err })
	run("Gather", func(ctx context.Context) error {
		_, err := m.Gather(ctx, [][]byte{dst, make([]byte, len(dst))}, e.bufs)
		return err
	})
	run("Scatter", func(ctx context.Context) error { _, err := m.Scatter(ctx, e.bufs, [][]byte{src, src}); return err })

	// Close is bounded: with copies left queued, Close(200 ms) returns in
	// time, the objects are closed, and everything is released once the
	// device runs again.
	e.d.Pause()
	for what, f := range map[string]func(ctx context.Context) error{
		"HtoD":      func(ctx context.Context) error { _, err := c.HtoD(ctx, e.bufs[0], src); return err },
		"Broadcast": func(ctx context.Context) error { _, err := m.Broadcast(ctx, e.bufs, src); return err },
		"Run":       func(ctx context.Context) error { _, err := p.Run(ctx, src, dst); return err },
	} {
		within(t, what, limit, func() error { ctx, cancel := deadline200ms(); defer cancel(); return f(ctx) })
	}
	within(t, "Pipeline.Close", limit, func() error { ctx, cancel := deadline200ms(); defer cancel(); return p.Close(ctx) })
	within(t, "Multi.Close", limit, func() error { ctx, cancel := deadline200ms(); defer cancel(); return m.Close(ctx) })
	within(t, "Copier.Close", limit, func() error { ctx, cancel := deadline200ms(); defer cancel(); return c.Close(ctx) })
	if _, err := c.HtoD(context.Background(), e.bufs[0], src); !errors.Is(err, ErrClosed) {
		t.Errorf("HtoD after a timed-out Close: %v, want ErrClosed", err)
	}
	if _, err := p.Run(context.Background(), src, dst); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after a timed-out Close: %v, want ErrClosed", err)
	}
	// A second Close waits again for what the first left, bounded by its
	// own context, and once everything is released it says ErrClosed.
	within(t, "second Copier.Close", limit, func() error { ctx, cancel := deadline200ms(); defer cancel(); return c.Close(ctx) })
	e.d.Resume()
	waitReleased(t, e.d, base)
	if err := c.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
		t.Errorf("Close once everything was released: %v, want nil or ErrClosed", err)
	}
	if err := c.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Close of a released Copier: %v, want ErrClosed", err)
	}
}

// TestRobustCloseWaitsForRun: Copier.Close during a Pipeline.Run waits
// for the Run (bounded), and the Run finishes cleanly.
func TestRobustCloseWaitsForRun(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c, err := New(e.ctx, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 64 << 10, Streams: 1, InFlight: 1, Work: func(*cuda.Stream, Chunk) error {
		once.Do(func() { close(started) })
		<-release
		return nil
	}})
	in := testutil.RandomBytes(256<<10, 5)
	out := make([]byte, len(in))
	runErr := make(chan error, 1)
	go func() {
		noPanic(t, "Run during Copier.Close", func() {
			_, err := p.Run(context.Background(), in, out)
			runErr <- err
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Copier.Close during a Run: %v, want it to wait for the Run (context.DeadlineExceeded)", err)
	}
	close(release)
	if err := <-runErr; err != nil {
		t.Errorf("Run that started before Copier.Close: %v", err)
	}
	if _, err := p.Run(context.Background(), in, out); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Copier.Close: %v, want ErrClosed", err)
	}
	testutil.CheckBytes(t, in, out)
	// The timed-out Close releases the Copier once the Run ended.
	<-c.gate.Idle()
	if err := c.rel.Release(); err != nil {
		t.Error(err)
	}
}

// TestRobustDroppedOwners: a Copier, Pipeline or Multi dropped without
// Close is counted by track.Dropped and its driver objects released.
func TestRobustDroppedOwners(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	base := e.d.Live()
	before := track.DroppedCounts()
	func() {
		c, err := New(e.ctx, smallRing()...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.NewPipeline(WithChunkSize(4096), WithStreams(1), WithPinStages(true)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.HtoD(context.Background(), e.devbuf(t, 4096), make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		if _, err := NewMulti([]*cuda.Context{e.ctx}, smallRing()...); err != nil {
			t.Fatal(err)
		}
	}()
	base.DeviceAllocs++ // the devbuf is freed by the test's cleanup
	end := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		now := track.DroppedCounts()
		done := true
		for _, k := range []string{"copier", "pipeline", "multi"} {
			if now[k] != before[k]+1 {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("dropped counts %v, before %v: want one more copier, pipeline and multi", now, before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitReleased(t, e.d, base)
}

// TestRobustNilArgs: nil receivers, arguments and contexts across the
// package return errors matching cuda.ErrInvalidValue, never panic.
func TestRobustNilArgs(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	dev := e.devbuf(t, 4096)
	c := e.copier(t, smallRing()...)
	var nilCtx context.Context
	bg := context.Background()
	var nc *Copier
	var np *Pipeline
	var nm *Multi
	var nop *Op
	m, err := NewMulti([]*cuda.Context{e.ctx}, smallRing()...)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(bg)
	p := e.pipeline(t, c, pipelineCfg{ChunkSize: 4096, Streams: 1})
	cases := map[string]func() error{
		"nil Copier HtoD":        func() error { _, err := nc.HtoD(bg, dev, []byte{1}); return err },
		"nil Copier DtoH":        func() error { _, err := nc.DtoH(bg, []byte{1}, dev); return err },
		"nil Copier HtoDFrom":    func() error { _, err := nc.HtoDFrom(bg, dev, bytes.NewReader(nil)); return err },
		"nil Copier DtoHTo":      func() error { _, err := nc.DtoHTo(bg, io.Discard, dev); return err },
		"nil Copier HtoDAsync":   func() error { _, err := nc.HtoDAsync(bg, dev, []byte{1}).Wait(bg); return err },
		"nil Copier Close":       func() error { return nc.Close(bg) },
		"nil Copier RunMapped":   func() error { return nc.RunMapped(bg, nil, nil, nil) },
		"nil Copier pipeline":    func() error { _, err := nc.NewPipeline(); return err },
		"nil Pipeline Run":       func() error { _, err := np.Run(bg, []byte{1}, nil); return err },
		"nil Pipeline Close":     func() error { return np.Close(bg) },
		"nil Multi Broadcast":    func() error { _, err := nm.Broadcast(bg, nil, []byte{1}); return err },
		"nil Multi Gather":       func() error { _, err := nm.Gather(bg, nil, nil); return err },
		"nil Multi Close":        func() error { return nm.Close(bg) },
		"nil Op Wait":            func() error { _, err := nop.Wait(bg); return err },
		"nil ctx HtoD":           func() error { _, err := c.HtoD(nilCtx, dev, []byte{1}); return err },
		"nil ctx DtoH":           func() error { _, err := c.DtoH(nilCtx, []byte{1}, dev); return err },
		"nil ctx HtoDAsync":      func() error { _, err := c.HtoDAsync(nilCtx, dev, []byte{1}).Wait(bg); return err },
		"nil ctx Wait":           func() error { _, err := c.HtoDAsync(bg, dev, []byte{1}).Wait(nilCtx); return err },
		"nil ctx HtoDFrom":       func() error { _, err := c.HtoDFrom(nilCtx, dev, bytes.NewReader(nil)); return err },
		"nil ctx DtoHTo":         func() error { _, err := c.DtoHTo(nilCtx, io.Discard, dev); return err },
		"nil ctx RunMapped":      func() error { return c.RunMapped(nilCtx, nil, nil, nil) },
		"nil ctx Close":          func() error { return c.Close(nilCtx) },
		"nil ctx Run":            func() error { _, err := p.Run(nilCtx, []byte{1}, nil); return err },
		"nil ctx Pipeline.Close": func() error { return p.Close(nilCtx) },
		"nil ctx Broadcast":      func() error { _, err := m.Broadcast(nilCtx, []*cuda.DeviceBuffer{dev}, []byte{1}); return err },
		"nil ctx Gather":         func() error { _, err := m.Gather(nilCtx, [][]byte{{1}}, []*cuda.DeviceBuffer{dev}); return err },
		"nil ctx Scatter":        func() error { _, err := m.Scatter(nilCtx, []*cuda.DeviceBuffer{dev}, [][]byte{{1}}); return err },
		"nil ctx Multi.Close":    func() error { return m.Close(nilCtx) },
		"nil reader":             func() error { _, err := c.HtoDFrom(bg, dev, nil); return err },
		"nil writer":             func() error { _, err := c.DtoHTo(bg, nil, dev); return err },
		"nil RunMapped buffer": func() error {
			return c.RunMapped(bg, nil, nil, func(*cuda.Stream, cuda.DevicePtr, int) error { return nil })
		},
		"nil Broadcast buffer": func() error { _, err := m.Broadcast(bg, []*cuda.DeviceBuffer{nil}, []byte{1}); return err },
		"nil Gather buffer":    func() error { _, err := m.Gather(bg, [][]byte{{1}}, []*cuda.DeviceBuffer{nil}); return err },
		"nil Copier option":    func() error { _, err := New(e.ctx, nil); return err },
		"nil pipeline option":  func() error { _, err := c.NewPipeline(nil); return err },
	}
	for name, f := range cases {
		noPanic(t, name, func() {
			if err := f(); !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("%s: %v, want an error matching cuda.ErrInvalidValue", name, err)
			}
		})
	}
	noPanic(t, "nil accessors", func() {
		if nc.Stream() != nil || nc.Context() != nil || nc.StageSize() != 0 || nc.Cache() != nil || nm.Devices() != 0 || nm.Copier(0) != nil || m.Copier(5) != nil {
			t.Error("accessors of nil objects return non-zero values")
		}
		nc.AddPinned(nil)()
		nm.AddPinned(nil)()
		nop.Cancel()
		<-nop.Done()
		if c.Cache().Stats() != (CacheStats{}) || c.Cache().Forget([]byte{1}) != 0 || c.Cache().reclaim(1) != 0 {
			t.Error("a nil cache reports something")
		}
	})
}

// A stream of another context given with WithStream is refused by New:
// the Copier's copies would be queued where its device buffers are not.
func TestRobustWithStreamOfAnotherContext(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DeviceCount: 2})
	ctxs := make([]*cuda.Context, 2)
	for i := range ctxs {
		dev, err := cuda.GetDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		if ctxs[i], err = dev.PrimaryContext(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := ctxs[1].NewStream(cuda.StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if cp, err := New(ctxs[0], WithStream(s)); !errors.Is(err, ErrWrongDevice) {
		if cp != nil {
			_ = cp.Close(context.Background())
		}
		t.Fatalf("New with device 1's stream for device 0: %v, want ErrWrongDevice", err)
	}
	cp, err := New(ctxs[1], WithStream(s))
	if err != nil {
		t.Fatalf("New with the context's own stream: %v", err)
	}
	if err := cp.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
