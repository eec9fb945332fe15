package load_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/load"
)

// A Loader reads a file's ranges into views of one device allocation.
// Here the GPU is cudatest's fake, so that the example runs anywhere
// (leave the first lines out on a machine with a GPU), and the file is a
// small one written first.
func ExampleLoader_Load() {
	drv, err := cudatest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	dir, err := os.MkdirTemp("", "load-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	shard := filepath.Join(dir, "shard.bin")
	data := bytes.Repeat([]byte("weights!"), 1<<20) // 8 MiB
	if err := os.WriteFile(shard, data, 0o644); err != nil {
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
	// 4 stages of 1 MiB instead of the defaults (load.DefaultSettings), each pinned
	// by the first read that takes it and kept until Close.
	l, err := load.New(gpu, load.WithDepth(4), load.WithStageSize(1<<20))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	dst, err := gpu.Alloc(4 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer dst.Free()
	a, err := dst.Slice(0, 2<<20)
	if err != nil {
		log.Fatal(err)
	}
	b, err := dst.Slice(2<<20, 2<<20)
	if err != nil {
		log.Fatal(err)
	}
	st, err := l.Load(context.Background(), shard, []load.Range{
		{Offset: 4096, Length: 2 << 20, Dst: a},
		{Offset: 6 << 20, Length: 2 << 20, Dst: b},
	})
	if err != nil {
		log.Fatal(err)
	}
	got := make([]byte, 4<<20)
	if _, err := dst.ReadAt(got, 0); err != nil {
		log.Fatal(err)
	}
	// st.GBps() and st.Mode say how fast and how the file was read.
	fmt.Println(st.Bytes>>20, "MiB loaded, every byte:",
		bytes.Equal(got[:2<<20], data[4096:4096+2<<20]) && bytes.Equal(got[2<<20:], data[6<<20:]))
	// Output: 4 MiB loaded, every byte: true
}
