//go:build linux

package pinmem

import (
	"context"
	"slices"
	"testing"
	"time"
)

// importShared exports src and imports it again in this process (a second
// mapping of the same pages, registered on its own: the importer's path).
func importShared(tb testing.TB, src *Buffer) *Buffer {
	tb.Helper()
	a, b := socketPairTB(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(tb, SendShared(ctx, a, src))
	imp, err := ReceiveShared(ctx, b, src.Len(), src.Flags())
	must(tb, err)
	tb.Cleanup(func() { must(tb, imp.Free()) })
	return imp
}

// TestGPUShareRoundTrip: an imported shared buffer copies to the GPU and
// back, and what the GPU wrote is what the exporter sees.
func TestGPUShareRoundTrip(t *testing.T) {
	const size = 8<<20 + 5
	g := newGPUEnv(t, size)
	src, err := AllocShared(size, 0)
	must(t, err)
	defer mustFree(t, src)
	imp := importShared(t, src)
	g.roundTrip(t, src.Bytes(), imp.Bytes(), 1)
	g.roundTrip(t, imp.Bytes(), src.Bytes(), 2)
}

// BenchmarkShareH2D: host-to-device copies from a shared buffer through
// the exporter's own mapping and through an imported one (the median of
// 9 copies each, in one run); the figure is importer over exporter
// (at least 0.98).
func BenchmarkShareH2D(b *testing.B) {
	const size = 256 << 20
	g := newGPUEnv(b, size)
	src, err := AllocShared(size, 0)
	must(b, err)
	b.Cleanup(func() { must(b, src.Free()) })
	imp := importShared(b, src)
	median := func(host []byte) float64 {
		var d []time.Duration
		for range 9 {
			d = append(d, g.copyTimed(b, host, true))
		}
		slices.Sort(d)
		return gbps(size, d[len(d)/2])
	}
	for b.Loop() {
		exp, im := median(src.Bytes()), median(imp.Bytes())
		b.ReportMetric(exp, "exporter-GB/s")
		b.ReportMetric(im, "importer-GB/s")
		b.ReportMetric(im/exp, "ratio")
	}
}
