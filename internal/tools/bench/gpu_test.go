package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// gpuSession opens device 0, skipping (failing under PINMEM_REQUIRE_GPU=1)
// without a GPU. Kernels must load on a GPU machine.
func gpuSession(t *testing.T) *Session {
	t.Helper()
	testutil.RequireGPU(t)
	var progress bytes.Buffer
	s, err := Open(t.Context(), 0, SessionConfig{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("progress:\n%s", progress.String())
	})
	if err := s.KernelError(); err != nil {
		t.Errorf("kernels do not load on this GPU: %v", err)
	}
	if err := s.SpinError(); err != nil {
		t.Errorf("spin-wait timing unavailable: %v", err)
	}
	return s
}

// checkResults fails on any skipped, unverified or non-positive result.
func checkResults(t *testing.T, rs []Result, want int) {
	t.Helper()
	if len(rs) != want {
		t.Errorf("%d results, want %d", len(rs), want)
	}
	for _, r := range rs {
		t.Log(r)
		if r.Timing == TimingComputed {
			// A bound computed from measured rows: a value, no samples,
			// and never claimed as verified.
			if r.Skipped || r.Verified || r.Samples != 0 || r.Median <= 0 {
				t.Errorf("bad computed row: %+v", r)
			}
			continue
		}
		if r.Skipped || !r.Verified || r.Samples < 1 || r.Median <= 0 || r.Min <= 0 || r.Min > r.Median || r.Max < r.Median {
			t.Errorf("bad result: %+v", r)
		}
		if strings.Contains(r.Note, "VERIFY FAILED") || strings.Contains(r.Note, "timed out") {
			t.Errorf("note: %+v", r)
		}
	}
}

func TestGPUBandwidthEveryKind(t *testing.T) {
	s := gpuSession(t)
	rs, err := s.Bandwidth(t.Context(), BandwidthConfig{Sizes: []int64{64 << 10, 1 << 20}, Samples: 2, MinBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	checkResults(t, rs, len(AllKinds())*2*3)
	for _, r := range rs {
		want := TimingSpin
		switch r.Kind {
		case KindPageable:
			want = TimingEvents
			if r.Dir == DirBidir {
				want = TimingWall
			}
		case KindPageableSync, KindCopier:
			want = TimingWall
		}
		if r.Timing != want {
			t.Errorf("%s %s: timing %q, want %q", r.Kind, r.Dir, r.Timing, want)
		}
	}
	var tbl, svg bytes.Buffer
	if err := WriteTable(&tbl, s.Meta("test"), rs, TableOptions{Baseline: KindPinned}); err != nil {
		t.Fatal(err)
	}
	if err := WritePlot(&svg, ImageSVG, s.Meta("test"), rs); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", tbl.String())
}

func TestGPUPinCost(t *testing.T) {
	s := gpuSession(t)
	rs, err := s.Pin(t.Context(), PinConfig{Sizes: []int64{1 << 20, 8 << 20}, Samples: 2})
	if err != nil {
		t.Fatal(err)
	}
	// hostalloc, mmap-register, malloc+register: pin and unpin; go-register also touch.
	checkResults(t, rs, 2*(2+2+3+2))
}

func TestGPUOverlap(t *testing.T) {
	s := gpuSession(t)
	rs, err := s.Overlap(t.Context(), OverlapConfig{Chunks: 8, ChunkSize: 4 << 20, Streams: 4, Samples: 2, VecAddSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// bidir bw, bound (ms, FPS), 3 variants (ms, FPS), vecadd pageable and pinned.
	checkResults(t, rs, 1+2+6+2)
}

func TestGPUZeroCopy(t *testing.T) {
	s := gpuSession(t)
	rs, err := s.ZeroCopy(t.Context(), ZeroCopyConfig{Size: 4 << 20, Reuse: []int{1, 4}, Samples: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkResults(t, rs, 4)
}
