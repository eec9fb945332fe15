package load

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// within runs f on a goroutine and fails the test when it has not
// returned after limit; unblock is then called to let it end.
func within(t *testing.T, limit time.Duration, unblock func(), f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		unblock()
		<-done
		t.Fatalf("still blocked after %v", limit)
	}
}

// waitReleased waits, up to 10 s, for the background release that a Close
// on a hung device left to l, then checks that the fake driver holds no
// stream, event, pinned host allocation or registration.
func waitReleased(t *testing.T, l *Loader, d *fakedrv.Driver) {
	t.Helper()
	select {
	case <-l.released:
	case <-time.After(10 * time.Second):
		t.Fatalf("resources not released 10 s after the device resumed: %+v", d.Live())
	}
	if c := d.Live(); c.Streams != 0 || c.Events != 0 || c.HostAllocs != 0 || c.Registrations != 0 {
		t.Fatalf("objects still live after the background release: %+v", c)
	}
}

// TestFakeLoadHungDevice: the device never finishes the copies; Load
// returns at its deadline, and once the device resumes the same Loader
// loads again, every byte right.
func TestFakeLoadHungDevice(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{WaitTimeout: -1})
	path, data := tempFile(t, 1<<20, 21)
	l := e.loader(t)
	dst := e.devbuf(t, len(data))
	e.d.Pause()
	var err error
	within(t, 10*time.Second, e.d.Resume, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = l.LoadFile(ctx, path, dst)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Load on a hung device: %v, want the deadline", err)
	}
	// The next load waits for those copies, bounded by its context, and
	// reads nothing meanwhile.
	var st Stats
	within(t, 10*time.Second, e.d.Resume, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		st, err = l.LoadFile(ctx, path, dst)
	})
	if !errors.Is(err, context.DeadlineExceeded) || st.ReadBytes != 0 {
		t.Errorf("Load behind hung copies: %v, %+v; want the deadline before any read", err, st)
	}
	e.d.Resume()
	if err := dst.Memset(0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}

// TestFakeCloseHungDevice: Close returns at its deadline while copies
// hang, and releases everything once the device resumes.
func TestFakeCloseHungDevice(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{WaitTimeout: -1})
	path, data := tempFile(t, 1<<20, 22)
	// One reader: no other waits for the poll to end before giving its
	// stage back, so Close could release every stage meanwhile.
	l, err := New(e.ctx, WithStageSize(64<<10), WithParallelism(1), WithDepth(6))
	if err != nil {
		t.Fatal(err)
	}
	dst := e.devbuf(t, len(data))
	e.d.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.LoadFile(ctx, path, dst); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Load: %v", err)
	}
	within(t, 10*time.Second, e.d.Resume, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err = l.Close(ctx)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close on a hung device: %v, want the deadline", err)
	}
	if err := l.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	e.d.Resume()
	waitReleased(t, l, e.d)
}

// TestFakeLoadFIFO: a path naming a FIFO is refused at once, not opened
// for ever waiting for a writer.
func TestFakeLoadFIFO(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	fifo := filepath.Join(t.TempDir(), "weights.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Opening the FIFO for writing is what an open blocked on it waits for.
	unblock := func() {
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
	}
	l := e.loader(t)
	dst := e.devbuf(t, 4096)
	for _, whole := range []bool{true, false} {
		var err error
		within(t, 10*time.Second, unblock, func() {
			if whole {
				_, err = l.LoadFile(context.Background(), fifo, dst)
			} else {
				_, err = l.Load(context.Background(), fifo, []Range{{Offset: 0, Length: 10, Dst: dst}})
			}
		})
		if !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("load of a FIFO (whole %v): %v, want fs.ErrInvalid", whole, err)
		}
	}
}

// TestFakeCallbackPanics: a Progress or ready callback that panics on a
// loader goroutine does not kill the process; the load raises the panic
// on its caller's goroutine, leaves nothing pinned, and the Loader loads
// again afterwards.
func TestFakeCallbackPanics(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 23)
	arm := true
	l := e.loader(t, WithProgress(func(done, total int64) {
		if arm && done > 0 {
			panic("progress boom")
		}
	}))
	dst := e.devbuf(t, len(data))
	raised := func(f func()) (v any) {
		defer func() { v = recover() }()
		f()
		return nil
	}
	if v := raised(func() { _, _ = l.LoadFile(context.Background(), path, dst) }); v != "progress boom" {
		t.Errorf("LoadFile with a panicking Progress raised %v", v)
	}
	arm = false
	files := []File{{Path: path, Ranges: []Range{{Offset: 0, Length: int64(len(data)), Dst: dst}}}}
	v := raised(func() {
		_, _ = l.LoadFiles(context.Background(), files, func(file, rng int) { panic("ready boom") })
	})
	if v != "ready boom" {
		t.Errorf("LoadFiles with a panicking ready raised %v", v)
	}
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
}

