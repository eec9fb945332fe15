package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

// memsetOn queues a memset of buf on s and records ev after it.
func memsetOn(t *testing.T, s *cuda.Stream, buf *cuda.DeviceBuffer, ev *cuda.Event) {
	t.Helper()
	if err := s.Memset(buf, 0, 9, buf.Size()); err != nil {
		t.Fatalf("queueing the memset: %v", err)
	}
	if ev != nil {
		if err := ev.Record(s); err != nil {
			t.Fatalf("recording the event: %v", err)
		}
	}
}

// streamBufEvent makes a stream, a device buffer and an event, released
// when t ends.
func streamBufEvent(t *testing.T, ctx *cuda.Context) (*cuda.Stream, *cuda.DeviceBuffer, *cuda.Event) {
	t.Helper()
	s, buf := newStream(t, ctx, cuda.StreamNonBlocking), deviceBuf(t, ctx, 64)
	ev, err := ctx.NewEvent(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Destroy() })
	return s, buf, ev
}

// TestAsyncFaultReporters: an asynchronous fault is reported once, by the
// first of an event query, an event synchronize, a stream query, a stream
// synchronize or a context synchronize that observes it, as a GPU reports
// it; it names cudatest, not an internal package.
func TestAsyncFaultReporters(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, buf, ev := streamBufEvent(t, ctx)
	reporters := []struct {
		name   string
		report func() error
	}{
		{"event query", func() error { _, err := ev.Query(); return err }},
		{"event synchronize", func() error { return ev.Synchronize(context.Background()) }},
		{"stream query", func() error { _, err := s.Query(); return err }},
		{"stream synchronize", func() error { return s.Synchronize(context.Background()) }},
		{"context synchronize", func() error { return ctx.Synchronize(context.Background()) }},
	}
	for _, r := range reporters {
		if err := d.FailAsync("cuMemsetD8Async", cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
			t.Fatal(err)
		}
		memsetOn(t, s, buf, ev)
		err := r.report()
		if !errors.Is(err, cuda.ErrLaunchFailed) {
			t.Errorf("%s after a faulting memset: %v, want ErrLaunchFailed", r.name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "cudatest") || strings.Contains(msg, "fakedrv") {
			t.Errorf("%s: the fault's message %q should name cudatest and no internal package", r.name, msg)
		}
		for _, again := range reporters {
			if err := again.report(); err != nil {
				t.Errorf("%s after %s reported the fault: %v, want it reported once", again.name, r.name, err)
			}
		}
	}
}

// TestStreamQueryReportsCopyFault: a stream query reports the fault of an
// asynchronous copy on the stream once the copy has run, as cuStreamQuery
// does on a GPU: once for a fault, on every query for a sticky one. While
// the faulting copy is held, the query says only that the stream is busy.
func TestStreamQueryReportsCopyFault(t *testing.T) {
	for _, c := range []struct {
		op     string
		sticky bool
	}{
		{cudatest.AnyHtoD, false},
		{cudatest.AnyDtoH, false},
		{cudatest.AnyHtoD, true},
		{cudatest.AnyDtoH, true},
	} {
		t.Run(fmt.Sprintf("%s/sticky=%v", c.op, c.sticky), func(t *testing.T) {
			d := cudatest.Install(t)
			ctx := primary(t)
			s, buf := newStream(t, ctx, cuda.StreamNonBlocking), deviceBuf(t, ctx, 64)
			host, err := pinmem.Alloc(64, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer host.Free()
			defer d.ClearFaults()
			when := cudatest.Once()
			if c.sticky {
				when = when.Sticky()
			}
			if err := d.FailAsync(c.op, when, cuda.ResultIllegalAddress); err != nil {
				t.Fatal(err)
			}
			if err := d.HoldStream(s); err != nil {
				t.Fatal(err)
			}
			if c.op == cudatest.AnyHtoD {
				err = s.CopyHtoD(buf, 0, host.Bytes())
			} else {
				err = s.CopyDtoH(host.Bytes(), buf, 0)
			}
			if err != nil {
				t.Fatalf("queueing the copy: %v", err)
			}
			if done, err := s.Query(); done || err != nil {
				t.Errorf("Query with the faulting copy held = %v, %v; want not done and no error", done, err)
			}
			if err := d.ReleaseStream(s); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Query(); !isCode(err, cuda.ResultIllegalAddress) || !strings.Contains(err.Error(), "cuStreamQuery") {
				t.Fatalf("Query after the copy faulted: %v, want CUDA_ERROR_ILLEGAL_ADDRESS reported by cuStreamQuery", err)
			}
			done, err := s.Query()
			if c.sticky && !isCode(err, cuda.ResultIllegalAddress) {
				t.Errorf("second Query after a sticky fault: %v, want CUDA_ERROR_ILLEGAL_ADDRESS again", err)
			}
			if !c.sticky && (!done || err != nil) {
				t.Errorf("second Query after the fault was reported = %v, %v; want done, reported once", done, err)
			}
		})
	}
}

// TestStickyFault: a sticky fault fails every later call in its context,
// as CUDA_ERROR_ILLEGAL_ADDRESS does on a GPU, while releases still work;
// ClearFaults resets the context.
func TestStickyFault(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, buf, ev := streamBufEvent(t, ctx)
	if err := d.FailAsync("cuMemsetD8Async", cudatest.Once().Sticky(), cuda.ResultIllegalAddress); err != nil {
		t.Fatal(err)
	}
	memsetOn(t, s, buf, nil)
	for name, call := range map[string]func() error{
		"stream synchronize":  func() error { return s.Synchronize(context.Background()) },
		"event record":        func() error { return ev.Record(s) },
		"event synchronize":   func() error { return ev.Synchronize(context.Background()) },
		"memset":              func() error { return s.Memset(buf, 0, 1, 64) },
		"context synchronize": func() error { return ctx.Synchronize(context.Background()) },
		"copy to host":        func() error { _, err := buf.ReadAt(make([]byte, 64), 0); return err },
		"allocation": func() error {
			b, err := ctx.Alloc(64)
			if err == nil {
				b.Free()
			}
			return err
		},
		"new stream": func() error {
			s, err := ctx.NewStream(0)
			if err == nil {
				s.Destroy()
			}
			return err
		},
	} {
		for range 2 {
			if err := call(); !isCode(err, cuda.ResultIllegalAddress) {
				t.Errorf("%s after a sticky fault: %v, want ErrIllegalAddress every time", name, err)
			}
		}
	}
	d.ClearFaults()
	b, err := ctx.Alloc(64)
	if err != nil {
		t.Fatalf("allocation after ClearFaults: %v", err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}

// TestStickyReleases: the calls that release objects succeed in a context
// a sticky fault broke.
func TestStickyReleases(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	s, err := ctx.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FailOn("cuMemsetD8_v2", cudatest.Once().Sticky(), cuda.ResultIllegalAddress); err != nil {
		t.Fatal(err)
	}
	if err := buf.Memset(1); !isCode(err, cuda.ResultIllegalAddress) {
		t.Fatalf("the faulting memset: %v", err)
	}
	if err := s.Synchronize(context.Background()); !isCode(err, cuda.ResultIllegalAddress) {
		t.Errorf("Synchronize after a sticky synchronous fault: %v, want ErrIllegalAddress", err)
	}
	if err := buf.Free(); err != nil {
		t.Errorf("Free in a broken context: %v", err)
	}
	if err := s.Destroy(); err != nil {
		t.Errorf("Destroy in a broken context: %v", err)
	}
}

// TestFaultByClass: a fault on AnyHtoD or AnyDtoH hits a Copier's copy of
// every size, whichever path and driver function the size takes, and
// Calls counts the class.
func TestFaultByClass(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	c := newCopier(t, ctx)
	dst, err := ctx.Alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	sizes := []int{1, 4 << 10, 64 << 10, 300 << 10, 1 << 20, 8 << 20}
	for _, class := range []string{cudatest.AnyHtoD, cudatest.AnyDtoH} {
		for _, n := range sizes {
			t.Run(fmt.Sprintf("%s/%d", class, n), func(t *testing.T) {
				defer d.ClearFaults()
				if err := d.FailAsync(class, cudatest.Always(), cuda.ResultIllegalAddress); err != nil {
					t.Fatal(err)
				}
				calls := d.Calls(class)
				host := pattern(n, 7)
				part, err := dst.Slice(0, n)
				if err != nil {
					t.Fatal(err)
				}
				if class == cudatest.AnyHtoD {
					_, err = c.HtoD(context.Background(), part, host)
				} else {
					_, err = c.DtoH(context.Background(), host, part)
				}
				if !isCode(err, cuda.ResultIllegalAddress) {
					t.Errorf("a %d-byte copy: %v, want the fault on %s", n, err, class)
				}
				if d.Calls(class) == calls {
					t.Errorf("Calls(%q) did not count the copy's calls", class)
				}
			})
		}
	}
	if err := d.FailOn("cuMemcpyAnything", cudatest.Once(), cuda.ResultLaunchFailed); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("FailOn of a name neither a function nor a class: %v", err)
	}
}

// TestFaultByClassAlloc: AnyAlloc hits device and pinned allocations.
func TestFaultByClassAlloc(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	if err := d.FailOn(cudatest.AnyAlloc, cudatest.Always(), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := ctx.Alloc(64); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("device allocation: %v, want ErrOutOfMemory", err)
	}
	if _, err := pinmem.Alloc(4096, 0); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("pinned allocation: %v, want ErrOutOfMemory", err)
	}
}

// TestKernelReplaced: registering a kernel again changes what a Function
// looked up before runs.
func TestKernelReplaced(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	fill := func(v byte) func(k *cudatest.Kernel) error {
		return func(k *cudatest.Kernel) error {
			mem, err := k.Mem(cuda.DevicePtr(k.Arg(0)), 16)
			if err != nil {
				return err
			}
			for i := range mem {
				mem[i] = v
			}
			return nil
		}
	}
	fn := kernelFunc(t, d, ctx, "fill", 1, fill(1))
	buf, s := deviceBuf(t, ctx, 16), newStream(t, ctx, 0)
	for _, v := range []byte{1, 2} {
		if err := d.RegisterKernel("fill", 1, fill(v)); err != nil {
			t.Fatal(err)
		}
		if err := fn.Launch(s, cuda.D1(1), cuda.D1(1), 0, buf.Ptr()); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 16)
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := buf.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{v}, 16)) {
			t.Errorf("after registering the body that writes %d: %v", v, got)
		}
	}
}

