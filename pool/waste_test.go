package pool

import (
	"context"
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// wasteOp replaces the block in slot (freeing it when there is one) with a
// new block of size bytes.
type wasteOp struct{ slot, size int }

// wasteSeq returns a request sequence over slots live blocks and its peak
// of live requested bytes. Mixes: "uniform" draws sizes uniformly from
// 1 KiB to 64 MiB; "skewed" draws 60% small (1-64 KiB, log-uniform), 25%
// from 8 hot sizes (256 KiB to 48 MiB, as a model's fixed tensors) and 15%
// log-uniform from 64 KiB to 64 MiB.
func wasteSeq(mix string, n, slots int, seed uint64) (ops []wasteOp, peakLive int64) {
	r := rand.New(rand.NewPCG(seed, 77))
	logU := func(lo, hi float64) int { return int(math.Exp2(lo + (hi-lo)*r.Float64())) }
	hot := make([]int, 8)
	for i := range hot {
		hot[i] = logU(18, 25.6)
	}
	live := make([]int, slots)
	var cur int64
	for range n {
		var size int
		switch mix {
		case "uniform":
			size = 1<<10 + r.IntN(64<<20-1<<10+1)
		case "skewed":
			switch x := r.Float64(); {
			case x < 0.60:
				size = logU(10, 16)
			case x < 0.85:
				size = hot[r.IntN(len(hot))]
			default:
				size = logU(16, 26)
			}
		default:
			panic(mix)
		}
		slot := r.IntN(slots)
		cur += int64(size - live[slot])
		live[slot] = size
		peakLive = max(peakLive, cur)
		ops = append(ops, wasteOp{slot, size})
	}
	return ops, peakLive
}

// runPoolSeq plays ops on a real pool (on whatever driver is installed)
// and returns its stats.
func runPoolSeq(tb testing.TB, ops []wasteOp, slots int) Stats {
	tb.Helper()
	// MethodHostAlloc: with the fake driver the memory is then never touched.
	p, err := New(WithFlags(0, pinmem.WithMethod(pinmem.MethodHostAlloc)))
	if err != nil {
		tb.Fatal(err)
	}
	live := make([]*Block, slots)
	for _, op := range ops {
		if b := live[op.slot]; b != nil {
			mustPut(tb, p, b)
		}
		live[op.slot] = mustGet(tb, p, op.size)
	}
	for _, b := range live {
		if b != nil {
			mustPut(tb, p, b)
		}
	}
	st := p.Stats()
	if err := p.Close(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return st
}

// simResult is what a simulated caching allocator pinned.
type simResult struct {
	peakPinned  int64
	hits, gets  int
	peakRounded int64
}

// simSeq simulates a caching allocator with the given rounding on ops:
// exact-class reuse, and, when evict is set, the pool's policy: a miss
// that would take the pinned bytes above the peak of rounded bytes in use
// first releases least recently released idle blocks.
// With pow2 rounding and no eviction it is PyTorch's caching host
// allocator (blocks never split, never released).
func simSeq(ops []wasteOp, slots int, round func(int) int, evict bool) simResult {
	type idleBlk struct {
		size int
		seq  int
	}
	var res simResult
	idle := map[int][]idleBlk{}
	live := make([]int, slots)
	var pinned, rounded int64
	seq := 0
	for _, op := range ops {
		if c := live[op.slot]; c != 0 {
			seq++
			idle[c] = append(idle[c], idleBlk{c, seq})
			rounded -= int64(c)
		}
		c := round(op.size)
		res.gets++
		rounded += int64(c)
		res.peakRounded = max(res.peakRounded, rounded)
		live[op.slot] = c
		if l := idle[c]; len(l) > 0 {
			idle[c] = l[:len(l)-1]
			res.hits++
			continue
		}
		excess := pinned + int64(c) - res.peakRounded // the pool's policy: stay within peak in use
		for freed := int64(0); evict && freed < excess; {
			best, bestSeq := -1, math.MaxInt
			for k, l := range idle {
				if len(l) > 0 && l[0].seq < bestSeq {
					best, bestSeq = k, l[0].seq
				}
			}
			if best < 0 {
				break
			}
			freed += int64(best)
			pinned -= int64(best)
			idle[best] = idle[best][1:]
		}
		pinned += int64(c)
		res.peakPinned = max(res.peakPinned, pinned)
	}
	return res
}

func pow2(n int) int {
	if n <= Align {
		return Align
	}
	return 1 << bits.Len(uint(n-1))
}

type wasteReport struct {
	pool, pow2, pow2Evict          float64 // peak pinned / peak live requested
	poolHit, pow2Hit, pow2EvictHit float64
}

func measureWaste(tb testing.TB, mix string) wasteReport {
	const n, slots = 3000, 24
	ops, peakLive := wasteSeq(mix, n, slots, 2026)
	st := runPoolSeq(tb, ops, slots)
	if st.PeakRequestedBytes != peakLive {
		tb.Fatalf("pool saw a peak of %d requested bytes, the sequence has %d", st.PeakRequestedBytes, peakLive)
	}
	pt := simSeq(ops, slots, pow2, false)
	pe := simSeq(ops, slots, pow2, true)
	live := float64(peakLive)
	return wasteReport{
		pool: float64(st.PeakPinnedBytes) / live, pow2: float64(pt.peakPinned) / live, pow2Evict: float64(pe.peakPinned) / live,
		poolHit: st.hitRate(), pow2Hit: float64(pt.hits) / float64(pt.gets), pow2EvictHit: float64(pe.hits) / float64(pe.gets),
	}
}

// TestWasteMixes: for a uniform and a skewed mix of request sizes, the
// pool's peak pinned bytes (slabs and idle cache included) stay within
// 1.125 times the peak of live requested bytes, and below power-of-two
// rounding on the same sequence.
func TestWasteMixes(t *testing.T) {
	for _, mix := range []string{"uniform", "skewed"} {
		t.Run(mix, func(t *testing.T) {
			useFake(t)
			w := measureWaste(t, mix)
			t.Logf("%s: peak pinned / peak live: pool %.3f (hits %.1f%%), pow2 never released (PyTorch) %.3f (hits %.1f%%), pow2 with the pool's release-on-miss %.3f (hits %.1f%%)",
				mix, w.pool, 100*w.poolHit, w.pow2, 100*w.pow2Hit, w.pow2Evict, 100*w.pow2EvictHit)
			if w.pool > 1.125 {
				t.Errorf("pool pinned %.3fx the peak live bytes, bound 1.125", w.pool)
			}
			if w.pool >= w.pow2Evict || w.pool >= w.pow2 {
				t.Errorf("pool %.3f not below power-of-two rounding (%.3f, %.3f)", w.pool, w.pow2Evict, w.pow2)
			}
		})
	}
}

// BenchmarkWaste reports, for a uniform (1 KiB..64 MiB) and a skewed mix
// of 3000 requests over 24 live blocks, peak pinned bytes over peak live
// requested bytes: the pool's ("pool-pinned/live"), PyTorch-style
// power-of-two caching that never releases ("pow2-pinned/live"), and
// power-of-two rounding with the pool's release-on-miss policy
// ("pow2evict-pinned/live"), with hit rates. It is accounting, so it runs
// on the fake driver everywhere (a GPU run pins the same bytes).
func BenchmarkWaste(b *testing.B) {
	for _, mix := range []string{"uniform", "skewed"} {
		b.Run(mix, func(b *testing.B) {
			testutil.UseFake(b, fakedrv.Options{})
			var w wasteReport
			for b.Loop() {
				w = measureWaste(b, mix)
			}
			b.ReportMetric(w.pool, "pool-pinned/live")
			b.ReportMetric(w.pow2, "pow2-pinned/live")
			b.ReportMetric(w.pow2Evict, "pow2evict-pinned/live")
			b.ReportMetric(100*w.poolHit, "pool-hit%")
			b.ReportMetric(100*w.pow2Hit, "pow2-hit%")
			b.ReportMetric(100*w.pow2EvictHit, "pow2evict-hit%")
		})
	}
}

// Prewarmed blocks set the footprint a miss stays within (as blocks in use
// at once do): a miss of another size releases only the idle memory it
// needs to stay within it (one prewarmed block for a 128 KiB slab), not
// every prewarmed block, so the Gets they were pinned for still hit.
func TestPrewarmSurvivesOtherMisses(t *testing.T) {
	d := useFake(t)
	p := newPool(t, WithPrewarm(1<<20, 8<<20))
	small := mustGet(t, p, 64) // a miss of another class
	if st := p.Stats(); st.CachedBytes < 7<<20 {
		t.Errorf("a 64-byte miss released prewarmed blocks: %v", st)
	}
	calls := d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2")
	var bs []*Block
	for range 8 {
		bs = append(bs, mustGet(t, p, 1<<20))
	}
	if n := d.Calls("cuMemHostAlloc") + d.Calls("cuMemHostRegister_v2"); n > calls+1 || p.Stats().Hits < 7 {
		t.Errorf("Gets of the prewarmed size pinned %d times: %v", n-calls, p.Stats())
	}
	for _, b := range bs {
		mustPut(t, p, b)
	}
	mustPut(t, p, small)
}

// Prewarming stops before a block that would take the idle bytes above
// WithMaxCached: pinned, that block would leave the cache at once and stay
// pinned, deferred, until the next miss.
func TestPrewarmWithinMaxCached(t *testing.T) {
	useFake(t)
	p := newPool(t, WithPrewarm(3<<20, 8<<20), WithMaxCached(8<<20))
	if st := p.Stats(); st.CachedBytes != 6<<20 || st.PinnedBytes != 6<<20 || st.DeferredUnpins != 0 {
		t.Errorf("after prewarming 8 MiB in 3 MiB blocks under an 8 MiB cap: %v", st)
	}
}
