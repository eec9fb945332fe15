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

	"github.com/pinmem/pinmem/internal/testutil"
	"github.com/pinmem/pinmem/load/internal/uring"
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
// the mapping that ModeMapped registers.
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
func uringChunks(rings []*uring.Ring) pageCacheReader {
	return func(f *os.File, size int64, bufs [][][]byte) (int64, error) {
		var next atomic.Int64
		return eachReader(len(bufs), func(w int, got *atomic.Int64) error {
			r := rings[w]
			chunk := int64(len(bufs[w][0]))
			var cs []uring.Completion
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
// directory; it is read once before timing so that it is in the page
// cache.
func BenchmarkPageCacheRead(b *testing.B) {
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
	readers := min(DefaultReaders, runtime.NumCPU())
	const chunk, perReader = DefaultStageSize, 2
	heap := make([][][]byte, readers)
	stages := make([][][]byte, readers)
	rings := make([]*uring.Ring, readers)
	for w := range readers {
		heap[w] = [][]byte{make([]byte, chunk)}
		for range perReader {
			m, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Munmap(m)
			stages[w] = append(stages[w], m)
		}
		if rings[w], err = uring.New(4); err != nil {
			b.Skipf("io_uring: %v", err)
		}
		defer rings[w].Close()
		if err := rings[w].Register(stages[w]); err != nil {
			b.Fatal(err)
		}
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	paths := []struct {
		name string
		read pageCacheReader
		bufs [][][]byte
	}{
		{"host", preadChunks, heap},
		{"pread", preadChunks, stages},
		{"uring", uringChunks(rings), stages},
		{"mapped", mappedChunks(m), stages},
	}
	for _, p := range paths { // bring the file into the page cache, and fault in the buffers
		if n, err := p.read(f, size, p.bufs); err != nil || n != size {
			b.Fatalf("%s: read %d of %d bytes: %v", p.name, n, size, err)
		}
	}
	took := make([]time.Duration, len(paths))
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for k := range paths {
			p := paths[(i+k)%len(paths)] // rotate the order: no path always runs first
			t0 := time.Now()
			if n, err := p.read(f, size, p.bufs); err != nil || n != size {
				b.Fatalf("%s: read %d of %d bytes: %v", p.name, n, size, err)
			}
			took[(i+k)%len(paths)] += time.Since(t0)
		}
	}
	for k, p := range paths {
		b.ReportMetric(float64(size)*float64(b.N)/took[k].Seconds()/1e9, p.name+"-GB/s")
		if k > 0 {
			b.ReportMetric(took[0].Seconds()/took[k].Seconds(), p.name+"/host")
		}
	}
}
