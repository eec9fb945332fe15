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
