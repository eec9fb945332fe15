package pinmem_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// copyVsCKinds pairs each host-memory kind of the C reference (cref/bw.c)
// with how pinmem makes the same kind.
var copyVsCKinds = []struct {
	c     string
	flags pinmem.Flags
	opts  []pinmem.Option
}{
	{"pinned", 0, []pinmem.Option{pinmem.WithMethod(pinmem.MethodHostAlloc)}},
	{"portable", pinmem.Portable, []pinmem.Option{pinmem.WithMethod(pinmem.MethodHostAlloc)}},
	{"mapped", pinmem.Mapped, []pinmem.Option{pinmem.WithMethod(pinmem.MethodHostAlloc)}},
	{"write-combined", pinmem.WriteCombined, []pinmem.Option{pinmem.WithMethod(pinmem.MethodHostAlloc)}},
	{"registered", 0, []pinmem.Option{pinmem.WithMethod(pinmem.MethodMmapRegister)}},
}

var copyVsCSizes = []int{64 << 10, 1 << 20, 16 << 20, 256 << 20}

// BenchmarkCopyVsC measures H2D and D2H bandwidth of pinmem buffers of each
// kind and size through the public API (cuda.Stream copies timed with
// events, as the C program does: one non-blocking stream, enough copies for
// at least 20 ms a sample), interleaving each round of Go samples with one
// run of the C reference (path in PINMEM_CREF_BW, one sample per kind and
// size). It reports, per kind/dir/size, the Go and C medians and go/c; the
// C program's own min-max spread (in %) is reported as c-spread-%.
func BenchmarkCopyVsC(b *testing.B) {
	testutil.RequireGPU(b)
	cprog := os.Getenv("PINMEM_CREF_BW")
	dev, err := cuda.GetDevice(0)
	if err != nil {
		b.Fatal(err)
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		b.Fatal(err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	maxSize := slices.Max(copyVsCSizes)
	d, err := ctx.Alloc(maxSize)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free()
	start, _ := ctx.NewEvent(cuda.EventDefault)
	end, _ := ctx.NewEvent(cuda.EventDefault)
	defer start.Destroy()
	defer end.Destroy()

	type key struct {
		kind, dir string
		size      int
	}
	goS := map[key][]float64{}
	cS := map[key][]float64{}
	bufs := map[string]*pinmem.Buffer{}
	for _, k := range copyVsCKinds {
		buf, err := pinmem.Alloc(maxSize, k.flags, k.opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer buf.Free()
		copy(buf.Bytes(), testutil.RandomBytes(maxSize, 5))
		bufs[k.c] = buf
	}
	sample := func(host []byte, h2d bool) (float64, error) {
		n := len(host)
		reps := 1
		for {
			if err := start.Record(s); err != nil {
				return 0, err
			}
			for i := 0; i < reps; i++ {
				var err error
				if h2d {
					err = s.CopyHtoD(d, 0, host)
				} else {
					err = s.CopyDtoH(host, d, 0)
				}
				if err != nil {
					return 0, err
				}
			}
			if err := end.Record(s); err != nil {
				return 0, err
			}
			if err := end.Synchronize(context.Background()); err != nil {
				return 0, err
			}
			el, err := end.Elapsed(start)
			if err != nil {
				return 0, err
			}
			if el >= 20*time.Millisecond || reps >= 1<<16 {
				return float64(n) * float64(reps) / el.Seconds() / 1e9, nil
			}
			reps *= 2
		}
	}
	const rounds = 5
	for i := 0; i < b.N; i++ {
		for r := 0; r < rounds; r++ {
			for _, k := range copyVsCKinds {
				for _, n := range copyVsCSizes {
					for _, dir := range []string{"h2d", "d2h"} {
						g, err := sample(bufs[k.c].Bytes()[:n], dir == "h2d")
						if err != nil {
							b.Fatal(err)
						}
						goS[key{k.c, dir, n}] = append(goS[key{k.c, dir, n}], g)
					}
				}
			}
			if cprog == "" {
				continue
			}
			args := []string{"--samples", "1", "--kinds", "pinned,portable,mapped,write-combined,registered"}
			for _, n := range copyVsCSizes {
				args = append(args, strconv.Itoa(n))
			}
			for _, rec := range testutil.RunCref(b, cprog, args...) {
				cS[key{rec.Kind, rec.Dir, rec.Size}] = append(cS[key{rec.Kind, rec.Dir, rec.Size}], rec.Median)
			}
		}
	}
	for _, k := range copyVsCKinds {
		for _, n := range copyVsCSizes {
			for _, dir := range []string{"h2d", "d2h"} {
				kk := key{k.c, dir, n}
				name := fmt.Sprintf("%s/%s/%dKiB", k.c, dir, n>>10)
				b.ReportMetric(med(goS[kk]), name+"/go-GB/s")
				if c := cS[kk]; len(c) > 0 {
					b.ReportMetric(med(c), name+"/c-GB/s")
					b.ReportMetric(med(goS[kk])/med(c), name+"/go/c")
					b.ReportMetric(100*(slices.Max(c)-slices.Min(c))/med(c), name+"/c-spread-%")
				}
			}
		}
	}
}

func med(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
