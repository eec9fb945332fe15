package load

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// gpuFileBytes is the size of the GPU tests' file: PINMEM_LOAD_BYTES, or
// 256 MiB (32 MiB with -test.short).
func gpuFileBytes(t testing.TB) int {
	if v := os.Getenv("PINMEM_LOAD_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("PINMEM_LOAD_BYTES=%q: want a positive byte count", v)
		}
		return n
	}
	if testing.Short() { // the sanitizer tier
		return 32 << 20
	}
	return 256 << 20
}

func gpuLoader(t testing.TB, ctx *cuda.Context, opts ...Option) *Loader {
	t.Helper()
	l, err := New(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func gpuAlloc(t testing.TB, ctx *cuda.Context, n int) *cuda.DeviceBuffer {
	t.Helper()
	b, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Errorf("freeing device memory: %v", err)
		}
	})
	return b
}

// TestGPULoadFile loads a file of random bytes in every mode (buffered,
// direct, and direct after its pages were dropped where the platform can)
// and copies it back to compare every byte.
func TestGPULoadFile(t *testing.T) {
	ctx := testutil.GPUContext(t)
	n := gpuFileBytes(t)
	data := testutil.RandomBytes(n, 42)
	path := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := gpuAlloc(t, ctx, n)
	l := gpuLoader(t, ctx)
	back := make([]byte, n)
	for _, m := range []Mode{ModeBuffered, ModeDirect, ModeAuto, ModeMapped} {
		if err := dst.Memset(0xA5); err != nil {
			t.Fatal(err)
		}
		l.cfg.mode = m
		st, err := l.LoadFile(context.Background(), path, dst)
		if err != nil {
			t.Fatalf("%v: %v", m, err)
		}
		t.Logf("%v: %d bytes in %v, %.2f GB/s, %d reads, mode %v, resident %.2f, fallback %q", m, st.Bytes, st.Wall, st.GBps(), st.Reads, st.Mode, st.Resident, st.Fallback)
		testutil.Poison(back)
		if _, err := dst.ReadAt(back, 0); err != nil {
			t.Fatal(err)
		}
		testutil.CheckBytes(t, data, back)
	}
}

// TestGPULoadRanges loads every other 3 MiB + 17 bytes of a file into
// views of one allocation and checks them.
func TestGPULoadRanges(t *testing.T) {
	ctx := testutil.GPUContext(t)
	n := 64 << 20
	data := testutil.RandomBytes(n, 43)
	path := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := gpuAlloc(t, ctx, n)
	var rs []Range
	const step = 3<<20 + 17
	for off := 0; off+step <= n; off += 2 * step {
		v, err := dst.Slice(off, step)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, Range{Offset: int64(off), Length: step, Dst: v})
	}
	for _, m := range []Mode{ModeBuffered, ModeDirect, ModeMapped} {
		if err := dst.Memset(0); err != nil {
			t.Fatal(err)
		}
		l := gpuLoader(t, ctx, WithMode(m))
		if _, err := l.Load(context.Background(), path, rs); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, n)
		if _, err := dst.ReadAt(back, 0); err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			got := back[r.Offset : r.Offset+r.Length]
			if off := testutil.FirstMismatch(data[r.Offset:r.Offset+r.Length], got); off >= 0 {
				t.Fatalf("%v: range %d differs at %d", m, i, off)
			}
		}
	}
}

// BenchmarkGPULoadFile measures LoadFile of a warm file (buffered) and
// with direct I/O (which reads the disk whatever the page cache holds).
func BenchmarkGPULoadFile(b *testing.B) {
	ctx := testutil.GPUContext(b)
	n := gpuFileBytes(b)
	path := filepath.Join(b.TempDir(), "weights.bin")
	if err := os.WriteFile(path, testutil.RandomBytes(n, 44), 0o644); err != nil {
		b.Fatal(err)
	}
	dst := gpuAlloc(b, ctx, n)
	for _, m := range []Mode{ModeBuffered, ModeDirect} {
		b.Run(m.String(), func(b *testing.B) {
			l := gpuLoader(b, ctx, WithMode(m))
			// An untimed load pins the stages (b.Loop starts the timer), so
			// the loop measures loads that reuse them.
			if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			for b.Loop() {
				if _, err := l.LoadFile(context.Background(), path, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGPUReadFileCopy is the naive way, for comparison: os.ReadFile
// into Go memory, then one synchronous copy from that pageable memory.
func BenchmarkGPUReadFileCopy(b *testing.B) {
	ctx := testutil.GPUContext(b)
	n := gpuFileBytes(b)
	path := filepath.Join(b.TempDir(), "weights.bin")
	if err := os.WriteFile(path, testutil.RandomBytes(n, 44), 0o644); err != nil {
		b.Fatal(err)
	}
	dst := gpuAlloc(b, ctx, n)
	b.SetBytes(int64(n))
	for b.Loop() {
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := dst.WriteAt(data, 0); err != nil {
			b.Fatal(err)
		}
	}
}
