package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

var (
	_ io.ReaderAt = (*cuda.DeviceBuffer)(nil)
	_ io.WriterAt = (*cuda.DeviceBuffer)(nil)
)

// Stream copies check the buffer's liveness and the range as the
// synchronous methods do: a typed error, and no driver call.
func TestStreamCopiesCheckRangeAndLiveness(t *testing.T) {
	fd, ctx := fakeContext(t)
	s, err := ctx.NewStream(cuda.StreamNonBlocking)
	must(t, err)
	defer s.Destroy()
	live, err := ctx.Alloc(64)
	must(t, err)
	defer live.Free()
	freed, err := ctx.Alloc(64)
	must(t, err)
	view, err := freed.Slice(8, 8)
	must(t, err)
	must(t, freed.Free())
	host := make([]byte, 16)

	cases := []struct {
		name string
		want error
		do   func() error
	}{
		{"HtoD past end", cuda.ErrInvalidValue, func() error { return s.CopyHtoD(live, 56, host) }},
		{"HtoD negative offset", cuda.ErrInvalidValue, func() error { return s.CopyHtoD(live, -1, host) }},
		{"HtoD freed", cuda.ErrInvalidHandle, func() error { return s.CopyHtoD(freed, 0, host) }},
		{"HtoD view of freed", cuda.ErrInvalidHandle, func() error { return s.CopyHtoD(view, 0, host[:8]) }},
		{"HtoD nil buffer", cuda.ErrInvalidValue, func() error { return s.CopyHtoD(nil, 0, host) }},
		{"DtoH past end", cuda.ErrInvalidValue, func() error { return s.CopyDtoH(host, live, 49) }},
		{"DtoH freed", cuda.ErrInvalidHandle, func() error { return s.CopyDtoH(host, freed, 0) }},
		{"DtoD dst past end", cuda.ErrInvalidValue, func() error { return s.CopyDtoD(live, 60, live, 0, 8) }},
		{"DtoD src freed", cuda.ErrInvalidHandle, func() error { return s.CopyDtoD(live, 0, freed, 0, 8) }},
		{"Memset past end", cuda.ErrInvalidValue, func() error { return s.Memset(live, 1, 0, 64) }},
		{"Memset freed", cuda.ErrInvalidHandle, func() error { return s.Memset(view, 0, 0, 1) }},
	}
	before := fd.CallCounts()
	for _, c := range cases {
		if err := c.do(); !errors.Is(err, c.want) {
			t.Errorf("%s = %v, want %v", c.name, err, c.want)
		}
	}
	after := fd.CallCounts()
	for _, op := range []string{"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8Async"} {
		if after[op] != before[op] {
			t.Errorf("%s called %d times by refused copies", op, after[op]-before[op])
		}
	}

	// In range, the same calls copy.
	in := []byte("0123456789abcdef")
	must(t, s.CopyHtoD(live, 48, in))
	must(t, s.CopyDtoD(live, 0, live, 48, 16))
	out := make([]byte, 16)
	must(t, s.CopyDtoH(out, live, 0))
	must(t, s.Synchronize(context.Background()))
	if !bytes.Equal(out, in) {
		t.Fatalf("round trip = %q, want %q", out, in)
	}
}

// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt: a read reaching
// the end returns what is there and io.EOF; a write out of range writes
// nothing.
func TestDeviceBufferReaderAtWriterAt(t *testing.T) {
	_, ctx := fakeContext(t)
	b, err := ctx.Alloc(10)
	must(t, err)
	defer b.Free()
	if n, err := b.WriteAt([]byte("0123456789"), 0); n != 10 || err != nil {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	if n, err := b.WriteAt([]byte("xyz"), 8); n != 0 || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("WriteAt past end = %d, %v; want 0, ErrInvalidValue", n, err)
	}
	if n, err := b.WriteAt([]byte("x"), -1); n != 0 || !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("WriteAt(-1) = %d, %v; want 0, ErrInvalidValue", n, err)
	}
	p := make([]byte, 4)
	if n, err := b.ReadAt(p, 8); n != 2 || err != io.EOF || string(p[:2]) != "89" {
		t.Errorf("ReadAt at 8 = %d, %v, %q; want 2, EOF, \"89\"", n, err, p[:n])
	}
	if n, err := b.ReadAt(p, 10); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end = %d, %v; want 0, EOF", n, err)
	}
	if _, err := b.ReadAt(p, -1); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("ReadAt(-1) = %v, want ErrInvalidValue", err)
	}
	all, err := io.ReadAll(io.NewSectionReader(b, 3, 100))
	if err != nil || string(all) != "3456789" {
		t.Errorf("through io.SectionReader = %q, %v", all, err)
	}
	must(t, b.Free())
	if _, err := b.ReadAt(p, 0); !errors.Is(err, cuda.ErrInvalidHandle) {
		t.Errorf("ReadAt after Free = %v, want ErrInvalidHandle", err)
	}
}
