package cuda_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// callBatch is how many calls one timed sample issues; the C reference
// (cref/callcost.c) uses the same batch.
const callBatch = 1000

// sampleGo times one batch of fn and returns ns per call.
func sampleGo(fn func() error) (float64, error) {
	start := time.Now()
	for i := 0; i < callBatch; i++ {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	return float64(time.Since(start).Nanoseconds()) / callBatch, nil
}

// cSamples is how many batches one round of the C reference times (after
// one warm-up batch); roundGo does the same on the Go side.
const cSamples = 5

// roundGo is the Go side of one round, timed as cref/callcost times C: a
// warm-up batch, then cSamples batches each started on an idle stream, and
// their median in ns per call.
func roundGo(fn, sync func() error) (float64, error) {
	var v []float64
	for i := -1; i < cSamples; i++ {
		if err := sync(); err != nil {
			return 0, err
		}
		ns, err := sampleGo(fn)
		if err != nil {
			return 0, err
		}
		if i >= 0 {
			v = append(v, ns)
		}
	}
	return median(v), nil
}

// callCostCases are the calls compared with C: a trivial driver call and
// issuing a 4 KiB asynchronous H2D copy from pinned memory.
func callCostCases(b *testing.B) (cases map[string]func() error, sync func() error) {
	ctx := gpuContext(b)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy() })
	dev, err := ctx.Alloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.Free() })
	host := pinnedHost(b, ctx, 4096)
	return map[string]func() error{
		"asyncH2D4KiB": func() error { return s.CopyHtoD(dev, 0, host) },
	}, func() error { return s.Synchronize(context.Background()) }
}

// BenchmarkCallCost measures what a driver call costs through the public
// cuda package (purego, CGO_ENABLED=0). ns/op is per call.
func BenchmarkCallCost(b *testing.B) {
	cases, sync := callCostCases(b)
	for _, name := range []string{"ctxGetCurrent", "asyncH2D4KiB"} {
		fn := cases[name]
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := fn(); err != nil {
					b.Fatal(err)
				}
				if i%callBatch == callBatch-1 {
					b.StopTimer()
					if err := sync(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
			b.StopTimer()
			if err := sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkCallCostVsC interleaves rounds of the Go calls with runs of the
// C reference (the callcost program built from cref/ with nvcc; its path in
// PINMEM_CREF_CALLCOST). Each round samples every case, Go through pinmem's
// trampoline and through purego.SyscallN, then runs the C program once (it
// measures both of its calls), so that every ratio compares samples taken
// within the same second: the host's speed drifts by several percent from
// one minute to the next, more than the differences measured. A sample is
// timed the same way on both sides: a warm-up batch, then the median of
// five batches of 1000 calls. The calling thread and the C program are bound
// to the same CPU (testutil.BenchCPU). It reports, per case, the medians over
// rounds and Go/C, the median of the per-round ratios, and the ratio of the
// fastest rounds. Without the C program it reports the Go medians only. Each b.N
// iteration is a whole set of rounds (seconds); run it with
// -test.benchtime=1x.
func BenchmarkCallCostVsC(b *testing.B) {
	cases, sync := callCostCases(b)
	cprog := os.Getenv("PINMEM_CREF_CALLCOST")
	cpu := testutil.BindThread(b, testutil.BenchCPU())
	rounds := 31
	if testing.Short() {
		rounds = 5
	}
	names := []string{"ctxGetCurrent", "asyncH2D4KiB"}
	goNs, pgNs, cNs := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for i := 0; i < b.N; i++ {
		for r := range rounds {
			for k := range names {
				name := names[(r+k)%len(names)] // rotate which case goes first
				ns, err := roundGo(cases[name], sync)
				if err != nil {
					b.Fatal(err)
				}
				goNs[name] = append(goNs[name], ns)
				// The same calls through purego.SyscallN, for the
				// trampoline's gain in the same round.
				// Only with -tags pinmem_purego; otherwise the column is 0.
				ns = 0
				if cudadrv.PuregoSwitch {
					prev := cudadrv.UsePuregoCalls(true)
					ns, err = roundGo(cases[name], sync)
					cudadrv.UsePuregoCalls(prev)
					if err != nil {
						b.Fatal(err)
					}
				}
				pgNs[name] = append(pgNs[name], ns)
			}
			line := fmt.Sprintf("round %2d:", r)
			if cprog != "" {
				c := sampleC(b, cprog, cpu)
				for _, name := range names {
					cNs[name] = append(cNs[name], c[cKind[name]])
				}
			}
			for _, name := range names {
				line += fmt.Sprintf(" %s go %.0f purego %.0f", name, goNs[name][len(goNs[name])-1], pgNs[name][len(pgNs[name])-1])
				if len(cNs[name]) > 0 {
					line += fmt.Sprintf(" c %.0f", cNs[name][len(cNs[name])-1])
				}
			}
			testutil.BenchLog("CallCostVsC %s", line)
		}
	}
	if err := sync(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(cpu), "cpu")
	for _, name := range names {
		if len(cNs[name]) > 0 {
			// The host switches between a fast and a slow regime from one
			// round to the next; the fastest round of each side compares
			// the two in the fast one.
			b.ReportMetric(slices.Min(goNs[name])/slices.Min(cNs[name]), name+"-go/c-best")
		}
		b.ReportMetric(median(goNs[name]), name+"-go-ns")
		b.ReportMetric(median(pgNs[name]), name+"-purego-ns")
		if len(cNs[name]) > 0 {
			b.ReportMetric(median(cNs[name]), name+"-c-ns")
			b.ReportMetric(median(goNs[name])/median(cNs[name]), name+"-go/c")
			b.ReportMetric(medianRatio(goNs[name], cNs[name]), name+"-go/c-per-round")
		}
	}
}

// medianRatio is the median over rounds of a[i]/b[i].
func medianRatio(a, b []float64) float64 {
	r := make([]float64, min(len(a), len(b)))
	for i := range r {
		r[i] = a[i] / b[i]
	}
	return median(r)
}

// cKind maps a case to the "kind" the C reference prints for it.
var cKind = map[string]string{"ctxGetCurrent": "cuCtxGetCurrent", "asyncH2D4KiB": "cuMemcpyHtoDAsync"}

// sampleC runs the C reference for a few samples and returns its median
// ns per call for each kind it measured.
func sampleC(b *testing.B, prog string, cpu int) map[string]float64 {
	res := map[string]float64{}
	args := []string{"--samples", strconv.Itoa(cSamples), "--batch", strconv.Itoa(callBatch)}
	if cpu > 0 {
		args = append(args, "--cpu", strconv.Itoa(cpu))
	}
	for _, rec := range testutil.RunCref(b, prog, args...) {
		res[rec.Kind] = rec.Median
	}
	return res
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
