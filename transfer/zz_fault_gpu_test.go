package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/testutil"
	"github.com/pinmem/pinmem/kernels"
)

// TestGPUZZKernelFault runs a kernel that faults (it writes through an
// invalid pointer) in a Pipeline on a context of its own, so the sticky
// error does not poison the primary context the other tests use; this
// file's name makes it run last. The Pipeline must return an error matching
// cuda.ErrLaunchFailed, never success.
func TestGPUZZKernelFault(t *testing.T) {
	testutil.RequireGPU(t)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := cuda.NewContext(dev, cuda.SchedAuto)
	if err != nil {
		t.Fatal(err)
	}
	// The context is unusable after the fault: destroy it and everything in it.
	defer ctx.Destroy()
	c, err := New(ctx, WithStageSize(4<<20), WithDepth(2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := gpuKernel(t, ctx, kernels.KernelAdd)
	p, err := c.NewPipeline(PipelineConfig{ChunkSize: 1 << 20, Streams: 2,
		Work: func(s *cuda.Stream, ch Chunk) error {
			ptr := ch.Dev.Ptr()
			if ch.Index == 2 {
				ptr = 0x10 // not device memory
			}
			return f.Launch(s, cuda.D1(4), cuda.D1(256), 0, ptr, uint64(ch.Len), uint8(1))
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := testutil.RandomBytes(8<<20, 16)
	st, err := p.Run(context.Background(), in, make([]byte, len(in)))
	if !errors.Is(err, cuda.ErrLaunchFailed) {
		t.Fatalf("Run with a faulting kernel: %+v, %v", st, err)
	}
	if st.Chunks >= 8 {
		t.Fatalf("a faulted run delivered every chunk: %+v", st)
	}
	t.Logf("fault reported as: %v", err)
}
