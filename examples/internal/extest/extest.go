// Package extest holds what the examples' tests share: the check that an
// example's kernel.ptx is what nvcc made of the kernel.cu beside it (in the
// example's kernel/ folder), and the run of an example's main in a child
// process (to see what a user sees on a machine without a GPU).
//
// scripts/compile-kernels writes each kernel.ptx with a first line
//
//	// pinmem-source-sha256: <SHA-256 of kernel.cu>
//
// followed by nvcc's output. Until it has run on a machine with nvcc, an
// example keeps a placeholder kernel.ptx whose text says PLACEHOLDER and that
// defines no kernel.
package extest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// hashPrefix starts the first line of a generated PTX file.
const hashPrefix = "// pinmem-source-sha256: "

// ErrPlaceholder is returned by Verify for a placeholder PTX whose hash line
// matches its source.
var ErrPlaceholder = errors.New("kernel.ptx is a placeholder: generate it with scripts/compile-kernels on a machine with nvcc")

// IsPlaceholder reports whether ptx is a placeholder: it says PLACEHOLDER and
// defines no kernel (.entry).
func IsPlaceholder(ptx []byte) bool {
	return bytes.Contains(ptx, []byte("PLACEHOLDER")) && !bytes.Contains(ptx, []byte(".entry"))
}

// Verify returns nil when ptx carries the SHA-256 of source on its first line
// and defines every kernel named in kernels (".entry name("). A placeholder
// with the right hash line gives ErrPlaceholder; anything else a descriptive
// error.
func Verify(source, ptx []byte, kernels ...string) error {
	line, _, _ := bytes.Cut(ptx, []byte("\n"))
	got, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte(hashPrefix))
	if !ok {
		return fmt.Errorf("kernel.ptx's first line is %q, want %q<sha256 of kernel.cu>", line, hashPrefix)
	}
	sum := sha256.Sum256(source)
	if want := hex.EncodeToString(sum[:]); string(bytes.TrimSpace(got)) != want {
		return fmt.Errorf("kernel.ptx was generated from a kernel.cu with sha256 %s, but kernel.cu has sha256 %s now: run scripts/compile-kernels on a machine with nvcc and commit kernel.ptx", got, want)
	}
	if IsPlaceholder(ptx) {
		return ErrPlaceholder
	}
	for _, k := range kernels {
		if !bytes.Contains(ptx, []byte(".entry "+k+"(")) {
			return fmt.Errorf("kernel.ptx defines no kernel %s (no \".entry %s(\")", k, k)
		}
	}
	return nil
}

// Check fails t when Verify reports an error. A placeholder skips t, except
// under PINMEM_REQUIRE_GPU=1 (the GPU suite), where it fails: the examples
// cannot run there without their kernels.
func Check(t testing.TB, source, ptx []byte, kernels ...string) {
	t.Helper()
	err := Verify(source, ptx, kernels...)
	switch {
	case err == nil:
	case errors.Is(err, ErrPlaceholder) && !testutil.GPURequired():
		t.Skip(err.Error())
	default:
		t.Fatal(err)
	}
}

// envRunMain, set to 1, makes an example's test binary run the example's
// main instead of its tests (see Main).
const envRunMain = "PINMEM_EXAMPLE_RUN_MAIN"

// Main runs an example's tests with testutil.Main, or, when
// PINMEM_EXAMPLE_RUN_MAIN=1 (set by CheckNoGPU, or by hand), the example's
// main with the process's arguments. The GPU machine has test binaries and
// no go command, so this is how an example runs there as a program:
//
//	PINMEM_EXAMPLE_RUN_MAIN=1 .gpu/bin/examples_vectoradd_measure.test -sizes 16MiB
//
// Use it as
//
//	func TestMain(m *testing.M) { extest.Main(m, main) }
func Main(m *testing.M, mainFunc func()) {
	if os.Getenv(envRunMain) == "1" {
		mainFunc()
		os.Exit(0)
	}
	testutil.Main(m)
}

// result is what a run of an example's main printed and its exit status.
type result struct {
	Stdout, Stderr string
	Code           int
}

// runMain runs the example's main in a child process (this test binary,
// through Main) with args and extra environment variables, and returns
// what it printed and its exit status.
func runMain(t testing.TB, env []string, args ...string) result {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(append(os.Environ(), envRunMain+"=1"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	r := result{Stdout: o.String(), Stderr: e.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	default:
		t.Fatalf("running the example: %v", err)
	}
	return r
}

// ExitNoGPU is the exit status of an example that finds no NVIDIA driver or
// no CUDA device: the pinmem command's status for the same case.
const ExitNoGPU = 3

// CheckNoGPU runs the example's main with no driver to load (PINMEM_LIBCUDA
// names a library that does not exist, so the result is the same on a GPU
// machine) and fails t unless it exits with ExitNoGPU and exactly one line
// on stderr, starting with "name: this needs an NVIDIA GPU:", nothing on
// stdout, and nothing that looks like a crash.
func CheckNoGPU(t *testing.T, name string, args ...string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("pinmem loads the driver on Linux only")
	}
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	r := runMain(t, []string{"PINMEM_LIBCUDA=" + missing}, args...)
	if r.Code != ExitNoGPU {
		t.Errorf("exit status %d without a driver; want %d, as the pinmem command", r.Code, ExitNoGPU)
	}
	if r.Stdout != "" {
		t.Errorf("stdout = %q; want nothing", r.Stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	if !strings.HasSuffix(r.Stderr, "\n") || len(lines) != 1 {
		t.Fatalf("stderr has %d lines; want exactly one:\n%s", len(lines), r.Stderr)
	}
	if want := name + ": this needs an NVIDIA GPU:"; !strings.HasPrefix(lines[0], want) {
		t.Errorf("stderr %q does not start with %q", lines[0], want)
	}
	for _, bad := range []string{"panic", "goroutine", "runtime error"} {
		if strings.Contains(lines[0], bad) {
			t.Errorf("stderr %q contains %q", lines[0], bad)
		}
	}
}
