package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Parse reads and validates the header of the safetensors file of size
// bytes that r reads, against every rule of the package documentation.
// It reads only the 8-byte length prefix and the header (at most
// MaxHeaderSize bytes), never the data region.
//
// A malformed file, including one shorter than size claims, is an error
// matching ErrFormat (a *FormatError); a nil r or a negative size matches
// ErrInvalid; any other error from r is returned wrapped.
func Parse(r io.ReaderAt, size int64) (*Header, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil reader", ErrInvalid)
	}
	if size < 0 {
		return nil, fmt.Errorf("%w: negative file size %d", ErrInvalid, size)
	}
	if size < 8 {
		return nil, formatErr(0, "file of %d bytes is shorter than the 8-byte header length", size)
	}
	var prefix [8]byte
	if err := readFull(r, prefix[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > uint64(maxHeaderSize) {
		return nil, formatErr(0, "header length %d exceeds the limit of %d bytes", n, maxHeaderSize)
	}
	if n > uint64(size-8) {
		return nil, formatErr(0, "header length %d runs past the end of the %d-byte file", n, size)
	}
	hdr := make([]byte, n)
	if err := readFull(r, hdr, 8); err != nil {
		return nil, err
	}
	return parseHeader(hdr, size)
}

// readFull reads len(p) bytes at off; a short read is a truncated file.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n >= len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return formatErr(off+int64(n), "file truncated: read %d of the %d bytes at offset %d", n, len(p), off)
	}
	return fmt.Errorf("safetensors: read %d bytes at offset %d: %w", len(p), off, err)
}

// entry is a tensor being parsed, with where its entry began for errors.
type entry struct {
	Tensor
	at int64
}

// parser walks the header's JSON tokens. Values are never decoded
// generically: each token is checked against what may come next, so
// nesting depth and allocation stay bounded by the header's length.
type parser struct {
	dec *json.Decoder
}

// at returns the file offset of the decoder's position.
func (p *parser) at() int64 { return 8 + p.dec.InputOffset() }

// token returns the next JSON token; a syntax error is a FormatError.
func (p *parser) token() (json.Token, error) {
	at := p.at()
	tok, err := p.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, formatErr(8+se.Offset, "header is not valid JSON: %v", se)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, formatErr(at, "header JSON ends early")
		}
		return nil, formatErr(at, "header is not valid JSON: %v", err)
	}
	return tok, nil
}

// delim consumes the delimiter want ('{' or '['); what names the value.
func (p *parser) delim(want json.Delim, what string) error {
	at := p.at()
	tok, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		kind := "an object"
		if want == '[' {
			kind = "an array"
		}
		return formatErr(at, "%s is %s, not %s", what, describe(tok), kind)
	}
	return nil
}

// str consumes a string token; what names the value.
func (p *parser) str(what string) (string, error) {
	at := p.at()
	tok, err := p.token()
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", formatErr(at, "%s is %s, not a string", what, describe(tok))
	}
	return s, nil
}

// integer consumes a non-negative JSON integer, element i of the array
// named array.
func (p *parser) integer(array string, i int) (int64, error) {
	what := func() string { return fmt.Sprintf("%s element %d", array, i) }
	at := p.at()
	tok, err := p.token()
	if err != nil {
		return 0, err
	}
	num, ok := tok.(json.Number)
	if !ok {
		return 0, formatErr(at, "%s is %s, not an integer", what(), describe(tok))
	}
	v, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, formatErr(at, "%s, %s, does not fit in an int64", what(), num)
		}
		return 0, formatErr(at, "%s, %s, is not an integer", what(), num)
	}
	if v < 0 {
		return 0, formatErr(at, "%s, %d, is negative", what(), v)
	}
	return v, nil
}

// describe names a token's kind for an error message.
func describe(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return "an object"
		case '[':
			return "an array"
		}
		return "the end of a container"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// parseHeader validates the header bytes hdr of a file of size bytes.
