package blocks

import (
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

// span is a block's host or device address range: block i of list l,
// written by its copy (w) or read.
type span struct {
	lo, hi uint64
	l, i   int32
	w      bool
}

func cmpSpan(a, b span) int {
	switch {
	case a.lo < b.lo:
		return -1
	case a.lo > b.lo:
		return 1
	case a.l != b.l:
		return int(a.l - b.l)
	}
	return int(a.i - b.i)
}

// piece is one copy of a list: a whole block, or the part of one that
// lies in one pinned range when the block's host memory spans several
// (one driver copy must not span two registrations: the driver refuses
// it). off is the part's offset in the block's host and device memory.
type piece struct {
	l, blk, off, n int
	dev            uint64 // kernel: the device address of the part's host memory
}

// cmpPiece orders pieces by list; byList keeps host address order
// within a list.
func cmpPiece(a, b piece) int { return a.l - b.l }

// scratch holds the arrays of one Copy call; they are pooled, since a
// list of thousands of blocks would otherwise allocate hundreds of KiB per
// call.
type scratch struct {
	host, dev []span
	pieces    []piece // the copies to queue, by list, in host address order
	starts    []int   // list l's pieces are pieces[starts[l]:starts[l+1]]
	cuts      []uint64
	keys      []uint64 // sortSpans' packed keys
	keys2     []uint64 // radixSort's second buffer
	tmp       []span   // sortSpans' reordered copy
	tmpPieces []piece  // byList's reordered copy
	counts    []int    // byList's next place of each list
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
	sc.host, sc.dev = sc.host[:0], sc.dev[:0]
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

// sortSpans sorts sp by address (cmpSpan); a list already in order costs
// one pass. A shuffled list of thousands of blocks (a KV cache's free
// list) is the case that costs: each span becomes one integer key, its
// address relative to the lowest with its position in the low bits, and
// the keys are sorted as plain integers by radix, several times faster
// than sorting the spans with a comparison function. Addresses too far
// apart for the key fall back to that.
func (sc *scratch) sortSpans(sp []span) {
	if len(sp) == 0 || slices.IsSortedFunc(sp, cmpSpan) {
		return
	}
	base, top := sp[0].lo, sp[0].lo
	var differ uint64 // the bits in which some address differs from the first
	for _, x := range sp {
		base, top = min(base, x.lo), max(top, x.lo)
		differ |= x.lo ^ sp[0].lo
	}
	// The low bits that no address differs in are the same in every offset
	// from base (blocks of one size): they are left out of the key.
	tz := 0
	if differ != 0 {
		tz = bits.TrailingZeros64(differ)
	}
	ib := bits.Len(uint(len(sp) - 1)) // bits for a position
	kb := bits.Len64((top-base)>>tz) + ib
	if kb > 64 {
		slices.SortFunc(sp, cmpSpan)
		return
	}
	sc.keys = sc.keys[:0]
	for k, x := range sp {
		sc.keys = append(sc.keys, (x.lo-base)>>tz<<ib|uint64(k))
	}
	keys := radixSort(sc.keys, &sc.keys2, kb)
	sc.tmp = append(sc.tmp[:0], sp...)
	mask := uint64(1)<<ib - 1
	for j, key := range keys {
		sp[j] = sc.tmp[key&mask]
	}
}

// radixSort sorts keys, whose values fit in nbits bits, and returns the
// sorted slice: keys itself or *buf (grown to len(keys)), whichever the
// last pass wrote. Short lists are sorted in place by comparison.
func radixSort(keys []uint64, buf *[]uint64, nbits int) []uint64 {
	if len(keys) < 256 {
		slices.Sort(keys)
		return keys
	}
	if cap(*buf) < len(keys) {
		*buf = make([]uint64, len(keys))
	}
	src, dst := keys, (*buf)[:len(keys)]
	for shift := 0; shift < nbits; shift += 8 {
		var count [257]int
		for _, k := range src {
			count[(k>>shift)&0xff+1]++
		}
		for i := 1; i < 257; i++ {
			count[i] += count[i-1]
		}
		for _, k := range src {
			d := (k >> shift) & 0xff
			dst[count[d]] = k
			count[d]++
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
// to one device range).
func (sc *scratch) pinned(drv cudadrv.Driver, lists []List, kernel bool) error {
	c := &hostCheck{drv: drv}
	for _, h := range sc.host {
		var ok bool
		sc.cuts, ok = c.cover(h.lo, h.hi, sc.cuts[:0])
		if c.qerr != nil {
			return fmt.Errorf("blocks: list %d, block %d: asking the driver whether its host memory is pinned: %w", h.l, h.i, c.qerr)
		}
		if !ok {
			return argErr(int(h.l), int(h.i), "host memory [%#x,+%d) is not pinned all through", h.lo, h.hi-h.lo)
		}
		if err := sc.addPieces(c, h, kernel); err != nil {
			return err
		}
	}
	sc.byList(lists)
	return nil
}

// addPieces appends the pieces of the block of h, whose host memory is
// pinned with range boundaries sc.cuts.
func (sc *scratch) addPieces(c *hostCheck, h span, kernel bool) error {
	for k := 0; k <= len(sc.cuts); k++ {
		plo, phi := h.lo, h.hi
		if k > 0 {
			plo = sc.cuts[k-1]
		}
		if k < len(sc.cuts) {
			phi = sc.cuts[k]
		}
		p := piece{l: int(h.l), blk: int(h.i), off: int(plo - h.lo), n: int(phi - plo)}
		if kernel {
			d, ok := c.devAddr(plo)
			if ok && c.noRange && phi-plo > 1 {
				// No ranges, so no cuts: the last byte must map where the first does.
				last, lok := c.devAddr(phi - 1)
				ok = lok && last == d+(phi-1-plo)
			}
			if !ok {
				if c.qerr != nil {
					return fmt.Errorf("blocks: list %d, block %d: asking the driver for the device address of its host memory: %w", h.l, h.i, c.qerr)
				}
				sc.unmapped = true
				return argErr(int(h.l), int(h.i), "host memory [%#x,+%d) is not mapped into the device's address space, which the kernel needs (allocate it with pinmem.Mapped)", plo, phi-plo)
			}
			p.dev = d
			// The kernel reaches host memory through device addresses:
			// ranges mapped one after the other need no cut.
			if k > 0 {
				if last := &sc.pieces[len(sc.pieces)-1]; last.dev+uint64(last.n) == d {
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
func (sc *scratch) byList(lists []List) {
	for _, p := range sc.pieces {
		sc.starts[p.l+1]++
	}
	for l := 1; l <= len(lists); l++ {
		sc.starts[l] += sc.starts[l-1]
	}
	if slices.IsSortedFunc(sc.pieces, cmpPiece) {
		return
	}
	next := append(sc.counts[:0], sc.starts[:len(lists)]...)
	sc.tmpPieces = append(sc.tmpPieces[:0], sc.pieces...)
	for _, p := range sc.tmpPieces {
		sc.pieces[next[p.l]] = p
		next[p.l]++
	}
	sc.counts = next
}

// hostCheck asks the driver about host memory, remembering the last
// pinned range it found so that blocks carved from one buffer cost a few
// queries in all (cover).
type hostCheck struct {
	drv     cudadrv.Driver
	qerr    error // the first failure other than "unknown address"
	noRange bool  // the driver knows pinned blocks but reports no range: stop asking
	known   span  // the last pinned range found
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
		c.known, c.asked = span{lo: start, hi: start + size}, false
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
