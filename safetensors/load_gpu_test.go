//go:build linux

package safetensors

import (
	"context"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/testutil"
	"github.com/pinmem/pinmem/load"
)

// envGPUBytes sets the size of the GPU test's file (bytes; default 1 GiB,
// use 4294967296 or more for the full-size check), and envGPUDir the
// directory it is written to and kept in (default a temporary directory,
// removed at the end), so that scripts/torch-load.py and `pinmem bench
// load` can read the same file afterwards.
const (
	envGPUBytes = "PINMEM_SAFETENSORS_BYTES"
	envGPUDir   = "PINMEM_SAFETENSORS_DIR"
)

// dropPages writes the file back and asks the kernel to drop its pages, so
// that the next load reads the disk.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Logf("fadvise DONTNEED: %v (the cold load may read the page cache)", err)
	}
}

// warmPages reads the file through the page cache.
func warmPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		t.Fatal(err)
	}
}

// checkTensor copies the device bytes of tensor tn back and compares them
// with what the generator wrote.
func checkTensor(t *testing.T, tn Tensor, seed int, view *cuda.DeviceBuffer, host []byte) {
	t.Helper()
	if tn.Size() == 0 {
		return
	}
	host = host[:tn.Size()]
	testutil.Poison(host)
	if _, err := view.ReadAt(host, 0); err != nil {
		t.Fatal(err)
	}
	if off := testutil.FirstMismatch(tensorData(seed, tn.Size()), host); off >= 0 {
		t.Fatalf("tensor %s (%s %v): byte %d of %d differs", tn.Name, tn.DType, tn.Shape, off, tn.Size())
	}
}

// TestGPULoadModel writes a safetensors file of random tensors of several
// dtypes and shapes (PINMEM_SAFETENSORS_BYTES, default 1 GiB, 64 MiB with
// -test.short), loads it
// cold (pages dropped) and warm into one allocation, then into one
// allocation per tensor, and checks every tensor byte for byte each time.
func TestGPULoadModel(t *testing.T) {
	ctx := testutil.GPUContext(t)
	total := int64(1 << 30)
	if testing.Short() { // the sanitizer tier
		total = 64 << 20
	}
	if v := os.Getenv(envGPUBytes); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive byte count", envGPUBytes, v)
		}
		total = n
	}
	dir := os.Getenv(envGPUDir)
	if dir == "" {
		dir = t.TempDir()
	}
	start := time.Now()
	path, h, seed := writeModel(t, dir, total, 4096)
	size := h.DataEnd
	t.Logf("wrote %s: %d tensors, %d bytes in %v", path, len(h.Tensors), size, time.Since(start))

	l, err := load.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	var largest int64
	for _, tn := range h.Tensors {
		largest = max(largest, tn.Size())
	}
	host := make([]byte, largest)

	for _, temp := range []string{"cold", "warm"} {
		if temp == "cold" {
			dropPages(t, path)
		} else {
			warmPages(t, path) // a direct load leaves the page cache as it was
		}
		ts, err := LoadAll(context.Background(), l, path)
		if err != nil {
			t.Fatalf("%s LoadAll: %v", temp, err)
		}
		st := ts.Stats
		t.Logf("%s LoadAll: %d bytes in %v = %.2f GB/s, mode %v, resident %.2f, fallback %q", temp, st.Bytes, st.Wall, st.GBps(), st.Mode, st.Resident, st.Fallback)
		for _, tn := range h.Tensors {
			got, view, ok := ts.Tensor(tn.Name)
			if !ok || got.DType != tn.DType || got.NumElements() != tn.NumElements() {
				t.Fatalf("tensor %s: %+v, %v", tn.Name, got, ok)
			}
			checkTensor(t, tn, seed[tn.Name], view, host)
		}
		if err := ts.Free(); err != nil {
			t.Fatal(err)
		}
	}

	bufs := map[string]*cuda.DeviceBuffer{}
	defer func() {
		for _, b := range bufs {
			if err := b.Free(); err != nil {
				t.Error(err)
			}
		}
	}()
	_, st, err := Load(context.Background(), l, path, func(tn Tensor) (*cuda.DeviceBuffer, error) {
		if tn.Size() == 0 {
			return nil, nil
		}
		b, err := ctx.Alloc(int(tn.Size()))
		if err == nil {
			bufs[tn.Name] = b
		}
		return b, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Load into %d allocations: %d bytes in %v = %.2f GB/s, %d reads, mode %v", len(bufs), st.Bytes, st.Wall, st.GBps(), st.Reads, st.Mode)
	for _, tn := range h.Tensors {
		if b := bufs[tn.Name]; b != nil {
			checkTensor(t, tn, seed[tn.Name], b, host)
		}
	}
}
