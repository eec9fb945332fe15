//go:build linux

package load

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// pageCacheReader reads the whole file f of size bytes with one goroutine
// per bufs[w], each taking the next chunk into its buffers, and returns
// the bytes read.
type pageCacheReader func(f *os.File, size int64, bufs [][][]byte) (int64, error)

// preadChunks has each goroutine pread the next chunk into its first
// buffer: the host's own parallel read (with Go heap buffers) and the
// loader's buffered path (with page-aligned stage-sized buffers).
func preadChunks(f *os.File, size int64, bufs [][][]byte) (int64, error) {
	var next atomic.Int64
	return eachReader(len(bufs), func(w int, got *atomic.Int64) error {
		buf := bufs[w][0]
		for {
			off := (next.Add(1) - 1) * int64(len(buf))
			if off >= size {
				return nil
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
			got.Add(int64(n))
			if err != nil {
				return err
			}
		}
	})
}

// mappedChunks has each goroutine copy the next chunk of the file's
// mapping into its first buffer: the CPU reading the page cache through
// a mapping of the file instead of pread.
func mappedChunks(m []byte) pageCacheReader {
	return func(_ *os.File, size int64, bufs [][][]byte) (int64, error) {
		var next atomic.Int64
		return eachReader(len(bufs), func(w int, got *atomic.Int64) error {
			buf := bufs[w][0]
			for {
				off := (next.Add(1) - 1) * int64(len(buf))
				if off >= size {
					return nil
				}
				got.Add(int64(copy(buf, m[off:min(off+int64(len(buf)), size)])))
			}
		})
	}
}

// uringChunks has each goroutine keep a read in flight into each of its
// buffers, registered with its own ring (IORING_OP_READ_FIXED).
func uringChunks(rings []*uringRing) pageCacheReader {
	return func(f *os.File, size int64, bufs [][][]byte) (int64, error) {
		var next atomic.Int64
		return eachReader(len(bufs), func(w int, got *atomic.Int64) error {
			r := rings[w]
			chunk := int64(len(bufs[w][0]))
			var cs []uringCompletion
			pending := 0
			queue := func(k int) {
				if off := (next.Add(1) - 1) * chunk; off < size {
					r.Read(int(f.Fd()), bufs[w][k][:min(chunk, size-off)], off, k, uint64(k))
					pending++
				}
			}
			for k := range bufs[w] {
				queue(k)
			}
			for pending > 0 {
				if err := r.Submit(1); err != nil {
					return err
				}
				cs = r.Reap(cs[:0])
				for _, c := range cs {
					pending--
					if c.Res < 0 {
						return fmt.Errorf("read: %w", unix.Errno(-c.Res))
					}
					got.Add(int64(c.Res))
					queue(int(c.Tag))
				}
			}
			return nil
		})
	}
}

// eachReader runs f for n readers at once and returns the bytes they
// counted as read.
func eachReader(n int, f func(w int, got *atomic.Int64) error) (int64, error) {
	errs := make([]error, n)
	var got atomic.Int64
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = f(w, &got)
		}()
	}
	wg.Wait()
	return got.Load(), errors.Join(errs...)
}

// readSetup is what the read benchmarks share: the file, and per reader a
// heap buffer, two page-aligned stage-sized buffers and an io_uring with
// those registered.
type readSetup struct {
	path         string
	f            *os.File
	size         int64
	heap, stages [][][]byte
	rings        []*uringRing
}

// setupRead opens $PINMEM_BENCH_FILE, or 1 GiB written to a temporary
// directory, and makes the buffers and rings of min(DefaultParallelism,
// NumCPU) readers. Everything is released at the end of the benchmark.
func setupRead(b *testing.B) *readSetup {
	s := &readSetup{path: os.Getenv("PINMEM_BENCH_FILE")}
	if s.path == "" {
		s.path = filepath.Join(b.TempDir(), "weights.bin")
		if err := os.WriteFile(s.path, testutil.RandomBytes(1<<30, 1), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	var err error
	if s.f, err = os.Open(s.path); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.f.Close() })
	fi, err := s.f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	s.size = fi.Size()
	readers := min(DefaultParallelism, runtime.NumCPU())
	const perReader = 2
	s.heap = make([][][]byte, readers)
	s.stages = make([][][]byte, readers)
	s.rings = make([]*uringRing, readers)
	for w := range readers {
		s.heap[w] = [][]byte{make([]byte, DefaultStageSize)}
		for range perReader {
			m, err := unix.Mmap(-1, 0, DefaultStageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { unix.Munmap(m) })
			s.stages[w] = append(s.stages[w], m)
		}
		r, err := newURing(4)
		if err != nil {
			b.Skipf("io_uring: %v", err)
		}
		b.Cleanup(func() { r.Close() })
		if err := r.Register(s.stages[w]); err != nil {
			b.Fatal(err)
		}
		s.rings[w] = r
	}
	return s
}

