package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// file returns a safetensors file: the length of header, header, then
// dataLen bytes of data (0, 1, 2, ...).
func file(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	for i := range dataLen {
		b = append(b, byte(i))
	}
	return b
}

// withLen returns an 8-byte length n followed by rest.
func withLen(n uint64, rest string) []byte {
	b := binary.LittleEndian.AppendUint64(nil, n)
	return append(b, rest...)
}

func parseBytes(b []byte) (*Header, error) {
	return Parse(bytes.NewReader(b), int64(len(b)))
}

func TestParseValid(t *testing.T) {
	// As the reference writer lays a file out: metadata first, keys in any
	// order, the header padded with spaces to a multiple of 8.
	hdr := `{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	b := file(hdr, 16)
	h, err := parseBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	start := int64(8 + len(hdr))
	want := []Tensor{
		{Name: "a", DType: F32, Shape: []int64{2}, Begin: start, End: start + 8},
		{Name: "b", DType: F16, Shape: []int64{2, 2}, Begin: start + 8, End: start + 16},
	}
	if !reflect.DeepEqual(h.Tensors, want) {
		t.Errorf("Tensors = %+v, want %+v", h.Tensors, want)
	}
	if !maps.Equal(h.Metadata, map[string]string{"format": "pt"}) {
		t.Errorf("Metadata = %v", h.Metadata)
	}
	if h.DataStart != start || h.DataEnd != int64(len(b)) {
		t.Errorf("DataStart, DataEnd = %d, %d, want %d, %d", h.DataStart, h.DataEnd, start, len(b))
	}
	if tb, ok := h.Lookup("b"); !ok || tb.Begin != start+8 || tb.NumElements() != 4 || tb.Size() != 8 {
		t.Errorf("Lookup(b) = %+v, %v", tb, ok)
	}
	if _, ok := h.Lookup("c"); ok {
		t.Error("Lookup(c) found a tensor the file does not have")
	}
	if !bytes.Equal(b[want[1].Begin:want[1].End], []byte{8, 9, 10, 11, 12, 13, 14, 15}) {
		t.Error("tensor b's offsets do not point at its bytes")
	}
}

func TestParseValidEdges(t *testing.T) {
	for _, c := range []struct {
		name, hdr string
		data      int
		tensors   []string // names in the order Parse must return them
		meta      map[string]string
	}{
		{"empty", `{}`, 0, nil, nil},
		{"metadata only", `{"__metadata__":{"k":"v","":""}}`, 0, nil, map[string]string{"k": "v", "": ""}},
		{"null metadata", `{"__metadata__":null}`, 0, nil, nil},
		{"empty metadata", `{"__metadata__":{}}`, 0, nil, map[string]string{}},
		{"scalar", `{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}`, 8, []string{"s"}, nil},
		{"zero-size tensors sort before the tensor at their offset, by name",
			`{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"z2":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"z1":{"dtype":"BF16","shape":[5,0],"data_offsets":[4,4]},"y":{"dtype":"BOOL","shape":[1],"data_offsets":[4,5]},"z0":{"dtype":"I8","shape":[0],"data_offsets":[0,0]}}`,
			5, []string{"z0", "x", "z1", "z2", "y"}, nil},
		{"only zero-size", `{"a":{"dtype":"F64","shape":[0],"data_offsets":[0,0]}}`, 0, []string{"a"}, nil},
		{"trailing JSON whitespace", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} \t\r\n", 1, []string{"a"}, nil},
		{"inner whitespace", "{ \"a\" : { \"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , 2 ] , \"dtype\" : \"F16\" } }", 2, []string{"a"}, nil},
		{"escaped and non-ASCII names", `{"\u00e9\n\"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"日本":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2, []string{"é\n\"", "日本"}, nil},
		{"every dtype", everyDType(), 8 * len(dtypes), nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := file(c.hdr, c.data)
			h, err := parseBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			checkHeader(t, h, b)
			if c.tensors != nil {
				var got []string
				for _, tn := range h.Tensors {
					got = append(got, tn.Name)
				}
				if !reflect.DeepEqual(got, c.tensors) {
					t.Errorf("tensors %q, want %q", got, c.tensors)
				}
			}
			if !maps.Equal(h.Metadata, c.meta) || (h.Metadata == nil) != (c.meta == nil) {
				t.Errorf("Metadata = %#v, want %#v", h.Metadata, c.meta)
			}
		})
	}
}

