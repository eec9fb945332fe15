package units

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	good := []struct {
		in   string
		want int64
	}{
		{"4096", 4096}, {"1K", 1024}, {"1k", 1024}, {"1KiB", 1024}, {"1kib", 1024},
		{"1M", 1 << 20}, {"1MiB", 1 << 20}, {"1G", 1 << 30}, {"1GiB", 1 << 30}, {"1T", 1 << 40}, {"2TiB", 2 << 40},
		{"1KB", 1000}, {"1MB", 1e6}, {"1GB", 1e9}, {"1TB", 1e12}, {"1.5GiB", 3 << 29}, {"1.1KB", 1100},
		{" 64 KiB ", 64 << 10}, {"1EiB", 1 << 60}, {"1B", 1}, {"+8", 8}, {"7E", 7 << 60}, {"2Gi", 2 << 30},
	}
	for _, c := range good {
		if got, err := ParseSize(c.in, 0); err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, want string }{
		{"", "is empty"}, {"-1", "is negative"}, {"-1GiB", "is negative"}, {"0", "is zero"}, {"0.0001K", "not a whole number"},
		{"99999999999999999999", "is too large (at most"}, {"8EiB", "is too large"}, {"1.5B", "not a whole number"},
		{"12Q", `unknown suffix "Q" (want B, K/Ki/KiB`}, {"1ZiB", `unknown suffix "ZiB"`}, {"GiB", "has no number"},
		{"1..2K", "malformed number"}, {"1_000", "malformed number"}, {".", "malformed number"}, {"0x10", `unknown suffix "x10"`},
	}
	for _, c := range bad {
		_, err := ParseSize(c.in, 0)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSize(%q) error %v; want ErrInvalid saying %q", c.in, err, c.want)
		}
	}
	if _, err := ParseSize("2TiB", 1<<40); err == nil || !strings.Contains(err.Error(), "at most 1TiB") {
		t.Errorf("limit: %v", err)
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{1: "1B", 1000: "1000B", 1024: "1KiB", 1536: "1.5KiB", 3 << 29: "1.5GiB", 1 << 60: "1EiB", math.MaxInt64: "9223372036854775807B", 1100: "1100B"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzParseSize: ParseSize never panics, accepts only 1..max, and what it
// accepts formats to text that parses back to the same count.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "64KiB", "1.5GiB", "1GB", "-1", "99999999999999999999", "1EiB", "1.1KB", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s, 0)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") && !strings.Contains(s, "\n") {
				t.Fatalf("ParseSize(%q): error %v", s, err)
			}
			return
		}
		if n < 1 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		back, err := ParseSize(FormatSize(n), 0)
		if err != nil || back != n {
			t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, FormatSize(n), back, err)
		}
	})
}
