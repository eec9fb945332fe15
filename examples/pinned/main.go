// Command pinned shows pinmem's pinned host memory: it pins a buffer with
// each method, copies it to the GPU and back, and prints the ledger beside
// the host's own figures (where Mlocked stays at zero).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

func main() {
	size := flag.Int("size", 256<<20, "buffer size in bytes")
	flag.Parse()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	d, err := ctx.Alloc(*size)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	var bufs []*pinmem.Buffer
	for _, m := range []pinmem.Method{pinmem.MethodHostAlloc, pinmem.MethodMmapRegister} {
		t0 := time.Now()
		b, err := pinmem.Alloc(*size, 0, pinmem.WithMethod(m))
		if err != nil {
			log.Fatal(err)
		}
		pin := time.Since(t0)
		for i := range b.Bytes() {
			b.Bytes()[i] = byte(i * 7)
		}
		want := bytes.Clone(b.Bytes())
		if err := d.Write(0, b.Bytes()); err != nil {
			log.Fatal(err)
		}
		clear(b.Bytes())
		if err := d.Read(0, b.Bytes()); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-14s pinned %d bytes in %v (huge pages: %v), round trip ok: %v\n",
			m, b.Pinned(), pin, b.HugePages(), bytes.Equal(want, b.Bytes()))
		bufs = append(bufs, b)
	}
	fmt.Print(pinmem.Stats())
	for _, b := range bufs {
		if err := b.Free(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(pinmem.Stats())
}
