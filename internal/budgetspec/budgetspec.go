// Package budgetspec parses the pinned-memory budget as the environment
// (PINMEM_BUDGET), the pinmem command and doctor give it: bytes with a
// size suffix, or a percentage of physical memory.
package budgetspec

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/units"
)

// Parse parses a budget as PINMEM_BUDGET gives it: a positive number
// of bytes in the size syntax of the pinmem command (K, Ki,
// KiB, M, Mi, MiB, G, Gi, GiB, T, Ti, TiB are powers of 1024; KB, MB, GB, TB
// powers of 1000; "1.5GiB" is allowed when whole), or a percentage
// (0 < p <= 100, fractions allowed) of physical, the physical memory in
// bytes. Errors match cuda.ErrInvalidValue and say what is wrong.
func Parse(s string, physical uint64) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty budget: %w", cuda.ErrInvalidValue)
	}
	if p, ok := strings.CutSuffix(t, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 100 {
			return 0, fmt.Errorf("budget %q: percentage must be in (0,100]: %w", s, cuda.ErrInvalidValue)
		}
		n := int64(f / 100 * float64(physical))
		if n <= 0 {
			return 0, fmt.Errorf("budget %q of %d bytes of physical memory is zero: %w", s, physical, cuda.ErrInvalidValue)
		}
		return n, nil
	}
	n, err := units.ParseSize(t, 0)
	if err != nil {
		return 0, fmt.Errorf("budget: %w: %w", err, cuda.ErrInvalidValue)
	}
	return n, nil
}
