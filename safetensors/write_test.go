package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// randomData returns a Data callback writing n pseudo-random bytes from
// seed in chunks, and the bytes it writes.
func randomData(n int, seed uint64) (func(io.Writer) error, []byte) {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], rng.Uint64())
		copy(b[i:], w[:])
	}
	return func(w io.Writer) error {
		for p := b; len(p) > 0; {
			k := min(len(p), 7)
			if _, err := w.Write(p[:k]); err != nil {
				return err
			}
			p = p[k:]
		}
		return nil
	}, b
}

func TestWriteRoundTrip(t *testing.T) {
	shapes := map[string][]int64{"w1": {3, 5}, "scalar": {}, "empty": {0, 7}, "b": {2, 3, 4}, "v": {11}, "e": {1}}
	var specs []Spec
	want := map[string][]byte{}
	i := 0
	for _, name := range []string{"w1", "scalar", "empty", "b", "v", "e"} {
		d := dtypes[(i*5)%len(dtypes)]
		n := int(d.ElemSize())
		for _, x := range shapes[name] {
			n *= int(x)
		}
		fn, data := randomData(n, uint64(i))
		specs = append(specs, Spec{Name: name, DType: d, Shape: shapes[name], Data: fn})
		want[name] = data
		i++
	}
	specs = append(specs, Spec{Name: "zeros", DType: F32, Shape: []int64{100000}}) // nil Data
	want["zeros"] = make([]byte, 400000)
	meta := map[string]string{"format": "pt", "quote\"": "é"}

	var buf bytes.Buffer
	wh, err := Write(&buf, specs, meta)
	if err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if wh.DataStart%8 != 0 {
		t.Errorf("DataStart %d is not 8-byte aligned", wh.DataStart)
	}
	h, err := parseBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, wh) {
		t.Errorf("Parse = %+v\nWrite returned %+v", h, wh)
	}
	checkHeader(t, h, b)
	if !maps.Equal(h.Metadata, meta) {
		t.Errorf("Metadata = %v, want %v", h.Metadata, meta)
	}
	if len(h.Tensors) != len(specs) {
		t.Fatalf("%d tensors, want %d", len(h.Tensors), len(specs))
	}
	for _, s := range specs {
		tn, ok := h.Lookup(s.Name)
		if !ok {
			t.Fatalf("tensor %q missing", s.Name)
		}
		if tn.DType != s.DType || !reflect.DeepEqual(tn.Shape, s.Shape) {
			t.Errorf("tensor %q: %s %v, want %s %v", s.Name, tn.DType, tn.Shape, s.DType, s.Shape)
		}
		if !bytes.Equal(b[tn.Begin:tn.End], want[s.Name]) {
			t.Errorf("tensor %q: data differs", s.Name)
		}
	}
}

func TestWriteNoMetadata(t *testing.T) {
	var buf bytes.Buffer
	if _, err := Write(&buf, nil, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if got := buf.String()[8:]; got != "{}      " {
		t.Errorf("header %q, want an empty object padded to 8 bytes", got)
	}
	h, err := parseBytes(buf.Bytes())
	if err != nil || h.Metadata != nil || len(h.Tensors) != 0 || h.DataEnd != 16 {
		t.Errorf("Parse = %+v, %v", h, err)
	}
}

func TestWriteInvalid(t *testing.T) {
	u8 := func(name string) Spec { return Spec{Name: name, DType: U8, Shape: []int64{1}} }
	for _, c := range []struct {
		name  string
		specs []Spec
		meta  map[string]string
		want  string
	}{
		{"duplicate name", []Spec{u8("a"), u8("b"), u8("a")}, nil, "given twice"},
		{"reserved name", []Spec{u8(metadataKey)}, nil, "reserved"},
		{"invalid UTF-8 name", []Spec{u8("a\xff")}, nil, "not valid UTF-8"},
		{"unknown dtype", []Spec{{Name: "a", DType: "F4", Shape: []int64{2}}}, nil, "unknown dtype"},
		{"empty dtype", []Spec{{Name: "a", Shape: []int64{2}}}, nil, "unknown dtype"},
		{"negative dimension", []Spec{{Name: "a", DType: U8, Shape: []int64{2, -1}}}, nil, "negative"},
		{"element overflow", []Spec{{Name: "a", DType: U8, Shape: []int64{1 << 32, 1 << 32}}}, nil, "element count overflows"},
		{"byte overflow", []Spec{{Name: "a", DType: F64, Shape: []int64{1 << 61}}}, nil, "byte length overflows"},
		{"region overflow", []Spec{{Name: "a", DType: U8, Shape: []int64{1 << 62}}, {Name: "b", DType: U8, Shape: []int64{1 << 62}}}, nil, "region's length overflows"},
		{"file overflow", []Spec{{Name: "a", DType: U8, Shape: []int64{1<<63 - 1}}}, nil, "file's length overflows"},
		{"rank", []Spec{{Name: "a", DType: U8, Shape: make([]int64, MaxRank+1)}}, nil, "more than 64"},
		{"metadata key", nil, map[string]string{"\xff": "v"}, "not valid UTF-8"},
		{"metadata value", nil, map[string]string{"k": "\xc3"}, "not valid UTF-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, c.specs, c.meta)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want ErrInvalid saying %q", err, c.want)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes of an invalid file", buf.Len())
			}
		})
	}
	if _, err := Write(nil, nil, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil writer: %v, want ErrInvalid", err)
	}
}

