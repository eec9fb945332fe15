package blocks

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudaerr"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// blk is one non-empty block of a call, as check found it: block i of
// list l, n bytes at host address h and device address d. A call's blocks
// are kept once, in list order, and every later pass reads them through
// their position j in that order (see sortAddrs).
type blk struct {
	h, d, n uint64
	l, i    int32
}

// bounds gathers, over one side's addresses, what a packed sort key needs:
// the lowest and highest address and the bits in which some address
// differs from the first.
type bounds struct {
	lo, hi, first, differ uint64
	any                   bool
}

// add takes address a into b.
func (b *bounds) add(a uint64) {
	if !b.any {
		b.lo, b.hi, b.first, b.any = a, a, a, true
	}
	b.lo, b.hi = min(b.lo, a), max(b.hi, a)
	b.differ |= a ^ b.first
}

// piece is one copy of a list: a whole block, or the part of one that
// lies in one pinned range when the block's host memory spans several
// (one driver copy must not span two registrations: the driver refuses
// it). It holds the addresses the strategies hand to the driver, so that
// queuing it reads nothing else: dev is the part's device address, host
// its host address, or for the kernel the device address that maps it.
type piece struct {
	dev, host, n uint64
	l, blk       int32
}

// scratch holds the arrays of one Copy call; they are pooled, since a
// list of thousands of blocks would otherwise allocate hundreds of KiB per
// call.
type scratch struct {
	blks      []blk    // the non-empty blocks, in list order
	hb, db    bounds   // their host and device addresses' bounds
	hostOrder []uint64 // blks by host address (sortAddrs' keys), for conflict and pinned
	devOrder  []uint64 // blks by device address, where a copy writes device memory
	keys2     []uint64 // radixSort's second buffer
	count     []uint32 // radixSort's counts
	pieces    []piece  // the copies to queue, by list, in host address order
	starts    []int    // list l's pieces are pieces[starts[l]:starts[l+1]]
	cuts      []uint64
	tmpPieces []piece // byList's reordered copy
	next      []int   // byList's next place of each list
	ops       []cudadrv.BatchOp
	dsts      []cudadrv.DevicePtr
	srcs      []cudadrv.DevicePtr
	sizes     []uint64
	// unmapped: pinned refused a host block that the kernel cannot reach
	// (not mapped into the device's address space).
	unmapped bool
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (sc *scratch) reset(nlists int) {
	sc.blks, sc.hb, sc.db = sc.blks[:0], bounds{}, bounds{}
	sc.hostOrder, sc.devOrder = sc.hostOrder[:0], sc.devOrder[:0]
	sc.resetPieces(nlists)
}

// resetPieces forgets the pieces pinned made, so that it can make them
// again for another strategy.
func (sc *scratch) resetPieces(nlists int) {
	sc.pieces, sc.unmapped = sc.pieces[:0], false
	sc.starts = append(sc.starts[:0], make([]int, nlists+1)...)
}

// put drops the scratch's references to host memory and pools it.
func (sc *scratch) put() {
	clear(sc.ops)
	scratchPool.Put(sc)
}

// listPieces returns list l's pieces.
func (sc *scratch) listPieces(l int) []piece { return sc.pieces[sc.starts[l]:sc.starts[l+1]] }

func addrOf(b []byte) uint64 { return uint64(hostptr.AddrOf(b)) }

// posMask is the mask of the low bits of sortAddrs' keys that hold a
// block's position in sc.blks.
func (sc *scratch) posMask() uint64 { return 1<<bits.Len(uint(len(sc.blks)-1)) - 1 }

// sortAddrs returns in keys (reused) the blocks of sc.blks ordered by host
// address (dev false) or device address, ties by position, which is list
// then block order: one integer per block, its position in the bits
// posMask keeps. Only the keys move, not the blocks, and later passes walk
// them. Each key is the block's address relative to the lowest, above its
// position, so that the keys sort as plain integers (radixSort); the low
// bits that no address differs in (blocks of one size) are left out.
// Blocks already in order cost one pass. Addresses too far apart for a key
// are sorted by comparison, the key then being the position alone.
func (sc *scratch) sortAddrs(keys []uint64, dev bool) []uint64 {
	keys = keys[:0]
	if len(sc.blks) == 0 {
		return keys
	}
	bd := sc.hb
	if dev {
		bd = sc.db
	}
	addr := func(b *blk) uint64 {
		if dev {
			return b.d
		}
		return b.h
	}
	tz := 0
	if bd.differ != 0 {
		tz = bits.TrailingZeros64(bd.differ)
	}
	ib := bits.Len(uint(len(sc.blks) - 1)) // bits for a position
	kb := bits.Len64((bd.hi-bd.lo)>>tz) + ib
	if kb > 64 {
		for j := range sc.blks {
			keys = append(keys, uint64(j))
		}
		slices.SortFunc(keys, func(x, y uint64) int {
			return cmp.Or(cmp.Compare(addr(&sc.blks[x]), addr(&sc.blks[y])), cmp.Compare(x, y))
		})
		return keys
	}
	sorted := true
	for j := range sc.blks {
		k := (addr(&sc.blks[j])-bd.lo)>>tz<<ib | uint64(j)
		sorted = sorted && (j == 0 || k > keys[j-1])
		keys = append(keys, k)
	}
	if sorted {
		return keys
	}
	// The positions below ib rise already: a stable sort by the address
	// bits alone orders the keys.
	s := radixSort(keys, &sc.keys2, &sc.count, ib, kb)
	if &s[0] != &keys[0] {
		// The last pass wrote the second buffer: it is the result now.
		keys, sc.keys2 = sc.keys2[:len(keys)], keys
	}
	return keys
}

// radixDigit is the widest digit radixSort sorts by in one pass: 8192
// counts (32 KiB), so that the addresses of 4096 blocks of one buffer, or
// of two lists of 4096 over two buffers side by side, take one pass.
const radixDigit = 13

// radixSort sorts keys stably by their bits from lo up to nbits (the
// bits above are 0) and returns the sorted slice: keys itself or *buf
// (grown to len(keys)), whichever the last pass wrote. Each pass sorts by
// one digit: the fewest passes of digits up to radixDigit bits wide, and
// no wider than the keys' count needs (short lists take narrow digits,
// whose counts cost less to clear). Short lists are sorted in place by
// comparison, which orders the bits below lo too.
func radixSort(keys []uint64, buf *[]uint64, count *[]uint32, lo, nbits int) []uint64 {
	if len(keys) < 256 {
		slices.Sort(keys)
		return keys
	}
	if nbits <= lo {
		return keys
	}
	if cap(*buf) < len(keys) {
		*buf = make([]uint64, len(keys))
	}
	width := min(radixDigit, bits.Len(uint(len(keys))))
	passes := (nbits - lo + width - 1) / width
	width = (nbits - lo + passes - 1) / passes
	if len(*count) < 1<<radixDigit+1 {
		*count = make([]uint32, 1<<radixDigit+1)
	}
	// The counts as an array, and digits masked to its size, so that
	// indexing them needs no bounds check.
	cnt, mask := (*[1<<radixDigit + 1]uint32)(*count), uint64(1)<<width-1
	src, dst := keys, (*buf)[:len(keys)]
	for shift := lo; shift < nbits; shift += width {
		clear(cnt[:mask+2])
		for _, k := range src {
			cnt[(k>>shift)&mask&(1<<radixDigit-1)+1]++
		}
		for i := uint64(1); i <= mask+1; i++ {
			cnt[i] += cnt[i-1]
		}
		for _, k := range src {
			d := (k >> shift) & mask & (1<<radixDigit - 1)
			dst[cnt[d]] = k
			cnt[d]++
		}
		src, dst = dst, src
	}
	return src
}

// pinned checks, with the context current, that every host block is
// pinned all through (hostCheck.cover), and for the kernel mapped, and
// makes the call's copies (sc.pieces, by list, in host address order):
// one per block, cut where a block's host memory crosses from one pinned
// range into the next (for the kernel, only where the ranges do not map
// to one device range). It walks the blocks in host address order
// (sc.hostOrder), so that blocks carved from one buffer cost a few driver
// queries in all.
func (sc *scratch) pinned(drv cudadrv.Driver, nlists int, kernel bool) error {
	c := &hostCheck{drv: drv}
	mask := sc.posMask()
	for _, key := range sc.hostOrder {
		b := &sc.blks[key&mask]
		var ok bool
		sc.cuts, ok = c.cover(b.h, b.h+b.n, sc.cuts[:0])
		if c.qerr != nil {
			return fmt.Errorf("blocks: list %d, block %d: asking the driver whether its host memory is pinned: %w", b.l, b.i, c.qerr)
		}
		if !ok {
			return argErr(int(b.l), int(b.i), "host memory [%#x,+%d) is not pinned all through", b.h, b.n)
		}
		if err := sc.addPieces(c, b, kernel); err != nil {
			return err
		}
	}
	sc.byList(nlists)
	return nil
}

// addPieces appends the pieces of b, whose host memory is pinned with
// range boundaries sc.cuts.
func (sc *scratch) addPieces(c *hostCheck, b *blk, kernel bool) error {
	for k := 0; k <= len(sc.cuts); k++ {
		plo, phi := b.h, b.h+b.n
		if k > 0 {
			plo = sc.cuts[k-1]
		}
		if k < len(sc.cuts) {
			phi = sc.cuts[k]
		}
		off := plo - b.h
		p := piece{dev: b.d + off, host: plo, n: phi - plo, l: b.l, blk: b.i}
		if kernel {
			d, ok := c.devAddr(plo)
			if ok && c.noRange && phi-plo > 1 {
				// No ranges, so no cuts: the last byte must map where the first does.
				last, lok := c.devAddr(phi - 1)
				ok = lok && last == d+(phi-1-plo)
			}
			if !ok {
				if c.qerr != nil {
					return fmt.Errorf("blocks: list %d, block %d: asking the driver for the device address of its host memory: %w", b.l, b.i, c.qerr)
				}
				sc.unmapped = true
				return argErr(int(b.l), int(b.i), "host memory [%#x,+%d) is not mapped into the device's address space, which the kernel needs (allocate it with pinmem.Mapped)", plo, phi-plo)
			}
			p.host = d
			// The kernel reaches host memory through device addresses:
			// ranges mapped one after the other need no cut.
			if k > 0 {
				if last := &sc.pieces[len(sc.pieces)-1]; last.host+last.n == d {
					last.n += p.n
					continue
				}
			}
		}
		sc.pieces = append(sc.pieces, p)
	}
	return nil
}

// byList groups sc.pieces, made in host address order, by list and sets
// sc.starts: a stable counting sort by list alone, so that within a list
// the pieces stay in host address order (no strategy needs the lists'
// block order). The sorted case, one list among them, costs one pass.
func (sc *scratch) byList(nlists int) {
	sorted := true
	for k, p := range sc.pieces {
		sc.starts[p.l+1]++
		sorted = sorted && (k == 0 || p.l >= sc.pieces[k-1].l)
	}
	for l := 1; l <= nlists; l++ {
		sc.starts[l] += sc.starts[l-1]
	}
	if sorted {
		return
	}
	next := append(sc.next[:0], sc.starts[:nlists]...)
	sc.tmpPieces = slices.Grow(sc.tmpPieces[:0], len(sc.pieces))[:len(sc.pieces)]
	for _, p := range sc.pieces {
		sc.tmpPieces[next[p.l]] = p
		next[p.l]++
	}
	sc.pieces, sc.tmpPieces, sc.next = sc.tmpPieces, sc.pieces, next
}

// hostCheck asks the driver about host memory, remembering the last
// pinned range it found so that blocks carved from one buffer cost a few
// queries in all (cover).
type hostCheck struct {
	drv     cudadrv.Driver
	qerr    error                   // the first failure other than "unknown address"
	noRange bool                    // the driver knows pinned blocks but reports no range: stop asking
	known   struct{ lo, hi uint64 } // the last pinned range found
	dev     uint64
	mapped  bool // known's device address is dev
	asked   bool // whether known's device address was asked for
}

// attr reads a pointer attribute. The driver answers
// CUDA_ERROR_INVALID_VALUE for an address it does not know (pageable
// memory): that is a plain false. Any other failure of the queries that
// decide (memory type, device pointer) is kept in qerr; the range
// queries only save work, so their failures count as "no range".
func (c *hostCheck) attr(a cudadrv.PointerAttribute, p uint64) (uint64, bool) {
	v, err := cudaerr.Public2(c.drv.PointerGetAttribute(a, cudadrv.DevicePtr(p)))
	decides := a == cudadrv.PointerAttrMemoryType || a == cudadrv.PointerAttrDevicePointer
	if err != nil && decides && !errors.Is(err, cuda.ErrInvalidValue) && c.qerr == nil {
		c.qerr = err
	}
	return v, err == nil
}

func (c *hostCheck) isHost(p uint64) bool {
	t, ok := c.attr(cudadrv.PointerAttrMemoryType, p)
	return ok && t == cudadrv.MemoryTypeHost
}

// cover reports whether [lo, hi) is pinned host memory all through, and
// appends to cuts each address inside it where one pinned range (an
// allocation or a registration) ends and the next begins. It walks the
// driver's ranges from lo, remembering the last one found; a block whose
// two ends are pinned with pageable memory between them is not pinned.
// Where the driver reports no range it falls back to probe, which finds a
// pageable gap of a page or more but no boundary between ranges.
func (c *hostCheck) cover(lo, hi uint64, cuts []uint64) ([]uint64, bool) {
	for p := lo; p < hi; {
		if p >= c.known.lo && p < c.known.hi {
			if hi <= c.known.hi {
				return cuts, true
			}
			p = c.known.hi
			cuts = append(cuts, p) // the next range must start right here
			continue
		}
		if c.noRange {
			return cuts, c.probe(p, hi)
		}
		start, ok := c.attr(cudadrv.PointerAttrRangeStart, p)
		var size uint64
		if ok {
			size, ok = c.attr(cudadrv.PointerAttrRangeSize, p)
		}
		if !c.isHost(p) {
			return cuts, false // pageable (or not host memory at all)
		}
		if !ok || start > p || p-start >= size {
			// Pinned, but the driver reports no range holding p: stop asking.
			c.noRange = true
			return cuts, c.probe(p, hi)
		}
		c.known.lo, c.known.hi, c.asked = start, start+size, false
	}
	return cuts, true
}

// hostPage is the granularity at which probe asks.
var hostPage = uint64(os.Getpagesize())

// probe reports whether the first and the last byte of [lo, hi), and the
// first byte of every page between them, are pinned host memory: pinning
// is per page, so no pageable page lies inside.
func (c *hostCheck) probe(lo, hi uint64) bool {
	if !c.isHost(lo) {
		return false
	}
	for q := lo - lo%hostPage + hostPage; q < hi; q += hostPage {
		if !c.isHost(q) {
			return false
		}
	}
	return c.isHost(hi - 1)
}

// devAddr returns the device address of pinned host address p, or false
// when the memory is not mapped: from the remembered range's mapping when
// p lies in it, else asked for p alone.
func (c *hostCheck) devAddr(p uint64) (uint64, bool) {
	if p >= c.known.lo && p < c.known.hi {
		if !c.asked {
			c.dev, c.mapped = c.attr(cudadrv.PointerAttrDevicePointer, c.known.lo)
			c.asked = true
		}
		if c.mapped {
			return c.dev + (p - c.known.lo), true
		}
		return 0, false
	}
	return c.attr(cudadrv.PointerAttrDevicePointer, p)
}
