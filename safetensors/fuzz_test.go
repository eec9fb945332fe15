package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"math/big"
	"reflect"
	"testing"
	"unicode/utf8"
)

// checkHeader fails t unless h, accepted for the file b, satisfies every
// invariant Parse promises.
func checkHeader(t *testing.T, h *Header, b []byte) {
	t.Helper()
	n := int64(binary.LittleEndian.Uint64(b[:8]))
	if h.DataStart != 8+n || h.DataStart > int64(len(b)) {
		t.Fatalf("DataStart %d, want 8 + %d within the %d-byte file", h.DataStart, n, len(b))
	}
	if h.DataEnd != int64(len(b)) {
		t.Fatalf("DataEnd %d, want the file size %d", h.DataEnd, len(b))
	}
	end := h.DataStart
	names := map[string]bool{}
	for i, tn := range h.Tensors {
		if tn.DType.ElemSize() == 0 {
			t.Fatalf("tensor %q: dtype %q accepted", tn.Name, tn.DType)
		}
		if len(tn.Shape) > MaxRank {
			t.Fatalf("tensor %q: rank %d", tn.Name, len(tn.Shape))
		}
		// The element count and byte length, in exact arithmetic.
		bytes := big.NewInt(int64(tn.DType.ElemSize()))
		for _, d := range tn.Shape {
			if d < 0 {
				t.Fatalf("tensor %q: negative dimension in %v", tn.Name, tn.Shape)
			}
			bytes.Mul(bytes, big.NewInt(d))
		}
		if !bytes.IsInt64() || bytes.Int64() != tn.Size() {
			t.Fatalf("tensor %q: %d bytes for shape %v of %s (%v)", tn.Name, tn.Size(), tn.Shape, tn.DType, bytes)
		}
		if tn.NumElements()*int64(tn.DType.ElemSize()) != tn.Size() {
			t.Fatalf("tensor %q: NumElements %d", tn.Name, tn.NumElements())
		}
		if tn.Begin != end || tn.End < tn.Begin || tn.End > h.DataEnd {
			t.Fatalf("tensor %q: [%d, %d), want to begin at %d and end by %d", tn.Name, tn.Begin, tn.End, end, h.DataEnd)
		}
		if i > 0 {
			p := h.Tensors[i-1]
			if p.Begin == tn.Begin && p.End == tn.End && p.Name >= tn.Name {
				t.Fatalf("tensors %q and %q out of order", p.Name, tn.Name)
			}
		}
		end = tn.End
		if names[tn.Name] || tn.Name == metadataKey || !utf8.ValidString(tn.Name) {
			t.Fatalf("tensor name %q repeated, reserved or not UTF-8", tn.Name)
		}
		names[tn.Name] = true
		if got, ok := h.Lookup(tn.Name); !ok || !reflect.DeepEqual(got, tn) {
			t.Fatalf("Lookup(%q) = %+v, %v", tn.Name, got, ok)
		}
	}
	if end != h.DataEnd {
		t.Fatalf("tensors end at %d, the data region at %d", end, h.DataEnd)
	}
	for k, v := range h.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			t.Fatalf("metadata %q: %q not UTF-8", k, v)
		}
	}
}

// rewrite writes the tensors and metadata of h, with their data from b,
// as a new file.
func rewrite(t *testing.T, h *Header, b []byte) ([]byte, *Header) {
	t.Helper()
	specs := make([]Spec, len(h.Tensors))
	for i, tn := range h.Tensors {
		specs[i] = Spec{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: func(w io.Writer) error {
			_, err := w.Write(b[tn.Begin:tn.End])
			return err
		}}
	}
	var buf bytes.Buffer
	wh, err := Write(&buf, specs, h.Metadata)
	if err != nil {
		t.Fatalf("Write of an accepted header: %v", err)
	}
	return buf.Bytes(), wh
}

