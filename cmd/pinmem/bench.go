package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

func init() {
	extraCommands = append(extraCommands, newBench, newZeroCopy)
}

// reportFormats are the formats of a measuring command's report.
var reportFormats = []string{"table", "json", "csv"}

// measureFlags are the flags every single-GPU measuring command shares.
type measureFlags struct {
	output
	device    int
	samples   int
	baseline  string
	quiet     bool
	baselines func(string) (string, error) // checks --baseline, returns its canonical spelling
}

func (o *measureFlags) register(c *cobra.Command, defSamples int, defBaseline string, baselines func(string) (string, error), choices []string) {
	o.output.register(c, reportFormats, true)
	o.baselines = baselines
	f := c.Flags()
	f.IntVar(&o.device, "device", 0, "GPU ordinal to measure")
	f.IntVar(&o.samples, "samples", defSamples, "timed samples per measurement (median, min and max are reported)")
	f.StringVar(&o.baseline, "baseline", defBaseline, "what the table's ratio column compares with: "+strings.Join(choices, ", ")+" (empty: no ratio column)")
	f.BoolVar(&o.quiet, "quiet", false, "no progress bar or notes on standard error")
	f.SetNormalizeFunc(aliasFlags)
	_ = c.RegisterFlagCompletionFunc("baseline", fixedCompletion(choices...))
	_ = c.RegisterFlagCompletionFunc("device", cobra.NoFileCompletions)
}

// check validates the shared flags, the output paths and PINMEM_BUDGET
// before any GPU work.
func (o *measureFlags) check() (bench.Format, error) {
	if o.device < 0 {
		return "", usagef("--device %d: must be 0 or more", o.device)
	}
	if o.samples < 1 || o.samples > bench.MaxSamples {
		return "", usagef("--samples %d: must be from 1 to %d", o.samples, bench.MaxSamples)
	}
	if o.baseline != "" {
		b, err := o.baselines(o.baseline)
		if err != nil {
			return "", usagef("--baseline: %v", err)
		}
		o.baseline = b
	}
	f, err := o.output.check()
	if err != nil {
		return "", err
	}
	return f, checkBudgetEnv()
}

// open opens the device, with a progress bar for about total results.
// Without a driver or GPU the error is the cuda sentinel (exit status 3).
func (o *measureFlags) open(cmd *cobra.Command, total int, what string) (*bench.Session, *progress, error) {
	return o.openWith(cmd, total, what, bench.SessionConfig{})
}

// openWith is open with the session configured by sc (its Progress is
// the progress bar's).
func (o *measureFlags) openWith(cmd *cobra.Command, total int, what string, sc bench.SessionConfig) (*bench.Session, *progress, error) {
	pr := newProgress(cmd.ErrOrStderr(), o.quiet, total, what)
	sc.Progress = pr.writer()
	s, err := bench.Open(cmd.Context(), o.device, sc)
	if err != nil {
		pr.done()
		return nil, nil, err
	}
	if !o.quiet {
		if kerr := s.KernelError(); kerr != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "pinmem: kernels unavailable, using plain event timing and skipping kernel benches: %v\n", kerr)
		}
	}
	return s, pr, nil
}

// meta is the report's provenance: the session's, the tool, the command
// line and the configuration.
func meta(m bench.Meta, cfg any) bench.Meta {
	m.Tool, m.Argv, m.Config = toolInfo(), argv, cfg
	return m
}

