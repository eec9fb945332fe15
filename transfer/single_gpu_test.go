package transfer

import (
	"bytes"
	"context"
	"testing"
)

// BenchmarkSingleStage compares, side by side with interleaved samples,
// the single-stage path (one pinned stage, the CPU copy on the caller's
// goroutine or the copy goroutines, one asynchronous copy per piece and a
// wait on the stream) with the driver's own pageable copy of the same Go
// slice and the forced ring (staged), from 4 KiB to 32 MiB both ways. It
// reports single/driver with a context that cannot end (single, cut into
// pieces as a Copier cuts it, stagePieces) and one that can (single-ctx),
// staged/driver, and the single-stage path in 1, 2 and 4 pieces
// (singlePieces) over the driver: the measurements behind singleBand and
// stagePieces. Each size ends with a round trip through the single-stage
// path, whole and in pieces, checked byte for byte. About a minute:
//
//	.gpu/bin/transfer.test -test.run '^$' -test.bench 'SingleStage' -test.benchtime 1x
func BenchmarkSingleStage(b *testing.B) {
	ctx := gpuCtx(b)
	c := gpuCopier(b, ctx)
	sizes := []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 24 << 20, 32 << 20}
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
				via := func(ctx context.Context, how strategy, pieces int32) func() error {
					return func() error {
						c.tune().stagePieces = int(pieces)
						defer func() { c.tune().stagePieces = 0 }()
						var err error
						if dir == HostToDevice {
							_, err = c.htod(ctx, d, h, how)
						} else {
							_, err = c.dtoh(ctx, h, d, how)
						}
						return err
					}
				}
				driver := func() error { _, err := d.WriteAt(h, 0); return err }
				if dir == DeviceToHost {
					driver = func() error { _, err := d.ReadAt(h, 0); return err }
				}
				m, g := sideBySideRounds(b, n, rounds*b.N, []variant{
					{"single", via(bg, forceShort, 0)},
					{"single-ctx", via(cctx, forceShort, 0)},
					{"driver", driver},
					{"staged", via(bg, forceStaged, 0)},
					{"single2", via(bg, forceShort, 2)},
					{"single4", via(bg, forceShort, 4)},
					{"single1", via(bg, forceShort, 1)},
				})
				b.ReportMetric(m[0]/m[2], "single/driver")
				b.ReportMetric(pairedRatio(g[0], g[2]), "single/driver-paired")
				b.ReportMetric(m[1]/m[2], "single-ctx/driver")
				b.ReportMetric(m[3]/m[2], "staged/driver")
				b.ReportMetric(pairedRatio(g[3], g[0]), "staged/single-paired")
				b.ReportMetric(pairedRatio(g[4], g[2]), "single2/driver-paired")
				b.ReportMetric(pairedRatio(g[5], g[2]), "single4/driver-paired")
				b.ReportMetric(pairedRatio(g[6], g[2]), "single1/driver-paired")
			})
		}
		// Every byte, both ways, through the single-stage path, whole and
		// in pieces.
		for _, pieces := range []int32{1, 4} {
			c.tune().stagePieces = int(pieces)
			for i := range h {
				h[i] = byte(i*13 + n + int(pieces))
			}
			clear(back[:n])
			st, err := c.htod(cctx, d, h, forceShort)
			if err != nil || st.Stages != 1 {
				b.Fatalf("%d bytes, %d pieces: single H2D: %v (%v)", n, pieces, err, st)
			}
			if st, err = c.dtoh(cctx, back[:n], d, forceShort); err != nil || st.Stages != 1 {
				b.Fatalf("%d bytes, %d pieces: single D2H: %v (%v)", n, pieces, err, st)
			}
			if !bytes.Equal(back[:n], h) {
				b.Fatalf("%d bytes, %d pieces: single-stage round trip differs", n, pieces)
			}
		}
		c.tune().stagePieces = 0
	}
}
