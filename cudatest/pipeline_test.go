package cudatest_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/pool"
	"github.com/pinmem/pinmem/transfer"
)

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
	defer p.Close()
	c, err := transfer.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pl, err := c.NewPipeline(transfer.PipelineConfig{ChunkSize: 64 << 10, Streams: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()

	in, err := p.Get(1<<20 + 100)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put(in)
	out, err := p.Get(in.Len())
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

	if err := d.FailAsync("cuMemcpyDtoHAsync_v2", cudatest.Nth(3), 700); err != nil {
		t.Fatal(err)
	}
	_, err = pl.Run(context.Background(), in.Bytes(), out.Bytes())
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_ILLEGAL_ADDRESS" {
		t.Errorf("Run with a faulting copy: %v, want CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
}
