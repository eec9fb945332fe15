package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

// newPipeline returns a Pipeline of c that is closed, and its Close checked,
// when t ends.
func newPipeline(t *testing.T, c *transfer.Copier, opts ...transfer.PipelineOption) *transfer.Pipeline {
	t.Helper()
	pl, err := c.NewPipeline(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pl.Close(context.Background()); err != nil {
			t.Errorf("closing the Pipeline: %v", err)
		}
	})
	return pl
}

// TestPoolAndPipeline: a pool's pinned blocks feed a Copier's Pipeline on
// the fake; an asynchronous fault in one chunk's copy back stops the Run
// with the driver's error; everything is released at the end.
func TestPoolAndPipeline(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	p, err := pool.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("closing the pool: %v", err)
		}
	})
	c := newCopier(t, ctx)
	pl := newPipeline(t, c, transfer.WithChunkSize(64<<10), transfer.WithStreams(2))

	in, err := p.Get(context.Background(), 1<<20+100)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put(in)
	out, err := p.Get(context.Background(), in.Len())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put(out)
	copy(in.Bytes(), pattern(in.Len(), 4))
	if _, err := pl.Run(context.Background(), in.Bytes(), out.Bytes()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in.Bytes(), out.Bytes()) {
		t.Fatal("the Pipeline's round trip changed the bytes")
	}

	if err := d.FailAsync("cuMemcpyDtoHAsync_v2", cudatest.Nth(3), cuda.ResultIllegalAddress); err != nil {
		t.Fatal(err)
	}
	_, err = pl.Run(context.Background(), in.Bytes(), out.Bytes())
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_ILLEGAL_ADDRESS" {
		t.Errorf("Run with a faulting copy: %v, want CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
}

// TestKernelInPipeline: a Pipeline whose Work launches a registered fake
// kernel runs the kernel's Go body on every chunk, in stream order; an
// error from the body fails the Run as a faulting kernel would.
func TestKernelInPipeline(t *testing.T) {
	d := cudatest.Install(t)
	ctx := primary(t)
	var fail atomic.Bool
	fn := kernelFunc(t, d, ctx, "invert", 2, func(k *cudatest.Kernel) error {
		if fail.Load() {
			return errors.New("boom")
		}
		mem, err := k.Mem(cuda.DevicePtr(k.Arg(0)), int(k.Arg(1)))
		if err != nil {
			return err
		}
		for i := range mem {
			mem[i] = ^mem[i]
		}
		return nil
	})
	c := newCopier(t, ctx)
	pl := newPipeline(t, c, transfer.WithChunkSize(32<<10),
		transfer.WithWork(transfer.LaunchWork(fn, cuda.D1(1), cuda.D1(256), func(ch transfer.Chunk) []any {
			return []any{ch.Dev.Ptr(), uint64(ch.Len)}
		})))
	in := pattern(200<<10+9, 5)
	out := make([]byte, len(in))
	if _, err := pl.Run(context.Background(), in, out); err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if out[i] != ^in[i] {
			t.Fatalf("byte %d: %#x in, %#x out, want the kernel's inverse", i, in[i], out[i])
		}
	}
	fail.Store(true)
	if _, err := pl.Run(context.Background(), in, out); !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Errorf("Run with a failing kernel: %v, want ErrLaunchFailed", err)
	}
	if err := d.RegisterKernel("", 0, nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("RegisterKernel with no name: %v", err)
	}
	if err := d.RegisterKernel("k", 65, nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("RegisterKernel with 65 arguments: %v", err)
	}
}
