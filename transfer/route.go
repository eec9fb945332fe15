package transfer

import "github.com/pinmem/pinmem/internal/copypool"

// The per-size choices of a pageable transfer, written once, as measured
// on an H200, PCIe Gen5 x16 (BenchmarkSingleStage, BenchmarkCopierVsDriver;
// docs/PERF.md):
//
//   - Up to 32 MiB and a stage, one pinned stage beats the ring both ways:
//     each ring piece pays a fork and join of the copy goroutines, an
//     event and a wait. Larger transfers, and those no stage holds, take
//     the ring.
//   - One stage is cut into pieces (stagePieces): host to device below
//     2 MiB into 4 pieces of at least 256 KiB, so that each piece's DMA
//     overlaps the copy of the next; from 16 MiB two halves both ways;
//     otherwise whole.
//   - Up to 1 MiB, with larger stages, the stage is a small one
//     (smallStageSize), pinned on first use beside the ring's: a Copier
//     that moves only small transfers pins a small stage per lane in use,
//     not a ring. Its size changes nothing in the schedule (stagePieces).
//   - The driver's own pageable copy, a few percent faster only host to
//     device at 64 KiB-1 MiB, cannot be interrupted (it would outlive a
//     call whose context ended): it is not used.
const (
	singleStagedMax  = 32 << 20              // the largest transfer one stage takes
	singleCopyInline = 2 * copypool.MinPiece // up to here the caller's goroutine copies alone
	singlePieceMin   = 256 << 10             // the smallest piece of one stage
	singleWholeMin   = 4 * singleCopyInline  // host to device from here: whole (or halves)
	singleHalvesMin  = 16 << 20              // from here: two halves both ways
	smallStageSize   = 1 << 20               // the stage of a transfer up to this size (pathSmall)
)

// path is how a pageable transfer moves.
type path uint8

const (
	pathStage path = iota // one pinned stage, in stagePieces pieces, when one is idle
	pathSmall             // as pathStage, in a small stage (smallStageSize)
	pathRing              // the Copier's ring of stages
)

// route chooses the path of a pageable transfer of n bytes with stages of
// stageSize bytes, and for one stage its size class; how forces a path
// (tests). It is pure.
func route(n, stageSize int, how strategy) path {
	switch {
	case how == forceStaged || n > stageSize || (how != forceShort && n > singleStagedMax):
		return pathRing
	case n <= smallStageSize && smallStageSize < stageSize:
		return pathSmall
	}
	return pathStage
}

// stagePieces returns the pieces of a one-stage transfer of n bytes in
// direction d and the size of all but the last (a multiple of 4 KiB); device
// to host at most two halves, the first copied out while the second flies.
// forced, when not 0, is the number of pieces (tuning.stagePieces).
func stagePieces(d Direction, n, forced int) (k, size int) {
	k = forced
	if k == 0 {
		k = 1
		switch {
		case d == HostToDevice && n < singleWholeMin:
			k = 4
		case n >= singleHalvesMin:
			k = 2
		}
	}
	k = min(k, n/singlePieceMin)
	if d == DeviceToHost {
		k = min(k, 2)
	}
	if k <= 1 {
		return 1, n
	}
	size = ((n+k-1)/k + 4095) &^ 4095
	return (n + size - 1) / size, size
}

// strategy forces a transfer's handling of pageable memory (tests).
type strategy uint8

const (
	byRoute     strategy = iota // as route's size bands say
	forceStaged                 // the ring at every size
	forceShort                  // one stage when one is idle and holds the transfer, else the ring
)
