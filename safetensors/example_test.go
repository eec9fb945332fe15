package safetensors_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/safetensors"
)

// writeModel writes a small safetensors file into dir: an F16 embedding
// of 4 x 8 and an F32 lm_head.weight of 8 x 4, each byte its index.
func writeModel(dir string) (string, error) {
	path := filepath.Join(dir, "model.safetensors")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	count := func(n int) func(w io.Writer) error {
		return func(w io.Writer) error {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(i)
			}
			_, err := w.Write(b)
			return err
		}
	}
	_, err = safetensors.Write(f, []safetensors.Spec{
		{Name: "embed.weight", DType: safetensors.F16, Shape: []int64{4, 8}, Data: count(64)},
		{Name: "lm_head.weight", DType: safetensors.F32, Shape: []int64{8, 4}, Data: count(128)},
	}, nil)
	return path, errors.Join(err, f.Close())
}

// LoadAll puts every tensor of a file into one device allocation. Here
// the GPU is cudatest's fake, so that the example runs anywhere (leave the
// first lines out on a machine with a GPU), and the file a small one
// written first.
func ExampleLoadAll() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	dir, err := os.MkdirTemp("", "safetensors-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	model, err := writeModel(dir)
	if err != nil {
		log.Fatal(err)
	}

	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	l, err := load.New(gpu, load.WithDepth(2), load.WithStageSize(1<<20))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	ts, err := safetensors.LoadAll(context.Background(), l, model)
	if err != nil {
		log.Fatal(err)
	}
	defer ts.Free()
	t, buf, ok := ts.Tensor("lm_head.weight")
	if !ok {
		log.Fatal("no lm_head.weight")
	}
	b := make([]byte, buf.Size())
	if _, err := buf.ReadAt(b, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.DType, t.Shape, buf.Size(), "bytes, the last", b[len(b)-1])
	// Output: F32 [8 4] 128 bytes, the last 127
}

// Load puts each tensor where a callback says: here, one allocation per
// tensor, kept in a map, and only the F16 and BF16 tensors (on cudatest's
// fake GPU, with the file of ExampleLoadAll).
func ExampleLoad() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	dir, err := os.MkdirTemp("", "safetensors-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	model, err := writeModel(dir)
	if err != nil {
		log.Fatal(err)
	}

	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	l, err := load.New(gpu, load.WithDepth(2), load.WithStageSize(1<<20))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	weights := map[string]*cuda.DeviceBuffer{}
	defer func() {
		for _, b := range weights {
			b.Free()
		}
	}()
	_, st, err := safetensors.Load(context.Background(), l, model, func(t safetensors.Tensor) (*cuda.DeviceBuffer, error) {
		if t.Size() == 0 || (t.DType != safetensors.F16 && t.DType != safetensors.BF16) {
			return nil, nil
		}
		b, err := gpu.Alloc(int(t.Size()))
		if err == nil {
			weights[t.Name] = b
		}
		return b, err
	})
	if err != nil {
		log.Fatal(err)
	}
	// st.GBps() says how fast.
	fmt.Println(len(weights), "tensor of", st.Bytes, "bytes:", weights["embed.weight"] != nil)
	// Output: 1 tensor of 64 bytes: true
}

// LoadCheckpoint loads a sharded checkpoint by its index, the shards in
// parallel. Here rank 1 of 4 takes its quarter of the rows of every 2-D
// tensor, and a server could start using each tensor as it is announced.
func ExampleLoadCheckpoint() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	l, err := load.New(gpu)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())
	const rank, ranks = 1, 4
	slices := map[string]*cuda.DeviceBuffer{}
	part := func(t safetensors.Tensor) (load.Range, error) {
		if len(t.Shape) != 2 || t.Shape[0]%ranks != 0 || t.Size() == 0 {
			return load.Range{}, nil // not this rank's
		}
		n := t.Size() / ranks // the rows rank*rows/ranks to (rank+1)*rows/ranks
		b, err := gpu.Alloc(int(n))
		slices[t.Name] = b
		return load.Range{Offset: rank * n, Length: n, Dst: b}, err
	}
	ready := func(t safetensors.Tensor) { fmt.Println("ready:", t.Name) }
	st, err := safetensors.LoadCheckpoint(context.Background(), l, "model/model.safetensors.index.json", part, ready)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d slices at %.1f GB/s\n", len(slices), st.GBps())
}