// everyDType returns a header with one 8-byte tensor of each dtype.
func everyDType() string {
	var parts []string
	for i, d := range dtypes {
		parts = append(parts, fmt.Sprintf(`"t%d":{"dtype":"%s","shape":[%d],"data_offsets":[%d,%d]}`, i, d, 8/d.ElemSize(), 8*i, 8*i+8))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// tensor returns one tensor entry for a header.
func tensor(name, dtype, shape string, begin, end int64) string {
	return fmt.Sprintf(`%q:{"dtype":%q,"shape":%s,"data_offsets":[%d,%d]}`, name, dtype, shape, begin, end)
}

// obj joins entries into a header object.
func obj(entries ...string) string { return "{" + strings.Join(entries, ",") + "}" }

// malformed lists files Parse must reject, each with a fragment of the
// reason it must give (so that the intended check, not another, fires).
var malformed = []struct {
	name string
	file []byte
	want string
}{
	{"empty file", nil, "shorter than the 8-byte"},
	{"7 bytes", []byte{1, 2, 3, 4, 5, 6, 7}, "shorter than the 8-byte"},
	{"length only, zero", withLen(0, ""), "does not begin with '{'"},
	{"length 2^64-1", withLen(1<<64-1, "{}"), "exceeds the limit"},
	{"length 2^63", withLen(1<<63, "{}"), "exceeds the limit"},
	{"length just over the limit", withLen(MaxHeaderSize+1, "{}"), "exceeds the limit"},
	{"length past the end of the file", withLen(100, "{}"), "runs past the end"},
	{"length one past the end", withLen(3, "{}"), "runs past the end"},
	{"truncated JSON", file(`{"a":{"dtype":"F32"`, 0), "ends early"},
	{"truncated mid-string", file(`{"a`, 0), "ends early"},
	{"array, not object", file(`[]`, 0), "does not begin with '{'"},
	{"string, not object", file(`"x"`, 0), "does not begin with '{'"},
	{"null, not object", file(`null`, 0), "does not begin with '{'"},
	{"leading whitespace", file(` {}`, 0), "does not begin with '{'"},
	{"invalid UTF-8 in a name", file("{\"a\xff\":{}}", 0), "not valid UTF-8"},
	{"invalid UTF-8 after the object", file("{}\xc3", 0), "not valid UTF-8"},
	{"trailing garbage", file(`{}x`, 0), "data after the header"},
	{"second object", file(`{}{}`, 0), "data after the header"},
	{"trailing NUL padding", file("{}\x00\x00", 0), "data after the header"},
	{"trailing comma", file(`{"__metadata__":{},}`, 0), "not valid JSON"},
	{"duplicate tensor", file(obj(tensor("a", "U8", "[1]", 0, 1), tensor("a", "U8", "[1]", 1, 2)), 2), `key "a" appears twice`},
	{"duplicate metadata", file(`{"__metadata__":{},"__metadata__":{}}`, 0), "appears twice"},
	{"duplicate metadata key", file(`{"__metadata__":{"k":"1","k":"2"}}`, 0), `key "k" appears twice`},
	{"metadata a number", file(`{"__metadata__":5}`, 0), "__metadata__ is a number, not an object"},
	{"metadata value a number", file(`{"__metadata__":{"k":1}}`, 0), "not a string"},
	{"metadata value an object", file(`{"__metadata__":{"k":{}}}`, 0), "not a string"},
	{"entry a number", file(`{"a":5}`, 0), `tensor "a" is a number, not an object`},
	{"entry an array", file(`{"a":[]}`, 0), "not an object"},
	{"unknown dtype", file(obj(tensor("a", "F128", "[1]", 0, 16)), 16), `unknown dtype "F128"`},
	{"lower-case dtype", file(obj(tensor("a", "f32", "[1]", 0, 4)), 4), `unknown dtype "f32"`},
	{"sub-byte dtype", file(obj(tensor("a", "F4", "[2]", 0, 1)), 1), `unknown dtype "F4"`},
	{"dtype a number", file(`{"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}`, 4), "dtype is a number, not a string"},
	{"negative dimension", file(obj(tensor("a", "U8", "[-1]", 0, 0)), 0), "is negative"},
	{"fractional dimension", file(obj(tensor("a", "U8", "[1.5]", 0, 1)), 1), "is not an integer"},
	{"exponent dimension", file(obj(tensor("a", "U8", "[1e0]", 0, 1)), 1), "is not an integer"},
	{"string dimension", file(obj(tensor("a", "U8", `["1"]`, 0, 1)), 1), "a string, not an integer"},
	{"nested shape", file(obj(tensor("a", "U8", "[[1]]", 0, 1)), 1), "an array, not an integer"},
	{"shape an object", file(obj(tensor("a", "U8", "{}", 0, 1)), 1), "shape is an object, not an array"},
	{"dimension beyond int64", file(obj(tensor("a", "U8", "[9223372036854775808]", 0, 1)), 1), "does not fit in an int64"},
	{"element count overflows", file(obj(tensor("a", "U8", "[4294967296,4294967296]", 0, 1)), 1), "element count overflows"},
	{"overflow before a zero dimension", file(obj(tensor("a", "U8", "[4294967296,4294967296,0]", 0, 0)), 0), "element count overflows"},
	{"byte length overflows", file(obj(tensor("a", "F64", "[2305843009213693952]", 0, 1)), 1), "byte length overflows"},
	{"rank beyond MaxRank", file(obj(tensor("a", "U8", "["+strings.Repeat("1,", MaxRank)+"1]", 0, 1)), 1), "more than 64 dimensions"},
	{"one offset", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}`, 1), "has 1 elements, not 2"},
	{"three offsets", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 2), "more than 2 elements"},
	{"offsets not an array", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":0}}`, 1), "data_offsets is a number, not an array"},
	{"string offsets", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}}`, 1), "not an integer"},
	{"negative offset", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[-1,-1]}}`, 0), "is negative"},
	{"begin after end", file(obj(tensor("a", "U8", "[1]", 2, 1)), 2), "begin after they end"},
	{"end past the file", file(obj(tensor("a", "U8", "[8]", 0, 8)), 4), "run past the end of the file"},
	{"end far past the file", file(obj(tensor("a", "U8", "[9223372036854775807]", 0, 9223372036854775807)), 4), "run past the end of the file"},
	{"length mismatch", file(obj(tensor("a", "F32", "[2]", 0, 4)), 4), "hold 4 bytes, but shape [2] of F32 needs 8"},
	{"overlap", file(obj(tensor("a", "U8", "[8]", 0, 8), tensor("b", "U8", "[8]", 4, 12)), 12), `tensor "b", bytes [4, 12) of the data, overlaps tensor "a"`},
	{"same range twice", file(obj(tensor("a", "U8", "[8]", 0, 8), tensor("b", "U8", "[8]", 0, 8)), 8), "overlaps"},
	{"zero-size inside another", file(obj(tensor("a", "U8", "[8]", 0, 8), tensor("z", "U8", "[0]", 4, 4)), 8), `tensor "z", bytes [4, 4) of the data, overlaps`},
	{"gap", file(obj(tensor("a", "U8", "[4]", 0, 4), tensor("b", "U8", "[4]", 8, 12)), 12), "leaving bytes [4, 8) after tensor \"a\" unused"},
	{"gap at the start", file(obj(tensor("a", "U8", "[4]", 4, 8)), 8), "begins at data offset 4, leaving bytes [0, 4) unused"},
	{"bytes after the last tensor", file(obj(tensor("a", "U8", "[4]", 0, 4)), 5), "1 bytes after the last tensor"},
	{"data but no tensors", file(`{}`, 1), "1 bytes after the last tensor"},
	{"missing dtype", file(`{"a":{"shape":[1],"data_offsets":[0,1]}}`, 1), "has no dtype"},
	{"missing shape", file(`{"a":{"dtype":"U8","data_offsets":[0,1]}}`, 1), "has no shape"},
	{"missing offsets", file(`{"a":{"dtype":"U8","shape":[1]}}`, 1), "has no data_offsets"},
	{"unknown field", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"offsets":[0,1]}}`, 1), `unknown field "offsets"`},
	{"field in another case", file(`{"a":{"DType":"U8","shape":[1],"data_offsets":[0,1]}}`, 1), `unknown field "DType"`},
	{"field twice", file(`{"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}`, 1), "field dtype twice"},
	{"shape twice", file(`{"a":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]}}`, 1), "field shape twice"},
	{"key not a string", file(`{1:{}}`, 0), "not valid JSON"},
	{"deep nesting", file(`{"a":{"dtype":"U8","shape":`+strings.Repeat("[", 100000), 0), "an array, not an integer"},
}

