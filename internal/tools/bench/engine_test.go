package bench

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestOpenWithoutDriver: on a machine without a GPU, Open fails with the
// cuda sentinel (the CLI turns it into one line). Skipped where a driver loads.
func TestOpenWithoutDriver(t *testing.T) {
	if _, err := cudadrv.Get(); err == nil {
		t.Skip("a driver is present")
	}
	s, err := Open(t.Context(), 0, SessionConfig{})
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded without a driver")
	}
	if !errors.Is(err, cuda.ErrNoDriver) && !errors.Is(err, cuda.ErrNoDevice) {
		t.Errorf("Open error %v matches neither ErrNoDriver nor ErrNoDevice", err)
	}
}

// TestEngineOnFakeDriver runs the engine's logic (allocation of every kind,
// queueing, event timing, poisoning and verification, cleanup) against the
// fake driver. It shows nothing about real bandwidth: the fake copies with
// memmove. Kernels are absent there, so the session must fall back to
// plain events and skip the mapped kind with the reason.
func TestEngineOnFakeDriver(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	s, err := Open(t.Context(), 0, SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	if kernels.IsPlaceholder() && s.KernelError() == nil {
		t.Error("placeholder PTX but no kernel error")
	}
	if s.KernelError() != nil && s.SpinError() == nil {
		t.Error("no kernels but spin-wait claimed")
	}
	rs, err := s.Bandwidth(t.Context(), BandwidthConfig{Sizes: []int64{4096, 64 << 10}, Samples: 2, MinBytes: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(AllKinds())*2*3 {
		t.Fatalf("%d results, want %d", len(rs), len(AllKinds())*2*3)
	}
	for _, r := range rs {
		t.Log(r)
		if r.Kind == KindMapped && s.KernelError() != nil {
			if !r.Skipped || !strings.Contains(r.Note, "kernels unavailable") {
				t.Errorf("mapped without kernels: %+v", r)
			}
			continue
		}
		if r.Skipped || !r.Verified || r.Samples != 2 || r.Median <= 0 || r.Min > r.Median || r.Max < r.Median {
			t.Errorf("result %+v", r)
		}
		if s.SpinError() != nil && r.Timing == TimingSpin {
			t.Errorf("spin timing claimed without spin-wait: %+v", r)
		}
		// Every Go-memory kind that a wall clock times, and pageable in
		// both directions at once, is timed by the wall clock.
		wall := r.Kind == KindPageableSync || r.Kind == KindCopier ||
			r.Kind == KindPageable && r.Dir == DirBidir
		if wall != (r.Timing == TimingWall) {
			t.Errorf("%s %s: timing %q", r.Kind, r.Dir, r.Timing)
		}
		if r.Kind == KindCopier && r.Path != "staged" && !r.Skipped {
			// A Go slice is pageable: a Copier stages every byte of it.
			t.Errorf("%s %s %d: path %q from the Copier's Stats, want staged", r.Kind, r.Dir, r.Size, r.Path)
		}
	}
	AddReferences(rs)
	for _, r := range rs {
		if r.Kind == KindCopier && (r.Ref != KindPageableSync || r.Ratio <= 0) {
			t.Errorf("copier row %s %d: ref %q ratio %v, want the pageable-sync row of the run", r.Dir, r.Size, r.Ref, r.Ratio)
		}
	}
	m := s.Meta("pinmem bench")
	if m.Device == "" || m.Timing == "" {
		t.Errorf("meta %+v", m)
	}
}

// TestPinOverlapZeroCopyOnFakeDriver runs the other benches' logic on the
// fake driver: pinning methods, the pipeline (copies only, without
// kernels) and the zero-copy bench's skip without kernels.
func TestPinOverlapZeroCopyOnFakeDriver(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{})
	s, err := Open(t.Context(), 0, SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rs, err := s.Pin(t.Context(), PinConfig{Sizes: []int64{1 << 20}, Samples: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 9 {
		t.Errorf("%d pin results, want 9", len(rs))
	}
	for _, r := range rs {
		if r.Skipped || !r.Verified || r.Samples != 2 || r.Unit != Ms {
			t.Errorf("pin result %+v", r)
		}
	}
	rs, err = s.Overlap(t.Context(), OverlapConfig{Chunks: 4, ChunkSize: 64 << 10, Streams: 2, Samples: 2, VecAddSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, r := range rs {
		t.Log(r)
		kinds[r.Kind] = true
		if r.Kind == VariantBound {
			if r.Timing != TimingComputed || r.Verified || r.Samples != 0 || r.Median <= 0 {
				t.Errorf("bound %+v", r)
			}
			continue
		}
		if r.Skipped || !r.Verified || r.Median <= 0 {
			t.Errorf("overlap result %+v", r)
		}
		if pipeline := r.Bench == "overlap" && r.Unit == Ms; pipeline && (s.KernelError() != nil) != strings.Contains(r.Note, "copies only, no kernel") {
			t.Errorf("overlap result %+v: its note should say whether the kernel ran (kernel error %v)", r, s.KernelError())
		}
	}
	for _, k := range []string{KindPinned, VariantBound, VariantPageableSync, VariantPinned1, "pinned-2streams", KindPageable} {
		if !kinds[k] {
			t.Errorf("no %q result", k)
		}
	}
	rs, err = s.ZeroCopy(t.Context(), ZeroCopyConfig{Size: 64 << 10, Reuse: []int{1, 2}, Samples: 2})
	if s.KernelError() != nil {
		if err != nil || len(rs) != 4 || !rs[0].Skipped {
			t.Errorf("zero-copy without kernels: %v, %+v", err, rs)
		}
		return
	}
	if err != nil || len(rs) != 4 {
		t.Fatalf("zero-copy: %v, %d results, want 4", err, len(rs))
	}
	for i, r := range rs {
		wantKind := []string{VariantZeroCopy, VariantExplicit}[i%2]
		if r.Kind != wantKind || r.Dir != fmt.Sprintf("reuse=%d", 1+i/2) || r.Skipped || !r.Verified || r.Samples != 2 || r.Median <= 0 {
			t.Errorf("zero-copy result %d: %+v", i, r)
		}
	}
}
