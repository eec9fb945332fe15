// Package testutil holds what every pinmem test binary shares: a TestMain
// that fails on leaked driver objects and goroutines, GPU requirements that
// cannot pass by skipping when PINMEM_REQUIRE_GPU=1, skips for missing
// features that are listed at the end of the run, a fake driver installer
// and byte helpers.
package testutil

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/track"
)

// EnvRequireGPU names the environment variable that, set to 1, turns every
// skip for a missing GPU or driver into a failure.
const EnvRequireGPU = "PINMEM_REQUIRE_GPU"

// GPURequired reports whether PINMEM_REQUIRE_GPU=1.
func GPURequired() bool { return os.Getenv(EnvRequireGPU) == "1" }

var (
	skipMu       sync.Mutex
	featureSkips []string
)

// Main runs the tests of a package: use it as
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
//
// It records creation stacks of driver objects, runs the tests, calls each
// of after (to print figures gathered over all tests, say, whatever order
// they ran in), prints the skips for missing features ("FEATURE SKIPS:
// test: reason" lines), and exits with status 1 when the tests passed but
// a tracked driver object is still live (printing track.Report) or a
// goroutine leaked.
func Main(m *testing.M, after ...func()) {
	os.Exit(run(m, os.Stdout, os.Stderr, after...))
}

func run(m *testing.M, stdout, stderr io.Writer, after ...func()) int {
	track.EnableStacks(true)
	ignore := goleak.IgnoreCurrent()
	code := m.Run()
	for _, f := range after {
		f()
	}
	printFeatureSkips(stdout)
	if rep := track.Report(); rep != "" {
		fmt.Fprintf(stderr, "FAIL: leaked driver objects:\n%s", rep)
		if code == 0 {
			code = 1
		}
	}
	if err := goleak.Find(ignore); err != nil {
		fmt.Fprintf(stderr, "FAIL: leaked goroutines: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func printFeatureSkips(w io.Writer) {
	skipMu.Lock()
	defer skipMu.Unlock()
	for _, s := range featureSkips {
		fmt.Fprintf(w, "FEATURE SKIPS: %s\n", s)
	}
}

// FeatureSkips returns the "test: reason" entries recorded so far by
// SkipFeature and SkipIfNotSupported.
func FeatureSkips() []string {
	skipMu.Lock()
	defer skipMu.Unlock()
	return append([]string(nil), featureSkips...)
}

// SkipFeature skips t because the driver or device lacks a feature, and
// records it for the summary Main prints. Such skips are allowed even when
// PINMEM_REQUIRE_GPU=1.
func SkipFeature(t testing.TB, reason string) {
	t.Helper()
	skipMu.Lock()
	featureSkips = append(featureSkips, t.Name()+": "+reason)
	skipMu.Unlock()
	t.Skip("feature not supported: " + reason)
}

// SkipIfNotSupported does nothing for a nil err, skips t (as SkipFeature)
// when err matches cudadrv.ErrNotSupported, and fails t for any other error.
func SkipIfNotSupported(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, cudadrv.ErrNotSupported) {
		SkipFeature(t, err.Error())
	}
	t.Fatalf("unexpected error: %v", err)
}

// isFake reports whether d is a stand-in for the real driver.
func isFake(d cudadrv.Driver) bool {
	f, ok := d.(interface{ IsFake() bool })
	return ok && f.IsFake()
}

// RequireGPU returns the real driver with at least one device. Without
// one it skips t, or fails it when PINMEM_REQUIRE_GPU=1; an unexpected
// load error always fails. A fake driver (UseFake, cudatest.Install) does
// not count as a GPU.
func RequireGPU(t testing.TB) cudadrv.Driver {
	t.Helper()
	noGPU := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if GPURequired() {
			t.Fatalf("%s=1 but %s", EnvRequireGPU, msg)
		}
		t.Skip("no GPU: " + msg)
	}
	d, err := cudadrv.Get()
	if err != nil {
		if errors.Is(err, cudadrv.ErrNoDriver) || errors.Is(err, cudadrv.ErrNoDevice) {
			noGPU("%v", err)
		}
		t.Fatalf("loading the NVIDIA driver: %v", err)
	}
	if isFake(d) {
		noGPU("the installed driver is a fake (%T)", d)
	}
	n, err := d.DeviceGetCount()
	if err != nil {
		t.Fatalf("cuDeviceGetCount: %v", err)
	}
	if n == 0 {
		noGPU("the driver reports no device")
	}
	return d
}

