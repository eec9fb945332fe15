package load_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/load"
)

// A Loader reads a file's ranges into views of one device allocation.
func ExampleLoader_Load() {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	l, err := load.New(gpu, load.WithProgress(func(done, total int64) {
		fmt.Printf("\r%d of %d MiB", done>>20, total>>20)
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	dst, err := gpu.Alloc(2 << 30)
	if err != nil {
		log.Fatal(err)
	}
	defer dst.Free()
	a, _ := dst.Slice(0, 1<<30)
	b, _ := dst.Slice(1<<30, 1<<30)
	st, err := l.Load(context.Background(), "shard.bin", []load.Range{
		{Offset: 4096, Length: 1 << 30, Dst: a},
		{Offset: 3 << 30, Length: 1 << 30, Dst: b},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\n%.1f GB/s, read %s\n", st.GBps(), st.Mode)
}
