package transfer

import (
	"bytes"
	"context"
	"testing"
)

// BenchmarkSingleStage compares, side by side with interleaved samples,
// the single-stage path (one pinned stage, the CPU copy on the caller's
// goroutine, one asynchronous copy and a wait on the stream), with a
// context that cannot end (single) and one that can (single-ctx), against
// the driver's own pageable copy of the same Go slice and the forced ring
// (staged), from 4 KiB to 16 MiB both ways, and reports single/driver,
// single-ctx/driver and staged/driver. The single-stage path's default
// bands (singleBand) are the sizes where single beats the driver in both
// directions. Each size ends with a round trip through the single-stage
// path checked byte for
// byte. Under 30 s:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'SingleStage' -test.benchtime 1x
func BenchmarkSingleStage(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	sizes := []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20}
	maxN := sizes[len(sizes)-1]
	heap := touched(maxN)
	back := make([]byte, maxN)
	dev := gpuAlloc(b, ctx, maxN)
	bg := context.Background()
	cctx, cancel := context.WithCancel(bg)
	b.Cleanup(cancel)
	for _, n := range sizes {
		h := heap[:n]
		d, _ := dev.Slice(0, n)
		rounds := roundsFor(n)
		if n <= 1<<20 {
			rounds = 51
		}
		for _, dir := range []Direction{HostToDevice, DeviceToHost} {
			name := "H2D/"
			if dir == DeviceToHost {
				name = "D2H/"
			}
			b.Run(name+sizeName(n), func(b *testing.B) {
				b.SetBytes(int64(n))
				via := func(ctx context.Context, how strategy) func() error {
					return func() error {
						var err error
						if dir == HostToDevice {
							_, err = c.htod(ctx, d, h, how)
						} else {
							_, err = c.dtoh(ctx, h, d, how)
						}
						return err
					}
				}
				driver := func() error { return d.CopyFromHost(0, h) }
				if dir == DeviceToHost {
					driver = func() error { return d.CopyToHost(0, h) }
				}
				m, g := sideBySideRounds(b, n, rounds*b.N, []variant{
					{"single", via(bg, forceSingle)},
					{"single-ctx", via(cctx, forceSingle)},
					{"driver", driver},
					{"staged", via(bg, forceStaged)},
				})
				b.ReportMetric(m[0]/m[2], "single/driver")
				b.ReportMetric(pairedRatio(g[0], g[2]), "single/driver-paired")
				b.ReportMetric(m[1]/m[2], "single-ctx/driver")
				b.ReportMetric(m[3]/m[2], "staged/driver")
			})
		}
		// Every byte, both ways, through the single-stage path.
		for i := range h {
			h[i] = byte(i*13 + n)
		}
		clear(back[:n])
		st, err := c.htod(cctx, d, h, forceSingle)
		if err != nil || st.Stages != 1 {
			b.Fatalf("%d bytes: single H2D: %v (%v)", n, err, st)
		}
		if st, err = c.dtoh(cctx, back[:n], d, forceSingle); err != nil || st.Stages != 1 {
			b.Fatalf("%d bytes: single D2H: %v (%v)", n, err, st)
		}
		if !bytes.Equal(back[:n], h) {
			b.Fatalf("%d bytes: single-stage round trip differs", n)
		}
	}
}
