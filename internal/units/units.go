// Package units parses and formats byte counts for the whole project: the
// command's size flags and PINMEM_BUDGET read sizes with the same rules.
//
// Binary units: K, M, G, T, P, E, KiB, MiB, GiB, TiB, PiB, EiB (and Ki, Mi,
// Gi, Ti, Pi, Ei) are powers of 1024 (K, Ki and KiB mean the same). Decimal units must be spelled with a B:
// KB, MB, GB, TB, PB, EB are powers of 1000. B or no suffix is bytes.
// Suffixes are case-insensitive; a fraction is allowed when the result is a
// whole number of bytes ("1.5GiB", "1.1KB"), and the arithmetic is exact.
package units

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every error ParseSize returns.
var ErrInvalid = errors.New("units: invalid size")

// Error is a size ParseSize refused: Input is the text, Reason says what is
// wrong ("is negative", "unknown suffix ..."). It matches ErrInvalid.
type Error struct {
	Input  string
	Reason string
}

// Error returns "size INPUT: REASON".
func (e *Error) Error() string { return fmt.Sprintf("size %q %s", e.Input, e.Reason) }

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func fail(in, format string, args ...any) error {
	if len(in) > 40 {
		in = in[:40] + "..."
	}
	return &Error{Input: in, Reason: fmt.Sprintf(format, args...)}
}

// suffixes maps each lower-cased suffix to its multiplier.
var suffixes = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tib": 1 << 40, "p": 1 << 50, "pib": 1 << 50, "e": 1 << 60, "eib": 1 << 60,
	"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40, "pi": 1 << 50, "ei": 1 << 60,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "eb": 1e18,
}

// SuffixList names the accepted suffixes, for messages.
const SuffixList = "B, K/Ki/KiB, M/Mi/MiB, G/Gi/GiB, T/Ti/TiB, P/Pi/PiB, E/Ei/EiB (powers of 1024) or KB, MB, GB, TB, PB, EB (powers of 1000)"

// ParseSize parses a byte count (see the package documentation) from 1 to
// max bytes (max <= 0: math.MaxInt64). The error is an *Error matching
// ErrInvalid that says what is wrong: empty, negative, zero, no number, a
// malformed number, an unknown suffix (with the list), not a whole number
// of bytes, or too large (with the limit).
func ParseSize(s string, max int64) (int64, error) {
	if max <= 0 {
		max = math.MaxInt64
	}
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, fail(s, "is empty (want e.g. 4096, 64KiB, 1.5GiB, 1GB)")
	case len(t) > 64:
		return 0, fail(t, "is too long")
	case t[0] == '-':
		return 0, fail(s, "is negative (want at least 1 byte)")
	case t[0] == '+':
		t = t[1:]
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.' || t[i] == '_') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	if strings.Contains(num, "_") {
		return 0, fail(s, "has a malformed number %q (digits and one decimal point only)", num)
	}
	mult, ok := suffixes[strings.ToLower(unit)]
	switch {
	case num == "":
		return 0, fail(s, "has no number (want e.g. 4096, 64KiB, 1.5GiB, 1GB)")
	case !ok:
		return 0, fail(s, "has an unknown suffix %q (want %s)", unit, SuffixList)
	}
	whole, frac, _ := strings.Cut(num, ".")
	if strings.Contains(frac, ".") || whole == "" && frac == "" {
		return 0, fail(s, "has a malformed number %q", num)
	}
	// v = whole.frac * mult, exactly: (whole*10^k + frac) * mult / 10^k.
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	v, _ := new(big.Int).SetString(whole+frac, 10) // digits only: cannot fail
	v.Mul(v, big.NewInt(mult))
	q, r := new(big.Int).QuoRem(v, scale, new(big.Int))
	switch {
	case q.Cmp(big.NewInt(max)) > 0:
		return 0, fail(s, "is too large (at most %s)", FormatSize(max))
	case r.Sign() != 0:
		return 0, fail(s, "is not a whole number of bytes")
	case q.Sign() == 0:
		return 0, fail(s, "is zero (want at least 1 byte)")
	}
	return q.Int64(), nil
}

// FormatSize formats n bytes compactly in binary units: "64KiB", "1MiB",
// "1.5GiB" (whole or half units), else plain bytes ("1000B"). ParseSize
// reads every result back to n.
func FormatSize(n int64) string {
	units := []struct {
		v    int64
		name string
	}{{1 << 60, "EiB"}, {1 << 50, "PiB"}, {1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}}
	for _, u := range units {
		if n >= u.v {
			if n%u.v == 0 {
				return fmt.Sprintf("%d%s", n/u.v, u.name)
			}
			if n%(u.v/2) == 0 { // the only exact one-decimal fraction of a power of 1024
				return fmt.Sprintf("%d.5%s", n/u.v, u.name)
			}
		}
	}
	return fmt.Sprintf("%dB", n)
}