// seeds are valid files for the fuzz targets to mutate.
func seeds() [][]byte {
	var out [][]byte
	for _, specs := range [][]Spec{
		nil,
		{{Name: "a", DType: F32, Shape: []int64{2, 2}}, {Name: "b", DType: I8, Shape: []int64{3}}},
		{{Name: "z", DType: BF16, Shape: []int64{0}}, {Name: "s", DType: F64}, {Name: "é", DType: Bool, Shape: []int64{1, 1, 2}}},
	} {
		var buf bytes.Buffer
		if _, err := Write(&buf, specs, map[string]string{"format": "pt"}); err != nil {
			panic(err)
		}
		out = append(out, buf.Bytes())
	}
	return out
}

func FuzzParse(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
	for _, c := range malformed {
		f.Add(c.file)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseBytes(b)
		if err != nil {
			var fe *FormatError
			if !errors.Is(err, ErrFormat) || !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			if fe.Offset < -1 || fe.Offset > int64(len(b)) {
				t.Fatalf("error %v: offset %d outside the %d-byte file", err, fe.Offset, len(b))
			}
			return
		}
		checkHeader(t, h, b)
		// Write -> Parse gives the same tensors, metadata and data...
		out, wh := rewrite(t, h, b)
		h2, err := parseBytes(out)
		if err != nil {
			t.Fatalf("Parse of the rewritten file: %v", err)
		}
		checkHeader(t, h2, out)
		if !reflect.DeepEqual(h2, wh) {
			t.Fatalf("Parse = %+v, Write returned %+v", h2, wh)
		}
		if len(h2.Tensors) != len(h.Tensors) || !maps.Equal(h2.Metadata, h.Metadata) {
			t.Fatalf("rewritten header %+v, from %+v", h2, h)
		}
		for i, tn := range h.Tensors {
			t2 := h2.Tensors[i]
			if t2.Name != tn.Name || t2.DType != tn.DType || !reflect.DeepEqual(t2.Shape, tn.Shape) ||
				t2.Begin-h2.DataStart != tn.Begin-h.DataStart || t2.End-h2.DataStart != tn.End-h.DataStart {
				t.Fatalf("tensor %d rewritten as %+v, from %+v", i, t2, tn)
			}
		}
		if !bytes.Equal(out[h2.DataStart:], b[h.DataStart:]) {
			t.Fatal("rewritten data region differs")
		}
		// ...and Write's output is canonical: rewriting it changes nothing.
		if again, _ := rewrite(t, h2, out); !bytes.Equal(again, out) {
			t.Fatal("rewriting a written file changed it")
		}
	})
}

var errStop = errors.New("stop writing")

