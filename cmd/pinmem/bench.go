package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/bench"
)

func init() {
	extraCommands = append(extraCommands, newBench, newZeroCopy)
}

// outputFlags are the flags every measuring command shares.
type outputFlags struct {
	device   int
	samples  int
	format   string
	out      string
	baseline string
	quiet    bool
}

func (o *outputFlags) register(c *cobra.Command, defSamples int, defBaseline string) {
	f := c.Flags()
	f.IntVar(&o.device, "device", 0, "GPU ordinal to measure")
	f.IntVar(&o.samples, "samples", defSamples, "timed samples per measurement (median, min and max are reported)")
	f.StringVar(&o.format, "format", "table", "output format: table, json or csv")
	f.StringVar(&o.out, "out", "", "write the report to this file instead of standard output")
	f.StringVar(&o.baseline, "baseline", defBaseline, "kind the table's ratio column compares with (empty: no ratio column)")
	f.BoolVar(&o.quiet, "quiet", false, "no progress lines on standard error")
}

// check validates the shared flags before any GPU work.
func (o *outputFlags) check() (bench.Format, error) {
	if o.device < 0 {
		return "", fmt.Errorf("--device %d: must be 0 or more", o.device)
	}
	if o.samples < 1 || o.samples > 1000 {
		return "", fmt.Errorf("--samples %d: must be from 1 to 1000", o.samples)
	}
	f, err := bench.ParseFormat(o.format)
	if err != nil {
		return "", fmt.Errorf("--format: %w", err)
	}
	return f, nil
}

// open opens the device with progress on stderr unless --quiet. Without
// a driver or GPU the error is the cuda sentinel, which main describes.
func (o *outputFlags) open(cmd *cobra.Command) (*bench.Session, error) {
	var progress io.Writer
	if !o.quiet {
		progress = cmd.ErrOrStderr()
	}
	s, err := bench.Open(cmd.Context(), o.device, bench.SessionConfig{Progress: progress})
	if err != nil {
		return nil, err
	}
	if !o.quiet {
		if kerr := s.KernelError(); kerr != nil {
			fmt.Fprintf(progress, "pinmem: kernels unavailable, using plain event timing and skipping kernel benches: %v\n", kerr)
		}
		fmt.Fprintf(progress, "pinmem: measuring on %s\n", s.Meta("").Device)
	}
	return s, nil
}

// emit writes the report to --out or stdout; runErr (a run that ended
// early) is returned after the partial results are written.
func (o *outputFlags) emit(cmd *cobra.Command, f bench.Format, m bench.Meta, rs []bench.Result, runErr error) error {
	var buf bytes.Buffer
	if err := bench.Write(&buf, f, m, rs, bench.TableOptions{Baseline: o.baseline}); err != nil {
		return errors.Join(runErr, err)
	}
	if o.out == "" {
		_, err := cmd.OutOrStdout().Write(buf.Bytes())
		return errors.Join(runErr, err)
	}
	if err := os.WriteFile(o.out, buf.Bytes(), 0o644); err != nil {
		return errors.Join(runErr, fmt.Errorf("writing the report: %w", err))
	}
	return runErr
}

// writePlot writes the SVG plot of the bandwidth results to path.
func writePlot(path, title string, rs []bench.Result) error {
	var buf bytes.Buffer
	if err := bench.WriteSVG(&buf, title, rs); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	return nil
}

