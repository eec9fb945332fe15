package safetensors

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/regfile"
	"github.com/pinmem/pinmem/load"
)

// ReadHeader opens the file at path and parses its header (see Parse); it
// reads only the header.
func ReadHeader(path string) (*Header, error) {
	s, err := openHeader(path)
	if err != nil {
		return nil, err
	}
	s.f.Close()
	return s.h, nil
}

// openHeader opens the file at path and parses its header, and returns it
// as a shard whose file stays open for the load to read the data of that
// same file.
//
// Only a regular file is opened: a FIFO or a device is an error matching
// fs.ErrInvalid, and the open never blocks (O_NONBLOCK, which changes
// nothing for a regular file).
func openHeader(path string) (*shard, error) {
	f, fi, err := prefixed(regfile.Open(path))
	if err != nil {
		return nil, err
	}
	h, err := Parse(f, fi.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	return &shard{name: path, f: f, fi: fi, lp: openedPath(f, fi, path), h: h}, nil
}

// openedPath returns a path that names the file f is open on for as long
// as f stays open: /proc/self/fd/N on Linux. The load opens its file by
// path; given path itself, it would read whatever file path names by then
// (a file renamed over it, a symbolic link switched to another model),
// with the offsets of the header parsed from f. Where there is no such
// name (no /proc), path itself is returned.
func openedPath(f *os.File, fi os.FileInfo, path string) string {
	p := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if pfi, err := os.Stat(p); err == nil && os.SameFile(fi, pfi) {
		return p
	}
	return path
}

// loadErr wraps an error of the load of path, read through lp, naming path
// (also in a *load.ShortFileError) rather than lp.
func loadErr(path, lp string, err error) error {
	if se, ok := errors.AsType[*load.ShortFileError](err); ok && se.Path == lp {
		se.Path = path
	}
	return fmt.Errorf("safetensors: loading %s: %w", path, err)
}

// Destination chooses where tensor t goes: a device buffer (or a
// DeviceBuffer.Slice view) of the Loader's context holding at least
// t.Size() bytes, or nil to leave the tensor out of the load. It is
// called once per tensor, in the order of Header.Tensors, before anything
// is read; an error ends the load before any read.
type Destination func(t Tensor) (*cuda.DeviceBuffer, error)

// Into returns a Destination that loads the tensors named in bufs into
// their buffers and leaves every other tensor out. A name of bufs that the
// file does not have is not an error (check Header.Lookup for that).
func Into(bufs map[string]*cuda.DeviceBuffer) Destination {
	return func(t Tensor) (*cuda.DeviceBuffer, error) { return bufs[t.Name], nil }
}

// Load parses the header of the safetensors file at path and loads every
// tensor for which dst returns a buffer into that buffer, with l (see
// load.Loader.Load): tensors that are neighbours in the file are read
// together, and the whole data region is read at storage or page-cache
// speed whatever the number of tensors. On Linux the data is read from
// the very file whose header was parsed (through /proc/self/fd), even if
// path is replaced or its symbolic link switched meanwhile.
//
// A malformed or truncated file is an error matching ErrFormat before any
// read (never a panic or an out-of-bounds read); a buffer dst returns that
// is too small, freed, of another context or overlapping another tensor's
// is a *load.RangeError (load.ErrRange); a file that shrinks while it is
// read is a *load.ShortFileError (load.ErrShortFile), and one whose size
// or modification time changed from the header's parse to the end of the
// load an error matching load.ErrChanged. The header is
// returned with the load's statistics whenever it could be parsed. The
// buffers dst returns stay the caller's, to free whether the load
// succeeded or not; after an error, once l.Wait has returned nil (a load
// whose ctx ended may have left copies into them queued).
func Load(ctx context.Context, l *load.Loader, path string, dst Destination) (*Header, load.Stats, error) {
	if l == nil || dst == nil {
		return nil, load.Stats{Resident: -1}, fmt.Errorf("%w: nil Loader or Destination", ErrInvalid)
	}
	s, err := openHeader(path)
	if err != nil {
		return nil, load.Stats{Resident: -1}, err
	}
	defer s.f.Close() // open while the load reads the file through s.lp
	h := s.h
	ranges := make([]load.Range, 0, len(h.Tensors))
	for _, t := range h.Tensors {
		b, err := dst(t)
		if err != nil {
			return h, load.Stats{Resident: -1}, fmt.Errorf("safetensors: destination of tensor %s: %w", quote(t.Name), err)
		}
		if b == nil {
			continue
		}
		ranges = append(ranges, load.Range{Offset: t.Begin, Length: t.Size(), Dst: b})
	}
	st, err := l.Load(ctx, s.lp, ranges)
	if err == nil {
		err = s.unchanged()
	}
	if err != nil {
		return h, st, loadErr(path, s.lp, err)
	}
	return h, st, nil
}

// Tensors is a file's tensors loaded into one device allocation, each at
// its offset in the file's data region.
type Tensors struct {
	// Header is the file's parsed header.
	Header *Header
	// Buffer holds the data region: tensor t at t.Begin - Header.DataStart.
	// It is nil when the data region is empty (no tensor has a byte).
	Buffer *cuda.DeviceBuffer
	// Stats describes the load.
	Stats load.Stats
}

// LoadAll loads every tensor of the safetensors file at path into one new
// allocation of the Loader's context, laid out as the file's data region
// (so tensors keep the file's alignment; writers pad the header so that
// the region starts 8-byte aligned). The data region is read as one range,
// from the file whose header was parsed, as for Load.
// The caller frees the memory with Tensors.Free. Errors are those of Load,
// and a failed allocation (an error matching cuda.ErrOutOfMemory); on any
// error nothing stays allocated: the allocation is freed before LoadAll
// returns, or, when ctx ended while copies into it were still queued, in
// the background once they ran (see load.Loader.Wait).
func LoadAll(ctx context.Context, l *load.Loader, path string) (*Tensors, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil Loader", ErrInvalid)
	}
	s, err := openHeader(path)
	if err != nil {
		return nil, err
	}
	defer s.f.Close() // open while the load reads the file through s.lp
	h := s.h
	ts := &Tensors{Header: h, Stats: load.Stats{Resident: -1}}
	n := h.DataEnd - h.DataStart
	if n == 0 {
		return ts, nil
	}
	if n > int64(int(^uint(0)>>1)) {
		return nil, fmt.Errorf("%w: a data region of %d bytes does not fit in an int", ErrInvalid, n)
	}
	if ts.Buffer, err = l.Context().Alloc(int(n)); err != nil {
		return nil, fmt.Errorf("safetensors: allocating %d bytes of device memory for %s: %w", n, path, err)
	}
	ts.Stats, err = l.Load(ctx, s.lp, []load.Range{{Offset: h.DataStart, Length: n, Dst: ts.Buffer}})
	if err == nil {
		err = s.unchanged()
	}
	if err != nil {
		err = loadErr(path, s.lp, err)
		// A load whose ctx ended may have left copies into the buffer
		// queued: it is freed once they ran, now if they have.
		if l.Wait(ctx) == nil {
			return nil, errors.Join(err, ts.Buffer.Free())
		}
		go func() {
			if l.Wait(context.Background()) == nil {
				_ = ts.Buffer.Free()
			}
		}()
		return nil, err
	}
	return ts, nil
}

// Tensor returns the tensor named name and a view of its bytes in Buffer
// (nil for a tensor of no bytes, and once Buffer was freed), or false when
// the file has no such tensor.
func (ts *Tensors) Tensor(name string) (Tensor, *cuda.DeviceBuffer, bool) {
	if ts == nil {
		return Tensor{}, nil, false
	}
	t, ok := ts.Header.Lookup(name)
	if !ok {
		return Tensor{}, nil, false
	}
	if t.Size() == 0 || ts.Buffer == nil {
		return t, nil, true
	}
	// Slice fails only for a freed Buffer (the header tiles it): the file
	// still has the tensor, but there is no memory to view.
	v, err := ts.Buffer.Slice(int(t.Begin-ts.Header.DataStart), int(t.Size()))
	if err != nil {
		return t, nil, true
	}
	return t, v, true
}

// Free releases Buffer. A second Free returns an error matching
// cuda.ErrInvalidHandle.
func (ts *Tensors) Free() error {
	if ts == nil || ts.Buffer == nil {
		return nil
	}
	return ts.Buffer.Free()
}
