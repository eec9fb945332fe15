package bench

import (
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
)

// TestCopierPairedOnFake: one way, the copier rows are measured side by
// side with the driver's synchronous copy of the same slice and keep the
// paired ratio as their reference; from 16 MiB a staged-bound row
// follows (its two copies run together, each alone in its note), and the copier's note gives its ratio to it; every row is
// verified. Both ways at once, the copier row is timed as before. (The
// fake's figures mean nothing: structure only.)
func TestCopierPairedOnFake(t *testing.T) {
	_, s := blocksOnFake(t, fakedrv.Options{})
	rs, err := s.Bandwidth(t.Context(), BandwidthConfig{Kinds: []string{KindCopier, KindPageableSync}, Sizes: []int64{4 << 10, 16 << 20}, Samples: 3, MinBytes: 1 << 20, MaxReps: 4})
	if err != nil {
		t.Fatal(err)
	}
	AddReferences(rs)
	got := map[string]Result{}
	for _, r := range rs {
		t.Log(r, r.Ref, r.Ratio, r.Note)
		got[r.Kind+" "+r.Dir+" "+FormatSize(r.Size)] = r
	}
	for _, size := range []string{"4KiB", "16MiB"} {
		for _, dir := range []string{DirH2D, DirD2H} {
			r := got[KindCopier+" "+dir+" "+size]
			if !r.Verified || r.Samples != 3 || !r.Paired || r.Ref != KindPageableSync || r.Ratio <= 0 || !strings.Contains(r.Note, "paired with the driver's synchronous copy") {
				t.Errorf("copier %s %s: %+v", dir, size, r)
			}
			b, ok := got[KindStagedBound+" "+dir+" "+size]
			if ok != (size == "16MiB") {
				t.Errorf("staged-bound %s %s: present %v", dir, size, ok)
				continue
			}
			if ok && (b.Timing != TimingWall || !b.Verified || b.Median <= 0 || !strings.Contains(b.Note, "started together") || !strings.Contains(b.Note, "each alone") || b.Median > b.Max || !strings.Contains(r.Note, "of staged-bound (paired)")) {
				t.Errorf("staged-bound %s %s: %+v; copier note %q", dir, size, b, r.Note)
			}
		}
		if r := got[KindCopier+" "+DirBidir+" "+size]; !r.Verified || r.Paired || r.Samples != 3 {
			t.Errorf("copier bidir %s: %+v", size, r)
		}
	}
}

// TestReferencesKeepPaired: a row whose ratio was measured side by side
// keeps it; the others are computed from the medians.
func TestReferencesKeepPaired(t *testing.T) {
	rs := []Result{
		{Bench: "bw", Kind: KindPageableSync, Dir: DirH2D, Size: 4096, Unit: GBps, Median: 2, Samples: 1},
		{Bench: "bw", Kind: KindCopier, Dir: DirH2D, Size: 4096, Unit: GBps, Median: 3, Samples: 1, Ref: KindPageableSync, Ratio: 1.1, Paired: true},
		{Bench: "bw", Kind: KindCopier, Dir: DirD2H, Size: 4096, Unit: GBps, Median: 3, Samples: 1, Ref: KindPageableSync, Ratio: 1.1},
	}
	AddReferences(rs)
	if rs[1].Ratio != 1.1 || rs[1].Ref != KindPageableSync {
		t.Errorf("paired row: %q %v, want its measured 1.1", rs[1].Ref, rs[1].Ratio)
	}
	if rs[2].Ratio != 0 || rs[2].Ref != "" {
		t.Errorf("unpaired row without a reference row: %q %v, want none", rs[2].Ref, rs[2].Ratio)
	}
}

// TestStagedBoundCheck: the staged bound's check passes after its variant
// ran both copies, each way, and fails when the variant skips either the
// CPU's copy or the copy engine's.
func TestStagedBoundCheck(t *testing.T) {
	_, s := blocksOnFake(t, fakedrv.Options{})
	const n = 1 << 20
	w := &bwWork{s: s, ctx: t.Context(), n: n}
	t.Cleanup(w.close)
	if err := w.setup(); err != nil {
		t.Fatal(err)
	}
	if err := w.boundMem(n); err != nil {
		t.Fatal(err)
	}
	hA, err := s.allocHost(KindCopier, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{DirH2D, DirD2H} {
		vs := w.boundVariants(hA, dir, n) // memcpy, dma, both
		if err := w.boundCheck(hA, dir, n, vs[2]); err != nil {
			t.Errorf("%s: both copies ran: %v", dir, err)
		}
		for i, skip := range []string{"the CPU's copy", "the copy engine's copy"} {
			only := vs[1-i] // the other copy alone
			if err := w.boundCheck(hA, dir, n, only); err == nil || !strings.Contains(err.Error(), skip) {
				t.Errorf("%s: %s left out: error %v, want one naming it", dir, skip, err)
			}
		}
	}
}

// TestStagedBoundOverBudget: when the bound's pinned buffers do not fit
// pinmem's budget, the copier row is measured as before, no staged-bound
// row follows, and the copier's note says why.
func TestStagedBoundOverBudget(t *testing.T) {
	_, s := blocksOnFake(t, fakedrv.Options{})
	prev := pinmem.SetBudget(40 << 20) // the copier's stages fit, not two more buffers of 16 MiB
	t.Cleanup(func() { pinmem.SetBudget(prev) })
	rs, err := s.Bandwidth(t.Context(), BandwidthConfig{Kinds: []string{KindCopier, KindPageableSync}, Dirs: []string{DirH2D}, Sizes: []int64{16 << 20}, Samples: 2, MinBytes: 1 << 20, MaxReps: 2})
	if err != nil {
		t.Fatal(err)
	}
	var copier *Result
	for i, r := range rs {
		if r.Kind == KindStagedBound {
			t.Errorf("staged-bound row over the budget: %+v", r)
		}
		if r.Kind == KindCopier {
			copier = &rs[i]
		}
	}
	if copier == nil || !copier.Verified || !strings.Contains(copier.Note, "no staged-bound row: ") {
		t.Fatalf("copier row %+v", copier)
	}
	if !strings.Contains(copier.Note, "budget") {
		t.Errorf("copier note %q: want the budget error", copier.Note)
	}
}