func closeSession(s *bench.Session, err *error) {
	if cerr := s.Close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// oneOf returns a --baseline check against a parser of one name: "all"
// and lists are refused, and so is an unknown name, with the names
// without parse's "or all".
func oneOf(parse func(string) ([]string, error)) func(string) (string, error) {
	return func(s string) (string, error) {
		if t := strings.ToLower(strings.TrimSpace(s)); t == "all" || strings.Contains(t, ",") {
			return "", fmt.Errorf("%q: a baseline is one name, not a list or all", s)
		}
		l, err := parse(s)
		if err != nil {
			return "", errors.New(strings.Replace(err.Error(), ", or all)", ")", 1))
		}
		if len(l) != 1 {
			return "", fmt.Errorf("%q: want one name", s)
		}
		return l[0], nil
	}
}

func newBench() *cobra.Command {
	var (
		o     measureFlags
		kinds string
		sizes string
		dirs  string
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure host<->GPU bandwidth for every kind of host memory",
		Long: `bench measures copies between host memory and the GPU for each kind of host
memory, at each size, in each direction, the way nvbandwidth does: a spin
kernel holds the stream while the copies are queued, so launch overhead is not
timed; a warm-up, then several samples (median, min, max); random data, poisoned
destinations, every byte of a sample checked.

Kinds: pageable (Go heap, the driver's asynchronous pageable copy, timed by
events), pageable-sync (Go heap, the driver's synchronous copy, timed by the
wall clock), pinned (cuMemHostAlloc), portable, write-combined, mmap-register
(mmap + cuMemHostRegister), go-register (pinmem.Register of a Go slice),
mapped (zero-copy: a kernel reads/writes host memory), copier (a Go slice
moved by a default transfer.Copier, what users of package transfer get; each
row's path says which path the Copier took at that size). The wall-clock kinds compare like with like: copier against
pageable-sync is the Copier against the driver's own copy of Go memory.
One way, the copier is measured side by side with that driver copy of the
same slice, in paired rounds (each sample runs both, in a random order, one
untimed call and then the sample's copies), and its ratio is the median of
the rounds' ratios, as BenchmarkCopierVsDriver measures it. From 16 MiB a
staged-bound row follows each copier row: per round, the CPU's parallel copy
between the slice and pinned memory (the Copier's goroutines) and the copy
engine's copy of that pinned memory, started together and timed until both
end, what a staged copy can reach on this machine (its note gives each
alone; it pins two buffers of the row's size); the copier's note gives
its ratio to it.
Directions: h2d, d2h, bidir (both at once: two streams, or for the wall-clock
kinds and pageable two goroutines; the figure is the sum).

Every row names its same-run reference and the ratio to it (JSON: ref,
ratio): Go-memory kinds against pageable-sync, the pinned family against
pinned (or the C reference's rows where pinmem bench all ran it).

Subcommands: "bench all" (every headline figure in one run), "bench pin"
(cost of pinning), "bench overlap" (the pipeline), "bench matrix" (every GPU
alone and all at once, like nvbandwidth), "bench blocks" (scattered block
copies by each blocks.Copier strategy, one way and both at once), "bench load"
(a file to the GPU).

` + exitHelp,
		Example: `  pinmem bench
  pinmem bench --kinds pageable,pinned,write-combined --sizes 1MiB,256MiB --dirs h2d,d2h
  pinmem bench --format json -o bw.json --plot bw.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg := bench.BandwidthConfig{Samples: o.samples}
			if cfg.Kinds, err = bench.ParseKinds(kinds); err != nil {
				return usagef("--kinds: %v", err)
			}
			if slices.Contains(strings.Split(strings.ToLower(kinds), ","), bench.KindStaged) {
				fmt.Fprintf(cmd.ErrOrStderr(), "pinmem: --kinds %s is the deprecated name of %s: measuring %s\n", bench.KindStaged, bench.KindCopier, bench.KindCopier)
			}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usagef("--sizes: %v", err)
			}
			if cfg.Dirs, err = bench.ParseDirs(dirs); err != nil {
				return usagef("--dirs: %v", err)
			}
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg.Samples = o.samples
			if cfg, err = cfg.Resolved(); err != nil {
				return usage(err)
			}
			s, pr, err := o.open(cmd, len(cfg.Kinds)*len(cfg.Sizes)*len(cfg.Dirs), "bench")
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Bandwidth(cmd.Context(), cfg)
			pr.done()
			return o.emit(cmd, f, meta(s.Meta("pinmem bench"), cfg), rs, bench.TableOptions{Baseline: o.baseline}, runErr)
		},
	}
	o.register(c, 5, bench.KindPinned, oneOf(bench.ParseKinds), bench.AllKinds())
	c.Flags().StringVar(&kinds, "kinds", "all", "host memory kinds, comma-separated: "+strings.Join(bench.AllKinds(), ",")+" (or all; short names: wc, mmap, go, sync, zerocopy)")
	c.Flags().StringVar(&sizes, "sizes", sizeList(bench.DefaultSizes), "copy sizes, comma-separated (64KiB, 16MiB, 1GiB, 1000000, ...)")
	c.Flags().StringVar(&dirs, "dirs", "h2d,d2h,bidir", "directions, comma-separated: h2d, d2h, bidir (or all); --dir is the same flag")
	_ = c.RegisterFlagCompletionFunc("kinds", fixedCompletion(append(bench.AllKinds(), "all")...))
	_ = c.RegisterFlagCompletionFunc("dirs", fixedCompletion(append(bench.AllDirs(), "all")...))
	_ = c.RegisterFlagCompletionFunc("sizes", fixedCompletion("64KiB", "1MiB", "16MiB", "256MiB", "1GiB"))
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
		o       measureFlags
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
  pinmem bench pin --sizes 1MiB,64MiB --methods hostalloc,mmap-register --plot pin.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg := bench.PinConfig{}
			if cfg.Methods, err = bench.ParsePinMethods(methods); err != nil {
				return usagef("--methods: %v", err)
			}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usagef("--sizes: %v", err)
			}
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg.Samples = o.samples
			if cfg, err = cfg.Resolved(); err != nil {
				return usage(err)
			}
			s, pr, err := o.open(cmd, len(cfg.Methods)*len(cfg.Sizes), "bench pin")
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Pin(cmd.Context(), cfg)
			pr.done()
			return o.emit(cmd, f, meta(s.Meta("pinmem bench pin"), cfg), rs, bench.TableOptions{Baseline: o.baseline}, runErr)
		},
	}
	o.register(c, 3, bench.PinHostAlloc, oneOf(bench.ParsePinMethods), bench.AllPinMethods())
	c.Flags().StringVar(&methods, "methods", "all", "pinning methods, comma-separated: "+strings.Join(bench.AllPinMethods(), ",")+" (or all)")
	c.Flags().StringVar(&sizes, "sizes", sizeList(bench.DefaultPinSizes), "buffer sizes, comma-separated")
	_ = c.RegisterFlagCompletionFunc("methods", fixedCompletion(append(bench.AllPinMethods(), "all")...))
	return c
}

var pinnedNStreams = regexp.MustCompile(`^pinned-([0-9]+)streams?$`)

// overlapVariant checks an overlap --baseline.
func overlapVariant(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case bench.VariantPageableSync, bench.VariantPinned1, bench.VariantBound:
		return s, nil
	}
	if m := pinnedNStreams.FindStringSubmatch(s); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n >= 1 && n <= 64 {
			return bench.VariantPinnedN(n), nil
		}
	}
	return "", fmt.Errorf("unknown variant %q (want %s, %s, pinned-Nstreams or %s)", s, bench.VariantPageableSync, bench.VariantPinned1, bench.VariantBound)
}

func newBenchOverlap() *cobra.Command {
	var (
		o       measureFlags
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
  pinmem bench overlap --chunks 32 --chunk-size 8MiB --streams 8 --plot overlap.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if chunks < 1 || chunks > 4096 {
				return usagef("--chunks %d: must be from 1 to 4096", chunks)
			}
			if streams < 1 || streams > 64 {
				return usagef("--streams %d: must be from 1 to 64", streams)
			}
			cs, err := bench.ParseSize(chunk)
			if err != nil {
				return usagef("--chunk-size: %v", err)
			}
			cfg := bench.OverlapConfig{Chunks: chunks, ChunkSize: cs, Streams: streams}
			switch strings.TrimSpace(vecadd) {
			case "0", "off", "none":
				cfg.VecAddSize = -1
			default:
				if cfg.VecAddSize, err = bench.ParseSize(vecadd); err != nil {
					return usagef("--vecadd-size: %v", err)
				}
			}
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg.Samples = o.samples
			if cfg, err = cfg.Resolved(); err != nil {
				return usage(err)
			}
			s, pr, err := o.open(cmd, 12, "bench overlap")
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Overlap(cmd.Context(), cfg)
			pr.done()
			return o.emit(cmd, f, meta(s.Meta("pinmem bench overlap"), cfg), rs, bench.TableOptions{Baseline: o.baseline}, runErr)
		},
	}
	o.register(c, 5, bench.VariantPageableSync, overlapVariant,
		[]string{bench.VariantPageableSync, bench.VariantPinned1, bench.VariantPinnedN(4), bench.VariantBound})
	c.Flags().IntVar(&chunks, "chunks", 16, "number of chunks (frames)")
	c.Flags().StringVar(&chunk, "chunk-size", "32MiB", "bytes per chunk")
	c.Flags().IntVar(&streams, "streams", 4, "streams of the overlapped pinned variant")
	c.Flags().StringVar(&vecadd, "vecadd-size", "64MiB", "bytes per vector in the vector-add scenario (off to skip)")
	return c
}

// zeroCopyVariant checks a zerocopy --baseline.
func zeroCopyVariant(s string) (string, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); v {
	case bench.VariantZeroCopy, bench.VariantExplicit:
		return v, nil
	case "zerocopy", "mapped":
		return bench.VariantZeroCopy, nil
	}
	return "", fmt.Errorf("unknown variant %q (want %s or %s)", s, bench.VariantZeroCopy, bench.VariantExplicit)
}

func newZeroCopy() *cobra.Command {
	var (
		o     measureFlags
		sizes string
		reuse string
	)
	c := &cobra.Command{
		Use:   "zerocopy",
		Short: "Compare zero-copy reads of mapped host memory with an explicit copy, across reuse factors",
		Long: `zerocopy reads data that lives in host memory R times with a kernel
(read_sum_u32), two ways: zero-copy (the kernel reads mapped host memory
through its device pointer on every pass) and explicit (one copy to device
memory, then R passes there). Zero-copy moves the data over the bus on every
pass, at the rate a kernel's loads reach over PCIe; the explicit copy moves
it once, at the copy engine's rate. Whether zero-copy wins even for data read
once depends on the machine: the ratio column (speed against explicit, above
1 = zero-copy faster) shows it, and docs/PERF.md shows the shipped run's.
Zero-copy saves the device memory and the copy; each further read costs it
another trip over the bus. Needs the kernels to load.`,
		Example: `  pinmem zerocopy
  pinmem zerocopy --sizes 64MiB --reuse 1,2,4,8,16 --plot zerocopy.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			list, err := bench.ParseSizes(sizes)
			if err != nil {
				return usagef("--sizes: %v", err)
			}
			for _, n := range list {
				if n%4 != 0 {
					return usagef("--sizes %s: must be a multiple of 4 bytes", bench.FormatSize(n))
				}
			}
			rf, err := parseReuse(reuse)
			if err != nil {
				return usagef("--reuse: %v", err)
			}
			f, err := o.check()
			if err != nil {
				return err
			}
			var cfgs []bench.ZeroCopyConfig
			for _, n := range list {
				cfg, err := bench.ZeroCopyConfig{Size: n, Reuse: rf, Samples: o.samples}.Resolved()
				if err != nil {
					return usage(err)
				}
				cfgs = append(cfgs, cfg)
			}
			s, pr, err := o.open(cmd, 2*len(rf)*len(list), "zerocopy")
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			var rs []bench.Result
			var runErr error
			for _, cfg := range cfgs {
				var part []bench.Result
				part, runErr = s.ZeroCopy(cmd.Context(), cfg)
				rs = append(rs, part...)
				if runErr != nil {
					break
				}
			}
			pr.done()
			var conf any = cfgs
			if len(cfgs) == 1 {
				conf = cfgs[0]
			}
			return o.emit(cmd, f, meta(s.Meta("pinmem zerocopy"), conf), rs, bench.TableOptions{Baseline: o.baseline}, runErr)
		},
	}
	o.register(c, 5, bench.VariantExplicit, zeroCopyVariant, []string{bench.VariantExplicit, bench.VariantZeroCopy})
	c.Flags().StringVar(&sizes, "sizes", "256MiB", "bytes of data, comma-separated (each a multiple of 4); --size is the same flag")
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
