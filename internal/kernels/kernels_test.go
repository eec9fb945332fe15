package kernels

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestPTXMatchesSource fails when pinmem.ptx was not generated from the
// committed pinmem.cu: edit the source, then run scripts/compile-kernels on a
// machine with nvcc and commit both files.
func TestPTXMatchesSource(t *testing.T) {
	got, want := SourceHash(), EmbeddedSourceHash()
	if got == "" {
		t.Fatalf("pinmem.ptx first line is not %q<sha256>: %q", hashPrefix, firstLine(ptx))
	}
	if got != want {
		t.Fatalf("pinmem.ptx records source sha256 %s, but the embedded pinmem.cu has sha256 %s: run scripts/compile-kernels on a GPU machine and commit kernels/pinmem.ptx", got, want)
	}
	if err := Check(); err != nil && !errors.Is(err, ErrPlaceholder) {
		t.Fatalf("Check() = %v", err)
	}
	if IsPlaceholder() {
		t.Logf("pinmem.ptx is still the placeholder: kernels cannot be loaded until it is generated")
	}
}

// TestPTXDefinesKernels checks, for real nvcc output, that every kernel name
// is an entry point of the PTX.
func TestPTXDefinesKernels(t *testing.T) {
	if IsPlaceholder() {
		t.Skip("pinmem.ptx is the placeholder; generate it with scripts/compile-kernels")
	}
	for _, name := range Names() {
		if !bytes.Contains(ptx, []byte(".entry "+name+"(")) {
			t.Errorf("PTX has no .entry %s(", name)
		}
	}
	if !bytes.Contains(ptx, []byte(".version ")) || !bytes.Contains(ptx, []byte(".target ")) {
		t.Errorf("PTX lacks .version or .target directives")
	}
}

func TestSourceDefinesKernels(t *testing.T) {
	for _, name := range Names() {
		if !bytes.Contains(source, []byte(`extern "C" __global__ void `+name+"(")) {
			t.Errorf("pinmem.cu has no extern \"C\" __global__ void %s(", name)
		}
	}
}

func TestImageIsNULTerminated(t *testing.T) {
	img := Image()
	if len(img) != len(ptx)+1 || img[len(img)-1] != 0 {
		t.Fatalf("Image() has length %d and last byte %d; want %d and 0", len(img), img[len(img)-1], len(ptx)+1)
	}
	if bytes.IndexByte(img[:len(img)-1], 0) >= 0 {
		t.Fatalf("PTX contains a NUL byte before its end")
	}
	p := PTX()
	p[0] ^= 0xFF
	if PTX()[0] == p[0] {
		t.Fatalf("PTX() returns the embedded slice, not a copy")
	}
}

// TestPatternGolden pins Pattern to values computed independently (Python),
// so the Go twin and the CUDA kernel cannot drift together unnoticed.
func TestPatternGolden(t *testing.T) {
	cases := []struct {
		seed uint32
		i    uint64
		want uint32
	}{
		{0, 0, 0x3bfb64ce},
		{0, 1, 0xbef07c3f},
		{1, 0, 0xcb6eda9e},
		{1, 1, 0xcd4802ed},
		{42, 12345, 0x024be70f},
		{3735928559, 1099511627783, 0xd2a13291},
		{4294967295, 18446744073709551615, 0xc269198b},
	}
	for _, c := range cases {
		if got := Pattern(c.seed, c.i); got != c.want {
			t.Errorf("Pattern(%d, %d) = %#x, want %#x", c.seed, c.i, got, c.want)
		}
	}
}