func parseHeader(hdr []byte, size int64) (*Header, error) {
	dataStart := 8 + int64(len(hdr))
	if err := checkUTF8(hdr); err != nil {
		return nil, err
	}
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, formatErr(8, "header does not begin with '{'")
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	p := &parser{dec: dec}
	if err := p.delim('{', "header"); err != nil {
		return nil, err
	}
	h := &Header{DataStart: dataStart}
	entries, metadata, err := p.members(dataStart, size-dataStart)
	if err != nil {
		return nil, err
	}
	h.Metadata = metadata
	if _, err := p.token(); err != nil { // the closing '}': More said so
		return nil, err
	}
	at := p.at()
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, formatErr(at, "data after the header's JSON object")
	}

	h.Tensors = make([]Tensor, len(entries))
	where := make(map[string]int64, len(entries))
	for i, e := range entries {
		h.Tensors[i] = e.Tensor
		where[e.Name] = e.at
	}
	h.index = sortTensors(h.Tensors)
	end, err := checkLayout(h.Tensors, where, dataStart)
	if err != nil {
		return nil, err
	}
	if end != size {
		return nil, formatErr(end, "%d bytes after the last tensor's data (the data region ends at %d, the file at %d)", size-end, end, size)
	}
	h.DataEnd = end
	return h, nil
}

