// Command imagepipeline blurs a batch of video frames on the GPU with a
// transfer.Pipeline: the frames are ordinary Go memory, the Pipeline cuts
// them into chunks of one frame and, on several streams at once, copies a
// frame in through pinned staging buffers, runs the caller's work on it (a
// 3x3 box blur, kernel/kernel.cu) and copies the result out, so that one
// frame's copy in overlaps another's blur and a third's copy out. Every
// output pixel is checked against the blur computed on the CPU.
//
// The article pinmem grew from claims pinned memory and streams took such a
// pipeline from 120 to 210 frames per second; that measurement (naive,
// pinned, N streams and the Pipeline, against the copy bound) is ./measure:
//
//	go run ./examples/imagepipeline/measure -res 1080p,4k
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/imagepipeline/kernel"
	"github.com/pinmem/pinmem/transfer"
)

// video is the batch: frames RGBA frames of width x height pixels.
type video struct{ width, height, frames int }

func main() {
	if err := run(context.Background(), video{1920, 1080, 16}, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "imagepipeline: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "imagepipeline:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, v video, w io.Writer) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	mod, err := gpu.LoadModule(kernel.PTX)
	if err != nil {
		return fmt.Errorf("loading the kernel: %w", err)
	}
	defer func() { err = errors.Join(err, mod.Destroy()) }()
	blur, err := mod.Function(kernel.Name)
	if err != nil {
		return err
	}

	frame := v.width * v.height * 4
	// The blur cannot run in place: each stream blurs the chunk's frame
	// into a scratch frame of its own and copies the result back into the
	// chunk's device memory, which the Pipeline then copies out.
	var mu sync.Mutex
	scratch := map[*cuda.Stream]*cuda.DeviceBuffer{}
	defer func() {
		for _, d := range scratch {
			err = errors.Join(err, d.Free())
		}
	}()
	work := func(s *cuda.Stream, ch transfer.Chunk) error {
		mu.Lock()
		tmp, ok := scratch[s]
		if !ok {
			var err error
			if tmp, err = gpu.Alloc(frame); err != nil {
				mu.Unlock()
				return err
			}
			scratch[s] = tmp
		}
		mu.Unlock()
		err := blur.Launch(s, cuda.D1(256), cuda.D1(256), 0, ch.Dev.Ptr(), tmp.Ptr(), uint32(v.width), uint32(v.height))
		if err != nil {
			return err
		}
		return s.CopyDtoD(ch.Dev, 0, tmp, 0, ch.Len)
	}

	cp, err := transfer.New(gpu)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Close(ctx)) }()
	pl, err := cp.NewPipeline(
		transfer.WithChunkSize(frame), // one chunk is one frame
		transfer.WithStreams(4),
		transfer.WithWork(work),
	)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pl.Close(ctx)) }()

	// The frames, in Go memory, and room for the blurred ones.
	in := make([]byte, v.frames*frame)
	for i := range in {
		in[i] = byte(i*7 + i/frame*31)
	}
	out := make([]byte, len(in))
	st, err := pl.Run(ctx, in, out)
	if err != nil {
		return err
	}

	want := make([]byte, frame)
	for f := range v.frames {
		kernel.Blur(want, in[f*frame:(f+1)*frame], v.width, v.height)
		if !bytes.Equal(out[f*frame:(f+1)*frame], want) {
			return fmt.Errorf("frame %d: the blurred frame differs from the CPU's blur", f)
		}
	}
	fmt.Fprintf(w, "%d frames of %dx%d blurred through a 4-stream Pipeline at %.0f frames/s, every pixel checked\n",
		v.frames, v.width, v.height, float64(st.Chunks)/st.Wall.Seconds())
	return nil
}
