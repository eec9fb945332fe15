package bench

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"64KiB": 64 << 10, "64k": 64 << 10, "64K": 64 << 10, "1MiB": 1 << 20, "16m": 16 << 20,
		"1GiB": 1 << 30, "1.5GiB": 3 << 29, " 4g ": 4 << 30, "1000": 1000, "1000B": 1000,
		"1MB": 1000000, "2GB": 2000000000, "1TiB": 1 << 40,
		// exact decimal arithmetic: in float64, 1.005*1000 is 1004.9999999999999
		"1.005KB": 1005, "1.1KB": 1100, "0.5KiB": 512, ".5K": 512, "2.": 2, "1.0KB": 1000,
		"1000GB": 1e12, "00064KiB": 64 << 10,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"": "empty", "0": "zero", "0.0K": "zero", "-1": "negative", "-1GiB": "negative", "abc": "no number",
		"12Q": `unknown suffix "Q" (want B, K/Ki/KiB`, "1EiB": "too large (at most 1TiB)", "1.5": "whole number", "0.1KiB": "whole number",
		"2TiB": "too large", "1099511627777": "too large", "99999999999999999999": "too large",
		"KiB": "no number", "1..2M": "malformed number", ".": "malformed number", "1.2.3": "malformed number",
		strings.Repeat("9", 41): "too large", strings.Repeat("9", 65): "too long",
	} {
		got, err := ParseSize(in)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSize(%q) = %d, %v; want an ErrInvalid error saying %q", in, got, err, want)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("64KiB, 1MiB,,16MiB,1MiB")
	if err != nil || !reflect.DeepEqual(got, []int64{64 << 10, 1 << 20, 16 << 20}) {
		t.Errorf("ParseSizes = %v, %v", got, err)
	}
	for _, in := range []string{"", ",", "1MiB,x"} {
		if _, err := ParseSizes(in); err == nil {
			t.Errorf("ParseSizes(%q) succeeded", in)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{
		64 << 10: "64KiB", 1 << 20: "1MiB", 256 << 20: "256MiB", 1 << 30: "1GiB", 3 << 29: "1.5GiB",
		4 << 30: "4GiB", 1000: "1000B", 1: "1B", 1 << 40: "1TiB",
	} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}

func TestParseKinds(t *testing.T) {
	got, err := ParseKinds("wc, pinned,PAGEABLE,zerocopy,go,mmap,pinned")
	want := []string{KindPageable, KindPinned, KindWriteCombined, KindMmapRegister, KindGoRegister, KindMapped}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseKinds = %v, %v; want %v", got, err, want)
	}
	if got, err := ParseKinds("all"); err != nil || !reflect.DeepEqual(got, AllKinds()) {
		t.Errorf("ParseKinds(all) = %v, %v", got, err)
	}
	_, err = ParseKinds("pinned,bogus")
	if err == nil || !strings.Contains(err.Error(), `unknown kind "bogus"`) || !strings.Contains(err.Error(), "write-combined") {
		t.Errorf("ParseKinds(bogus) error = %v", err)
	}
	if _, err := ParseKinds(" , "); err == nil {
		t.Error("ParseKinds of an empty list succeeded")
	}
}

func TestParseDirs(t *testing.T) {
	got, err := ParseDirs("bidir,h2d")
	if err != nil || !reflect.DeepEqual(got, []string{DirH2D, DirBidir}) {
		t.Errorf("ParseDirs = %v, %v", got, err)
	}
	if got, _ := ParseDirs("all"); !reflect.DeepEqual(got, AllDirs()) {
		t.Errorf("ParseDirs(all) = %v", got)
	}
	if _, err := ParseDirs("up"); err == nil {
		t.Error("ParseDirs(up) succeeded")
	}
}

func TestParseBlockKindsAndDirs(t *testing.T) {
	got, err := ParseBlockKinds("auto, batch,contig,percopy,kernel,per-copy")
	if err != nil || !reflect.DeepEqual(got, AllBlockKinds()) {
		t.Errorf("ParseBlockKinds = %v, %v; want %v", got, err, AllBlockKinds())
	}
	if _, err := ParseBlockKinds("dma"); err == nil || !strings.Contains(err.Error(), `unknown block strategy "dma"`) {
		t.Errorf("ParseBlockKinds(dma) error = %v", err)
	}
	if got, err := ParseBlockDirs("all"); err != nil || !reflect.DeepEqual(got, []string{DirH2D, DirD2H, DirBidir}) {
		t.Errorf("ParseBlockDirs(all) = %v, %v", got, err)
	}
	if got, err := ParseBlockDirs("dtoh"); err != nil || !reflect.DeepEqual(got, []string{DirD2H}) {
		t.Errorf("ParseBlockDirs(dtoh) = %v, %v", got, err)
	}
	if got, err := ParseBlockDirs("both,h2d"); err != nil || !reflect.DeepEqual(got, []string{DirH2D, DirBidir}) {
		t.Errorf("ParseBlockDirs(both,h2d) = %v, %v", got, err)
	}
	if _, err := ParseBlockDirs("h2d,sideways"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `unknown direction "sideways"`) {
		t.Errorf("ParseBlockDirs(sideways) error = %v", err)
	}
}

func TestParsePinMethodsAndFormat(t *testing.T) {
	got, err := ParsePinMethods("pytorch,hostalloc")
	if err != nil || !reflect.DeepEqual(got, []string{PinHostAlloc, PinMallocRegister}) {
		t.Errorf("ParsePinMethods = %v, %v", got, err)
	}
	for in, want := range map[string]Format{"table": FormatTable, "": FormatTable, "JSON": FormatJSON, "csv": FormatCSV} {
		if f, err := ParseFormat(in); err != nil || f != want {
			t.Errorf("ParseFormat(%q) = %q, %v", in, f, err)
		}
	}
	if _, err := ParseFormat("xml"); err == nil {
		t.Error("ParseFormat(xml) succeeded")
	}
}

func TestSummarize(t *testing.T) {
	cases := []struct {
		in   []float64
		want Summary
	}{
		{nil, Summary{}},
		{[]float64{3}, Summary{3, 3, 3, 1}},
		{[]float64{5, 1, 3}, Summary{3, 1, 5, 3}},
		{[]float64{4, 1, 3, 2}, Summary{2.5, 1, 4, 4}},
		{[]float64{2, math.NaN(), 8}, Summary{5, 2, 8, 2}},
	}
	for _, c := range cases {
		if got := Summarize(c.in); got != c.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	in := []float64{9, 1, 5}
	Summarize(in)
	if in[0] != 9 {
		t.Error("Summarize sorted its argument in place")
	}
}

func TestRateAndRatio(t *testing.T) {
	if got := Rate(1e9, time.Second); got != 1 {
		t.Errorf("Rate = %v", got)
	}
	if got := Rate(1e9, 0); got != 0 {
		t.Errorf("Rate over 0 s = %v", got)
	}
	if got := Millis(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("Millis = %v", got)
	}
	fast := Result{Unit: GBps, Median: 50}
	slow := Result{Unit: GBps, Median: 10}
	if x, ok := Ratio(fast, slow); !ok || x != 5 {
		t.Errorf("Ratio GB/s = %v, %v", x, ok)
	}
	if x, ok := Ratio(Result{Unit: Ms, Median: 8}, Result{Unit: Ms, Median: 16}); !ok || x != 2 {
		t.Errorf("Ratio ms = %v, %v (a shorter time is faster)", x, ok)
	}
	if _, ok := Ratio(fast, Result{Unit: Ms, Median: 1}); ok {
		t.Error("Ratio across units succeeded")
	}
	if _, ok := Ratio(fast, Result{Unit: GBps, Skipped: true}); ok {
		t.Error("Ratio against a skipped result succeeded")
	}
}

func TestTouchAndHelpers(t *testing.T) {
	b := make([]byte, 5*4096+10)
	touch(b, 3)
	for p := 0; p < len(b); p += 4096 {
		if b[p] != 1 {
			t.Fatalf("page at %d not touched", p)
		}
	}
	if i := firstDiff([]byte("abcdef"), []byte("abcXef")); i != 3 {
		t.Errorf("firstDiff = %d", i)
	}
	big := randomBytes(200000, 1)
	other := append([]byte(nil), big...)
	if firstDiff(big, other) != -1 {
		t.Error("firstDiff of equal slices")
	}
	other[150001]++
	if i := firstDiff(big, other); i != 150001 {
		t.Errorf("firstDiff = %d, want 150001", i)
	}
	a, b3, b4 := randomBytes(64, 3), randomBytes(64, 3), randomBytes(64, 4)
	if !bytes.Equal(a, b3) || bytes.Equal(a, b4) {
		t.Error("randomBytes is not determined by its seed")
	}
	if zeros := bytes.Count(randomBytes(4096, 9), []byte{0}); zeros > 64 {
		t.Errorf("randomBytes: %d zero bytes in 4096, want about 16", zeros)
	}
	if got := sumWords([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}); got != 0x100000000 {
		t.Errorf("sumWords = %#x", got)
	}
}
