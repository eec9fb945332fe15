package bench

import (
	"testing"

	"github.com/pinmem/pinmem/transfer"
)

// TestCopierPath: a row names the one path a transfer took, or each
// path's share of a mixed one.
func TestCopierPath(t *testing.T) {
	for _, c := range []struct {
		st   transfer.Stats
		want string
	}{
		{transfer.Stats{Bytes: 100, StagedBytes: 100, Stages: 2}, "staged"},
		{transfer.Stats{Bytes: 100, DirectBytes: 100}, "direct"},
		{transfer.Stats{Bytes: 100, StagedBytes: 75, DirectBytes: 25}, "staged 75% + direct 25%"},
	} {
		if got := copierPath(c.st); got != c.want {
			t.Errorf("%+v: %q, want %q", c.st, got, c.want)
		}
	}
}

// TestReferences: each row's same-run reference, with the fallbacks when
// the C reference did not run, and none for a computed bound.
func TestReferences(t *testing.T) {
	row := func(bench, kind, dir string, v float64) Result {
		return Result{Bench: bench, Kind: kind, Dir: dir, Size: 1 << 20, Unit: GBps, Median: v, Min: v, Max: v, Samples: 1}
	}
	rs := []Result{
		row("bw", KindPageableSync, DirH2D, 10),
		row("bw", KindCopier, DirH2D, 15),
		row("bw", KindPinned, DirH2D, 50),
		row("bw", CRefPrefix+KindPinned, DirH2D, 50),
		row("bw", KindPortable, DirH2D, 25),
		row("bw", KindPageable, DirH2D, 5),
		row("overlap", VariantBound, "pipeline", 9),
		row("overlap", VariantPageableSync, "pipeline", 3),
	}
	AddReferences(rs)
	want := []struct {
		ref   string
		ratio float64
	}{{"", 0}, {KindPageableSync, 1.5}, {CRefPrefix + KindPinned, 1}, {"", 0}, {KindPinned, 0.5}, {KindPageableSync, 0.5}, {"", 0}, {"", 0}}
	for i, w := range want {
		if rs[i].Ref != w.ref || rs[i].Ratio != w.ratio {
			t.Errorf("%s %s: ref %q ratio %v, want %q %v", rs[i].Bench, rs[i].Kind, rs[i].Ref, rs[i].Ratio, w.ref, w.ratio)
		}
	}
}

// TestReferenceKind: the reference row of every bench's kinds.
func TestReferenceKind(t *testing.T) {
	for _, c := range []struct{ bench, kind, want string }{
		{"bw", KindCopier, KindPageableSync}, {"bw", KindGoRegister, KindPageableSync},
		{"bw", KindPinned, CRefPrefix + KindPinned}, {"bw", KindMapped, CRefPrefix + KindMapped},
		{"bw", KindMmapRegister, KindPinned}, {"bw", KindPageableSync, ""}, {"bw", VariantBound, ""},
		{"pin", "mmap-register", PinHostAlloc}, {"pin", PinHostAlloc, ""},
		{"overlap", "pinned", VariantPageableSync}, {"vecadd", "pinned", KindPageable},
		{"zerocopy", "mapped", VariantExplicit}, {"concurrency", "copier", KindPageableSync},
		{"blocks", "kernel", CRefPrefix + "loop"}, {"blocks", CRefPrefix + "loop", CRefPrefix + "contiguous"},
		{"blocks", CRefPrefix + "batch", CRefPrefix + "contiguous"}, {"blocks", CRefPrefix + "contiguous", CRefPrefix + "loop"},
		{"load", "loader", KindTorch}, {"load", "checkpoint", KindTorch}, {"load", "parallel-read", ""},
		{"imagepipeline", "naive", CRefPrefix + "naive"}, {"imagepipeline", "pinned-4", CRefPrefix + "pinned-4"},
		{"imagepipeline", VariantPinned1, VariantBound}, {"imagepipeline", "pipeline", KindImageStagedBound},
		{"imagepipeline", VariantBound, ""}, {"unknown", "x", ""},
	} {
		if got := referenceKind(c.bench, c.kind); got != c.want {
			t.Errorf("referenceKind(%q, %q) = %q, want %q", c.bench, c.kind, got, c.want)
		}
	}
}
