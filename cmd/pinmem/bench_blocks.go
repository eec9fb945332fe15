package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

func init() {
	benchSubcommands = append(benchSubcommands, newBenchBlocks)
}

func newBenchBlocks() *cobra.Command {
	var (
		o      measureFlags
		sizes  string
		dirs   string
		blocks int
	)
	c := &cobra.Command{
		Use:   "blocks",
		Short: "Scattered block copies (a KV cache paged out and in, one way or both at once): each blocks.Copier strategy against contiguous copies",
		Long: `blocks measures package blocks the way an inference server pages a KV
cache: a list of --blocks blocks, scattered on both sides (host slots of one
pinned, mapped allocation taken in shuffled order with 4 KiB left between
slots; device slots of one device allocation, shuffled), copied by each
strategy: driver-batch (cuMemcpyBatchAsync, CUDA 12.8+), per-copy (one
cuMemcpyAsync per block), kernel (pinmem's gather/scatter kernel over mapped
host memory) and auto (the note says which it chose). Directions h2d and d2h
move one list one way, beside contiguous: the same bytes, contiguous on both
sides, one copy per registration segment of the host buffer (a driver copy
may not span two), the upper bound. Direction bidir pages one list out
and another in at once on two streams with one call, beside contiguous: one
contiguous copy each way at once, the bidirectional pinned bound; its figure
is the bytes of both directions over the time of both. The ratio column is
each against contiguous of the same size and direction. The defaults move
4096 blocks of up to 2 MiB: with bidir, 16 GiB of device memory and as much
pinned host memory; --blocks and --sizes make a run smaller.

A sample is one list, timed with the host wall clock from the call that
queues it to the end of the stream's synchronize, so the CPU cost of queuing
the blocks counts; the note gives the median time the queuing call took and
the driver calls it made. Every block of every sample is checked against the
data it should carry (destinations poisoned first). A strategy the driver
lacks (driver-batch before CUDA 12.8) is reported as skipped.

` + exitHelp,
		Example: `  pinmem bench blocks
  pinmem bench blocks --sizes 2MiB --dirs bidir
  pinmem bench blocks --sizes 16KiB,1MiB --blocks 1024 --dirs h2d --format json -o blocks.json --plot blocks.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg := bench.BlocksConfig{}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usagef("--sizes: %v", err)
			}
			for _, n := range cfg.Sizes {
				if n > bench.MaxBlockSize {
					return usagef("--sizes %s: a block is at most %s", bench.FormatSize(n), bench.FormatSize(bench.MaxBlockSize))
				}
			}
			if cfg.Dirs, err = bench.ParseBlockDirs(dirs); err != nil {
				return usagef("--dirs: %v", err)
			}
			if blocks < 1 || blocks > bench.MaxBlocks {
				return usagef("--blocks %d: must be from 1 to %d", blocks, bench.MaxBlocks)
			}
			cfg.Blocks = blocks
			f, err := o.check()
			if err != nil {
				return err
			}
			cfg.Samples = o.samples
			if cfg, err = cfg.Resolved(); err != nil {
				return usage(err)
			}
			// No spin-wait: a sample is timed from the host, queuing included.
			s, pr, err := o.openWith(cmd, len(cfg.Sizes)*len(cfg.Dirs)*len(cfg.Kinds), "bench blocks", bench.SessionConfig{NoSpin: true})
			if err != nil {
				return err
			}
			defer closeSession(s, &err)
			rs, runErr := s.Blocks(cmd.Context(), cfg)
			pr.done()
			m := meta(s.Meta("pinmem bench blocks"), cfg)
			m.Timing = bench.BlocksTiming
			return o.emit(cmd, f, m, rs, bench.TableOptions{Baseline: o.baseline}, runErr)
		},
	}
	o.register(c, 5, bench.BlockKindContiguous, oneOf(bench.ParseBlockKinds), bench.AllBlockKinds())
	fl := c.Flags()
	fl.StringVar(&sizes, "sizes", sizeList(bench.DefaultBlockSizes), "block sizes, comma-separated (each up to "+bench.FormatSize(bench.MaxBlockSize)+"); --size is the same flag")
	fl.StringVar(&dirs, "dirs", strings.Join(bench.AllBlockDirs(), ","), "directions, comma-separated: h2d, d2h, bidir (or all); --dir is the same flag")
	fl.IntVar(&blocks, "blocks", bench.DefaultBlocks, "blocks per list")
	_ = c.RegisterFlagCompletionFunc("dirs", fixedCompletion(append(bench.AllBlockDirs(), "all")...))
	_ = c.RegisterFlagCompletionFunc("sizes", fixedCompletion("16KiB", "64KiB", "256KiB", "512KiB", "2MiB"))
	_ = c.RegisterFlagCompletionFunc("blocks", cobra.NoFileCompletions)
	return c
}
