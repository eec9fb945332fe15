package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

func init() {
	benchSubcommands = append(benchSubcommands, newBenchMatrix)
}

func newBenchMatrix() *cobra.Command {
	var (
		o        output
		devices  string
		baseline string
		sizes    string
		dirs     string
		samples  int
		quiet    bool
	)
	c := &cobra.Command{
		Use:   "matrix",
		Short: "Host<->GPU bandwidth matrix: every device alone, then all at once",
		Long: `matrix measures, like nvbandwidth, copies between portable pinned host memory
(placed on each GPU's NUMA node where the host has several) and each GPU: one
row per device with H2D, D2H and bidirectional figures, then an "all at once"
row where every device copies at the same time, reported as the sum of the
devices' concurrent figures and compared with the sum of the per-device rows.
With one GPU the two rows measure the same thing.`,
		Example: `  pinmem bench matrix
  pinmem bench matrix --devices 0,1 --sizes 1GiB --format json -o matrix.json --plot matrix.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if samples < 1 || samples > bench.MaxSamples {
				return usagef("--samples %d: must be from 1 to %d", samples, bench.MaxSamples)
			}
			list, err := bench.ParseSizes(sizes)
			if err != nil {
				return usagef("--sizes: %v", err)
			}
			ds, err := bench.ParseDirs(dirs)
			if err != nil {
				return usagef("--dirs: %v", err)
			}
			devs, err := parseDevices(devices)
			if err != nil {
				return usagef("--devices: %v", err)
			}
			if b := strings.TrimSpace(baseline); b != "" && b != bench.KindAll && !regexp.MustCompile(`^gpu[0-9]+$`).MatchString(b) {
				return usagef("--baseline %q: want gpuN or all", baseline)
			}
			f, err := o.check()
			if err != nil {
				return err
			}
			if err := checkBudgetEnv(); err != nil {
				return err
			}
			var cfgs []bench.MatrixConfig
			for _, n := range list {
				cfg, err := bench.MatrixConfig{Size: n, Dirs: ds, Devices: devs, Samples: samples}.Resolved()
				if err != nil {
					return usage(err)
				}
				cfgs = append(cfgs, cfg)
			}
			total := (max(len(devs), 1) + 1) * len(ds) * len(list)
			pr := newProgress(cmd.ErrOrStderr(), quiet, total, "bench matrix")
			var rs []bench.Result
			var m bench.Meta
			var runErr error
			for i := range cfgs {
				cfgs[i].Session.Progress = pr.writer()
				part, pm, err := bench.Matrix(cmd.Context(), cfgs[i])
				if i == 0 {
					m = pm
				}
				rs, runErr = append(rs, part...), err
				if err != nil {
					break
				}
			}
			pr.done()
			if len(rs) == 0 && runErr != nil {
				return runErr
			}
			var conf any = cfgs
			if len(cfgs) == 1 {
				conf = cfgs[0]
			}
			return o.emit(cmd, f, meta(m, conf), rs, bench.TableOptions{Baseline: baseline}, runErr)
		},
	}
	o.register(c, reportFormats, true)
	fl := c.Flags()
	fl.StringVar(&devices, "devices", "all", "GPU ordinals, comma-separated (or all)")
	fl.StringVar(&sizes, "sizes", "256MiB", "bytes per copy, comma-separated; --size is the same flag")
	fl.StringVar(&dirs, "dirs", "h2d,d2h,bidir", "directions, comma-separated: h2d, d2h, bidir (or all); --dir is the same flag")
	fl.IntVar(&samples, "samples", 5, "timed samples per measurement (median, min and max are reported)")
	fl.BoolVar(&quiet, "quiet", false, "no progress bar on standard error")
	fl.StringVar(&baseline, "baseline", "", "a row (gpuN or all) the table's ratio column compares with (empty: the matrix table)")
	// --device is --devices here: the flag every other measuring command has.
	fl.SetNormalizeFunc(func(f *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "device" {
			name = "devices"
		}
		return aliasFlags(f, name)
	})
	_ = c.RegisterFlagCompletionFunc("dirs", fixedCompletion(append(bench.AllDirs(), "all")...))
	_ = c.RegisterFlagCompletionFunc("devices", cobra.NoFileCompletions)
	return c
}

// parseDevices parses "all" (nil: every device) or a comma-separated list
// of distinct ordinals.
func parseDevices(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return nil, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("device %q: want an ordinal from 0", p)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}
