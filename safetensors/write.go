package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// Spec describes one tensor for Write.
type Spec struct {
	Name  string
	DType DType
	// Shape lists the dimensions; empty for a scalar.
	Shape []int64
	// Data writes the tensor's bytes, exactly the product of Shape times
	// DType.ElemSize of them, to w (in as many calls as it likes); nil writes zeros. It is
	// called once, in the order of the tensors given to Write.
	Data func(w io.Writer) error
}

// Write writes a safetensors file to w: the tensors laid out one after
// the other in the order given, and metadata (if not empty) as
// "__metadata__". The header is padded with spaces to a multiple of 8
// bytes so that the data region is 8-byte aligned. Data is streamed from
// each Spec's Data callback straight to w, so a file of any size needs
// only the header in memory; wrap w in a bufio.Writer for small writes.
//
// Write checks everything before writing anything: a tensor name or
// metadata string that is not valid UTF-8, the reserved name
// "__metadata__", a name given twice, an unsupported dtype, a shape
// with a negative dimension, more than MaxRank dimensions or a size that
// overflows int64, or a header longer than MaxHeaderSize, is an error
// matching ErrInvalid and nothing is written. A Data callback that writes
// more or fewer bytes than its tensor holds is an error matching
// ErrInvalid (the excess is not written); an error from a callback or
// from w is returned wrapped, and the file is then incomplete.
//
// On success Write returns the file's Header, equal to what Parse returns
// for the file.
func Write(w io.Writer, tensors []Spec, metadata map[string]string) (*Header, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil writer", ErrInvalid)
	}
	layout := make([]Tensor, len(tensors))
	seen := make(map[string]bool, len(tensors))
	var off int64
	// least is a lower bound on the header's length (the names and
	// metadata strings alone), so that a header far too long is refused
	// before it is built.
	least := 0
	for _, s := range tensors {
		least += len(s.Name)
	}
	for k, v := range metadata {
		least += len(k) + len(v)
	}
	if int64(least) > maxHeaderSize {
		return nil, fmt.Errorf("%w: the header would be more than %d bytes (the names and metadata alone take %d)", ErrInvalid, maxHeaderSize, least)
	}
	for i, s := range tensors {
		what := fmt.Sprintf("tensor %d (%s)", i, quote(s.Name))
		switch {
		case !utf8.ValidString(s.Name):
			return nil, fmt.Errorf("%w: %s: name is not valid UTF-8", ErrInvalid, what)
		case s.Name == metadataKey:
			return nil, fmt.Errorf("%w: %s: the name %s is reserved for metadata", ErrInvalid, what, metadataKey)
		case seen[s.Name]:
			return nil, fmt.Errorf("%w: %s: name given twice", ErrInvalid, what)
		case s.DType.ElemSize() == 0:
			return nil, fmt.Errorf("%w: %s: unknown dtype %s", ErrInvalid, what, quote(string(s.DType)))
		case len(s.Shape) > MaxRank:
			return nil, fmt.Errorf("%w: %s: %d dimensions, more than %d", ErrInvalid, what, len(s.Shape), MaxRank)
		}
		seen[s.Name] = true
		_, n, reason := byteLen(s.Shape, s.DType)
		if reason != "" {
			return nil, fmt.Errorf("%w: %s: %s", ErrInvalid, what, reason)
		}
		if off > 1<<63-1-n {
			return nil, fmt.Errorf("%w: %s: the data region's length overflows int64", ErrInvalid, what)
		}
		layout[i] = Tensor{Name: s.Name, DType: s.DType, Shape: slices.Clone(s.Shape), Begin: off, End: off + n}
		off += n
	}
	keys := make([]string, 0, len(metadata))
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: metadata %s: key or value is not valid UTF-8", ErrInvalid, quote(k))
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)

	var hdr bytes.Buffer
	hdr.Write(make([]byte, 8)) // the length, filled in below
	hdr.WriteByte('{')
	comma := false
	if len(keys) > 0 {
		writeString(&hdr, metadataKey)
		hdr.WriteString(":{")
		for i, k := range keys {
			if i > 0 {
				hdr.WriteByte(',')
			}
			writeString(&hdr, k)
			hdr.WriteByte(':')
			writeString(&hdr, metadata[k])
		}
		hdr.WriteByte('}')
		comma = true
	}
	for _, t := range layout {
		if comma {
			hdr.WriteByte(',')
		}
		comma = true
		writeString(&hdr, t.Name)
		fmt.Fprintf(&hdr, `:{"dtype":"%s","shape":[`, t.DType)
		for i, d := range t.Shape {
			if i > 0 {
				hdr.WriteByte(',')
			}
			fmt.Fprintf(&hdr, "%d", d)
		}
		fmt.Fprintf(&hdr, `],"data_offsets":[%d,%d]}`, t.Begin, t.End)
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	n := int64(hdr.Len() - 8)
	if n > maxHeaderSize {
		return nil, fmt.Errorf("%w: the header would be %d bytes, more than %d", ErrInvalid, n, maxHeaderSize)
	}
	if off > 1<<63-1-8-n {
		return nil, fmt.Errorf("%w: the file's length overflows int64", ErrInvalid)
	}
	b := hdr.Bytes()
	binary.LittleEndian.PutUint64(b[:8], uint64(n))
	if _, err := w.Write(b); err != nil {
		return nil, fmt.Errorf("safetensors: write header: %w", err)
	}

	dataStart := 8 + n
	for i, s := range tensors {
		t := &layout[i]
		t.Begin += dataStart
		t.End += dataStart
		lw := &limitWriter{w: w, left: t.Size()}
		var err error
		if s.Data == nil {
			err = writeZeros(lw, t.Size())
		} else {
			err = s.Data(lw)
		}
		if lw.err != nil {
			err = lw.err // the callback may have dropped it
		}
		if err != nil {
			return nil, fmt.Errorf("safetensors: write tensor %s: %w", quote(t.Name), err)
		}
		if lw.left != 0 {
			return nil, fmt.Errorf("%w: tensor %s: Data wrote %d of its %d bytes", ErrInvalid, quote(t.Name), t.Size()-lw.left, t.Size())
		}
	}
	h := &Header{Tensors: layout, DataStart: dataStart, DataEnd: dataStart + off}
	if len(keys) > 0 {
		h.Metadata = make(map[string]string, len(keys))
		for _, k := range keys {
			h.Metadata[k] = metadata[k]
		}
	}
	h.index = sortTensors(h.Tensors)
	return h, nil
}

// writeString writes s as a JSON string (s is valid UTF-8).
func writeString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always marshals
	b.Write(enc)
}

// limitWriter passes at most left bytes to w; a write beyond the limit
// writes nothing and fails, and the first error sticks.
type limitWriter struct {
	w    io.Writer
	left int64
	err  error
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if int64(len(p)) > l.left {
		l.err = fmt.Errorf("%w: Data writes more than the tensor's bytes (%d more asked, %d left)", ErrInvalid, len(p), l.left)
		return 0, l.err
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		l.err = err
	}
	return n, err
}

// writeZeros writes n zero bytes to w.
func writeZeros(w io.Writer, n int64) error {
	zeros := make([]byte, min(n, 1<<16))
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := w.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
