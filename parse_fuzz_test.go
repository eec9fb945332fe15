package pinmem

import (
	"errors"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

// FuzzParseBudget: any string gives a budget in (0, physical*...] or an
// error, never a panic or a negative budget.
func FuzzParseBudget(f *testing.F) {
	for _, s := range []string{"", "0", "1", "40%", "100%", "150%", "0.5%", "8G", "8Gi", "1.5Ti", "-1", "1e3", "9223372036854775807", "99999999999999999999G", "%", "Gi", " 4 GiB ", "nan%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBudget(s, 64<<30)
		if err == nil && n <= 0 {
			t.Errorf("ParseBudget(%q) = %d without an error", s, n)
		}
		if err != nil && !strings.Contains(err.Error(), "pinmem") && !strings.Contains(err.Error(), "budget") {
			t.Logf("ParseBudget(%q): %v", s, err)
		}
	})
}

// FuzzParseFlags: any string gives known flags or an error, never a panic.
func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"", "portable", "mapped,writecombined", "Portable|Mapped", "wc", "bogus", ",,", "readonly"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := ParseFlags(s)
		if err != nil {
			if !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("ParseFlags(%q): untyped error %v", s, err)
			}
			return
		}
		if fl&^allFlags != 0 {
			t.Errorf("ParseFlags(%q) = %#x with unknown bits", s, uint32(fl))
		}
		// What String prints parses back to the same flags.
		if back, err := ParseFlags(fl.String()); err != nil || back != fl {
			t.Errorf("ParseFlags(%q) = %v, whose String %q parses to %v, %v", s, fl, fl.String(), back, err)
		}
	})
}