func TestWriteHeaderLimit(t *testing.T) {
	lowerLimit(t, 1000)
	for _, c := range []struct {
		name  string
		specs []Spec
		meta  map[string]string
		want  string
	}{
		{"names too long", []Spec{{Name: strings.Repeat("x", 500), DType: U8}, {Name: strings.Repeat("y", 501), DType: U8}}, nil, "names and metadata alone take 1001"},
		{"metadata too long", nil, map[string]string{"k": strings.Repeat("v", 1000)}, "names and metadata alone take 1001"},
		// Within the lower bound, but JSON escapes each NUL as 6 bytes.
		{"escapes too long", []Spec{{Name: strings.Repeat("\x00", 200), DType: U8}}, nil, "the header would be 1256 bytes, more than 1000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, c.specs, c.meta)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want ErrInvalid saying %q", err, c.want)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes of an invalid file", buf.Len())
			}
		})
	}
	// A header of exactly the limit is written and parsed.
	var buf bytes.Buffer
	name := strings.Repeat("n", 1000-len(`{"":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}`))
	if _, err := Write(&buf, []Spec{{Name: name, DType: U8}}, nil); err != nil {
		t.Fatalf("header of exactly the limit: %v", err)
	}
	if _, err := parseBytes(buf.Bytes()); err != nil {
		t.Fatalf("Parse of a header of exactly the limit: %v", err)
	}
	b := buf.Bytes()
	if n := binary.LittleEndian.Uint64(b); n != 1000 {
		t.Fatalf("header of %d bytes, want 1000", n)
	}
}

// lowerLimit sets the header limit to n for the rest of the test.
func lowerLimit(t *testing.T, n int64) {
	old := maxHeaderSize
	maxHeaderSize = n
	t.Cleanup(func() { maxHeaderSize = old })
}

// failWriter fails every write after the first n bytes.
type failWriter struct {
	n   int
	err error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, f.err
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriteDataErrors(t *testing.T) {
	boom := errors.New("boom")
	one := func(data func(io.Writer) error) []Spec {
		return []Spec{{Name: "a", DType: F32, Shape: []int64{4}, Data: data}}
	}
	t.Run("too many bytes", func(t *testing.T) {
		var buf bytes.Buffer
		_, err := Write(&buf, one(func(w io.Writer) error {
			_, err := w.Write(make([]byte, 17))
			return err
		}), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than") {
			t.Errorf("error %v, want ErrInvalid", err)
		}
		if h := buf.Len(); h%8 != 0 {
			t.Errorf("wrote %d bytes: the excess reached the file", h)
		}
	})
	t.Run("too many bytes, error dropped", func(t *testing.T) {
		_, err := Write(io.Discard, one(func(w io.Writer) error {
			w.Write(make([]byte, 10)) //nolint:errcheck // the test drops the error on purpose
			w.Write(make([]byte, 10)) //nolint:errcheck
			return nil
		}), nil)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("error %v, want ErrInvalid", err)
		}
	})
	t.Run("too few bytes", func(t *testing.T) {
		_, err := Write(io.Discard, one(func(w io.Writer) error {
			_, err := w.Write(make([]byte, 15))
			return err
		}), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "wrote 15 of its 16 bytes") {
			t.Errorf("error %v, want ErrInvalid", err)
		}
	})
	t.Run("callback error", func(t *testing.T) {
		_, err := Write(io.Discard, one(func(io.Writer) error { return boom }), nil)
		if !errors.Is(err, boom) {
			t.Errorf("error %v, want the callback's", err)
		}
	})
	t.Run("writer error in the header", func(t *testing.T) {
		_, err := Write(&failWriter{n: 3, err: boom}, one(nil), nil)
		if !errors.Is(err, boom) {
			t.Errorf("error %v, want the writer's", err)
		}
	})
	t.Run("writer error in the data", func(t *testing.T) {
		// The header and prefix take 64 bytes; the write fails 6 bytes into the data.
		_, err := Write(&failWriter{n: 64 + 6, err: boom}, one(nil), nil)
		if !errors.Is(err, boom) {
			t.Errorf("error %v, want the writer's", err)
		}
	})
}

// tally keeps the first bytes written to it and counts the rest.
type tally struct {
	head []byte
	n    int64
}

func (t *tally) Write(p []byte) (int, error) {
	if room := 4096 - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	t.n += int64(len(p))
	return len(p), nil
}

func TestWriteStreams(t *testing.T) {
	// 1 GiB of tensors goes through Write with a few MiB allocated: the
	// data streams from the callback to the writer, never held whole.
	const chunk = 1 << 20
	buf := make([]byte, chunk)
	data := func(w io.Writer) error {
		for range 256 {
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return nil
	}
	specs := []Spec{
		{Name: "a", DType: BF16, Shape: []int64{1 << 27}, Data: data},
		{Name: "b", DType: F32, Shape: []int64{1 << 12, 1 << 14}, Data: data},
		{Name: "c", DType: I8, Shape: []int64{1 << 28}, Data: data},
		{Name: "d", DType: U64, Shape: []int64{1 << 25}}, // zeros
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var out tally
	wh, err := Write(&out, specs, nil)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("Write allocated %d bytes for a 1 GiB file", got)
	}
	if out.n != wh.DataEnd || out.n < 1<<30 {
		t.Fatalf("wrote %d bytes, header says %d", out.n, wh.DataEnd)
	}
	h, err := Parse(bytes.NewReader(out.head), out.n)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, wh) {
		t.Errorf("Parse = %+v, Write returned %+v", h, wh)
	}
}
