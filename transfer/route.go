package transfer

// The per-size choices of a pageable transfer, written once. Measured
// side by side on an H200, PCIe Gen5 x16 (BenchmarkSingleStage,
// BenchmarkCopierVsDriver, BenchmarkCopierConcurrent; docs/PERF.md):
//
//   - Up to 32 MiB (singleStagedMax) and a stage, one pinned stage beats
//     the ring both ways: the ring's pieces each pay a fork and join of
//     the copy goroutines, a stage event and a wait, and its CPU copies
//     run beside DMA that slows them. Larger transfers take the ring.
//   - One stage is cut into pieces (stagePieces): host to device below
//     2 MiB (singleWholeMin) into 4 pieces of at least 256 KiB filled on
//     the caller's goroutine, so that each piece's DMA overlaps the copy
//     of the next (at 1 MiB on a par with the driver's copy, which
//     overlaps its own bounce copies); from 16 MiB (singleHalvesMin) into
//     two halves both ways; otherwise whole.
//   - The driver's own pageable copy won only host to device from 64 KiB
//     to 1 MiB, by a few percent, and cannot be interrupted (it would
//     outlive a call whose context ended): it is not used; those sizes
//     take one stage.
//   - Below the Copier's Thresholds (16 MiB by default) a transfer that no
//     stage holds (a Copier with small stages) takes the ring too.
const (
	singleStagedMax  = 32 << 20             // the largest transfer one stage takes
	singleCopyInline = 2 * minPiece         // up to here the caller's goroutine copies alone
	singlePieceMin   = 256 << 10            // the smallest piece of one stage
	singleWholeMin   = 4 * singleCopyInline // host to device from here: whole (or halves)
	singleHalvesMin  = 16 << 20             // from here: two halves both ways
)

// path is how a pageable transfer moves.
type path uint8

const (
	pathStage path = iota // one pinned stage, in stagePieces pieces, when one is idle
	pathRing              // the Copier's ring of stages
)

// String names the path as Stats and the tests do.
func (p path) String() string {
	if p == pathRing {
		return "ring"
	}
	return "stage"
}

// route chooses the path of a pageable transfer of n bytes in direction
// d for a Copier with stages of stageSize bytes and thresholds thr, as the
// measured bands above say; how forces a path (Calibrate, benchmarks).
// It is pure: the same arguments give the same path.
func route(d Direction, n int, thr Thresholds, stageSize int, how strategy) path {
	switch {
	case how == forceStaged || n > stageSize:
		return pathRing
	case how == forceShort || int64(n) < thr.of(d) || n <= singleStagedMax:
		return pathStage
	}
	return pathRing
}

// stagePieces returns the number of pieces of a transfer of n bytes in
// direction d through one stage and the size of all but the last (a
// multiple of 4 KiB): host to device, the DMA of each piece is queued as
// soon as the CPU has copied it into the stage, so that it overlaps the
// CPU's copy of the next; device to host, the transfer goes in two halves
// at most, the CPU copying the first out while the second is in flight.
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
