package cudadrv_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// inprocBatch and inprocSamples time a round the way cref/callcost does:
// a warm-up batch, then the median of inprocSamples batches of inprocBatch
// calls, the stream synchronized before each batch.
const (
	inprocBatch   = 1000
	inprocSamples = 5
)

// BenchmarkInProcessC locates the gap between issuing a 4 KiB async H2D
// copy from Go and from C. In one process, on one locked thread, with one
// context, stream and pair of buffers, rounds interleave:
//
//   - go: the raw binding's MemcpyHtoDAsync (pinmem's trampoline), one Go
//     call per copy;
//   - go-batch8: the same copies through RunBatch, 8 per crossing;
//   - c-inproc: the same copies issued by a C loop (cref/loop.c, built by
//     cref/build as libpinmemloop.so; path in PINMEM_CREF_LOOPLIB) that the
//     Go code enters once per batch;
//   - c-gapN: the C loop with a busy wait of N ns after each call, which
//     shows how much of a gap between calls (what a Go caller spends
//     crossing into C) the total absorbs;
//   - c-fence4: the C loop with four atomic read-modify-writes (full
//     barriers) after each call, about what the Go scheduler executes on a
//     crossing;
//   - c-process: the separate cref/callcost program (PINMEM_CREF_CALLCOST),
//     when set.
//
// The series of a case rotate their order from round to round, every round
// is printed (testutil.BenchLog), and the calling thread and the C program
// are bound to one CPU (testutil.BenchCPU).
//
// go vs c-inproc is the cost of the Go calls themselves; c-inproc vs
// c-process is the cost of the process they are made in (its threads, its
// other allocations). cuCtxGetCurrent is measured the same way. Run it with
// -test.benchtime=1x.
func BenchmarkInProcessC(b *testing.B) {
	d := testutil.RequireGPU(b)
	lib := os.Getenv("PINMEM_CREF_LOOPLIB")
	if lib == "" {
		b.Skip("PINMEM_CREF_LOOPLIB (cref/build's libpinmemloop.so) not set")
	}
	h, err := purego.Dlopen(filepath.Clean(lib), purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		b.Fatalf("%s: %v", lib, err)
	}
	cu, err := purego.Dlopen(cudadrv.LibraryPath(), purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		b.Fatal(err)
	}
	sym := func(h uintptr, name string) uintptr {
		p, err := purego.Dlsym(h, name)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		return p
	}
	loopHtoD, loopGetCur := sym(h, "pinmem_loop_htod_async"), sym(h, "pinmem_loop_ctx_get_current")
	loopGap, loopFence := sym(h, "pinmem_loop_htod_async_gap"), sym(h, "pinmem_loop_htod_async_fence")
	cuHtoD, cuGetCur := sym(cu, "cuMemcpyHtoDAsync_v2"), sym(cu, "cuCtxGetCurrent")

	// Locked, not bound: threads the driver starts (with the retain below)
	// inherit the affinity of the thread that starts them. Each
	// sub-benchmark binds its own thread.
	testutil.BindThread(b, 0)
	check := func(what string, err error) {
		b.Helper()
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	ctx, release := primaryCurrent(b, d)
	defer release()
	s, err := d.StreamCreate(cudadrv.StreamNonBlocking)
	check("StreamCreate", err)
	defer func() { check("StreamDestroy", d.StreamDestroy(s)) }()
	const n = 4096
	dp, err := d.MemAlloc(n)
	check("MemAlloc", err)
	defer func() { check("MemFree", d.MemFree(dp)) }()
	src, err := d.MemHostAlloc(n, 0)
	check("MemHostAlloc", err)
	defer func() { check("MemFreeHost", d.MemFreeHost(src)) }()

	// round times one kind of call: batch returns the ns of inprocBatch calls.
	round := func(b *testing.B, batch func() (int64, error)) float64 {
		b.Helper()
		var v []float64
		for i := -1; i < inprocSamples; i++ {
			if err := d.StreamSynchronize(s); err != nil {
				b.Fatalf("StreamSynchronize: %v", err)
			}
			ns, err := batch()
			if err != nil {
				b.Fatal(err)
			}
			if i >= 0 {
				v = append(v, float64(ns)/inprocBatch)
			}
		}
		return median(v)
	}
	goLoop := func(call func() error) func() (int64, error) {
		return func() (int64, error) {
			t := time.Now()
			for range inprocBatch {
				if err := call(); err != nil {
					return 0, err
				}
			}
			return time.Since(t).Nanoseconds(), nil
		}
	}
	ops := make([]cudadrv.BatchOp, 8)
	for i := range ops {
		ops[i] = cudadrv.BatchOp{Kind: cudadrv.BatchCopyHtoD, Dev: dp, Host: src, N: n, Stream: s}
	}
	cGap := func(gap int) func() (int64, error) {
		return func() (int64, error) {
			return loopResult(cudadrv.CCall(loopGap, cuHtoD, uintptr(dp), uintptr(src), n, uintptr(s), inprocBatch, uintptr(gap)))
		}
	}
	type series struct {
		name string
		run  func() (int64, error)
	}
	cases := map[string][]series{
		"ctxGetCurrent": {
			{"go", goLoop(func() error { _, err := d.CtxGetCurrent(); return err })},
			{"c-inproc", func() (int64, error) { return loopResult(cudadrv.CCall(loopGetCur, cuGetCur, inprocBatch)) }},
		},
		"asyncH2D4KiB": {
			{"go", goLoop(func() error { return d.MemcpyHtoDAsync(dp, src, n, s) })},
			{"go-batch8", func() (int64, error) {
				t := time.Now()
				for range inprocBatch / len(ops) {
					if _, err := cudadrv.RunBatch(d, ops); err != nil {
						return 0, err
					}
				}
				return time.Since(t).Nanoseconds(), nil
			}},
			{"c-inproc", func() (int64, error) {
				return loopResult(cudadrv.CCall(loopHtoD, cuHtoD, uintptr(dp), uintptr(src), n, uintptr(s), inprocBatch))
			}},
			{"c-gap0", cGap(0)},
			{"c-gap100", cGap(100)},
			{"c-gap200", cGap(200)},
			{"c-fence4", func() (int64, error) {
				return loopResult(cudadrv.CCall(loopFence, cuHtoD, uintptr(dp), uintptr(src), n, uintptr(s), inprocBatch, 4))
			}},
		},
	}
	cprog := os.Getenv("PINMEM_CREF_CALLCOST")
	rounds := 21
	if testing.Short() {
		rounds = 5
	}
	for _, name := range []string{"ctxGetCurrent", "asyncH2D4KiB"} {
		b.Run(name, func(b *testing.B) {
			// A sub-benchmark runs on a goroutine of its own: bind its
			// thread and make the context current there.
			cpu := testutil.BindThread(b, testutil.BenchCPU())
			if err := d.CtxSetCurrent(ctx); err != nil {
				b.Fatalf("CtxSetCurrent: %v", err)
			}
			ser := cases[name]
			got := map[string][]float64{}
			for i := 0; i < b.N; i++ {
				for r := range rounds {
					line := fmt.Sprintf("round %2d:", r)
					for k := range ser {
						x := ser[(r+k)%len(ser)] // rotate which series goes first
						v := round(b, x.run)
						got[x.name] = append(got[x.name], v)
						line += fmt.Sprintf(" %s %.0f", x.name, v)
					}
					if cprog != "" {
						v := callcostMedian(b, cprog, name, cpu)
						got["c-process"] = append(got["c-process"], v)
						line += fmt.Sprintf(" c-process %.0f", v)
					}
					testutil.BenchLog("%s %s", name, line)
				}
			}
			in := median(got["c-inproc"])
			b.ReportMetric(float64(cpu), "cpu")
			for _, x := range append(ser, series{name: "c-process"}) {
				if v := got[x.name]; len(v) > 0 {
					b.ReportMetric(median(v), x.name+"-ns/call")
					if x.name != "c-inproc" {
						b.ReportMetric(median(v)/in, x.name+"/c-inproc")
					}
				}
			}
		})
	}
}

// loopResult turns a cref/loop.c result (ns, or minus a CUresult) into Go.
func loopResult(r uintptr) (int64, error) {
	v := int64(r)
	if v < 0 {
		return 0, &cudadrv.Error{Op: "pinmem_loop", Code: cudadrv.Result(-v)}
	}
	return v, nil
}

// callcostMedian runs cref/callcost once and returns its median for the
// kind that matches case name.
func callcostMedian(b *testing.B, prog, name string, cpu int) float64 {
	kind := map[string]string{"asyncH2D4KiB": "cuMemcpyHtoDAsync", "ctxGetCurrent": "cuCtxGetCurrent"}[name]
	args := []string{"--samples", strconv.Itoa(inprocSamples), "--batch", strconv.Itoa(inprocBatch)}
	if cpu > 0 {
		args = append(args, "--cpu", strconv.Itoa(cpu))
	}
	for _, rec := range testutil.RunCref(b, prog, args...) {
		if rec.Kind == kind {
			return rec.Median
		}
	}
	b.Fatalf("%s printed no %s median", prog, kind)
	return 0
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