// RandomBytes returns n pseudo-random bytes determined by seed.
func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// PoisonByte is the pattern Poison fills memory with.
const PoisonByte = 0xA5

// Poison fills b with PoisonByte, so that memory a copy failed to write stands out.
func Poison(b []byte) {
	for i := range b {
		b[i] = PoisonByte
	}
}

// CheckBytes fails t, naming the first differing offset, when got differs from want.
func CheckBytes(t testing.TB, want, got []byte) {
	t.Helper()
	if off := FirstMismatch(want, got); off >= 0 {
		var w, g string
		if off < len(want) {
			w = fmt.Sprintf("%#02x", want[off])
		} else {
			w = "end"
		}
		if off < len(got) {
			g = fmt.Sprintf("%#02x", got[off])
		} else {
			g = "end"
		}
		t.Fatalf("bytes differ at offset %d of %d (want %s, got %s; want len %d, got len %d)", off, max(len(want), len(got)), w, g, len(want), len(got))
	}
}

// FirstMismatch returns the first offset at which a and b differ (the
// shorter length when one is a prefix of the other), or -1 when they are equal.
func FirstMismatch(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// GPUContext returns device 0's primary context after RequireGPU: it skips
// without a GPU, and fails instead under PINMEM_REQUIRE_GPU=1.
func GPUContext(t testing.TB) *cuda.Context {
	t.Helper()
	RequireGPU(t)
	return PrimaryContext(t)
}

// PrimaryContext returns device 0's primary context through whatever driver
// is installed (the real one or a fake); any failure fails t.
func PrimaryContext(t testing.TB) *cuda.Context {
	t.Helper()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	return ctx
}

// CrefRec is one JSON result line of a C reference program (cref/).
type CrefRec struct {
	Bench  string  `json:"bench"`
	Kind   string  `json:"kind"`
	Dir    string  `json:"dir"`
	Size   int     `json:"size"`
	Median float64 `json:"median"`
}

// RunCref runs a C reference program with args and returns the result lines
// it printed (those with a median); a failure to run it fails tb.
func RunCref(tb testing.TB, prog string, args ...string) []CrefRec {
	tb.Helper()
	out, err := exec.Command(filepath.Clean(prog), args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		tb.Fatalf("%s %v: %v\n%s", prog, args, err, stderr)
	}
	var recs []CrefRec
	for _, line := range bytes.Split(out, []byte("\n")) {
		var rec CrefRec
		if json.Unmarshal(line, &rec) == nil && rec.Median > 0 {
			recs = append(recs, rec)
		}
	}
	return recs
}

// BenchCPU is the CPU that call-cost benchmarks bind their calling thread and
// the C reference to (PINMEM_BENCH_CPU; default 2 on machines with at least
// four CPUs, so that CPU 0's interrupts stay out of the way), or 0 for none.
func BenchCPU() int {
	if v := os.Getenv("PINMEM_BENCH_CPU"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 && n < runtime.NumCPU() {
			return n
		}
		return 0
	}
	if runtime.NumCPU() >= 4 {
		return 2
	}
	return 0
}

// BenchLog prints one line of a benchmark's detail (a round's samples) to
// stdout, prefixed with "# ". testing keeps only the first 10 lines a
// benchmark logs through b.Log; these are not cut, and tools that read
// benchmark lines skip them.
func BenchLog(format string, args ...any) {
	fmt.Printf("# "+format+"\n", args...)
}
