package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/blocks"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.blocks != 1024 || cfg.blockSize != 2<<20 || cfg.strategy != blocks.Auto {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	if cfg, err := parseFlags([]string{"-strategy", "per-copy", "-kib", "64"}, io.Discard); err != nil || cfg.strategy != blocks.PerCopy || cfg.blockSize != 64<<10 {
		t.Errorf("-strategy per-copy -kib 64 = %+v, %v", cfg, err)
	}
	if cfg, err := parseFlags([]string{"-strategy", "kernel"}, io.Discard); err != nil || cfg.strategy != blocks.Kernel {
		t.Errorf("-strategy kernel = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-blocks", "0"}, {"-kib", "-1"}, {"-strategy", "dma"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunOnFakeDriver pages 4096 blocks out and 4096 in at once on the
// fake driver with each strategy: every byte is checked by run.
func TestRunOnFakeDriver(t *testing.T) {
	for _, s := range []blocks.Strategy{blocks.Auto, blocks.DriverBatch, blocks.PerCopy, blocks.Kernel} {
		t.Run(s.String(), func(t *testing.T) {
			cudatest.Install(t)
			var out strings.Builder
			res, err := run(context.Background(), config{blocks: 4096, blockSize: 1 << 10, strategy: s}, &out)
			if err != nil {
				t.Fatal(err)
			}
			// Auto has the kernel and 1 KiB blocks of a mapped pool: it takes it.
			if want := map[blocks.Strategy]blocks.Strategy{blocks.Auto: blocks.Kernel}[s]; want != 0 && res.Strategy != want {
				t.Errorf("auto chose %v, want %v", res.Strategy, want)
			}
			if res.Blocks != 2*4096 {
				t.Errorf("report %+v, want 8192 blocks", res)
			}
			if !strings.HasSuffix(out.String(), "every byte checked\n") {
				t.Errorf("output %q", out.String())
			}
		})
	}
}

// TestRunReportsDriverFailure: a failing copy comes back as run's error.
func TestRunReportsDriverFailure(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemcpyBatchAsync_v2", cudatest.Once(), cuda.ResultOutOfMemory); err != nil {
		t.Fatal(err)
	}
	_, err := run(context.Background(), config{blocks: 64, blockSize: 1 << 10, strategy: blocks.DriverBatch}, io.Discard)
	if !errors.Is(err, cuda.ErrOutOfMemory) || !strings.Contains(err.Error(), "paging") {
		t.Fatalf("run with a failing batch copy = %v", err)
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "kvblocks", "-blocks", "16")
}

// TestOnGPU pages 1024 blocks of 2 MiB out and 1024 in at once with each
// strategy on the GPU; run checks every byte.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	for _, s := range []blocks.Strategy{blocks.Auto, blocks.DriverBatch, blocks.PerCopy, blocks.Kernel} {
		var out strings.Builder
		if _, err := run(context.Background(), config{blocks: 1024, blockSize: 2 << 20, strategy: s}, &out); err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		t.Log(strings.TrimSpace(out.String()))
	}
}
