package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/cmd/pinmem/internal/remotebench"
	"github.com/pinmem/pinmem/internal/tools/bench"
)

func init() {
	benchSubcommands = append(benchSubcommands, newBenchRemote)
}

func newBenchRemote() *cobra.Command {
	var (
		transports, sizes, lists, perftest string
		maxBytes, regBytes                 string
		samples                            int
		serve                              int64
	)
	c := &cobra.Command{
		Use:   "remote",
		Short: "Package remote's UCX transport between two processes, beside ucx_perftest -t ucp_put_bw on the same transport",
		Long: `remote measures remote.Remote.Put between this process and a copy of it
started as the peer, for each transport (shm: UCX_TLS=posix,self; tcp:
UCX_TLS=tcp,self on the loopback interface; sm, on request: UCX_TLS=sm,self),
block size and list length: one
Put of a list of blocks at shuffled offsets on both sides, completed at the
remote side (a flush), timed from the call to its return; the median of
--samples Puts after a warm-up. A put row places the blocks at shuffled
offsets on both sides; a -same row sends every block from and to the same
offsets, ucx_perftest's own pattern (both ends stay in the CPU's caches).
The put rows write to pinmem memory the peer registered (remote.Register);
the put-alloc rows to memory the peer's transport allocated
(remote.Agent.Alloc), as ucx_perftest's is: over shared memory UCX maps that
into the writer and copies once, while pinmem memory goes through UCX's
emulation of remote access (messages the peer copies out). Beside each size, ucx_perftest -t ucp_put_bw
(UCX's own benchmark, from ucx-utils) runs a server and a client on 127.0.0.1
over the same transport, and the ratio column is the Put's GB/s over its
overall GB/s. The register row is the time of one Register of a fresh
--reg-size buffer (its pages touched first), per GiB.

Without a CUDA driver the memory on both sides is plain host memory from
pinmem's fake driver (the note says so): UCX over shared memory and TCP
copies it with the CPU, so page-locking changes nothing there.

` + exitHelp,
		Example: `  pinmem bench remote
  pinmem bench remote --transports tcp --sizes 4MiB --lists 16`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if serve > 0 {
				return remotebench.ServePeer(int(serve))
			}
			cfg := remotebench.Config{Samples: samples}
			if cfg.Transports, err = remoteTransports(transports); err != nil {
				return err
			}
			if cfg.Sizes, err = bench.ParseSizes(sizes); err != nil {
				return usagef("--sizes: %v", err)
			}
			if cfg.Lists, err = remoteLists(lists); err != nil {
				return err
			}
			if cfg.MaxBytes, err = bench.ParseSize(maxBytes); err != nil {
				return usagef("--max-bytes: %v", err)
			}
			if cfg.RegBytes, err = bench.ParseSize(regBytes); err != nil {
				return usagef("--reg-size: %v", err)
			}
			for _, s := range cfg.Sizes {
				if s > cfg.MaxBytes {
					return usagef("--sizes %s: larger than --max-bytes %s", bench.FormatSize(s), maxBytes)
				}
			}
			if samples < 1 || samples > bench.MaxSamples {
				return usagef("--samples %d: must be from 1 to %d", samples, bench.MaxSamples)
			}
			if perftest != "none" {
				if cfg.Perftest, err = exec.LookPath(perftest); err != nil {
					return fmt.Errorf("%s not found (install ucx-utils, or --perftest none): %w", perftest, err)
				}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			peer := func(n int64) *exec.Cmd {
				return exec.Command(exe, "bench", "remote", "--serve", strconv.FormatInt(n, 10))
			}
			progress := func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), s) }
			// Which UCX_TLS each transport name stands for.
			fmt.Fprintf(cmd.OutOrStdout(), "UCX_TLS per transport: %s\n", tlsList(cfg.Transports))
			rows, note, runErr := remotebench.Run(cmd.Context(), cfg, peer, progress)
			fmt.Fprintf(cmd.OutOrStdout(), "pinmem bench remote: remote.Put over UCX between two processes, %d samples per row (median); ratio: against ucx_perftest -t ucp_put_bw of the same size and transport\n", samples)
			if note != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "memory: %s\n", note)
			}
			remotebench.Table(cmd.OutOrStdout(), rows)
			return runErr
		},
	}
	f := c.Flags()
	f.StringVar(&transports, "transports", "shm,tcp", "transports, comma-separated: shm (UCX_TLS=posix,self), tcp (UCX_TLS=tcp,self on lo), sm (UCX_TLS=sm,self: every shared-memory transport, cma included)")
	f.StringVar(&sizes, "sizes", "4KiB,64KiB,1MiB,4MiB", "block sizes, comma-separated")
	f.StringVar(&lists, "lists", "1,64,4096", "blocks per Put, comma-separated (a list is cut to fit --max-bytes)")
	f.StringVar(&maxBytes, "max-bytes", "64MiB", "bytes per Put at most: the size of the region on each side")
	f.StringVar(&regBytes, "reg-size", "1GiB", "buffer registered for the registration-time row")
	f.IntVar(&samples, "samples", 5, "timed Puts per row")
	f.StringVar(&perftest, "perftest", "ucx_perftest", "the ucx_perftest binary (none: no reference)")
	f.Int64Var(&serve, "serve", 0, "run as the peer: register this many bytes, print the key, serve until stdin closes")
	_ = f.MarkHidden("serve")
	return c
}

// remoteTransports parses --transports, names of remotebench.Transports
// separated by commas, into those transports in the order given.
func remoteTransports(names string) ([]remotebench.Transport, error) {
	var ts []remotebench.Transport
	for _, name := range strings.Split(names, ",") {
		found := false
		for _, t := range remotebench.Transports {
			if t.Name == strings.TrimSpace(name) {
				ts, found = append(ts, t), true
			}
		}
		if !found {
			return nil, usagef("--transports: %q is not shm, tcp or sm", name)
		}
	}
	return ts, nil
}

// remoteLists parses --lists, block counts from 1 to bench.MaxBlocks
// separated by commas.
func remoteLists(lists string) ([]int, error) {
	var ns []int
	for _, l := range strings.Split(lists, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil || n < 1 || n > bench.MaxBlocks {
			return nil, usagef("--lists: %q is not a count from 1 to %d", l, bench.MaxBlocks)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func tlsList(ts []remotebench.Transport) string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name+"="+t.TLS)
	}
	return strings.Join(out, " ")
}
