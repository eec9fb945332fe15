package transfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// atCounter is an io.ReaderAt, io.WriterAt and io.Seeker over a byte
// slice that records how many ReadAt or WriteAt calls ran at once, and
// fails the calls that reach failAt (when positive).
type atCounter struct {
	mu       sync.Mutex
	data     []byte
	pos      int64
	now, max atomic.Int32
	failAt   int64
	err      error
}

func (a *atCounter) enter() {
	n := a.now.Add(1)
	for {
		m := a.max.Load()
		if n <= m || a.max.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(2 * time.Millisecond) // long enough for the calls of a stage to overlap
}

func (a *atCounter) ReadAt(p []byte, off int64) (int, error) {
	a.enter()
	defer a.now.Add(-1)
	if a.failAt > 0 && off+int64(len(p)) > a.failAt {
		return 0, a.err
	}
	if off >= int64(len(a.data)) {
		return 0, io.EOF
	}
	n := copy(p, a.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (a *atCounter) WriteAt(p []byte, off int64) (int, error) {
	a.enter()
	defer a.now.Add(-1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(a.data)) {
		a.data = append(a.data, make([]byte, end-int64(len(a.data)))...)
	}
	return copy(a.data[off:], p), nil
}

func (a *atCounter) Read(p []byte) (int, error) {
	n, err := a.ReadAt(p, a.pos)
	a.pos += int64(n)
	return n, err
}

func (a *atCounter) Write(p []byte) (int, error) {
	n, err := a.WriteAt(p, a.pos)
	a.pos += int64(n)
	return n, err
}

func (a *atCounter) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		off += a.pos
	case io.SeekEnd:
		off += int64(len(a.data))
	}
	a.pos = off
	return off, nil
}

// ioRing is a ring of three 4 MiB stages with 4 copy goroutines: a stage
// is read or written by up to 4 calls at once.
func ioRing() []Option {
	return []Option{WithStageSize(4 << 20), WithDepth(3), WithParallelism(4)}
}

// TestFakeReadFromReaderAt: a reader that is an io.ReaderAt and an
// io.Seeker is read from its offset with parallel ReadAt calls, every byte
// lands in place, and its offset ends just past the bytes copied, as
// after a Read loop: when the buffer fills first and when the reader ends
// first.
func TestFakeReadFromReaderAt(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, ioRing()...)
	src := testutil.RandomBytes(13<<20+777, 3)
	const start = 1234
	for _, n := range []int{9<<20 + 5, len(src)} { // the buffer fills first; the reader ends first
		a := &atCounter{data: src, pos: start}
		dev := e.devbuf(t, n)
		st, err := c.HtoDFrom(context.Background(), dev, a)
		want := min(n, len(src)-start)
		if err != nil || st.Bytes != int64(want) {
			t.Fatalf("buffer of %d: %+v, %v; want %d bytes", n, st, err, want)
		}
		testutil.CheckBytes(t, src[start:start+want], e.deviceBytes(t, dev)[:want])
		if a.pos != int64(start+want) {
			t.Errorf("buffer of %d: the reader's offset is %d after the copy, want %d", n, a.pos, start+want)
		}
		if a.max.Load() < 2 {
			t.Errorf("buffer of %d: at most %d ReadAt calls at once, want several", n, a.max.Load())
		}
	}
	// A file, read from its offset.
	path := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	dev := e.devbuf(t, 8<<20)
	if st, err := c.HtoDFrom(context.Background(), dev, f); err != nil || st.Bytes != 8<<20 {
		t.Fatalf("file: %+v, %v", st, err)
	}
	testutil.CheckBytes(t, src[start:start+8<<20], e.deviceBytes(t, dev))
	if off, _ := f.Seek(0, io.SeekCurrent); off != start+8<<20 {
		t.Errorf("file offset %d after the copy, want %d", off, start+8<<20)
	}
	// A failing ReadAt stops the transfer with its error; the bytes read
	// before it are copied and the offset is past them.
	boom := errors.New("boom")
	a := &atCounter{data: src, failAt: 6 << 20, err: boom}
	if st, err := c.HtoDFrom(context.Background(), e.devbuf(t, 12<<20), a); !errors.Is(err, boom) || a.pos != st.Bytes || st.Bytes > 6<<20 {
		t.Fatalf("failing ReadAt: %+v, %v, offset %d", st, err, a.pos)
	}
}

// TestFakeWriteToWriterAt: a writer that is an io.WriterAt and an
// io.Seeker is written at its offset with parallel WriteAt calls and its
// offset ends past the bytes written; a file opened with O_APPEND, which
// refuses WriteAt, is written as a stream.
func TestFakeWriteToWriterAt(t *testing.T) {
	e := useFake(t, fakedrv.Options{})
	c := e.copier(t, ioRing()...)
	n := 11<<20 + 3
	src := testutil.RandomBytes(n, 4)
	dev := e.devbuf(t, n)
	if _, err := c.HtoD(context.Background(), dev, src); err != nil {
		t.Fatal(err)
	}
	const start = 999
	a := &atCounter{data: make([]byte, start), pos: start}
	if st, err := c.DtoHTo(context.Background(), a, dev); err != nil || st.Bytes != int64(n) {
		t.Fatalf("WriterAt: %+v, %v", st, err)
	}
	testutil.CheckBytes(t, src, a.data[start:])
	if a.pos != int64(start+n) || a.max.Load() < 2 {
		t.Errorf("WriterAt: offset %d (want %d), %d WriteAt calls at once (want several)", a.pos, start+n, a.max.Load())
	}
	dir := t.TempDir()
	for _, appendMode := range []bool{false, true} {
		path := filepath.Join(dir, "out")
		if err := os.WriteFile(path, []byte("head"), 0o600); err != nil {
			t.Fatal(err)
		}
		flags := os.O_WRONLY
		if appendMode {
			flags |= os.O_APPEND
		}
		f, err := os.OpenFile(path, flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(4, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		st, err := c.DtoHTo(context.Background(), f, dev)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil || st.Bytes != int64(n) {
			t.Fatalf("file (append %v): %+v, %v", appendMode, st, err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(got, []byte("head")) || len(got) != 4+n {
			t.Fatalf("file (append %v): %d bytes, want %d after the head", appendMode, len(got), 4+n)
		}
		testutil.CheckBytes(t, src, got[4:])
	}
}