// TestFakeReadyBlocks: a ready callback that blocks (sending to a
// consumer that has gone away, say) does not hold the load past its
// context: LoadFiles returns the context's error, no callback starts after
// it returned, and once the callback returns the Loader loads again.
func TestFakeReadyBlocks(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 24)
	l := e.loader(t)
	dst := e.devbuf(t, len(data))
	var ranges []Range
	for off := 0; off < len(data); off += 64 << 10 {
		v, err := dst.Slice(off, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		ranges = append(ranges, Range{Offset: int64(off), Length: 64 << 10, Dst: v})
	}
	release := make(chan struct{})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	defer unblock()
	var calls, late atomic.Int64
	var returned atomic.Bool
	ready := func(file, rng int) {
		if returned.Load() {
			late.Add(1)
		}
		if calls.Add(1) == 1 {
			<-release
		}
	}
	var err error
	within(t, 10*time.Second, unblock, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = l.LoadFiles(ctx, []File{{Path: path, Ranges: ranges}}, ready)
		returned.Store(true)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LoadFiles with a blocked ready: %v, want the deadline", err)
	}
	unblock()
	if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
		t.Fatal(err)
	}
	testutil.CheckBytes(t, data, e.deviceBytes(t, dst, len(data)))
	if n := late.Load(); n != 0 {
		t.Errorf("ready called %d times after LoadFiles returned", n)
	}
}

// TestFakeWait: after a load that returned at its deadline on a device
// that does not run its copies, Wait returns at its own deadline while
// they are queued and nil once they ran, after which the destination is
// freed without a copy faulting on it; on a closed Loader likewise.
func TestFakeWait(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{WaitTimeout: -1})
	path, data := tempFile(t, 1<<20, 25)
	for _, closed := range []bool{false, true} {
		l := e.loader(t)
		dst, err := e.ctx.Alloc(len(data))
		if err != nil {
			t.Fatal(err)
		}
		e.d.Pause()
		short := func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}
		within(t, 10*time.Second, e.d.Resume, func() {
			ctx, cancel := short()
			defer cancel()
			_, err = l.LoadFile(ctx, path, dst)
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Load on a paused device: %v", err)
		}
		if closed {
			ctx, cancel := short()
			err = l.Close(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Close on a paused device: %v", err)
			}
		}
		within(t, 10*time.Second, e.d.Resume, func() {
			ctx, cancel := short()
			defer cancel()
			err = l.Wait(ctx)
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait while copies are queued (closed %v): %v, want the deadline", closed, err)
		}
		e.d.Resume()
		if err := l.Wait(context.Background()); err != nil {
			t.Fatalf("Wait once the device resumed (closed %v): %v", closed, err)
		}
		if err := dst.Free(); err != nil {
			t.Fatal(err)
		}
		if errs := e.d.AsyncErrors(); len(errs) != 0 {
			t.Fatalf("a copy ran after Wait returned (closed %v): %v", closed, errs)
		}
	}
}

// TestFakeNoQueryAfterReturn: a reader caught in a poll of the stages in
// flight when its load's context ends (here in a cuEventQuery that
// blocks) does not query a stage's event once the load has returned: by
// then Close may have destroyed it, or a later load recorded it again.
func TestFakeNoQueryAfterReturn(t *testing.T) {
	e := newFakeEnv(t, fakedrv.Options{})
	path, data := tempFile(t, 1<<20, 26)
	// One reader: no other waits for the poll to end before giving its
	// stage back, so Close could release every stage meanwhile.
	l, err := New(e.ctx, WithStageSize(64<<10), WithParallelism(1), WithDepth(6))
	if err != nil {
		t.Fatal(err)
	}
	dst := e.devbuf(t, len(data))
	var closed, queriedAfterClose atomic.Bool
	inQuery, release, queried := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var first sync.Once
	e.d.SetHook(func(op string) cudadrv.Result {
		if op == "cuEventQuery" {
			blocked := false
			first.Do(func() { blocked = true })
			if blocked {
				close(inQuery)
				<-release
				queriedAfterClose.Store(closed.Load())
				close(queried)
			}
		}
		return cudadrv.Success
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := l.LoadFile(ctx, path, dst)
		err = errors.Join(err, l.Close(context.Background()))
		closed.Store(true)
		done <- err
	}()
	<-inQuery
	// The load's deadline passes while the query blocks; let the load
	// and Close end if they do before the query returns.
	select {
	case err = <-done:
	case <-time.After(time.Second):
	}
	close(release)
	<-queried
	if err == nil {
		err = <-done
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("load whose query blocked past its deadline: %v, want the deadline", err)
	}
	if queriedAfterClose.Load() {
		t.Error("a stage's event was queried after the load returned and Close released it")
	}
	e.d.SetHook(nil)
}
