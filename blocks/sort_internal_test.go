package blocks

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSortAddrsMatchesComparisonSort checks sortAddrs (packed integer
// keys, radix sorted) against a plain comparison sort of the blocks by
// address, then list, then block, on both sides, for blocks kept as
// Copier.check keeps them (list and block indexes rising with the
// position): shuffled blocks of one size, mixed sizes, repeated
// addresses, blocks already in order, short lists, and addresses too far
// apart for a packed key (the comparison fallback).
func TestSortAddrsMatchesComparisonSort(t *testing.T) {
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
			sc.reset(1)
			hs, ds := g(n), g(n)
			l, idx := 0, 0
			for k := range n {
				idx += 1 + r.IntN(3) // rising, with gaps (empty blocks are skipped)
				if r.IntN(100) == 0 {
					l, idx = l+1, 0 // the next list
				}
				sc.hb.add(hs[k])
				sc.db.add(ds[k])
				sc.blks = append(sc.blks, blk{h: hs[k], d: ds[k], n: 1 + r.Uint64N(1<<20), l: int32(l), i: int32(idx)})
			}
			for _, dev := range []bool{false, true} {
				addr := func(b blk) uint64 {
					if dev {
						return b.d
					}
					return b.h
				}
				want := slices.Clone(sc.blks)
				slices.SortFunc(want, func(x, y blk) int {
					return cmp.Or(cmp.Compare(addr(x), addr(y)), cmp.Compare(x.l, y.l), cmp.Compare(x.i, y.i))
				})
				keys := sc.sortAddrs(nil, dev)
				got := make([]blk, 0, n)
				for _, k := range keys {
					got = append(got, sc.blks[k&sc.posMask()])
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s, %d blocks, device side %v: sortAddrs differs from the comparison sort", name, n, dev)
				}
			}
		}
	}
}

// TestRadixSort checks radixSort against slices.Sort at lengths around
// its cut-over and key widths that take an odd and an even number of
// passes (the result is then in the buffer or in keys), sorting all bits
// and, for keys whose low bits rise already (sortAddrs' positions), the
// bits above them only.
func TestRadixSort(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	var buf []uint64
	var count []uint32
	for _, n := range []int{0, 1, 255, 256, 4096, 9000} {
		for _, nbits := range []int{1, 8, 12, 16, 24, 26, 63, 64} {
			for _, lo := range []int{0, 14} {
				if lo >= nbits {
					continue
				}
				keys := make([]uint64, n)
				for k := range keys {
					keys[k] = r.Uint64()
					if nbits < 64 {
						keys[k] &= 1<<nbits - 1
					}
					if lo > 0 { // the low bits rise (n < 1<<14): k, with the bits above it random
						keys[k] = keys[k]>>lo<<lo | uint64(k)&(1<<lo-1)
					}
				}
				want := slices.Clone(keys)
				slices.Sort(want)
				if got := radixSort(keys, &buf, &count, lo, nbits); !slices.Equal(got, want) {
					t.Fatalf("%d keys of %d bits, sorted from bit %d: radixSort differs from slices.Sort", n, nbits, lo)
				}
			}
		}
	}
}

// TestByList checks the counting sort of byList against a stable
// comparison sort by list (by list, host address order kept within a
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
				sc.pieces = append(sc.pieces, piece{dev: uint64(off), n: uint64(n), l: int32(x.l), blk: int32(x.b)})
				off += n
			}
		}
		want := slices.Clone(sc.pieces)
		slices.SortStableFunc(want, func(x, y piece) int { return cmp.Compare(x.l, y.l) })
		sc.byList(c.nlists)
		if !slices.Equal(sc.pieces, want) {
			t.Fatalf("%d lists of %d blocks: byList differs from the comparison sort", c.nlists, c.nblk)
		}
		for l := range c.nlists {
			for _, p := range sc.listPieces(l) {
				if int(p.l) != l {
					t.Fatalf("%d lists of %d blocks: list %d's pieces hold a piece of list %d", c.nlists, c.nblk, l, p.l)
				}
			}
		}
		if sc.starts[c.nlists] != len(sc.pieces) {
			t.Fatalf("%d lists: the last list ends at %d, want %d", c.nlists, sc.starts[c.nlists], len(sc.pieces))
		}
	}
}

// BenchmarkSortAddrs orders the host addresses of 4096 shuffled 16 KiB
// blocks of one buffer (a KV cache's free list) with sortAddrs and, side
// by side, with a comparison sort of the blocks, and reports the ratio of
// their times per list.
//
//	go test ./blocks -run '^$' -bench SortAddrs
func BenchmarkSortAddrs(b *testing.B) {
	const nblk, bs = 4096, 16 << 10
	r := rand.New(rand.NewPCG(1, 2))
	var sc scratch
	sc.reset(1)
	for k, p := range r.Perm(nblk) {
		h := 0x7f00_0000_0000 + uint64(p)*bs
		sc.hb.add(h)
		sc.blks = append(sc.blks, blk{h: h, n: bs, i: int32(k)})
	}
	sorted := make([]blk, nblk)
	var keys []uint64
	var radixNs, cmpNs float64
	for b.Loop() {
		t0 := time.Now()
		keys = sc.sortAddrs(keys, false)
		radixNs += float64(time.Since(t0).Nanoseconds())
		copy(sorted, sc.blks)
		t0 = time.Now()
		slices.SortFunc(sorted, func(x, y blk) int {
			return cmp.Or(cmp.Compare(x.h, y.h), cmp.Compare(x.l, y.l), cmp.Compare(x.i, y.i))
		})
		cmpNs += float64(time.Since(t0).Nanoseconds())
	}
	b.ReportMetric(radixNs/float64(b.N), "sortAddrs-ns/list")
	b.ReportMetric(cmpNs/float64(b.N), "SortFunc-ns/list")
	b.ReportMetric(radixNs/cmpNs, "sortAddrs/SortFunc")
}
