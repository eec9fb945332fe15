// Command loadweights loads the tensors of a safetensors file into GPU
// memory with package safetensors (on package load: parallel reads into
// pinned stages, asynchronous copies, direct I/O for cold files) and checks
// every byte against the file.
//
// Given -file, it loads that file; otherwise it first writes a model of
// -size-mib MiB of random tensors of several dtypes and shapes to a
// temporary directory (removed at the end) with safetensors.Write.
//
// It prints one line: tensors, bytes, the rate, how the file was read, and
// "every byte checked". On a machine without an NVIDIA driver or GPU it
// prints one line saying so and exits with status 3.
//
// Usage:
//
//	loadweights [-file model.safetensors] [-size-mib 256]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/load"
	"github.com/pinmem/pinmem/safetensors"
)

type config struct {
	file    string // the file to load; empty: write one
	sizeMiB int    // size of the file written when file is empty
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadweights:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "loadweights: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		} else {
			fmt.Fprintln(os.Stderr, "loadweights:", err)
		}
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("loadweights", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.StringVar(&cfg.file, "file", "", "safetensors file to load (default: write a random model first)")
	fs.IntVar(&cfg.sizeMiB, "size-mib", 256, "size of the model written when -file is not given, in MiB")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.sizeMiB < 1 || cfg.sizeMiB > 1<<20 {
		return config{}, fmt.Errorf("-size-mib %d: want 1 to %d", cfg.sizeMiB, 1<<20)
	}
	return cfg, nil
}

func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	// The GPU first: without one there is nothing to write a file for.
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}
	path := cfg.file
	if path == "" {
		dir, err := os.MkdirTemp("", "loadweights-")
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
		path = filepath.Join(dir, "model.safetensors")
		if err := writeModel(path, int64(cfg.sizeMiB)<<20); err != nil {
			return err
		}
	}

	// A Loader owns pinned stages and streams: make one per process (or
	// per GPU) and reuse it for every file of a model.
	l, err := load.New(gpu)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close(context.Background())) }()

	// Every tensor into one device allocation, at its offset in the file.
	ts, err := safetensors.LoadAll(ctx, l, path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ts.Free()) }()

	if err := check(path, ts); err != nil {
		return err
	}
	st := ts.Stats
	fmt.Fprintf(out, "%d tensors, %.1f MiB to the GPU in %v at %.2f GB/s (%s read), every byte checked\n",
		len(ts.Header.Tensors), float64(st.Bytes)/(1<<20), st.Wall.Round(1e5), st.GBps(), st.Mode)
	return nil
}

// check copies every tensor back from the GPU and compares it with the
// file's bytes.
func check(path string, ts *safetensors.Tensors) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, t := range ts.Header.Tensors {
		_, view, ok := ts.Tensor(t.Name)
		if !ok {
			return fmt.Errorf("tensor %q is missing", t.Name)
		}
		if t.Size() == 0 {
			continue
		}
		want := make([]byte, t.Size())
		if _, err := f.ReadAt(want, t.Begin); err != nil {
			return err
		}
		got := make([]byte, t.Size())
		if _, err := view.ReadAt(got, 0); err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("tensor %q (%s %v) differs on the GPU", t.Name, t.DType, t.Shape)
		}
	}
	return nil
}

// writeModel writes about size bytes of random tensors: embeddings, then
// layers of an F16 weight, an F32 bias and a BF16 norm, and a few odd
// ones (a scalar, an empty tensor, a bool mask).
func writeModel(path string, size int64) (err error) {
	const hidden = 1024
	specs := []safetensors.Spec{
		{Name: "embed", DType: safetensors.F16, Shape: []int64{1000, hidden}},
		{Name: "scale", DType: safetensors.F32, Shape: []int64{}},
		{Name: "empty", DType: safetensors.I64, Shape: []int64{0}},
		{Name: "mask", DType: safetensors.Bool, Shape: []int64{17, 3}},
	}
	for i := 0; int64(i)*(hidden*hidden*2) < size-1000*hidden*2; i++ {
		specs = append(specs,
			safetensors.Spec{Name: fmt.Sprintf("layers.%d.weight", i), DType: safetensors.F16, Shape: []int64{hidden, hidden}},
			safetensors.Spec{Name: fmt.Sprintf("layers.%d.bias", i), DType: safetensors.F32, Shape: []int64{hidden}},
			safetensors.Spec{Name: fmt.Sprintf("layers.%d.norm", i), DType: safetensors.BF16, Shape: []int64{hidden}},
		)
	}
	rng := rand.NewChaCha8([32]byte{1})
	for i := range specs {
		specs[i].Data = func(w io.Writer) error {
			n := specs[i].DType.ElemSize()
			for _, d := range specs[i].Shape {
				n *= int(d)
			}
			_, err := io.CopyN(w, rng, int64(n))
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	w := bufio.NewWriterSize(f, 4<<20)
	if _, err := safetensors.Write(w, specs, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	return w.Flush()
}