// TestKernelPanics: a body that panics fails its launch, reported to the
// code waiting for it, instead of unwinding through the call that ran the
// work (here the test's ReleaseStream) and leaving the waiter blocked.
func TestKernelPanics(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	fn := kernelFunc(t, d, ctx, "trap", 0, func(*cudatest.Kernel) error { panic("trap") })
	s := newStream(t, ctx, 0)
	if err := d.HoldStream(s); err != nil {
		t.Fatal(err)
	}
	if err := fn.Launch(s, cuda.D1(1), cuda.D1(1), 0); err != nil {
		t.Fatal(err)
	}
	synced := make(chan error, 1)
	go func() { synced <- s.Synchronize(context.Background()) }()
	waitBlocked(t, d, s)
	if err := d.ReleaseStream(s); err != nil {
		t.Fatal(err)
	}
	if err := <-synced; !errors.Is(err, cuda.ErrLaunchFailed) || !strings.Contains(err.Error(), "panicked: trap") {
		t.Errorf("Synchronize after a kernel body panicked: %v, want ErrLaunchFailed naming the panic", err)
	}
}

// TestKernelMemRefused: Kernel.Mem past an allocation fails the launch
// with ErrLaunchFailed, and its error says what Mem refused, once.
func TestKernelMemRefused(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	fn := kernelFunc(t, d, ctx, "over", 1, func(k *cudatest.Kernel) error {
		_, err := k.Mem(cuda.DevicePtr(k.Arg(0)), 17)
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Kernel.Mem past the allocation: %v, want an error matching ErrInvalidValue", err)
		}
		return err
	})
	buf, s := deviceBuf(t, ctx, 16), newStream(t, ctx, 0)
	if err := fn.Launch(s, cuda.D1(1), cuda.D1(1), 0, buf.Ptr()); err != nil {
		t.Fatal(err)
	}
	err := s.Synchronize(context.Background())
	if !errors.Is(err, cuda.ErrLaunchFailed) || !strings.Contains(err.Error(), "Kernel.Mem(") || strings.Count(err.Error(), "kernel over") != 1 {
		t.Errorf("Synchronize after Kernel.Mem was refused: %v, want ErrLaunchFailed naming Kernel.Mem and the kernel once", err)
	}
}

