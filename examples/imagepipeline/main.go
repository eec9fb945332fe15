// Command imagepipeline runs an image-processing scenario: frames go to
// the GPU, a light kernel processes them (a brightness shift, add_u8), and
// they come back.
//
// It measures, side by side in one run:
//   - naive: frames in ordinary Go memory, synchronous copies, one frame at a
//     time;
//   - pipelined Go memory: transfer.Pipeline over several streams, staging the
//     same Go frames through pinned buffers;
//   - pipelined pinned: the frames live in pinned memory, so no staging copy
//     is left, only the overlapped transfers.
//
// Every output frame is checked (each byte = input + delta).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/transfer"
)

func main() {
	width := flag.Int("width", 1920, "frame width in pixels")
	height := flag.Int("height", 1080, "frame height in pixels")
	frames := flag.Int("frames", 120, "frames per run")
	streams := flag.Int("streams", 4, "streams for the pipelined runs")
	flag.Parse()
	if err := run(*width**height*4, *frames, *streams); err != nil {
		log.Fatal(err)
	}
}

func run(frameBytes, frames, streams int) error {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	mod, err := ctx.LoadModule(kernels.PTX())
	if err != nil {
		return err
	}
	defer mod.Unload()
	add, err := mod.Function(kernels.KernelAdd)
	if err != nil {
		return err
	}
	const delta = 7
	total := frameBytes * frames
	in := make([]byte, total)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range in {
		in[i] = byte(rng.Uint32())
	}
	out := make([]byte, total)

	// Naive: one frame at a time, pageable memory, synchronous copies.
	s, err := ctx.NewStream(cuda.StreamBlocking)
	if err != nil {
		return err
	}
	defer s.Destroy()
	d, err := ctx.Alloc(frameBytes)
	if err != nil {
		return err
	}
	defer d.Free()
	start := time.Now()
	for f := 0; f < frames; f++ {
		fr := in[f*frameBytes : (f+1)*frameBytes]
		if err := d.Write(0, fr); err != nil {
			return err
		}
		if err := add.Launch(s, cuda.D1(1024), cuda.D1(256), 0, d.Ptr(), uint64(frameBytes), uint8(delta)); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		if err := d.Read(0, out[f*frameBytes:(f+1)*frameBytes]); err != nil {
			return err
		}
	}
	naive := time.Since(start)
	if err := check(in, out, delta); err != nil {
		return fmt.Errorf("naive: %w", err)
	}

	cp, err := transfer.New(ctx)
	if err != nil {
		return err
	}
	defer cp.Close(context.Background())
	p, err := cp.NewPipeline(
		transfer.WithChunkSize(frameBytes),
		transfer.WithStreamCount(streams),
		transfer.WithWork(transfer.LaunchWork(add, cuda.D1(1024), cuda.D1(256), func(ch transfer.Chunk) []any {
			return []any{ch.Dev.Ptr(), uint64(ch.Len), uint8(delta)}
		})),
	)
	if err != nil {
		return err
	}
	defer p.Close(context.Background())

	clear(out)
	goStats, err := p.Run(context.Background(), in, out)
	if err != nil {
		return err
	}
	if err := check(in, out, delta); err != nil {
		return fmt.Errorf("pipelined Go memory: %w", err)
	}

	pin, err := pinmem.Alloc(total, 0)
	if err != nil {
		return err
	}
	defer pin.Free()
	pout, err := pinmem.Alloc(total, 0)
	if err != nil {
		return err
	}
	defer pout.Free()
	forgetIn, forgetOut := cp.AddPinned(pin), cp.AddPinned(pout)
	defer forgetIn()
	defer forgetOut()
	copy(pin.Bytes(), in)
	pinStats, err := p.Run(context.Background(), pin.Bytes(), pout.Bytes())
	if err != nil {
		return err
	}
	if err := check(in, pout.Bytes(), delta); err != nil {
		return fmt.Errorf("pipelined pinned: %w", err)
	}

	fps := func(d time.Duration) float64 { return float64(frames) / d.Seconds() }
	fmt.Printf("%d frames of %d bytes (%.1f MiB), add_u8 kernel, %d streams for the pipelines\n", frames, frameBytes, float64(frameBytes)/(1<<20), streams)
	fmt.Printf("%-30s %10s %10s %8s\n", "mode", "time", "FPS", "speedup")
	fmt.Printf("%-30s %10v %10.0f %7.2fx\n", "naive (pageable, sync)", naive.Round(time.Microsecond), fps(naive), 1.0)
	fmt.Printf("%-30s %10v %10.0f %7.2fx\n", "pipelined, Go memory (staged)", goStats.Wall.Round(time.Microsecond), fps(goStats.Wall), naive.Seconds()/goStats.Wall.Seconds())
	fmt.Printf("%-30s %10v %10.0f %7.2fx\n", "pipelined, pinned memory", pinStats.Wall.Round(time.Microsecond), fps(pinStats.Wall), naive.Seconds()/pinStats.Wall.Seconds())
	return nil
}

func check(in, out []byte, delta byte) error {
	for i := range in {
		if out[i] != in[i]+delta {
			return fmt.Errorf("byte %d: got %d, want %d", i, out[i], in[i]+delta)
		}
	}
	return nil
}
