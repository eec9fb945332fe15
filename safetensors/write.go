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
	if err := checkLeast(tensors, metadata); err != nil {
		return nil, err
	}
	layout, off, err := layOut(tensors)
	if err != nil {
		return nil, err
	}
	keys, err := metadataKeys(metadata)
	if err != nil {
		return nil, err
	}
	b := encodeHeader(layout, keys, metadata)
	n := int64(len(b) - 8)
	if n > maxHeaderSize {
		return nil, fmt.Errorf("%w: the header would be %d bytes, more than %d", ErrInvalid, n, maxHeaderSize)
	}
	if off > 1<<63-1-8-n {
		return nil, fmt.Errorf("%w: the file's length overflows int64", ErrInvalid)
	}
	binary.LittleEndian.PutUint64(b[:8], uint64(n))
	if _, err := w.Write(b); err != nil {
		return nil, fmt.Errorf("safetensors: write header: %w", err)
	}
	dataStart := 8 + n
	for i, s := range tensors {
		t := &layout[i]
		t.Begin += dataStart
		t.End += dataStart
		if err := writeTensor(w, s, t); err != nil {
			return nil, err
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

// checkLeast refuses a header far too long before it is built: the names
// and metadata strings alone are a lower bound on its length.
func checkLeast(tensors []Spec, metadata map[string]string) error {
	least := 0
	for _, s := range tensors {
		least += len(s.Name)
	}
	for k, v := range metadata {
		least += len(k) + len(v)
	}
	if int64(least) > maxHeaderSize {
		return fmt.Errorf("%w: the header would be more than %d bytes (the names and metadata alone take %d)", ErrInvalid, maxHeaderSize, least)
	}
	return nil
}

// layOut checks the tensors and places them one after the other: their
// offsets in the data region, and the region's length.
func layOut(tensors []Spec) ([]Tensor, int64, error) {
	layout := make([]Tensor, len(tensors))
	seen := make(map[string]bool, len(tensors))
	var off int64
	for i, s := range tensors {
		what := fmt.Sprintf("tensor %d (%s)", i, quote(s.Name))
		if reason := specProblem(s, seen); reason != "" {
			return nil, 0, fmt.Errorf("%w: %s: %s", ErrInvalid, what, reason)
		}
		seen[s.Name] = true
		_, n, reason := byteLen(s.Shape, s.DType)
		if reason != "" {
			return nil, 0, fmt.Errorf("%w: %s: %s", ErrInvalid, what, reason)
		}
		if off > 1<<63-1-n {
			return nil, 0, fmt.Errorf("%w: %s: the data region's length overflows int64", ErrInvalid, what)
		}
		layout[i] = Tensor{Name: s.Name, DType: s.DType, Shape: slices.Clone(s.Shape), Begin: off, End: off + n}
		off += n
	}
	return layout, off, nil
}

// specProblem says what is wrong with s's name, dtype or rank, given the
// names seen before it, or "".
func specProblem(s Spec, seen map[string]bool) string {
	switch {
	case !utf8.ValidString(s.Name):
		return "name is not valid UTF-8"
	case s.Name == metadataKey:
		return "the name " + metadataKey + " is reserved for metadata"
	case seen[s.Name]:
		return "name given twice"
	case s.DType.ElemSize() == 0:
		return "unknown dtype " + quote(string(s.DType))
	case len(s.Shape) > MaxRank:
		return fmt.Sprintf("%d dimensions, more than %d", len(s.Shape), MaxRank)
	}
	return ""
}

// metadataKeys checks the metadata's strings and returns its keys, sorted.
func metadataKeys(metadata map[string]string) ([]string, error) {
	keys := make([]string, 0, len(metadata))
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: metadata %s: key or value is not valid UTF-8", ErrInvalid, quote(k))
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// encodeHeader returns the file's first bytes: 8 for the header's length
// (left zero), then the header, the metadata first, padded with spaces to
// a multiple of 8 bytes.
func encodeHeader(layout []Tensor, keys []string, metadata map[string]string) []byte {
	var hdr bytes.Buffer
	hdr.Write(make([]byte, 8))
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
	return hdr.Bytes()
}

// writeTensor writes the bytes of tensor t from s's Data callback, or
// zeros, to w, exactly t's size of them.
func writeTensor(w io.Writer, s Spec, t *Tensor) error {
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
		return fmt.Errorf("safetensors: write tensor %s: %w", quote(t.Name), err)
	}
	if lw.left != 0 {
		return fmt.Errorf("%w: tensor %s: Data wrote %d of its %d bytes", ErrInvalid, quote(t.Name), t.Size()-lw.left, t.Size())
	}
	return nil
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
