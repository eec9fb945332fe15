// Command zerocopy shows when zero-copy (a kernel reading mapped pinned host
// memory directly over PCIe) beats an explicit copy to device memory, and
// when it loses: the same kernel reads the data once, twice, four and eight
// times. Zero-copy pays when data is read once; every further pass crosses
// PCIe again. The pinmem CLI's zero-copy bench measures the same with
// events; this example uses only the public API and wall-clock time.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	size := flag.Int("size", 64<<20, "bytes of host data (a multiple of 4)")
	flag.Parse()
	if err := run(*size); err != nil {
		log.Fatal(err)
	}
}

func run(size int) error {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	cctx, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	ctx := context.Background()
	cp, err := transfer.New(cctx)
	if err != nil {
		return err
	}
	defer cp.Close(ctx)
	mod, err := cctx.LoadModule(kernels.Image())
	if err != nil {
		return err
	}
	defer mod.Unload()
	fn, err := mod.Function(kernels.KernelReadSum)
	if err != nil {
		return err
	}
	host, err := pinmem.Alloc(size, pinmem.Mapped|pinmem.Portable, pinmem.WithDevice(dev))
	if err != nil {
		return err
	}
	defer host.Free()
	d, err := cctx.Alloc(size)
	if err != nil {
		return err
	}
	defer d.Free()
	out, err := cctx.Alloc(8)
	if err != nil {
		return err
	}
	defer out.Free()
	grid, block, words := cuda.D1(512), cuda.D1(256), uint64(size/4)
	for _, reuse := range []int{1, 2, 4, 8} {
		// Zero-copy: every pass reads host memory over PCIe.
		t0 := time.Now()
		err := cp.RunMapped(ctx, nil, host, func(s *cuda.Stream, p cuda.DevicePtr, _ int) error {
			for range reuse {
				if err := fn.Launch(s, grid, block, 0, p, words, out.Ptr()); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		zc := time.Since(t0)
		// Explicit: one copy, then every pass reads device memory.
		t0 = time.Now()
		if _, err := cp.HtoD(ctx, d, host.Bytes()); err != nil {
			return err
		}
		for range reuse {
			if err := fn.Launch(cp.Stream(), grid, block, 0, d.Ptr(), words, out.Ptr()); err != nil {
				return err
			}
		}
		if err := cp.Stream().Synchronize(); err != nil {
			return err
		}
		ex := time.Since(t0)
		winner := "explicit"
		if zc < ex {
			winner = "zero-copy"
		}
		fmt.Printf("reuse %d, %d bytes: zero-copy %v, explicit %v: %s wins\n", reuse, size, zc, ex, winner)
	}
	return nil
}
