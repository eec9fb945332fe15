package pool

import (
	"math/bits"

	"github.com/pinmem/pinmem"
)

// Size classes.
//
// Requests up to 128 bytes round up to a multiple of 16 (16, 32, ..., 128).
// Above that, every power-of-two interval (2^k, 2^(k+1)] is split into 8
// equal steps of 2^(k-3), so a request s rounds up by less than s/8: at
// most 12.5% is wasted, where power-of-two rounding wastes up to 100%.
// Every block is aligned to at least 16 bytes. A block lies in its slab at
// a multiple of its step size, so it is aligned to the smaller of its step
// size and the alignment of the slab, which is the driver's: small
// cuMemHostAlloc allocations come back 512-byte aligned, side by side in
// pages the driver pinned already, so no block is promised page alignment.
//
// Classes up to 256 KiB are carved from slabs pinned for many blocks at
// once; larger classes are pinned one block per allocation. Requests above
// HugeThreshold are not rounded to a class at all: each is pinned on
// its own at its size rounded up to a page, and a cached huge block is
// reused only for a request it exceeds by at most 1/8.
const (
	// Align is the smallest alignment of every block's memory.
	Align = 16

	// HugeThreshold is the largest request rounded to a size class; larger
	// ones are pinned individually at their page-rounded size.
	HugeThreshold = 32 << 20

	// slabMax is the largest class carved from slabs.
	slabMax = 256 << 10
	// maxSize is the largest request Get accepts: pinmem's.
	maxSize = pinmem.MaxSize

	smallMax    = 128
	smallSteps  = smallMax / Align // classes 0..7: 16..128
	stepsPerPow = 8
	pageSize    = 4096
	// slabTarget is the smallest slab; a slab also holds at least minSlabBlocks blocks.
	slabTarget    = 128 << 10
	minSlabBlocks = 4
)

var (
	numClasses   = classOf(HugeThreshold) + 1
	lastSlabCls  = classOf(slabMax)
	hugeClass    = numClasses // index of the huge "class" in per-class arrays
	classesTotal = numClasses + 1
)

// classOf returns the size class index of a request of n bytes, 1 <= n <= HugeThreshold.
func classOf(n int) int {
	if n <= smallMax {
		return (n+Align-1)/Align - 1
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1), k >= 7
	step := 1 << (k - 3)
	j := (n - 1<<k + step - 1) / step // 1..8
	return smallSteps + (k-7)*stepsPerPow + j - 1
}

// classSize returns the block size of class ci.
func classSize(ci int) int {
	if ci < smallSteps {
		return (ci + 1) * Align
	}
	o, j := (ci-smallSteps)/stepsPerPow, (ci-smallSteps)%stepsPerPow+1
	k := 7 + o
	return 1<<k + j<<(k-3)
}

// slabLayout returns how many blocks of class ci one slab holds and the
// slab's size in bytes (a whole number of pages).
func slabLayout(ci int) (blocks, bytes int) {
	size := classSize(ci)
	n := max(minSlabBlocks, (slabTarget+size-1)/size)
	bytes = roundUp(n*size, pageSize)
	return bytes / size, bytes
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// roundedSize returns the capacity of the block Get(size) hands out: the
// size class for size <= HugeThreshold, the size rounded up to a page
// above it. A cached huge block may be reused for a request up to 1/8
// smaller than its capacity. It returns 0 for sizes Get rejects.
func roundedSize(size int) int {
	switch {
	case size <= 0 || size > maxSize:
		return 0
	case size > HugeThreshold:
		return roundUp(size, pageSize)
	}
	return classSize(classOf(size))
}
