package budgetspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

func TestParse(t *testing.T) {
	const phys = 100 << 30
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1024", 1024},
		{" 4096 ", 4096},
		{"2K", 2048},
		{"2KB", 2000},
		{"2Ki", 2048},
		{"2KiB", 2048},
		{"3M", 3 << 20},
		{"3MB", 3e6},
		{"3Mi", 3 << 20},
		{"16G", 16 << 30},
		{"16GB", 16e9},
		{"16Gi", 16 << 30},
		{"16gib", 16 << 30},
		{"1.5Gi", 3 << 29},
		{"1Ti", 1 << 40},
		{"50%", 50 << 30},
		{"12.5%", phys / 8},
		{"100%", phys},
	} {
		got, err := Parse(tc.in, phys)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "0", "-5", "abc", "5X", "0%", "101%", "-1%", "%", "1e30", "NaN", "0.1"} {
		if got, err := Parse(in, phys); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("Parse(%q) = %d, %v; want cuda.ErrInvalidValue", in, got, err)
		}
	}
}

// FuzzParse: any string gives a budget in (0, physical*...] or an
// error, never a panic or a negative budget.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "0", "1", "40%", "100%", "150%", "0.5%", "8G", "8Gi", "1.5Ti", "-1", "1e3", "9223372036854775807", "99999999999999999999G", "%", "Gi", " 4 GiB ", "nan%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s, 64<<30)
		if err == nil && n <= 0 {
			t.Errorf("Parse(%q) = %d without an error", s, n)
		}
		if err != nil && !strings.Contains(err.Error(), "pinmem") && !strings.Contains(err.Error(), "budget") {
			t.Logf("Parse(%q): %v", s, err)
		}
	})
}
