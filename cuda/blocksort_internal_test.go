package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSortSpansMatchesComparisonSort checks sortSpans (packed integer
// keys, radix sorted) against a plain comparison sort by cmpSpan, for
// lists built as checkBlocks builds them (block indexes rising with the
// position): shuffled blocks of one size, mixed sizes, repeated
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
	var sc blockScratch
	for name, g := range gens {
		for _, n := range []int{1, 2, 3, 100, 255, 256, 257, 1000, 4096, 5000} {
			los := g(n)
			sp := make([]span, n)
			idx := 0
			for k, lo := range los {
				idx += 1 + r.IntN(3) // rising, with gaps (empty blocks are skipped)
				sp[k] = span{lo, lo + 1 + r.Uint64N(1<<20), idx}
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

// TestInBlockOrder checks the counting sort of pieces against a
// comparison sort by cmpPiece: pieces made per block, blocks in shuffled
// order, some blocks split into several pieces (a block over two pinned
// ranges), some blocks with none (empty).
func TestInBlockOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 1))
	var sc blockScratch
	for _, nblk := range []int{1, 2, 50, 4096} {
		sc.pieces = sc.pieces[:0]
		for _, b := range r.Perm(nblk) {
			np := r.IntN(4) // 0: an empty block
			off := 0
			for range np {
				n := 1 + r.IntN(100)
				sc.pieces = append(sc.pieces, piece{blk: b, off: off, n: n})
				off += n
			}
		}
		want := slices.Clone(sc.pieces)
		slices.SortFunc(want, cmpPiece)
		sc.inBlockOrder(nblk)
		if !slices.Equal(sc.pieces, want) {
			t.Fatalf("%d blocks: inBlockOrder differs from the comparison sort", nblk)
		}
	}
}

// BenchmarkSortSpans sorts the host spans of 4096 shuffled 16 KiB blocks
// of one buffer (a KV cache's free list) with sortSpans and, side by side,
// with the comparison sort by cmpSpan that it replaced, and reports the
// ratio of their times per list.
//
//	go test ./cuda -run '^$' -bench SortSpans
func BenchmarkSortSpans(b *testing.B) {
	const nblk, bs = 4096, 16 << 10
	r := rand.New(rand.NewPCG(1, 2))
	list := make([]span, nblk)
	for k, p := range r.Perm(nblk) {
		lo := 0x7f00_0000_0000 + uint64(p)*bs
		list[k] = span{lo, lo + bs, k}
	}
	var sc blockScratch
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
