package blocks

import (
	"fmt"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudaerr"
	"github.com/pinmem/pinmem/internal/hostptr"
)

// turns calls f(l, lo, hi) for the pieces of each list in turns of at
// most n pieces, list after list, until every piece is taken: lists on
// two streams are queued side by side, so that a stream whose queue is
// full (the driver's is about a thousand entries) does not hold back the
// other's first copies. It stops at f's first error.
func (sc *scratch) turns(nlists, n int, f func(l, lo, hi int) error) error {
	for done := 0; ; done += n {
		more := false
		for l := range nlists {
			ps := sc.listPieces(l)
			if done >= len(ps) {
				continue
			}
			more = true
			if err := f(l, done, min(done+n, len(ps))); err != nil {
				return err
			}
		}
		if !more {
			return nil
		}
	}
}

// issuePerCopy queues one driver copy per piece, the lists' copies
// alternating, 16 per crossing into C.
func issuePerCopy(drv cudadrv.Driver, lists []List, sc *scratch, rep *Report) error {
	sc.ops = sc.ops[:0]
	_ = sc.turns(len(lists), 1, func(l, lo, _ int) error {
		p := sc.listPieces(l)[lo]
		// The host pointer is taken from the block's slice, so that the
		// op holds the memory it copies: the piece's offset in its block
		// is its offset on the device side.
		b := lists[l].blocks[p.blk]
		off := p.dev - uint64(b.Dev.Ptr()) - uint64(b.Off)
		op := cudadrv.BatchOp{Kind: cudadrv.BatchCopyHtoD, Dev: cudadrv.DevicePtr(p.dev), Host: hostptr.PtrOf(b.Host[off:]), N: p.n, Stream: cudadrv.Stream(lists[l].s.Handle())}
		if lists[l].toHost {
			op.Kind = cudadrv.BatchCopyDtoH
		}
		sc.ops = append(sc.ops, op)
		return nil
	})
	n, err := cudaerr.Public2(cudadrv.RunBatch(drv, sc.ops))
	rep.Calls = n
	if err != nil {
		return fmt.Errorf("blocks: copy %d of %d: %w", n+1, len(sc.ops), err)
	}
	return nil
}

// issueBatch queues the lists with the driver's batch copy, batchCall
// copies a call, the lists' calls alternating.
func issueBatch(drv cudadrv.Driver, lists []List, sc *scratch, rep *Report) error {
	bc, ok := drv.(cudadrv.BatchCopier)
	if !ok {
		return fmt.Errorf("blocks: the driver has no batch copy: %w", cudadrv.ErrNotSupported)
	}
	attrs := []cudadrv.MemcpyAttributes{{SrcAccessOrder: cudadrv.MemcpySrcAccessOrderStream}}
	idxs := []uint64{0}
	return sc.turns(len(lists), batchCall, func(l, lo, hi int) error {
		sc.dsts, sc.srcs, sc.sizes = sc.dsts[:0], sc.srcs[:0], sc.sizes[:0]
		for _, p := range sc.listPieces(l)[lo:hi] {
			d, h := p.dev, p.host
			if lists[l].toHost {
				d, h = h, d
			}
			sc.dsts, sc.srcs = append(sc.dsts, cudadrv.DevicePtr(d)), append(sc.srcs, cudadrv.DevicePtr(h))
			sc.sizes = append(sc.sizes, p.n)
		}
		rep.Calls++
		if _, err := cudaerr.Public2(bc.MemcpyBatchAsync(sc.dsts, sc.srcs, sc.sizes, attrs, idxs, cudadrv.Stream(lists[l].s.Handle()))); err != nil {
			return fmt.Errorf("blocks: list %d: batch copy of copies %d to %d: %w", l, lo, hi-1, err)
		}
		return nil
	})
}
