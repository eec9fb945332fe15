package pinmem

import (
	"errors"
	"testing"

	"github.com/pinmem/pinmem/cuda"
)

// FuzzParseFlags: any string gives known flags or an error, never a panic.
func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"", "portable", "mapped,writecombined", "Portable|Mapped", "wc", "bogus", ",,", "readonly"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := parseFlags(s)
		if err != nil {
			if !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("parseFlags(%q): untyped error %v", s, err)
			}
			return
		}
		if fl&^allFlags != 0 {
			t.Errorf("parseFlags(%q) = %#x with unknown bits", s, uint32(fl))
		}
		// What String prints parses back to the same flags.
		if back, err := parseFlags(fl.String()); err != nil || back != fl {
			t.Errorf("parseFlags(%q) = %v, whose String %q parses to %v, %v", s, fl, fl.String(), back, err)
		}
	})
}
