package pool

import (
	"math/rand/v2"
	"testing"
)

// checkClass checks the rounding of one request size.
func checkClass(t *testing.T, n int) {
	t.Helper()
	c := roundedSize(n)
	if c < n {
		t.Fatalf("roundedSize(%d) = %d, smaller than the request", n, c)
	}
	waste := c - n
	if n > smallMax && n <= HugeThreshold && 8*waste >= n {
		t.Fatalf("roundedSize(%d) = %d wastes %d bytes, %.2f%% (bound 12.5%%)", n, c, waste, 100*float64(waste)/float64(n))
	}
	if n <= smallMax && waste >= Align {
		t.Fatalf("roundedSize(%d) = %d wastes %d bytes, bound %d for requests up to %d bytes", n, c, waste, Align, smallMax)
	}
	if n > HugeThreshold && waste >= pageSize {
		t.Fatalf("roundedSize(%d) = %d: a huge request is only page-rounded", n, c)
	}
	if c%Align != 0 {
		t.Fatalf("roundedSize(%d) = %d is not a multiple of %d", n, c, Align)
	}
}

// TestSizeClassWasteSweep sweeps every size up to 1 MiB, every size
// around each class boundary up to HugeThreshold, and random sizes up to
// 1 TiB: rounding never wastes 1/8 of a request (above 128 bytes).
func TestSizeClassWasteSweep(t *testing.T) {
	for n := 1; n <= 1<<20; n++ {
		checkClass(t, n)
	}
	for ci := 0; ci < numClasses; ci++ {
		c := classSize(ci)
		for _, n := range []int{c - 1, c, c + 1} {
			if n >= 1 && n <= maxSize {
				checkClass(t, n)
			}
		}
		if got := classOf(c); got != ci {
			t.Fatalf("classOf(classSize(%d) = %d) = %d", ci, c, got)
		}
		if ci > 0 && classSize(ci-1) >= c {
			t.Fatalf("class sizes not increasing at %d: %d then %d", ci, classSize(ci-1), c)
		}
		if ci > lastSlabCls && c%pageSize != 0 {
			t.Fatalf("class %d (%d bytes) is pinned on its own but not page-sized", ci, c)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		checkClass(t, 1+int(r.Int64N(1<<40)))
		checkClass(t, 1+int(r.Int64N(HugeThreshold)))
	}
	if numClasses != 152 || classSize(numClasses-1) != HugeThreshold {
		t.Errorf("numClasses %d, last class %d", numClasses, classSize(numClasses-1))
	}
	for _, n := range []int{0, -1, maxSize + 1} {
		if roundedSize(n) != 0 {
			t.Errorf("roundedSize(%d) = %d, want 0", n, roundedSize(n))
		}
	}
	// Power-of-two rounding, for contrast, wastes up to (almost) 100%.
	if w := float64(roundedSize(4<<30+1)) / float64(4<<30+1); w > 1.001 {
		t.Errorf("a 4 GiB + 1 request pins %.4fx", w)
	}
}

func TestSlabLayout(t *testing.T) {
	for ci := 0; ci <= lastSlabCls; ci++ {
		n, bytes := slabLayout(ci)
		size := classSize(ci)
		if n < minSlabBlocks || bytes < slabTarget || bytes%pageSize != 0 || n*size > bytes || bytes-n*size >= size {
			t.Errorf("class %d (%d bytes): %d blocks in a %d-byte slab", ci, size, n, bytes)
		}
		if slack := bytes - n*size; slack*32 > bytes {
			t.Errorf("class %d: %d of %d slab bytes unused", ci, slack, bytes)
		}
	}
}
