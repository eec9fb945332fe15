package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/cudatest"
	"github.com/pinmem/pinmem/examples/internal/extest"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/transfer"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

func TestRunOnFakeDriver(t *testing.T) {
	cudatest.Install(t)
	var out strings.Builder
	if err := run(context.Background(), config{size: 24 << 20, timeout: time.Minute, attempts: 1}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "24 MiB to the GPU at ") || strings.Contains(out.String(), "trying again") {
		t.Errorf("output %q", out.String())
	}
}

// onLine is a writer that calls f with each line written to it.
type onLine struct {
	mu sync.Mutex
	b  strings.Builder
	f  func(string)
}

func (o *onLine) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.b.Write(p)
	for _, l := range strings.Split(strings.TrimSuffix(string(p), "\n"), "\n") {
		o.f(l)
	}
	return len(p), nil
}

// TestRetryAfterDeadline holds every stream of the fake, as a stuck GPU
// would: the first attempt misses its deadline, the example says it tries
// again, the streams are released then, and the retry succeeds.
func TestRetryAfterDeadline(t *testing.T) {
	d := cudatest.Install(t)
	d.HoldAll()
	out := &onLine{f: func(line string) {
		if strings.Contains(line, "trying again") {
			d.ReleaseAll()
		}
	}}
	// Attempts enough that a slow machine still finishes: the deadlines
	// double from 20 ms.
	err := run(context.Background(), config{size: 24 << 20, timeout: 20 * time.Millisecond, attempts: 12}, out)
	if err != nil {
		t.Fatalf("run = %v\n%s", err, out.b.String())
	}
	if !strings.HasPrefix(out.b.String(), "host to device: attempt 1 missed its 20ms deadline; trying again with 40ms\n") {
		t.Errorf("output %q", out.b.String())
	}
}

// TestDeadlineOnEveryAttempt: with the streams held throughout, every
// attempt misses its deadline and retry returns the last one's error.
func TestDeadlineOnEveryAttempt(t *testing.T) {
	d := cudatest.Install(t)
	ctx := context.Background()
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := gpu.Alloc(24 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	cp, err := transfer.New(gpu)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close(ctx)
	d.HoldAll()
	defer d.ReleaseAll() // before Close: let the abandoned copies run
	var out strings.Builder
	src := make([]byte, buf.Size())
	_, err = retry(ctx, config{timeout: 10 * time.Millisecond, attempts: 2}, &out, "up", func(ctx context.Context) *transfer.Op {
		return cp.HtoDAsync(ctx, buf, src)
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "up, attempt 2 of 2") {
		t.Fatalf("retry = %v, want the second attempt's deadline", err)
	}
	if want := "up: attempt 1 missed its 10ms deadline; trying again with 20ms\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}

// TestOtherErrorsAreNotRetried: a failed copy is not a missed deadline.
func TestOtherErrorsAreNotRetried(t *testing.T) {
	d := cudatest.Install(t)
	if err := d.FailOn("cuMemcpyHtoDAsync_v2", cudatest.Always(), cuda.ResultLaunchFailed); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err := run(context.Background(), config{size: 24 << 20, timeout: time.Minute, attempts: 3}, &out)
	if !errors.Is(err, cuda.ErrLaunchFailed) || strings.Contains(out.String(), "trying again") {
		t.Fatalf("run = %v, output %q: want cuda.ErrLaunchFailed on the first attempt", err, out.String())
	}
}

func TestWithoutGPU(t *testing.T) { extest.CheckNoGPU(t, "asyncop") }

func TestOnGPU(t *testing.T) {
	testutil.RequireGPU(t)
	var out strings.Builder
	if err := run(context.Background(), config{size: 64 << 20, timeout: time.Second, attempts: 3}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
}