// FuzzRoundTrip builds tensors from the fuzzer's bytes, writes them and
// parses the file back: Write refuses exactly the invalid specs (checked
// here independently) and a written file parses to what Write returned,
// with every tensor's bytes in place.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{2, 1, 'a', 3, 2, 2, 3, 1, 'b', 12, 0}, "pt")
	f.Add([]byte{3, 1, 'a', 0, 0, 1, 'a', 1, 0, 0, 0, 4, 0}, "")
	f.Add([]byte{1, 2, 0xff, 'x', 5, 1, 4}, "\xff")
	f.Add([]byte{1, 12, '_', '_', 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', '_', '_', 1, 0}, "k")
	f.Add([]byte{1, 1, 'a', 14, 3, 255, 255, 255}, "")
	f.Fuzz(func(t *testing.T, in []byte, meta string) {
		if len(in) > 256 || len(meta) > 32 {
			// Longer inputs reach no new code, and the fuzzer's minimizing
			// of a long input takes time quadratic in its length.
			t.Skip()
		}
		next := func() int {
			if len(in) == 0 {
				return 0
			}
			v := int(in[0])
			in = in[1:]
			return v
		}
		var specs []Spec
		var want [][]byte
		valid, huge := true, false
		names := map[string]bool{}
		total := new(big.Int)
		for i := range next() % 6 {
			nl := next() % 13
			name := string(in[:min(nl, len(in))])
			in = in[min(nl, len(in)):]
			d := dtypes[next()%len(dtypes)]
			shape := make([]int64, next()%4)
			// Write refuses a shape whose element count overflows int64
			// at any step, left to right (even if a later 0 would bring
			// it back), or whose byte length does.
			elems, fits := big.NewInt(1), true
			for j := range shape {
				v := int64(next() % 5)
				if v == 4 && next()%8 == 7 {
					v = 1 << 40 // big: two of them overflow a product
				}
				shape[j] = v
				elems.Mul(elems, big.NewInt(v))
				fits = fits && elems.IsInt64()
			}
			size := new(big.Int).Mul(elems, big.NewInt(int64(d.ElemSize())))
			total.Add(total, size)
			if names[name] || name == metadataKey || !utf8.ValidString(name) || !fits || !size.IsInt64() || !total.IsInt64() {
				valid = false
			}
			names[name] = true
			spec := Spec{Name: name, DType: d, Shape: shape}
			var data []byte
			if size.IsInt64() && size.Int64() <= 1<<12 {
				spec.Data, data = randomData(int(size.Int64()), uint64(i))
			} else {
				spec.Data = func(io.Writer) error { return errStop }
				huge = true
			}
			specs = append(specs, spec)
			want = append(want, data)
		}
		metadata := map[string]string{}
		if meta != "" {
			metadata["k"] = meta
			metadata[meta] = "v"
			if !utf8.ValidString(meta) {
				valid = false
			}
		}
		if !valid {
			var buf bytes.Buffer
			if _, err := Write(&buf, specs, metadata); !errors.Is(err, ErrInvalid) || buf.Len() != 0 {
				t.Fatalf("Write of invalid specs: %v, %d bytes written", err, buf.Len())
			}
			return
		}
		if total.Cmp(big.NewInt(1<<62)) > 0 {
			return // near the file-length limit, which depends on the header's length
		}
		if huge {
			// Too big to write: the callbacks stop Write at the first big
			// tensor, and the header written so far must parse with the
			// size the file would have had.
			var buf bytes.Buffer
			if _, err := Write(&buf, specs, metadata); !errors.Is(err, errStop) {
				t.Fatalf("Write of valid big specs: %v, want the callback's error", err)
			}
			n := int64(binary.LittleEndian.Uint64(buf.Bytes()))
			h, err := Parse(bytes.NewReader(buf.Bytes()[:8+n]), 8+n+total.Int64())
			if err != nil {
				t.Fatalf("Parse of the header of a big file: %v", err)
			}
			for _, s := range specs {
				if tn, ok := h.Lookup(s.Name); !ok || tn.DType != s.DType || !reflect.DeepEqual(tn.Shape, s.Shape) {
					t.Fatalf("tensor %q: %+v, %v", s.Name, tn, ok)
				}
			}
			return
		}
		var buf bytes.Buffer
		wh, err := Write(&buf, specs, metadata)
		if err != nil {
			t.Fatalf("Write: %v", err)
		}
		b := buf.Bytes()
		h, err := parseBytes(b)
		if err != nil {
			t.Fatalf("Parse of a written file: %v", err)
		}
		checkHeader(t, h, b)
		if !reflect.DeepEqual(h, wh) {
			t.Fatalf("Parse = %+v, Write returned %+v", h, wh)
		}
		for i, s := range specs {
			tn, ok := h.Lookup(s.Name)
			if !ok || tn.DType != s.DType || !reflect.DeepEqual(tn.Shape, s.Shape) || !bytes.Equal(b[tn.Begin:tn.End], want[i]) {
				t.Fatalf("tensor %q: %+v, %v", s.Name, tn, ok)
			}
		}
		if !maps.Equal(h.Metadata, metadata) {
			t.Fatalf("Metadata = %v, want %v", h.Metadata, metadata)
		}
	})
}
