package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/remote"
)

// envFakeOffloader makes this test binary the offloader on the fake driver.
const envFakeOffloader = "KVREMOTE_TEST_FAKE_OFFLOADER"

func TestMain(m *testing.M) {
	if os.Getenv(envFakeOffloader) == "1" {
		if _, err := cudatest.Start(); err != nil {
			panic(err)
		}
		main()
		os.Exit(0)
	}
	extest.Main(m, main)
}

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.blocks != 512 || cfg.blockSize != 64<<10 || cfg.load != 128 || len(cfg.transports) != 2 || cfg.serve {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"-transport", "rdma"}, {"-load", "600"}, {"-kib", "0"}, {"x"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestTwoProcessesOnFakeDriver runs the loader here and the offloader in
// another process, both on the fake driver (their host memory is real),
// over shared memory and TCP: the loader checks every byte of every block
// it pulled, and again on the fake GPU.
func TestTwoProcessesOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	cfg, err := parseFlags([]string{"-blocks", "300", "-kib", "16", "-load", "100"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.offloader = func(args ...string) *exec.Cmd {
		c := self(args...)
		c.Env = append(os.Environ(), envFakeOffloader+"=1")
		return c
	}
	var out strings.Builder
	err = load(context.Background(), cfg, &out)
	if errors.Is(err, remote.ErrUnavailable) && os.Getenv("PINMEM_REQUIRE_UCX") != "1" {
		t.Skipf("UCX unavailable (PINMEM_REQUIRE_UCX=1 makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	for _, want := range []string{"shm: pulled 100 named blocks", "tcp: pulled 100 named blocks", "copied the 100 blocks onto"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestNoGPU: without a driver, the program says it needs one and exits 3.
func TestNoGPU(t *testing.T) { extest.CheckNoGPU(t, "kvremote", "-transport", "tcp") }