func TestPatternDeterministicAndSpread(t *testing.T) {
	a := make([]uint32, 1<<16)
	b := make([]uint32, 1<<16)
	FillPattern(a, 7)
	FillPattern(b, 7)
	if !slices.Equal(a, b) {
		t.Fatal("FillPattern is not deterministic")
	}
	if i := VerifyPattern(a, 7, 0); i != -1 {
		t.Fatalf("VerifyPattern of a fresh fill reports index %d", i)
	}
	if i := VerifyPattern(a[100:], 7, 100); i != -1 {
		t.Fatalf("VerifyPattern with offset reports index %d", i)
	}
	a[12345] ^= 1
	if i := VerifyPattern(a, 7, 0); i != 12345 {
		t.Fatalf("VerifyPattern after corrupting word 12345 = %d", i)
	}
	FillPattern(b, 8)
	same, zeros := 0, 0
	seen := make(map[uint32]struct{}, len(b))
	for i := range b {
		if Pattern(7, uint64(i)) == b[i] {
			same++
		}
		if b[i] == 0 {
			zeros++
		}
		seen[b[i]] = struct{}{}
	}
	if same > 4 {
		t.Errorf("seeds 7 and 8 agree on %d of %d words", same, len(b))
	}
	if zeros > 1 {
		t.Errorf("%d zero words in %d", zeros, len(b))
	}
	if len(seen) < len(b)-8 {
		t.Errorf("only %d distinct words in %d", len(seen), len(b))
	}
}

func TestChecksumGolden(t *testing.T) {
	w := make([]uint32, 1000)
	FillPattern(w, 7)
	if got, want := Checksum(w), uint64(2125761565092); got != want {
		t.Errorf("Checksum = %d, want %d", got, want)
	}
	if got, want := Sum(w), uint64(2125761580318); got != want {
		t.Errorf("Sum = %d, want %d", got, want)
	}
	// The golden values depend on nothing but the words: a second fill
	// gives the same words and the same sums.
	w2 := make([]uint32, len(w))
	FillPattern(w2, 7)
	if !slices.Equal(w, w2) || Checksum(w2) != 2125761565092 {
		t.Error("FillPattern or Checksum is not deterministic")
	}
	// Swapping two words keeps Sum but must change Checksum.
	w[1], w[2] = w[2], w[1]
	if Checksum(w) == 2125761565092 {
		t.Error("Checksum does not see swapped words")
	}
	if Sum(w) != 2125761580318 {
		t.Error("Sum changed after a swap")
	}
	if Checksum(nil) != 0 || Sum(nil) != 0 {
		t.Error("empty sums are not zero")
	}
}

// TestChecksumXorsIndex: each word is XORed with its (32-bit) index before
// it is added, and the sum does not stop at 32 bits.
func TestChecksumXorsIndex(t *testing.T) {
	w := []uint32{0xFFFFFFFF, 0xFFFFFFFF, 0, 3}
	// 0xFFFFFFFF^0 + 0xFFFFFFFF^1 + 0^2 + 3^3
	const want = 0xFFFFFFFF + 0xFFFFFFFE + 2 + 0
	if got := Checksum(w); got != want {
		t.Errorf("Checksum = %#x, want %#x", got, uint64(want))
	}
	if got := Sum(w); got != 0x2_0000_0001 { // 2*0xFFFFFFFF + 3
		t.Errorf("Sum = %#x, want 0x200000001", got)
	}
}

func TestAddBytes(t *testing.T) {
	b := []byte{0, 1, 254, 255}
	AddBytes(b, 2)
	if !bytes.Equal(b, []byte{2, 3, 0, 1}) {
		t.Errorf("AddBytes = %v", b)
	}
}

func TestMinDriverVersion(t *testing.T) {
	if MinDriverVersion != 13000 {
		t.Errorf("MinDriverVersion = %d", MinDriverVersion)
	}
	if !strings.Contains(string(source), "extern \"C\"") {
		t.Error("source not embedded")
	}
}

func firstLine(b []byte) string {
	l, _, _ := bytes.Cut(b, []byte("\n"))
	return string(l)
}

func BenchmarkFillPattern(b *testing.B) {
	w := make([]uint32, 1<<20)
	b.SetBytes(int64(len(w) * 4))
	for b.Loop() {
		FillPattern(w, 1)
	}
}
