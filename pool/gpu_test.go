package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// spinHold holds a stream on the GPU with the spin_wait kernel, which
// polls a flag in mapped pinned host memory until the host sets it.
type spinHold struct {
	t    testing.TB
	spin *cuda.Function
	flag *pinmem.Buffer
	fptr cuda.DevicePtr
}

const spinStatusOff = 64 // spin_wait's status word, in the flag's buffer

func newSpinHold(t testing.TB, ctx *cuda.Context) *spinHold {
	t.Helper()
	if err := kernels.Check(); err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule(kernels.Image())
	if errors.Is(err, cuda.ErrKernelImage) {
		testutil.SkipFeature(t, "kernels cannot load: "+err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mod.Destroy(); err != nil {
			t.Error(err)
		}
	})
	spin, err := mod.Function(kernels.KernelSpinWait)
	if err != nil {
		t.Fatal(err)
	}
	flag, err := pinmem.Alloc(4096, pinmem.Mapped)
	testutil.SkipIfNotSupported(t, err)
	t.Cleanup(func() {
		if err := flag.Free(); err != nil {
			t.Error(err)
		}
	})
	fptr, err := flag.DevicePtr()
	if err != nil {
		t.Fatal(err)
	}
	return &spinHold{t: t, spin: spin, flag: flag, fptr: fptr}
}

// hold queues spin_wait on s: later work on s waits until release.
func (h *spinHold) hold(s *cuda.Stream) {
	fb := h.flag.Bytes()
	binary.LittleEndian.PutUint32(fb[0:], 0)
	binary.LittleEndian.PutUint32(fb[spinStatusOff:], 0)
	const timeout = uint64(20 * time.Second)
	if err := h.spin.Launch(s, cuda.D1(1), cuda.D1(1), 0, h.fptr, timeout, h.fptr.Add(spinStatusOff)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *spinHold) release() { binary.LittleEndian.PutUint32(h.flag.Bytes()[0:], 1) }

// check fails the test unless the kernel was released by the flag (not by
// its timeout): only then was the stream really held until release.
func (h *spinHold) check() {
	h.t.Helper()
	if st := binary.LittleEndian.Uint32(h.flag.Bytes()[spinStatusOff:]); st != kernels.SpinReleased {
		h.t.Fatalf("spin_wait status %d, want %d (released): the stream was not held, the result proves nothing", st, kernels.SpinReleased)
	}
}

// TestGPUStreamOrderedReuse is the test on the GPU: a stream held
// by spin_wait, an async H2D copy of a filled block queued on it, the
// block Put with the stream, a block of the same size taken at once and
// overwritten, the stream released. With stream-ordered reuse the device
// holds the original data; with ordering switched off (the test-only
// switch) it holds the overwrite, which shows the test detects the
// difference. Fixed sizes (slab, own-block and huge classes) and random
// sizes from 1 KiB to 64 MiB.
func TestGPUStreamOrderedReuse(t *testing.T) {
	testutil.RequireGPU(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("random sizes from seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	sizes := []int{64, 4 << 10, 200 << 10, 1 << 20, 6<<20 + 5, HugeThreshold + 4097}
	for range 10 {
		sizes = append(sizes, int(math.Exp2(10+16*r.Float64()))) // log-uniform 1 KiB .. 64 MiB
	}
	for _, ordered := range []bool{true, false} {
		t.Run(map[bool]string{true: "ordered", false: "unordered"}[ordered], func(t *testing.T) {
			dev, err := cuda.GetDevice(0)
			if err != nil {
				t.Fatal(err)
			}
			ctx, s := newStream(t)
			h := newSpinHold(t, ctx)
			p := newPool(t, WithFlags(0, pinmem.WithDevice(dev)))
			p.s.unordered = !ordered
			for i, size := range sizes {
				reused, got, want, over := orderingCase(t, p, ctx, s, size, seed+uint64(i), func() { h.hold(s) }, h.release)
				h.check()
				checkOrdering(t, ordered, size, reused, got, want, over)
			}
			t.Log(p.Stats())
		})
	}
}

// TestGPUMappedPool has a kernel write into a mapped pool's blocks through
// their device pointers (slab and own blocks) and checks every word.
func TestGPUMappedPool(t *testing.T) {
	testutil.RequireGPU(t)
	ctx, s := newStream(t)
	if err := kernels.Check(); err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule(kernels.Image())
	if errors.Is(err, cuda.ErrKernelImage) {
		testutil.SkipFeature(t, "kernels cannot load: "+err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Destroy()
	fillK, err := mod.Function(kernels.KernelFill)
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(t, WithFlags(pinmem.Mapped))
	for i, size := range []int{4096, 4096, 64 << 10, 3 << 20, 8 << 20} {
		b, err := p.Get(context.Background(), size)
		testutil.SkipIfNotSupported(t, err)
		dp, err := b.DevicePtr()
		if err != nil {
			t.Fatal(err)
		}
		n := size / 4
		if err := fillK.Launch(s, cuda.D1(64), cuda.D1(256), 0, dp, uint64(n), uint32(i+1)); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		words := make([]uint32, n)
		for j := range words {
			words[j] = binary.LittleEndian.Uint32(b.Bytes()[4*j:])
		}
		if k := kernels.VerifyPattern(words, uint32(i+1), 0); k >= 0 {
			t.Fatalf("size %d: word %d wrong", size, k)
		}
		mustPut(t, p, b, s)
	}
}
