package bench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// TestBadConfigs: every out-of-range field, nil context, nil or closed
// session is an ErrInvalid error naming the field, before any GPU work.
func TestBadConfigs(t *testing.T) {
	d := testutil.UseFake(t, fakedrv.Options{})
	ctx := t.Context()
	s, err := Open(ctx, 0, SessionConfig{NoSpin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := d.Live()
	var nilCtx context.Context
	var nilSession *Session
	cases := []struct {
		name, want string
		run        func() error
	}{
		{"open nil ctx", "nil context", func() error { _, err := Open(nilCtx, 0, SessionConfig{}); return err }},
		{"open negative device", "device -1", func() error { _, err := Open(ctx, -1, SessionConfig{}); return err }},
		{"open spin timeout", "SpinTimeout", func() error { _, err := Open(ctx, 0, SessionConfig{SpinTimeout: -time.Second}); return err }},
		{"nil session", "nil *Session", func() error { _, err := nilSession.Bandwidth(ctx, BandwidthConfig{}); return err }},
		{"bw nil ctx", "nil context", func() error { _, err := s.Bandwidth(nilCtx, BandwidthConfig{}); return err }},
		{"bw kind", "BandwidthConfig.Kinds", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Kinds: []string{"wc"}}); return err }},
		{"bw dir", "BandwidthConfig.Dirs", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Dirs: []string{"up"}}); return err }},
		{"bw size 0", "BandwidthConfig.Sizes", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Sizes: []int64{0}}); return err }},
		{"bw size huge", "BandwidthConfig.Sizes", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Sizes: []int64{MaxSize + 1}}); return err }},
		{"bw samples", "BandwidthConfig.Samples", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Samples: -1}); return err }},
		{"bw samples max", "BandwidthConfig.Samples", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Samples: MaxSamples + 1}); return err }},
		{"bw warmup", "BandwidthConfig.Warmup", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{Warmup: -2}); return err }},
		{"bw minbytes", "BandwidthConfig.MinBytes", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{MinBytes: -1}); return err }},
		{"bw maxreps", "BandwidthConfig.MaxReps", func() error { _, err := s.Bandwidth(ctx, BandwidthConfig{MaxReps: -1}); return err }},
		{"pin nil ctx", "nil context", func() error { _, err := s.Pin(nilCtx, PinConfig{}); return err }},
		{"pin method", "PinConfig.Methods", func() error { _, err := s.Pin(ctx, PinConfig{Methods: []string{"mlock"}}); return err }},
		{"pin size", "PinConfig.Sizes", func() error { _, err := s.Pin(ctx, PinConfig{Sizes: []int64{-4096}}); return err }},
		{"pin samples", "PinConfig.Samples", func() error { _, err := s.Pin(ctx, PinConfig{Samples: -3}); return err }},
		{"overlap nil ctx", "nil context", func() error { _, err := s.Overlap(nilCtx, OverlapConfig{}); return err }},
		{"overlap chunks", "OverlapConfig.Chunks", func() error { _, err := s.Overlap(ctx, OverlapConfig{Chunks: 4097}); return err }},
		{"overlap chunk size", "OverlapConfig.ChunkSize", func() error { _, err := s.Overlap(ctx, OverlapConfig{ChunkSize: -1}); return err }},
		{"overlap total", "OverlapConfig.ChunkSize", func() error { _, err := s.Overlap(ctx, OverlapConfig{Chunks: 2, ChunkSize: MaxSize}); return err }},
		{"overlap streams", "OverlapConfig.Streams", func() error { _, err := s.Overlap(ctx, OverlapConfig{Streams: 65}); return err }},
		{"overlap samples", "OverlapConfig.Samples", func() error { _, err := s.Overlap(ctx, OverlapConfig{Samples: -1}); return err }},
		{"overlap vecadd", "OverlapConfig.VecAddSize", func() error { _, err := s.Overlap(ctx, OverlapConfig{VecAddSize: -2}); return err }},
		{"zerocopy nil ctx", "nil context", func() error { _, err := s.ZeroCopy(nilCtx, ZeroCopyConfig{}); return err }},
		{"zerocopy size", "ZeroCopyConfig.Size", func() error { _, err := s.ZeroCopy(ctx, ZeroCopyConfig{Size: 6}); return err }},
		{"zerocopy reuse", "ZeroCopyConfig.Reuse", func() error { _, err := s.ZeroCopy(ctx, ZeroCopyConfig{Reuse: []int{0}}); return err }},
		{"zerocopy samples", "ZeroCopyConfig.Samples", func() error { _, err := s.ZeroCopy(ctx, ZeroCopyConfig{Samples: MaxSamples + 1}); return err }},
		{"blocks nil ctx", "nil context", func() error { _, err := s.Blocks(nilCtx, BlocksConfig{}); return err }},
		{"blocks size 0", "BlocksConfig.Sizes", func() error { _, err := s.Blocks(ctx, BlocksConfig{Sizes: []int64{0}}); return err }},
		{"blocks size huge", "BlocksConfig.Sizes", func() error { _, err := s.Blocks(ctx, BlocksConfig{Sizes: []int64{MaxBlockSize + 1}}); return err }},
		{"blocks count", "BlocksConfig.Blocks", func() error { _, err := s.Blocks(ctx, BlocksConfig{Blocks: -1}); return err }},
		{"blocks count max", "BlocksConfig.Blocks", func() error { _, err := s.Blocks(ctx, BlocksConfig{Blocks: MaxBlocks + 1}); return err }},
		{"blocks sideways", "BlocksConfig.Dirs", func() error { _, err := s.Blocks(ctx, BlocksConfig{Dirs: []string{"sideways"}}); return err }},
		{"blocks kind", "BlocksConfig.Kinds", func() error { _, err := s.Blocks(ctx, BlocksConfig{Kinds: []string{"dma"}}); return err }},
		{"blocks samples", "BlocksConfig.Samples", func() error { _, err := s.Blocks(ctx, BlocksConfig{Samples: -1}); return err }},
		{"blocks warmup", "BlocksConfig.Warmup", func() error { _, err := s.Blocks(ctx, BlocksConfig{Warmup: 101}); return err }},
		{"blocks gap", "BlocksConfig.Gap", func() error { _, err := s.Blocks(ctx, BlocksConfig{Gap: -2}); return err }},
		{"blocks total", "host memory", func() error {
			_, err := s.Blocks(ctx, BlocksConfig{Blocks: MaxBlocks, Sizes: []int64{MaxBlockSize}})
			return err
		}},
		{"matrix nil ctx", "nil context", func() error { _, _, err := Matrix(nilCtx, MatrixConfig{}); return err }},
		{"matrix size", "MatrixConfig.Size", func() error { _, _, err := Matrix(ctx, MatrixConfig{Size: -1}); return err }},
		{"matrix devices", "MatrixConfig.Devices", func() error { _, _, err := Matrix(ctx, MatrixConfig{Devices: []int{0, 0}}); return err }},
		{"matrix negative device", "MatrixConfig.Devices", func() error { _, _, err := Matrix(ctx, MatrixConfig{Devices: []int{-1}}); return err }},
		{"matrix reps", "MatrixConfig.Reps", func() error { _, _, err := Matrix(ctx, MatrixConfig{Reps: 1001}); return err }},
		{"matrix dirs", "MatrixConfig.Dirs", func() error { _, _, err := Matrix(ctx, MatrixConfig{Dirs: []string{"sideways"}}); return err }},
		{"matrix session", "SpinTimeout", func() error {
			_, _, err := Matrix(ctx, MatrixConfig{Session: SessionConfig{SpinTimeout: time.Hour}})
			return err
		}},
	}
	for _, c := range cases {
		err := c.run()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
	if after := d.Live(); after != before {
		t.Errorf("bad configurations touched the GPU: live objects %+v, before %+v", after, before)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Bandwidth(ctx, BandwidthConfig{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Bandwidth after Close: %v, want ErrInvalid (closed)", err)
	}
}

// cancelAt makes the fake driver cancel a context at the n-th call of op
// from now on, and counts the calls of op.
type cancelAt struct {
	mu     sync.Mutex
	op     string
	n      int
	calls  int
	cancel context.CancelFunc
}

func (c *cancelAt) install(d *fakedrv.Driver) {
	d.SetHook(func(op string) cudadrv.Result {
		if op == c.op {
			c.mu.Lock()
			c.calls++
			if c.calls == c.n {
				c.cancel()
			}
			c.mu.Unlock()
		}
		return cudadrv.Success
	})
}

func (c *cancelAt) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TestCancelStopsAfterTheCurrentSample: a context canceled while a sample
// runs ends the measurement once that sample is done; the samples taken
// are reported with a note, and the error matches context.Canceled.
func TestCancelStopsAfterTheCurrentSample(t *testing.T) {
	t.Run("bandwidth", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		d := testutil.UseFake(t, fakedrv.Options{})
		s, err := Open(t.Context(), 0, SessionConfig{NoSpin: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// One pinned H2D measurement, no warm-up: sync 1 ends sample 1, sync
		// 2 (canceling) ends sample 2.
		c := &cancelAt{op: "cuEventSynchronize", n: 2, cancel: cancel}
		c.install(d)
		rs, err := s.Bandwidth(ctx, BandwidthConfig{Kinds: []string{KindPinned, KindPortable}, Sizes: []int64{64 << 10},
			Dirs: []string{DirH2D}, Samples: 5, Warmup: -1, MinBytes: 64 << 10})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Bandwidth error %v, want context.Canceled", err)
		}
		if len(rs) != 1 || rs[0].Samples != 2 || !rs[0].Verified || !strings.Contains(rs[0].Note, "stopped after 2 of 5 samples") {
			t.Fatalf("results %+v, want one pinned result of 2 samples", rs)
		}
		if n := c.count(); n != 2 {
			t.Errorf("%d samples synchronized, want 2 (no sample after the cancel)", n)
		}
	})
	t.Run("pin", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		d := testutil.UseFake(t, fakedrv.Options{})
		s, err := Open(t.Context(), 0, SessionConfig{NoSpin: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		(&cancelAt{op: "cuMemHostAlloc", n: 3, cancel: cancel}).install(d) // during the third sample
		rs, err := s.Pin(ctx, PinConfig{Methods: []string{PinHostAlloc}, Sizes: []int64{1 << 20, 2 << 20}, Samples: 5})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Pin error %v, want context.Canceled", err)
		}
		if len(rs) != 2 {
			t.Fatalf("%d results, want pin and unpin of the first size: %+v", len(rs), rs)
		}
		for _, r := range rs {
			if r.Samples != 3 || r.Size != 1<<20 || !strings.Contains(r.Note, "stopped after 3 of 5 samples") {
				t.Errorf("result %+v, want 3 samples of 1MiB", r)
			}
		}
	})
	t.Run("before", func(t *testing.T) {
		testutil.UseFake(t, fakedrv.Options{})
		s, err := Open(t.Context(), 0, SessionConfig{NoSpin: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := Open(ctx, 0, SessionConfig{}); !errors.Is(err, context.Canceled) {
			t.Errorf("Open: %v", err)
		}
		if rs, err := s.Bandwidth(ctx, BandwidthConfig{}); !errors.Is(err, context.Canceled) || len(rs) != 0 {
			t.Errorf("Bandwidth: %v, %d results", err, len(rs))
		}
		if rs, err := s.Overlap(ctx, OverlapConfig{}); !errors.Is(err, context.Canceled) || len(rs) != 0 {
			t.Errorf("Overlap: %v, %d results", err, len(rs))
		}
		if rs, err := s.ZeroCopy(ctx, ZeroCopyConfig{}); !errors.Is(err, context.Canceled) || len(rs) != 0 {
			t.Errorf("ZeroCopy: %v, %d results", err, len(rs))
		}
		if rs, _, err := Matrix(ctx, MatrixConfig{}); !errors.Is(err, context.Canceled) || len(rs) != 0 {
			t.Errorf("Matrix: %v, %d results", err, len(rs))
		}
	})
}

// TestMatrixNoDevices: a driver with no device gives cuda.ErrNoDevice, not
// an index out of range.
func TestMatrixNoDevices(t *testing.T) {
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{}})
	if rs, _, err := Matrix(t.Context(), MatrixConfig{}); !errors.Is(err, cuda.ErrNoDevice) || len(rs) != 0 {
		t.Errorf("Matrix without devices: %d results, %v; want cuda.ErrNoDevice", len(rs), err)
	}
}
