package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

// oracleEntry is one tensor entry as the oracle's own writer spells it.
type oracleEntry struct {
	name   string
	dtype  string
	shape  []int64
	offs   [2]int64
	fields []int // the order of dtype (0), shape (1) and data_offsets (2)
}

// oracleNames and oracleDTypes are what the oracle picks names and dtypes
// from: valid ones, the reserved key, names equal once decoded, and dtypes
// Parse must refuse.
var (
	oracleNames  = []string{"a", "b", "é", "", "q\"\\", "\n", metadataKey, "日本", "𝄞"}
	oracleDTypes = append(slices.Collect(func(yield func(string) bool) {
		for _, d := range dtypes {
			if !yield(string(d)) {
				return
			}
		}
	}), "f32", "F4", "F6_E2M3", "", "F32 ")
)

// oracleHeader writes the JSON header of entries (and metadata, placed
// before entry metaAt, or last) with the oracle's own writer: sep between
// tokens, every non-ASCII rune of a name escaped as \uXXXX when escape is
// set, padded with pad spaces.
func oracleHeader(entries []oracleEntry, metadata map[string]string, metaAt int, sep string, escape bool, pad int) string {
	str := func(s string) string {
		if !escape {
			b, _ := json.Marshal(s)
			return string(b)
		}
		var b strings.Builder
		b.WriteByte('"')
		for _, r := range s {
			switch {
			case r == '"' || r == '\\':
				b.WriteByte('\\')
				b.WriteRune(r)
			case r < 0x20 || r > 0x7e:
				for _, u := range utf16.Encode([]rune{r}) {
					fmt.Fprintf(&b, "\\u%04x", u)
				}
			default:
				b.WriteRune(r)
			}
		}
		b.WriteByte('"')
		return b.String()
	}
	var parts []string
	for _, e := range entries {
		var dims []string
		for _, d := range e.shape {
			dims = append(dims, fmt.Sprint(d))
		}
		fields := []string{
			str("dtype") + ":" + sep + str(e.dtype),
			str("shape") + ":" + sep + "[" + strings.Join(dims, ","+sep) + "]",
			fmt.Sprintf(`"data_offsets":%s[%d,%s%d]`, sep, e.offs[0], sep, e.offs[1]),
		}
		var ordered []string
		for _, f := range e.fields {
			ordered = append(ordered, fields[f])
		}
		parts = append(parts, str(e.name)+sep+":"+sep+"{"+sep+strings.Join(ordered, ","+sep)+sep+"}")
	}
	if metadata != nil {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(metadata)) {
			kv = append(kv, str(k)+sep+":"+sep+str(metadata[k]))
		}
		parts = slices.Insert(parts, min(metaAt, len(parts)), str(metadataKey)+":"+sep+"{"+strings.Join(kv, ","+sep)+"}")
	}
	return "{" + sep + strings.Join(parts, ","+sep) + sep + "}" + strings.Repeat(" ", pad)
}

// oracleValid decides, independently of Parse, whether a file of entries
// with dataLen data bytes is valid, and returns the tensors Parse must
// report (offsets relative to the data region) when it is.
func oracleValid(entries []oracleEntry, dataLen int64) ([]Tensor, bool) {
	names := map[string]bool{}
	var ts []Tensor
	for _, e := range entries {
		if names[e.name] || e.name == metadataKey {
			return nil, false
		}
		names[e.name] = true
		size := int64(DType(e.dtype).ElemSize())
		if size == 0 || len(e.shape) > MaxRank {
			return nil, false
		}
		n := big.NewInt(1)
		for _, d := range e.shape {
			n.Mul(n, big.NewInt(d))
			if !n.IsInt64() {
				return nil, false // the running product overflows
			}
		}
		n.Mul(n, big.NewInt(size))
		begin, end := e.offs[0], e.offs[1]
		if !n.IsInt64() || begin < 0 || begin > end || end > dataLen || end-begin != n.Int64() {
			return nil, false
		}
		ts = append(ts, Tensor{Name: e.name, DType: DType(e.dtype), Shape: append([]int64{}, e.shape...), Begin: begin, End: end})
	}
	slices.SortFunc(ts, func(a, b Tensor) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End), strings.Compare(a.Name, b.Name))
	})
	at := int64(0)
	for _, t := range ts {
		if t.Begin != at {
			return nil, false // a gap or an overlap
		}
		at = t.End
	}
	return ts, at == dataLen
}

