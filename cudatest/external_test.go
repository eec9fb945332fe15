package cudatest_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// appGoMod is the go.mod of a program outside pinmem's module; %s is the
// path of pinmem's module root.
const appGoMod = `module example.com/app

go 1.26.0

require github.com/pinmem/pinmem v0.0.0

replace github.com/pinmem/pinmem => %s
`

// appTest is that program's test: what a user of pinmem writes to test
// their code without a GPU.
const appTest = `package app_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/transfer"
)

func setup(t *testing.T) (*cuda.Context, *transfer.Copier, *cuda.DeviceBuffer) {
	t.Helper()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	c, err := transfer.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("closing the Copier: %v", err)
		}
	})
	buf, err := ctx.Alloc(5<<20 + 77)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	return ctx, c, buf
}

func TestRoundTripAndFault(t *testing.T) {
	d := cudatest.Install(t)
	_, c, buf := setup(t)
	in := make([]byte, buf.Size())
	for i := range in {
		in[i] = byte(i*131 + i>>11)
	}
	out := make([]byte, len(in))
	if _, err := c.HtoD(context.Background(), buf, in); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DtoH(context.Background(), out, buf); err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if in[i] != out[i] {
			t.Fatalf("byte %d: wrote %#x, read back %#x", i, in[i], out[i])
		}
	}

	pinned, err := pinmem.Alloc(1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := pinned.Free(); err != nil {
		t.Fatal(err)
	}

	// The next host-to-device copy fails as a faulting GPU's would. A
	// Copier moves a pageable slice of 5 MiB through one pinned stage
	// with one asynchronous copy, cuMemcpyHtoDAsync_v2.
	if err := d.FailOn("cuMemcpyHtoDAsync_v2", cudatest.Once(), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	_, err = c.HtoD(context.Background(), buf, in)
	var ce *cuda.Error
	if !errors.Is(err, cuda.ErrLaunchFailed) || !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_LAUNCH_FAILED" {
		t.Fatalf("HtoD with an injected fault: %v, want cuda.ErrLaunchFailed", err)
	}
	if _, err := c.HtoD(context.Background(), buf, in); err != nil {
		t.Fatalf("HtoD after the fault: %v", err)
	}
	if n := d.Calls("cuMemcpyHtoDAsync_v2"); n < 3 {
		t.Errorf("%d host-to-device copies counted, want at least 3", n)
	}
}

// TestLeaky leaves a device buffer behind; the cleanup of Install must fail it.
func TestLeaky(t *testing.T) {
	if os.Getenv("APP_LEAK") != "1" {
		t.Skip("run with APP_LEAK=1")
	}
	cudatest.Install(t)
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctx.Alloc(4096); err != nil {
		t.Fatal(err)
	}
}
`

// TestExternalModule builds a module outside pinmem's that depends on it
// through a replace directive, as a user's program would, and runs its
// test: a Copier round trip of a few MiB checked byte for byte, an injected
// fault seen through errors.Is, and the leak check, which must pass for the
// clean test and fail for the leaky one. It works offline, from the module
// cache.
func TestExternalModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with the go command: not in -short")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not available: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"go.mod":      []byte(strings.Replace(appGoMod, "%s", root, 1)),
		"go.sum":      sum,
		"app_test.go": []byte(appTest),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GONOSUMDB=*", "GOTOOLCHAIN=local")
	run := func(extraEnv []string, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(env, extraEnv...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	bin := filepath.Join(dir, "app.test")
	if out, err := run(nil, goCmd, "test", "-c", "-o", bin, "."); err != nil {
		t.Fatalf("building the external module's test: %v\n%s", err, out)
	}
	out, err := run(nil, bin, "-test.v", "-test.count=1")
	if err != nil || !strings.Contains(out, "--- PASS: TestRoundTripAndFault") {
		t.Fatalf("the external module's test: %v\n%s", err, out)
	}
	t.Logf("the external module's test:\n%s", out)
	out, err = run([]string{"APP_LEAK=1"}, bin, "-test.run=TestLeaky", "-test.count=1")
	if err == nil || !strings.Contains(out, "--- FAIL: TestLeaky") || !strings.Contains(out, "1 device allocation(s) (4096 bytes)") {
		t.Fatalf("the leaky external test: %v, want a failure naming the device allocation\n%s", err, out)
	}
}
