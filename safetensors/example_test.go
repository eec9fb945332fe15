package safetensors_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/safetensors"
)

// LoadAll puts every tensor of a file into one device allocation.
func ExampleLoadAll() {
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
	ts, err := safetensors.LoadAll(context.Background(), l, "model.safetensors")
	if err != nil {
		log.Fatal(err)
	}
	defer ts.Free()
	t, buf, ok := ts.Tensor("lm_head.weight")
	if ok {
		fmt.Println(t.DType, t.Shape, buf.Ptr())
	}
}

// Load puts each tensor where a callback says: here, one allocation per
// tensor, kept in a map, and only the F16 and BF16 tensors.
func ExampleLoad() {
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
	weights := map[string]*cuda.DeviceBuffer{}
	_, st, err := safetensors.Load(context.Background(), l, "model.safetensors", func(t safetensors.Tensor) (*cuda.DeviceBuffer, error) {
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
	fmt.Printf("%d tensors at %.1f GB/s\n", len(weights), st.GBps())
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