func closeSession(s *bench.Session, err *error) {
	if cerr := s.Close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

func newBench() *cobra.Command {
	var (
		o     outputFlags
		kinds string
		sizes string
		dirs  string
		plot  string
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure host<->GPU bandwidth for every kind of host memory",
		Long: `bench measures copies between host memory and the GPU for each kind of host
memory, at each size, in each direction, the way nvbandwidth does: a spin
kernel holds the stream while the copies are queued, so launch overhead is not
timed; a warm-up, then several samples (median, min, max); random data, poisoned
destinations, every byte of a sample checked.

Kinds: pageable (Go heap), pinned (cuMemHostAlloc), portable, write-combined,
registered-mmap (mmap + cuMemHostRegister), registered-go (pinmem.Register of a
Go slice), mapped (zero-copy: a kernel reads/writes host memory), staged (Go
slice through pinned stages, package transfer). Directions: h2d, d2h, bidir
(both at once on two streams; the figure is the sum).

Subcommands: "bench pin" (cost of pinning), "bench overlap" (the pipeline),
"bench matrix" (every GPU alone and all at once, like nvbandwidth).`,
		Example: `  pinmem bench
  pinmem bench --kinds pageable,pinned,wc --sizes 1MiB,256MiB --dir h2d,d2h
  pinmem bench --format json --out bw.json --plot bw.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg := bench.BandwidthConfig{Samples: o.samples}
			if cfg.Kinds, err = bench.ParseKinds(kinds); err != nil {
				return fmt.Errorf("--kinds: %w", err)
			}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return fmt.Errorf("--sizes: %w", err)
			}
			if cfg.Dirs, err = bench.ParseDirs(dirs); err != nil {
				return fmt.Errorf("--dir: %w", err)
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			s, err := o.open(cmd)
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Bandwidth(cmd.Context(), cfg)
			m := s.Meta("pinmem bench")
			if plot != "" && len(rs) > 0 {
				if perr := writePlot(plot, "pinmem bench: "+m.Device, rs); perr != nil {
					runErr = errors.Join(runErr, perr)
				}
			}
			return o.emit(cmd, f, m, rs, runErr)
		},
	}
	o.register(c, 5, bench.KindPinned)
	c.Flags().StringVar(&kinds, "kinds", "all", "host memory kinds, comma-separated: "+strings.Join(bench.AllKinds(), ",")+" (or all)")
	c.Flags().StringVar(&sizes, "sizes", sizeList(bench.DefaultSizes), "copy sizes, comma-separated (64KiB, 16MiB, 1GiB, 1000000, ...)")
	c.Flags().StringVar(&dirs, "dir", "h2d,d2h,bidir", "directions, comma-separated: h2d, d2h, bidir (or all)")
	c.Flags().StringVar(&plot, "plot", "", "also write an SVG plot of bandwidth against size to this file")
	c.AddCommand(newBenchPin(), newBenchOverlap())
	for _, sub := range benchSubcommands {
		c.AddCommand(sub())
	}
	return c
}

// benchSubcommands lets other files add "bench" subcommands.
var benchSubcommands []func() *cobra.Command

func sizeList(sizes []int64) string {
	var parts []string
	for _, n := range sizes {
		parts = append(parts, bench.FormatSize(n))
	}
	return strings.Join(parts, ",")
}

func newBenchPin() *cobra.Command {
	var (
		o       outputFlags
		methods string
		sizes   string
	)
	c := &cobra.Command{
		Use:   "pin",
		Short: "Measure the cost of pinning and unpinning host memory, per method and size",
		Long: `pin times obtaining and releasing pinned memory with each method:
hostalloc (cuMemHostAlloc / cuMemFreeHost), mmap-register (pinmem's mmap,
parallel page touch, cuMemHostRegister), go-register (cuMemHostRegister of an
already-touched Go slice, with the touch timed on its own), and
malloc+register (PyTorch-like: allocate, pre-fault on every core, register;
all timed). The ratio column is speed against hostalloc (above 1 = faster).
Sizes the pinned-memory budget refuses are reported as skipped.`,
		Example: `  pinmem bench pin
  pinmem bench pin --sizes 1MiB,64MiB --methods hostalloc,mmap`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg := bench.PinConfig{Samples: o.samples}
			if cfg.Methods, err = bench.ParsePinMethods(methods); err != nil {
				return fmt.Errorf("--methods: %w", err)
			}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return fmt.Errorf("--sizes: %w", err)
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			s, err := o.open(cmd)
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Pin(cmd.Context(), cfg)
			return o.emit(cmd, f, s.Meta("pinmem bench pin"), rs, runErr)
		},
	}
	o.register(c, 3, bench.PinHostAlloc)
	c.Flags().StringVar(&methods, "methods", "all", "pinning methods, comma-separated: "+strings.Join(bench.AllPinMethods(), ",")+" (or all)")
	c.Flags().StringVar(&sizes, "sizes", sizeList(bench.DefaultPinSizes), "buffer sizes, comma-separated")
	return c
}

func newBenchOverlap() *cobra.Command {
	var (
		o       outputFlags
		chunks  int
		chunk   string
		streams int
		vecadd  string
	)
	c := &cobra.Command{
		Use:   "overlap",
		Short: "Run an image pipeline (H2D -> kernel -> D2H per chunk) with and without overlap",
		Long: `overlap runs an image-processing style pipeline: chunks copied to the GPU,
changed by a light kernel (add_u8) and copied back, three ways: pageable memory
with synchronous copies; pinned memory on one stream; pinned memory on several
streams round-robin. It reports ms and FPS (chunks per second), the bound that
the measured bidirectional bandwidth sets, and a vector-add scenario (two
vectors in, one out, pageable vs pinned, end to end). The ratio column is speed
against pageable-sync.`,
		Example: `  pinmem bench overlap
  pinmem bench overlap --chunks 32 --chunk-size 8MiB --streams 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			f, err := o.check()
			if err != nil {
				return err
			}
			if chunks < 1 || chunks > 4096 {
				return fmt.Errorf("--chunks %d: must be from 1 to 4096", chunks)
			}
			if streams < 1 || streams > 64 {
				return fmt.Errorf("--streams %d: must be from 1 to 64", streams)
			}
			cs, err := bench.ParseSize(chunk)
			if err != nil {
				return fmt.Errorf("--chunk-size: %w", err)
			}
			cfg := bench.OverlapConfig{Chunks: chunks, ChunkSize: cs, Streams: streams, Samples: o.samples}
			switch strings.TrimSpace(vecadd) {
			case "0", "off", "none":
				cfg.VecAddSize = -1
			default:
				if cfg.VecAddSize, err = bench.ParseSize(vecadd); err != nil {
					return fmt.Errorf("--vecadd-size: %w", err)
				}
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			s, err := o.open(cmd)
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Overlap(cmd.Context(), cfg)
			return o.emit(cmd, f, s.Meta("pinmem bench overlap"), rs, runErr)
		},
	}
	o.register(c, 5, bench.VariantPageableSync)
	c.Flags().IntVar(&chunks, "chunks", 16, "number of chunks (frames)")
	c.Flags().StringVar(&chunk, "chunk-size", "32MiB", "bytes per chunk")
	c.Flags().IntVar(&streams, "streams", 4, "streams of the overlapped pinned variant")
	c.Flags().StringVar(&vecadd, "vecadd-size", "64MiB", "bytes per vector in the vector-add scenario (off to skip)")
	return c
}

func newZeroCopy() *cobra.Command {
	var (
		o     outputFlags
		size  string
		reuse string
	)
	c := &cobra.Command{
		Use:   "zerocopy",
		Short: "Compare zero-copy reads of mapped host memory with an explicit copy, across reuse factors",
		Long: `zerocopy reads data that lives in host memory R times with a kernel
(read_sum_u32), two ways: zero-copy (the kernel reads mapped host memory
through its device pointer on every pass) and explicit (one copy to device
memory, then R passes there). Zero-copy wins for data read once; the ratio
column (speed against explicit, above 1 = zero-copy faster) shows where that
stops. Needs the kernels to load.`,
		Example: `  pinmem zerocopy
  pinmem zerocopy --size 64MiB --reuse 1,2,4,8,16`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg := bench.ZeroCopyConfig{Samples: o.samples}
			if cfg.Size, err = bench.ParseSize(size); err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if cfg.Size%4 != 0 {
				return fmt.Errorf("--size %s: must be a multiple of 4 bytes", size)
			}
			if cfg.Reuse, err = parseReuse(reuse); err != nil {
				return fmt.Errorf("--reuse: %w", err)
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			s, err := o.open(cmd)
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.ZeroCopy(cmd.Context(), cfg)
			return o.emit(cmd, f, s.Meta("pinmem zerocopy"), rs, runErr)
		},
	}
	o.register(c, 5, bench.VariantExplicit)
	c.Flags().StringVar(&size, "size", "256MiB", "bytes of data")
	c.Flags().StringVar(&reuse, "reuse", "1,2,4,8", "reuse factors (kernel passes over the data), comma-separated")
	return c
}

// parseReuse parses a comma-separated list of reuse factors from 1 to
// bench.MaxReuse.
func parseReuse(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > bench.MaxReuse {
			return nil, fmt.Errorf("reuse factor %q: want a whole number from 1 to %d", p, bench.MaxReuse)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty reuse list")
	}
	return out, nil
}
