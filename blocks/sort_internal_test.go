package blocks

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSortSpansMatchesComparisonSort checks sortSpans (packed integer
// keys, radix sorted) against a plain comparison sort by cmpSpan, for
// lists built as Copier.check builds them (list and block indexes rising
// with the position): shuffled blocks of one size, mixed sizes, repeated
// addresses, lists already in order, short lists, and addresses too far
// apart for a packed key (the comparison fallback).
func TestSortSpansMatchesComparisonSort(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	type gen func(n int) []uint64
	gens := map[string]gen{
		"one size shuffled": func(n int) []uint64 {
			a := make([]uint64, n)
			for k, p := range r.Perm(n) {
				a[k] = 0x7f0000000000 + uint64(p)*16384
			}
			return a
		},
		"mixed sizes": func(n int) []uint64 {
			a := make([]uint64, n)
			for k := range a {
				a[k] = 0x5500_0000_0000 + r.Uint64N(1<<36)
			}
			return a
		},
		"repeated": func(n int) []uint64 {
			a := make([]uint64, n)
			for k := range a {
				a[k] = 0x1000 * (1 + r.Uint64N(4))
			}
			return a
		},
		"in order": func(n int) []uint64 {
			a := make([]uint64, n)
			for k := range a {
				a[k] = 0x2000 + uint64(k)*4096
			}
			return a
		},
		"far apart": func(n int) []uint64 {
			a := make([]uint64, n)
			for k := range a {
				a[k] = r.Uint64()
			}
			if n > 1 {
				a[0], a[1] = 0, math.MaxUint64
			}
			return a
		},
	}
	var sc scratch
	for name, g := range gens {
		for _, n := range []int{1, 2, 3, 100, 255, 256, 257, 1000, 4096, 5000} {
			los := g(n)
			sp := make([]span, n)
			l, idx := 0, 0
			for k, lo := range los {
				idx += 1 + r.IntN(3) // rising, with gaps (empty blocks are skipped)
				if r.IntN(100) == 0 {
					l, idx = l+1, 0 // the next list
				}
				sp[k] = span{lo: lo, hi: lo + 1 + r.Uint64N(1<<20), l: int32(l), i: int32(idx)}
			}
			want := slices.Clone(sp)
			slices.SortFunc(want, cmpSpan)
			sc.sortSpans(sp)
			if !slices.Equal(sp, want) {
				t.Fatalf("%s, %d spans: sortSpans differs from the comparison sort", name, n)
			}
		}
	}
}

// TestRadixSort checks radixSort against slices.Sort at lengths around
// its cut-over and key widths that take an odd and an even number of
// passes (the result is then in the buffer or in keys).
func TestRadixSort(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	var buf []uint64
	for _, n := range []int{0, 1, 255, 256, 4096} {
		for _, nbits := range []int{1, 8, 12, 16, 24, 63, 64} {
			keys := make([]uint64, n)
			for k := range keys {
				keys[k] = r.Uint64()
				if nbits < 64 {
					keys[k] &= 1<<nbits - 1
				}
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			if got := radixSort(keys, &buf, nbits); !slices.Equal(got, want) {
				t.Fatalf("%d keys of %d bits: radixSort differs from slices.Sort", n, nbits)
			}
		}
	}
}

// TestByList checks the counting sort of byList against a stable
// comparison sort by cmpPiece (by list, host address order kept within a
// list), and the list starts it sets: pieces made per block as
// pinned makes them (in host address order, so blocks and lists shuffled),
// some blocks split into several pieces (a block over two pinned ranges),
// some blocks with none (empty), some lists with none.
func TestByList(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 1))
	var sc scratch
	for _, c := range []struct{ nlists, nblk int }{{1, 1}, {1, 2}, {2, 50}, {3, 4096}, {1, 4096}} {
		sc.reset(c.nlists)
		type blk struct{ l, b int }
		var all []blk
		for l := range c.nlists {
			if c.nlists > 2 && l == 1 {
				continue // a list with no pieces
			}
			for b := range c.nblk {
				all = append(all, blk{l, b})
			}
		}
		if c.nblk > 1 {
			r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		}
		for _, x := range all {
			off := 0
			for range r.IntN(4) { // 0: an empty block
				n := 1 + r.IntN(100)
				sc.pieces = append(sc.pieces, piece{l: x.l, blk: x.b, off: off, n: n})
				off += n
			}
		}
		want := slices.Clone(sc.pieces)
		slices.SortStableFunc(want, cmpPiece)
		lists := make([]List, c.nlists)
		for l := range lists {
			lists[l].blocks = make([]Block, c.nblk)
		}
		sc.byList(lists)
		if !slices.Equal(sc.pieces, want) {
			t.Fatalf("%d lists of %d blocks: byList differs from the comparison sort", c.nlists, c.nblk)
		}
		for l := range c.nlists {
			for _, p := range sc.listPieces(l) {
				if p.l != l {
					t.Fatalf("%d lists of %d blocks: list %d's pieces hold a piece of list %d", c.nlists, c.nblk, l, p.l)
				}
			}
		}
		if sc.starts[c.nlists] != len(sc.pieces) {
			t.Fatalf("%d lists: the last list ends at %d, want %d", c.nlists, sc.starts[c.nlists], len(sc.pieces))
		}
	}
}

// BenchmarkSortSpans sorts the host spans of 4096 shuffled 16 KiB blocks
// of one buffer (a KV cache's free list) with sortSpans and, side by side,
// with the comparison sort by cmpSpan that it replaced, and reports the
// ratio of their times per list.
//
//	go test ./blocks -run '^$' -bench SortSpans
func BenchmarkSortSpans(b *testing.B) {
	const nblk, bs = 4096, 16 << 10
	r := rand.New(rand.NewPCG(1, 2))
	list := make([]span, nblk)
	for k, p := range r.Perm(nblk) {
		lo := 0x7f00_0000_0000 + uint64(p)*bs
		list[k] = span{lo: lo, hi: lo + bs, i: int32(k)}
	}
	var sc scratch
	sp := make([]span, nblk)
	var radixNs, cmpNs float64
	for b.Loop() {
		copy(sp, list)
		t0 := time.Now()
		sc.sortSpans(sp)
		radixNs += float64(time.Since(t0).Nanoseconds())
		copy(sp, list)
		t0 = time.Now()
		slices.SortFunc(sp, cmpSpan)
		cmpNs += float64(time.Since(t0).Nanoseconds())
	}
	b.ReportMetric(radixNs/float64(b.N), "sortSpans-ns/list")
	b.ReportMetric(cmpNs/float64(b.N), "SortFunc-ns/list")
	b.ReportMetric(radixNs/cmpNs, "sortSpans/SortFunc")
}
