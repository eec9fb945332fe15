// Command zerocopy shows when zero-copy (a kernel reading mapped pinned host
// memory directly over PCIe) beats an explicit copy to device memory, and
// when it loses: the same kernel reads the data once, twice, four and eight
// times. Zero-copy pays for data read once, because it skips the copy; data
// read many times is better copied once to device memory. This measures
// where that turns on the machine at hand.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	size := flag.Int("size", 64<<20, "bytes of host data")
	reps := flag.Int("reps", 5, "repetitions per cell (median)")
	flag.Parse()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	rows, err := transfer.CompareZeroCopy(context.Background(), ctx, *size, []int{1, 2, 4, 8}, *reps)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Println(r)
	}
}