// readPath is one way of reading the file: read with the buffers bufs.
type readPath struct {
	name string
	f    *os.File
	read pageCacheReader
	bufs [][][]byte
}

// sideBySide reads size bytes by every path in each iteration, in an
// order rotated from one iteration to the next, and reports each path's
// GB/s and the ratio of the first path's time to each other's.
func sideBySide(b *testing.B, size int64, paths []readPath) {
	for _, p := range paths { // warm up: fault the buffers in (and fill the page cache)
		if n, err := p.read(p.f, size, p.bufs); err != nil || n != size {
			b.Fatalf("%s: read %d of %d bytes: %v", p.name, n, size, err)
		}
	}
	took := make([]time.Duration, len(paths))
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for k := range paths {
			j := (i + k) % len(paths)
			t0 := time.Now()
			if n, err := paths[j].read(paths[j].f, size, paths[j].bufs); err != nil || n != size {
				b.Fatalf("%s: read %d of %d bytes: %v", paths[j].name, n, size, err)
			}
			took[j] += time.Since(t0)
		}
	}
	for k, p := range paths {
		b.ReportMetric(float64(size)*float64(b.N)/took[k].Seconds()/1e9, p.name+"-GB/s")
		if k > 0 {
			b.ReportMetric(took[0].Seconds()/took[k].Seconds(), p.name+"/"+paths[0].name)
		}
	}
}

// BenchmarkPageCacheRead reads one file from the page cache, side by side
// in every iteration, by each read path the loader has or could have,
// into buffers of a stage's size, and reports each path's GB/s and its
// ratio to the host's own parallel read of the file into Go memory
// ("host"): "pread" (the buffered path, into page-aligned stage-sized
// buffers), "uring" (io_uring reads into registered buffers, two in
// flight per reader) and "mapped" (the CPU copying out of the file's
// mapping). No GPU: the paths' device side is measured on a GPU.
//
// The file is $PINMEM_BENCH_FILE, or 1 GiB written to a temporary
// directory; the warm-up reads it, so it is in the page cache.
func BenchmarkPageCacheRead(b *testing.B) {
	s := setupRead(b)
	m, err := unix.Mmap(int(s.f.Fd()), 0, int(s.size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	sideBySide(b, s.size, []readPath{
		{"host", s.f, preadChunks, s.heap},
		{"pread", s.f, preadChunks, s.stages},
		{"uring", s.f, uringChunks(s.rings), s.stages},
		{"mapped", s.f, mappedChunks(m), s.stages},
	})
}

// BenchmarkDirectRead reads the same file with O_DIRECT, from the disk
// whatever the page cache holds, side by side: parallel pread ("pread",
// the loader's ModeDirect), io_uring reads into registered buffers
// ("uring", two in flight per reader) and pread with as many goroutines as
// uring has reads in flight ("pread-deep"), with the ratios to pread. The
// file's size is taken down to a multiple of Align.
func BenchmarkDirectRead(b *testing.B) {
	s := setupRead(b)
	df, err := openDirect(s.f)
	if err != nil {
		b.Skipf("O_DIRECT refused: %v", err)
	}
	defer df.Close()
	size := s.size / Align * Align
	var each [][][]byte // every stage its own reader: as many preads in flight as uring has
	for _, bs := range s.stages {
		for _, b := range bs {
			each = append(each, [][]byte{b})
		}
	}
	sideBySide(b, size, []readPath{
		{"pread", df, preadChunks, s.stages},
		{"uring", df, uringChunks(s.rings), s.stages},
		{"pread-deep", df, preadChunks, each},
	})
}
