package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/safetensors"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.sizeMiB != 256 || cfg.file != "" {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-size-mib", "0"}, {"-size-mib", "x"}, {"extra"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

func TestWithoutGPU(t *testing.T) {
	extest.CheckNoGPU(t, "loadweights", "-size-mib", "1")
}

// TestRunOnFakeDriver writes and loads a small model on the fake driver,
// then loads the file given with -file.
func TestRunOnFakeDriver(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	var out strings.Builder
	if err := run(context.Background(), config{sizeMiB: 6}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "every byte checked\n") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("output %q", out.String())
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := writeModel(path, 3<<20); err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.ReadHeader(path)
	if err != nil || len(h.Tensors) < 7 {
		t.Fatalf("written model: %v tensors, %v", h, err)
	}
	out.Reset()
	if err := run(context.Background(), config{file: path}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "every byte checked\n") {
		t.Errorf("output %q", out.String())
	}
	if c := d.Live(); c.DeviceAllocs != 0 || c.HostAllocs != 0 || c.Registrations != 0 {
		t.Errorf("left allocated: %+v", c)
	}
}

// TestRunReportsFailures checks that a malformed file and a failing copy
// come back as run's error.
func TestRunReportsFailures(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	if err := os.WriteFile(bad, []byte("\x02\x00\x00\x00\x00\x00\x00\x00{}x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), config{file: bad}, io.Discard); !errors.Is(err, safetensors.ErrFormat) {
		t.Errorf("malformed file: %v", err)
	}
	if err := d.FailOn("cuMemcpyHtoDAsync_v2", 1, cudadrv.ErrorOutOfMemory); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), config{sizeMiB: 2}, io.Discard); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("failing copy: %v", err)
	}
}

// TestOnGPU writes and loads a 256 MiB model on the machine's GPU.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), config{sizeMiB: 256}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	if !strings.HasSuffix(out.String(), "every byte checked\n") {
		t.Errorf("output %q", out.String())
	}
}
