//go:build linux

package load

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// BenchmarkReaderShapes is the host side of the loader's defaults: it
// reads one warm file from the page cache as the loader's buffered path
// does (parallel pread of stage-sized chunks into page-aligned buffers,
// one per reader) at 1, 2, 4, 8 and 16 readers (up to twice the cores)
// and 4, 8 and 16 MiB reads, side by side (every shape once per
// iteration, in rotated order). It reports each shape's GB/s, the
// shape DefaultSettings picks on this machine ("default-GB/s") and its
// ratio to the best shape of the run ("default/best"): the host's best
// parallel read of the same file. No GPU: the loader's device side is
// pinmem bench load's.
//
// The file is $PINMEM_BENCH_FILE, or 1 GiB written to a temporary
// directory; the warm-up reads it, so it is in the page cache.
//
//	go test ./load -run '^$' -bench ReaderShapes -benchtime 3x
func BenchmarkReaderShapes(b *testing.B) {
	path := os.Getenv("PINMEM_BENCH_FILE")
	if path == "" {
		path = filepath.Join(b.TempDir(), "weights.bin")
		if err := os.WriteFile(path, testutil.RandomBytes(1<<30, 1), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	size := fi.Size()
	type shape struct {
		readers, chunk int
		bufs           [][][]byte
		took           time.Duration
	}
	def := DefaultSettings()
	var shapes []*shape
	for _, r := range []int{1, 2, 4, 8, 16} {
		if r > 2*runtime.NumCPU() && r != def.Parallelism {
			continue
		}
		for _, c := range []int{4 << 20, 8 << 20, 16 << 20} {
			sh := &shape{readers: r, chunk: c}
			for range r {
				m, err := unix.Mmap(-1, 0, c, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { unix.Munmap(m) })
				sh.bufs = append(sh.bufs, [][]byte{m})
			}
			shapes = append(shapes, sh)
		}
	}
	read := func(sh *shape) {
		if n, err := preadChunks(f, size, sh.bufs); err != nil || n != size {
			b.Fatalf("%d readers of %d bytes: read %d of %d: %v", sh.readers, sh.chunk, n, size, err)
		}
	}
	read(shapes[0]) // warm the page cache
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for k := range shapes {
			sh := shapes[(i+k)%len(shapes)]
			t0 := time.Now()
			read(sh)
			sh.took += time.Since(t0)
		}
	}
	gbps := func(sh *shape) float64 { return float64(size) * float64(b.N) / sh.took.Seconds() / 1e9 }
	best := 0.0
	for _, sh := range shapes {
		v := gbps(sh)
		best = max(best, v)
		b.ReportMetric(v, fmt.Sprintf("r%d-%dMiB-GB/s", sh.readers, sh.chunk>>20))
		if sh.readers == def.Parallelism && sh.chunk == def.StageSize {
			b.ReportMetric(v, "default-GB/s")
		}
	}
	for _, sh := range shapes {
		if sh.readers == def.Parallelism && sh.chunk == def.StageSize {
			b.ReportMetric(gbps(sh)/best, "default/best")
		}
	}
}