func TestParseMalformed(t *testing.T) {
	if len(malformed) < 25 {
		t.Fatalf("only %d malformed cases", len(malformed))
	}
	for _, c := range malformed {
		t.Run(c.name, func(t *testing.T) {
			h, err := parseBytes(c.file)
			if err == nil {
				t.Fatalf("accepted: %+v", h)
			}
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			if fe.Offset > int64(len(c.file)) {
				t.Errorf("offset %d beyond the %d-byte file", fe.Offset, len(c.file))
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}

func TestFormatErrorOffset(t *testing.T) {
	b := file(obj(tensor("a", "U8", "[1]", 0, 1), tensor("b", "X9", "[1]", 1, 2)), 2)
	_, err := parseBytes(b)
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v is not a *FormatError", err)
	}
	// The offset is that of the "dtype" field of tensor b.
	want := int64(bytes.Index(b, []byte(`"b"`)))
	if fe.Offset < want || fe.Offset > int64(bytes.Index(b, []byte(`"X9"`))) {
		t.Errorf("offset %d, want within tensor b's entry (from %d)", fe.Offset, want)
	}
}

func TestParseArguments(t *testing.T) {
	if _, err := Parse(nil, 100); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil reader: %v, want ErrInvalid", err)
	}
	if _, err := Parse(bytes.NewReader(file(`{}`, 0)), -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative size: %v, want ErrInvalid", err)
	}
}

// recorder is a ReaderAt over b that records the ranges read and fails
// with err at or beyond failAt.
type recorder struct {
	b      []byte
	reads  [][2]int64
	failAt int64
	err    error
}

func (r *recorder) ReadAt(p []byte, off int64) (int, error) {
	r.reads = append(r.reads, [2]int64{off, off + int64(len(p))})
	if r.err != nil && off+int64(len(p)) > r.failAt {
		return 0, r.err
	}
	if off >= int64(len(r.b)) {
		return 0, io.EOF
	}
	n := copy(p, r.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestParseReadError(t *testing.T) {
	boom := errors.New("disk on fire")
	r := &recorder{b: file(`{}`, 0), failAt: 8, err: boom}
	_, err := Parse(r, 10)
	if !errors.Is(err, boom) || errors.Is(err, ErrFormat) {
		t.Errorf("error %v: want the reader's error, not ErrFormat", err)
	}
}

func TestParseTruncated(t *testing.T) {
	// The caller's size claims more than the reader holds: the header read
	// comes up short.
	b := file(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4)
	_, err := Parse(bytes.NewReader(b[:20]), int64(len(b)))
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("error %v, want a truncated-file ErrFormat", err)
	}
}

func TestParseReadsOnlyHeader(t *testing.T) {
	// A 1 TiB file: Parse reads the prefix and the header, nothing else.
	hdr := obj(tensor("w", "F32", "[268435456,1024]", 0, 1<<40))
	b := file(hdr, 0)
	r := &recorder{b: b}
	h, err := Parse(r, int64(len(b))+1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := h.Lookup("w"); w.Size() != 1<<40 {
		t.Errorf("tensor w holds %d bytes, want 2^40", w.Size())
	}
	for _, rd := range r.reads {
		if rd[1] > int64(len(b)) {
			t.Errorf("read [%d, %d) beyond the header (%d bytes)", rd[0], rd[1], len(b))
		}
	}
}

func TestParseHeaderLimit(t *testing.T) {
	lowerLimit(t, 16)
	at := file(`{}              `, 0) // 16 bytes
	if _, err := parseBytes(at); err != nil {
		t.Errorf("header of exactly the limit: %v", err)
	}
	over := file(`{}               `, 0) // 17 bytes
	if _, err := parseBytes(over); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "exceeds the limit of 16") {
		t.Errorf("header one past the limit: %v", err)
	}
}

func TestParseHugeLengthReadsNothing(t *testing.T) {
	// A header length beyond the limit or the file is refused from the
	// prefix alone: nothing past the first 8 bytes is read (or allocated).
	for _, n := range []uint64{1<<64 - 1, MaxHeaderSize + 1, 50} {
		r := &recorder{b: withLen(n, "{}")}
		if _, err := Parse(r, 10); !errors.Is(err, ErrFormat) {
			t.Errorf("length %d: %v, want ErrFormat", n, err)
		}
		if len(r.reads) != 1 || r.reads[0] != [2]int64{0, 8} {
			t.Errorf("length %d: reads %v, want only [0, 8)", n, r.reads)
		}
	}
}