// TestKernelFaultInPipeline: a kernel that faults in a running Pipeline
// makes Run return a *transfer.ChunkError naming the chunk, which matches
// the driver's error.
func TestKernelFaultInPipeline(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	fn := kernelFunc(t, d, ctx, "work", 0, nil)
	c := newCopier(t, ctx)
	pl := newPipeline(t, c, transfer.WithChunkSize(32<<10),
		transfer.WithWork(transfer.LaunchWork(fn, cuda.D1(1), cuda.D1(32), func(transfer.Chunk) []any { return nil })))
	if err := d.FailAsync(cudatest.AnyLaunch, cudatest.Nth(3), cuda.ResultIllegalAddress); err != nil {
		t.Fatal(err)
	}
	in := pattern(256<<10, 3)
	_, err := pl.Run(context.Background(), in, make([]byte, len(in)))
	var ce *transfer.ChunkError
	if !errors.As(err, &ce) || !isCode(err, cuda.ResultIllegalAddress) {
		t.Fatalf("Run with the third chunk's kernel faulting: %v (%T), want a *transfer.ChunkError matching ErrIllegalAddress", err, err)
	}
	if ce.Chunk != 2 {
		t.Errorf("ChunkError names chunk %d, want 2 (the third)", ce.Chunk)
	}
}

// isCode reports whether err is a *cuda.Error with code r.
func isCode(err error, r cuda.Result) bool {
	var ce *cuda.Error
	return errors.As(err, &ce) && ce.Code == r
}
