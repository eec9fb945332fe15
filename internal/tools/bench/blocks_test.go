package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/testhook"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// blocksOnFake opens a session on a fake driver with opts.
func blocksOnFake(t *testing.T, opts fakedrv.Options) (*fakedrv.Driver, *Session) {
	t.Helper()
	d := testutil.UseFake(t, opts)
	s, err := Open(t.Context(), 0, SessionConfig{NoSpin: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return d, s
}

// TestBlocksOnFakeDriver: every kind at every size and direction is
// measured and verified, in report order, with the notes that say what was
// copied and (auto) which strategy ran; the device and host memory are
// released afterwards.
func TestBlocksOnFakeDriver(t *testing.T) {
	d, s := blocksOnFake(t, fakedrv.Options{})
	before := d.Live()
	cfg := BlocksConfig{Sizes: []int64{4096, 12345}, Blocks: 48, Samples: 3}
	rs, err := s.Blocks(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * len(AllBlockDirs()) * len(AllBlockKinds()); len(rs) != want {
		t.Fatalf("%d results, want %d", len(rs), want)
	}
	i := 0
	for _, size := range cfg.Sizes {
		for _, dir := range AllBlockDirs() {
			for _, k := range AllBlockKinds() {
				r := rs[i]
				i++
				t.Log(r)
				if r.Bench != "blocks" || r.Kind != k || r.Dir != dir || r.Size != size || r.Unit != GBps || r.Timing != TimingWall {
					t.Errorf("result %d is %s %s %s %d %s, want %s %s %d", i, r.Bench, r.Kind, r.Dir, r.Size, r.Unit, k, dir, size)
				}
				if r.Skipped || !r.Verified || r.Failed() || r.Samples != 3 || r.Median <= 0 || r.Min > r.Median || r.Max < r.Median {
					t.Errorf("result %+v", r)
				}
				switch k {
				case BlockKindAuto:
					if !strings.Contains(r.Note, "chose kernel") || !strings.Contains(r.Note, "of the best strategy in this run") {
						t.Errorf("auto's note does not say what it chose and how it compares with the best: %q", r.Note)
					}
				case BlockKindPerCopy:
					if calls := map[string]string{DirBidir: "96 driver calls"}[dir]; !strings.Contains(r.Note, cmp.Or(calls, "48 driver calls")) {
						t.Errorf("per-copy note: %q", r.Note)
					}
				case BlockKindContiguous:
					if !strings.Contains(r.Note, "contiguous on both sides") || (dir == DirBidir) != strings.Contains(r.Note, "bidirectional pinned bound") {
						t.Errorf("contiguous note: %q", r.Note)
					}
				}
			}
		}
	}
	if after := d.Live(); after != before {
		t.Errorf("live objects after the bench %+v, before %+v", after, before)
	}
}

// TestBlocksWithoutBatchCopy: on a driver older than 12.8 the driver's
// batch is skipped with the reason; auto, given the kernel as the docs
// recommend, takes it for small blocks; the other kinds are measured.
func TestBlocksWithoutBatchCopy(t *testing.T) {
	_, s := blocksOnFake(t, fakedrv.Options{DriverVersion: 12040})
	rs, err := s.Blocks(t.Context(), BlocksConfig{Sizes: []int64{4096}, Blocks: 16, Dirs: []string{DirH2D}, Samples: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		switch {
		case r.Kind == BlockKindBatch:
			if !r.Skipped || !strings.Contains(r.Note, "not supported by this driver") {
				t.Errorf("driver batch on 12.4: %+v", r)
			}
		case r.Skipped || !r.Verified:
			t.Errorf("result %+v", r)
		case r.Kind == BlockKindAuto && (!strings.Contains(r.Note, "chose kernel") || !strings.Contains(r.Note, "of the best strategy in this run")):
			t.Errorf("auto on 12.4: %q", r.Note)
		}
	}
}

// TestBlocksContiguousAcrossRegistrations: with the host buffer pinned as
// several registrations (as pinmem pins a buffer over 4 GiB), the
// contiguous reference is measured and verified, copying one driver copy
// per registration (the driver, and the fake, refuse one copy across two),
// both ways and in bidir.
func TestBlocksContiguousAcrossRegistrations(t *testing.T) {
	const chunk = 256 << 10
	t.Cleanup(testhook.SetRegChunk(chunk))
	_, s := blocksOnFake(t, fakedrv.Options{})
	const bs, n = 64 << 10, 16 // 1 MiB a region, and the gaps: 5 registrations at least
	cfg := BlocksConfig{Sizes: []int64{bs}, Blocks: n, Samples: 2, Kinds: []string{BlockKindContiguous}}
	rs, err := s.Blocks(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(AllBlockDirs()) {
		t.Fatalf("%d results, want %d", len(rs), len(AllBlockDirs()))
	}
	// Region 0 is the buffer's first MiB (4 registrations); bidir's
	// region 1 starts after 16 slots of 64 KiB and a 4 KiB gap each, at
	// 1088 KiB, and spans 5.
	want := map[string]int{DirH2D: 4, DirD2H: 4, DirBidir: 4 + 5}
	for _, r := range rs {
		t.Log(r.Dir, r.Note)
		if r.Skipped || !r.Verified || r.Failed() || r.Samples != 2 {
			t.Errorf("contiguous %s across registrations: %+v", r.Dir, r)
			continue
		}
		if calls := fmt.Sprintf("; %d driver calls,", want[r.Dir]); !strings.Contains(r.Note, calls) {
			t.Errorf("contiguous %s: note %q, want %d driver calls (one per registration)", r.Dir, r.Note, want[r.Dir])
		}
	}
}

// TestBlocksVerifyFailure: a strategy that leaves a block out is caught by
// the check of its blocks: its result (and auto's, which takes the kernel
// for small blocks) says VERIFY FAILED after the sample, and the other
// kinds are verified.
func TestBlocksVerifyFailure(t *testing.T) {
	d, s := blocksOnFake(t, fakedrv.Options{})
	// A block kernel that copies every block but the last of its table:
	// the table follows host address order, so the block left out is the
	// one in the last host slot.
	d.RegisterKernel(kernels.KernelBlockCopy, []int{8, 4}, func(k *fakedrv.KernelCall) error {
		count := int(k.Uint32(1)) - 1
		descs, err := k.Mem(k.Ptr(0), uint64(max(count, 1)*kernels.BlockDescSize))
		if err != nil {
			return err
		}
		return kernels.BlockCopyTwin(descs, count, func(a, n uint64) ([]byte, error) { return k.Mem(cudadrv.DevicePtr(a), n) })
	})
	rs, err := s.Blocks(t.Context(), BlocksConfig{Sizes: []int64{4096}, Blocks: 8, Samples: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Kind == BlockKindKernel || r.Kind == BlockKindAuto {
			if !r.Failed() || r.Verified || r.Samples != 1 || !strings.Contains(r.Note, "VERIFY FAILED: sample 1: ") || !strings.Contains(r.Note, "(host slot 7,") {
				t.Errorf("kernel leaving a block out: %+v (%s)", r, r.Note)
			}
			continue
		}
		if !r.Verified || r.Failed() {
			t.Errorf("result %+v", r)
		}
	}
}

// TestBlocksCancel: a canceled context ends the run after the sample in
// progress, with the samples so far reported and the error matching
// context.Canceled.
func TestBlocksCancel(t *testing.T) {
	d, s := blocksOnFake(t, fakedrv.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Each sample synchronizes both streams twice (before and after); the
	// warm-up of the first kind takes the first four.
	c := &cancelAt{op: "cuStreamSynchronize", n: 9, cancel: cancel}
	c.install(d)
	rs, err := s.Blocks(ctx, BlocksConfig{Sizes: []int64{4096}, Blocks: 8, Samples: 5})
	d.ClearFaults()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if len(rs) != 1 || rs[0].Samples == 0 || rs[0].Samples >= 5 || !strings.Contains(rs[0].Note, "stopped after") {
		t.Fatalf("results %+v", rs)
	}
}
