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
	benchSubcommands = append(benchSubcommands, newBenchMatrix)
}

func newBenchMatrix() *cobra.Command {
	var (
		devices string
		size    string
		dirs    string
		samples int
		format  string
		out     string
		quiet   bool
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
  pinmem bench matrix --devices 0,1 --size 1GiB --format json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if samples < 1 || samples > 1000 {
				return fmt.Errorf("--samples %d: must be from 1 to 1000", samples)
			}
			f, err := bench.ParseFormat(format)
			if err != nil {
				return fmt.Errorf("--format: %w", err)
			}
			cfg := bench.MatrixConfig{Samples: samples}
			if cfg.Size, err = bench.ParseSize(size); err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if cfg.Dirs, err = bench.ParseDirs(dirs); err != nil {
				return fmt.Errorf("--dir: %w", err)
			}
			if cfg.Devices, err = parseDevices(devices); err != nil {
				return fmt.Errorf("--devices: %w", err)
			}
			var progress io.Writer
			if !quiet {
				progress = cmd.ErrOrStderr()
			}
			cfg.Session = bench.SessionConfig{Progress: progress}
			if err := cfg.Validate(); err != nil {
				return err
			}
			rs, m, runErr := bench.Matrix(cmd.Context(), cfg)
			if len(rs) == 0 && runErr != nil {
				return runErr
			}
			var buf bytes.Buffer
			if f == bench.FormatTable {
				err = bench.WriteMatrix(&buf, m, rs)
			} else {
				err = bench.Write(&buf, f, m, rs, bench.TableOptions{})
			}
			if err != nil {
				return errors.Join(runErr, err)
			}
			if out == "" {
				_, err = cmd.OutOrStdout().Write(buf.Bytes())
			} else if err = os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
				err = fmt.Errorf("writing the report: %w", err)
			}
			return errors.Join(runErr, err)
		},
	}
	fl := c.Flags()
	fl.StringVar(&devices, "devices", "all", "GPU ordinals, comma-separated (or all)")
	fl.StringVar(&size, "size", "256MiB", "bytes per copy")
	fl.StringVar(&dirs, "dir", "h2d,d2h,bidir", "directions, comma-separated: h2d, d2h, bidir (or all)")
	fl.IntVar(&samples, "samples", 5, "timed samples per measurement (median, min and max are reported)")
	fl.StringVar(&format, "format", "table", "output format: table (the matrix), json or csv")
	fl.StringVar(&out, "out", "", "write the report to this file instead of standard output")
	fl.BoolVar(&quiet, "quiet", false, "no progress lines on standard error")
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