// checkUTF8 reports a header that is not valid UTF-8, at the file offset
// of its first invalid byte: the format requires UTF-8, and encoding/json
// would replace invalid bytes in strings with U+FFFD rather than fail.
func checkUTF8(hdr []byte) error {
	if utf8.Valid(hdr) {
		return nil
	}
	i := 0
	for i < len(hdr) {
		r, n := utf8.DecodeRune(hdr[i:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		i += n
	}
	return formatErr(8+int64(i), "header is not valid UTF-8")
}

// members parses the members of the header's object up to its closing
// '}', which it leaves unread, and returns the tensors, checked against
// the data region of dataLen bytes at dataStart, in the order they
// appear, and the metadata (nil when absent or null). A key may appear
// only once.
func (p *parser) members(dataStart, dataLen int64) ([]entry, map[string]string, error) {
	var entries []entry
	var metadata map[string]string
	seen := map[string]bool{}
	for p.dec.More() {
		at := p.at()
		name, err := p.str("key")
		if err != nil {
			return nil, nil, err
		}
		if seen[name] {
			return nil, nil, formatErr(at, "key %s appears twice", quote(name))
		}
		seen[name] = true
		if name == metadataKey {
			if metadata, err = p.metadata(); err != nil {
				return nil, nil, err
			}
			continue
		}
		e, err := p.entry(name, at, dataStart, dataLen)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	return entries, metadata, nil
}

// checkLayout checks that the tensors, sorted by offset, tile the data
// region from dataStart without gaps or overlaps, naming a tensor at
// fault by where its entry began, and returns the file offset at which
// the last one ends (dataStart when there are none).
func checkLayout(tensors []Tensor, where map[string]int64, dataStart int64) (int64, error) {
	end := dataStart
	prev := ""
	for i, t := range tensors {
		switch {
		case t.Begin < end:
			return 0, formatErr(where[t.Name], "tensor %s, bytes [%d, %d) of the data, overlaps tensor %s, which ends at %d",
				quote(t.Name), t.Begin-dataStart, t.End-dataStart, quote(prev), end-dataStart)
		case t.Begin > end && i == 0:
			return 0, formatErr(where[t.Name], "the first tensor, %s, begins at data offset %d, leaving bytes [0, %d) unused",
				quote(t.Name), t.Begin-dataStart, t.Begin-dataStart)
		case t.Begin > end:
			return 0, formatErr(where[t.Name], "tensor %s begins at data offset %d, leaving bytes [%d, %d) after tensor %s unused",
				quote(t.Name), t.Begin-dataStart, end-dataStart, t.Begin-dataStart, quote(prev))
		}
		end, prev = t.End, t.Name
	}
	return end, nil
}

// metadata parses the value of "__metadata__": null or an object of strings.
func (p *parser) metadata() (map[string]string, error) {
	at := p.at()
	tok, err := p.token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, formatErr(at, "%s is %s, not an object", metadataKey, describe(tok))
	}
	m := map[string]string{}
	for p.dec.More() {
		at := p.at()
		k, err := p.str(metadataKey + " key")
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, formatErr(at, "%s key %s appears twice", metadataKey, quote(k))
		}
		v, err := p.str(metadataKey + " value of " + quote(k))
		if err != nil {
			return nil, err
		}
		m[k] = v
	}
	_, err = p.token() // '}'
	return m, err
}

// entryFields are the fields of a tensor's object, each required once, in
// the order a missing one is reported.
var entryFields = []string{"dtype", "shape", "data_offsets"}

// entry parses the object of tensor name, whose key began at file offset
// at, checking it against the data region of dataLen bytes at dataStart.
func (p *parser) entry(name string, at, dataStart, dataLen int64) (entry, error) {
	what := "tensor " + quote(name)
	if err := p.delim('{', what); err != nil {
		return entry{}, err
	}
	e := entry{Tensor: Tensor{Name: name}, at: at}
	have := map[string]bool{}
	var offsets []int64
	for p.dec.More() {
		fat := p.at()
		field, err := p.str(what + " field name")
		if err != nil {
			return entry{}, err
		}
		switch {
		case !slices.Contains(entryFields, field):
			return entry{}, formatErr(fat, "%s has unknown field %s (only dtype, shape and data_offsets)", what, quote(field))
		case have[field]:
			return entry{}, formatErr(fat, "%s has field %s twice", what, field)
		}
		have[field] = true
		if err := p.entryField(field, what, fat, &e, &offsets); err != nil {
			return entry{}, err
		}
	}
	if _, err := p.token(); err != nil { // '}'
		return entry{}, err
	}
	for _, f := range entryFields {
		if !have[f] {
			return entry{}, formatErr(at, "%s has no %s", what, f)
		}
	}
	if err := e.place(what, offsets[0], offsets[1], dataStart, dataLen); err != nil {
		return entry{}, err
	}
	return e, nil
}

// entryField parses the value of field (one of entryFields), which began
// at file offset fat, into e or offsets.
func (p *parser) entryField(field, what string, fat int64, e *entry, offsets *[]int64) error {
	var err error
	switch field {
	case "dtype":
		var s string
		if s, err = p.str(what + " dtype"); err != nil {
			return err
		}
		e.DType = DType(s)
		if e.DType.ElemSize() == 0 {
			return formatErr(fat, "%s has unknown dtype %s", what, quote(s))
		}
	case "shape":
		e.Shape, err = p.ints(what+" shape", "dimensions", MaxRank, fat)
	case "data_offsets":
		if *offsets, err = p.ints(what+" data_offsets", "elements", 2, fat); err == nil && len(*offsets) != 2 {
			err = formatErr(fat, "%s data_offsets has %d elements, not 2", what, len(*offsets))
		}
	}
	return err
}

// place checks the data offsets [begin, end) against the data region of
// dataLen bytes and e's shape and dtype, and sets e's file offsets.
func (e *entry) place(what string, begin, end, dataStart, dataLen int64) error {
	if begin > end {
		return formatErr(e.at, "%s data_offsets [%d, %d] begin after they end", what, begin, end)
	}
	if end > dataLen {
		return formatErr(e.at, "%s data_offsets [%d, %d] run past the end of the file (%d data bytes)", what, begin, end, dataLen)
	}
	_, n, reason := byteLen(e.Shape, e.DType)
	if reason != "" {
		return formatErr(e.at, "%s: %s", what, reason)
	}
	if end-begin != n {
		return formatErr(e.at, "%s data_offsets [%d, %d] hold %d bytes, but shape %v of %s needs %d",
			what, begin, end, end-begin, e.Shape, e.DType, n)
	}
	e.Begin, e.End = dataStart+begin, dataStart+end
	return nil
}

// ints parses an array of at most max non-negative integers; one more is
// an error, so that a hostile array is never held whole. what names the
// array, elems its elements; at is where the field began.
func (p *parser) ints(what, elems string, max int, at int64) ([]int64, error) {
	if err := p.delim('[', what); err != nil {
		return nil, err
	}
	vs := []int64{}
	for p.dec.More() {
		if len(vs) == max {
			return nil, formatErr(at, "%s has more than %d %s", what, max, elems)
		}
		v, err := p.integer(what, len(vs))
		if err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	_, err := p.token() // ']'
	return vs, err
}
