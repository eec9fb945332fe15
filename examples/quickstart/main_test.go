package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// envRunMain, set to 1, makes the test binary run the program's main
// instead of its tests. It is how the program runs where no go command
// exists to build it (the GPU machine runs test binaries only).
const envRunMain = "PINMEM_QUICKSTART_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	testutil.Main(m)
}

// The README shows the program between these two lines, inside a ```go
// fence, byte for byte as main.go has it.
const (
	readmeBegin = "<!-- quickstart: begin (examples/quickstart/main.go) -->"
	readmeEnd   = "<!-- quickstart: end -->"
)

// readmeProgram returns the Go code of the README's quick start.
func readmeProgram(readme string) (string, error) {
	_, rest, ok := strings.Cut(readme, readmeBegin+"\n")
	if !ok {
		return "", errors.New("README.md has no line " + readmeBegin)
	}
	block, _, ok := strings.Cut(rest, readmeEnd)
	if !ok {
		return "", errors.New("README.md has no line " + readmeEnd + " after " + readmeBegin)
	}
	code, ok := strings.CutPrefix(block, "```go\n")
	if !ok {
		return "", errors.New("the quick start block does not open with ```go")
	}
	code, ok = strings.CutSuffix(code, "```\n")
	if !ok {
		return "", errors.New("the quick start block does not close with ``` just before " + readmeEnd)
	}
	return code, nil
}

func TestReadmeShowsMainGo(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	code, err := readmeProgram(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if code == string(src) {
		return
	}
	got, want := strings.Split(code, "\n"), strings.Split(string(src), "\n")
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Fatalf("README.md's quick start differs from examples/quickstart/main.go at line %d:\nREADME:  %q\nmain.go: %q", i+1, g, w)
		}
	}
	t.Fatal("README.md's quick start differs from examples/quickstart/main.go")
}

func TestReadmeProgramRejectsBrokenBlocks(t *testing.T) {
	good := "text\n" + readmeBegin + "\n```go\npackage main\n```\n" + readmeEnd + "\nmore\n"
	if code, err := readmeProgram(good); err != nil || code != "package main\n" {
		t.Fatalf("readmeProgram(good) = %q, %v; want %q, nil", code, err, "package main\n")
	}
	for name, readme := range map[string]string{
		"no begin":   "```go\npackage main\n```\n" + readmeEnd + "\n",
		"no end":     readmeBegin + "\n```go\npackage main\n```\n",
		"no go tag":  readmeBegin + "\n```\npackage main\n```\n" + readmeEnd + "\n",
		"text after": readmeBegin + "\n```go\npackage main\n```\ntrailing\n" + readmeEnd + "\n",
	} {
		if code, err := readmeProgram(readme); err == nil {
			t.Errorf("%s: readmeProgram = %q, nil; want an error", name, code)
		}
	}
}

// program returns a command that runs the quick start: the binary built
// with go build, or, where no go command exists, this test binary running
// main.
func program(t *testing.T) *exec.Cmd {
	t.Helper()
	if goTool, err := exec.LookPath("go"); err == nil {
		bin := filepath.Join(t.TempDir(), "quickstart")
		build := exec.Command(goTool, "build", "-o", bin, ".")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return exec.Command(bin)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envRunMain+"=1")
	return cmd
}

// runProgram runs cmd with the extra environment and returns its stdout,
// stderr and exit code.
func runProgram(t *testing.T, cmd *exec.Cmd, env ...string) (stdout, stderr string, code int) {
	t.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running the quick start: %v", err)
	}
	return o.String(), e.String(), code
}

// TestWithoutGPU runs the program with no driver to load (PINMEM_LIBCUDA
// names a library that does not exist, so the result is the same on a GPU
// machine): it must exit with status 3 (the pinmem command's "no GPU") with
// exactly one line on stderr that says a GPU is needed, and nothing that
// looks like a crash.
func TestWithoutGPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("pinmem loads the driver on Linux only")
	}
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	stdout, stderr, code := runProgram(t, program(t), "PINMEM_LIBCUDA="+missing)
	if code != extest.ExitNoGPU {
		t.Errorf("exit status %d without a driver; want %d", code, extest.ExitNoGPU)
	}
	if stdout != "" {
		t.Errorf("stdout = %q; want nothing", stdout)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if !strings.HasSuffix(stderr, "\n") || len(lines) != 1 {
		t.Fatalf("stderr has %d lines; want exactly one:\n%s", len(lines), stderr)
	}
	line := lines[0]
	for _, want := range []string{"quickstart: this needs an NVIDIA GPU:", missing} {
		if !strings.Contains(line, want) {
			t.Errorf("stderr %q does not contain %q", line, want)
		}
	}
	for _, bad := range []string{"panic", "goroutine", "runtime error"} {
		if strings.Contains(line, bad) {
			t.Errorf("stderr %q contains %q", line, bad)
		}
	}
}

// TestOnGPU runs the program on the machine's GPU: it must copy, check the
// bytes and say so in one line.
func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	stdout, stderr, code := runProgram(t, program(t))
	if code != 0 || stderr != "" {
		t.Fatalf("exit status %d, stderr:\n%s", code, stderr)
	}
	if !strings.HasSuffix(stdout, "every byte checked\n") || strings.Count(stdout, "\n") != 1 {
		t.Errorf("stdout = %q; want one line ending in %q", stdout, "every byte checked")
	}
}

// TestRunOnFakeDriver runs the program's logic on the fake driver: every
// call it makes succeeds and the bytes come back, on any machine. (It shows
// the program uses the API correctly; speed and real copies are TestOnGPU's.)
func TestRunOnFakeDriver(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRunReportsDeviceFailure checks that a failing driver call comes back
// as run's error (which main prints as one line), not a panic.
func TestRunReportsDeviceFailure(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{DeviceMemLimit: 1 << 20})
	err := run(context.Background())
	if err == nil {
		t.Fatal("run succeeded with 1 MiB of device memory for a 64 MiB copy")
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q spans several lines", err)
	}
}