// FuzzParseOracle builds tensor entries from the fuzzer's bytes, mostly
// laid out validly and sometimes broken (a gap, an overlap, a wrong
// length, a duplicate or reserved name, an unknown dtype, an overflowing
// shape), writes the header with the test's own JSON writer (any field
// order, metadata anywhere, whitespace between tokens, escaped names),
// and checks that Parse accepts exactly the files the independent oracle
// finds valid, reporting exactly the oracle's tensors, every one inside
// the data region, and that otherwise it returns a *FormatError.
func FuzzParseOracle(f *testing.F) {
	f.Add([]byte{2, 0, 3, 2, 2, 2, 0, 0, 1, 10, 1, 0, 0, 1, 0, 0, 0}, "pt")
	f.Add([]byte{3, 4, 14, 1, 3, 5, 1, 2, 6, 1, 0, 7, 9, 0, 1, 2, 1}, "")
	f.Add([]byte{2, 0, 12, 1, 4, 7, 0, 1, 5, 2, 1, 1, 4, 6, 2, 1, 1}, "k")
	f.Fuzz(func(t *testing.T, in []byte, meta string) {
		if len(in) > 128 || len(meta) > 16 {
			t.Skip() // longer inputs reach no new code
		}
		next := func() int {
			if len(in) == 0 {
				return 0
			}
			v := int(in[0])
			in = in[1:]
			return v
		}
		var entries []oracleEntry
		at := int64(0) // where the next tensor begins in a valid layout
		for range next() % 5 {
			e := oracleEntry{name: oracleNames[next()%len(oracleNames)], dtype: oracleDTypes[next()%len(oracleDTypes)]}
			for range next() % 4 {
				d := int64(next() % 5)
				if d == 4 && next()%4 == 3 {
					d = 1 << 40 // two of them overflow a product
				}
				e.shape = append(e.shape, d)
			}
			n := int64(0)
			if size := DType(e.dtype).ElemSize(); size > 0 {
				p := big.NewInt(int64(size))
				for _, d := range e.shape {
					p.Mul(p, big.NewInt(d))
				}
				if p.IsInt64() && p.Int64() <= 1<<12 {
					n = p.Int64()
				}
			}
			e.offs = [2]int64{at, at + n}
			switch next() % 10 {
			case 6: // a gap before the tensor
				e.offs[0]++
				e.offs[1]++
			case 7: // one byte too many
				e.offs[1]++
			case 8: // overlapping the tensor before
				e.offs[0], e.offs[1] = max(0, at-1), max(0, at-1)+n
			case 9: // end before begin
				e.offs[0], e.offs[1] = e.offs[1]+1, e.offs[0]
			}
			at = max(at, e.offs[1])
			e.fields = [][]int{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {1, 2, 0}, {0, 2, 1}, {2, 0, 1}}[next()%6]
			entries = append(entries, e)
		}
		dataLen := at + int64(next()%4/3) // now and then a trailing byte
		var metadata map[string]string
		if meta != "" {
			meta = strings.ToValidUTF8(meta, "?") // a header of invalid UTF-8 is another test's concern
			metadata = map[string]string{"format": meta, meta: "v"}
		}
		sep := []string{"", " ", "\n\t", "\r\n  "}[next()%4]
		hdr := oracleHeader(entries, metadata, next()%(len(entries)+1), sep, next()%2 == 1, next()%8)
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
		b = append(b, hdr...)
		for i := range dataLen {
			b = append(b, byte(i))
		}

		want, valid := oracleValid(entries, dataLen)
		h, err := parseBytes(b)
		if !valid {
			var fe *FormatError
			if err == nil || !errors.Is(err, ErrFormat) || !errors.As(err, &fe) {
				t.Fatalf("header %s with %d data bytes: Parse = %+v, %v; the oracle finds it invalid", hdr, dataLen, h, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("header %s with %d data bytes: %v; the oracle finds it valid", hdr, dataLen, err)
		}
		checkHeader(t, h, b)
		start := int64(8 + len(hdr))
		for i := range want {
			want[i].Begin += start
			want[i].End += start
		}
		if len(want) == 0 {
			want = []Tensor{}
		}
		if !reflect.DeepEqual(h.Tensors, want) {
			t.Fatalf("header %s: Tensors = %+v, want %+v", hdr, h.Tensors, want)
		}
		if !maps.Equal(h.Metadata, metadata) || (h.Metadata == nil) != (metadata == nil) {
			t.Fatalf("header %s: Metadata = %v, want %v", hdr, h.Metadata, metadata)
		}
		if h.DataStart != start || h.DataEnd != start+dataLen {
			t.Fatalf("DataStart, DataEnd = %d, %d, want %d, %d", h.DataStart, h.DataEnd, start, start+dataLen)
		}
		// Every tensor lies inside the data region, and no two overlap.
		for i, tn := range h.Tensors {
			if tn.Begin < h.DataStart || tn.End > h.DataEnd || tn.Begin > tn.End {
				t.Fatalf("tensor %q [%d, %d) outside the data region [%d, %d)", tn.Name, tn.Begin, tn.End, h.DataStart, h.DataEnd)
			}
			if i > 0 && tn.Begin < h.Tensors[i-1].End {
				t.Fatalf("tensors %q and %q overlap", h.Tensors[i-1].Name, tn.Name)
			}
		}
		if !bytes.Equal(b[h.DataStart:h.DataEnd], b[start:]) {
			t.Fatal("data region")
		}
	})
}
