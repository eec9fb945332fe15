package bench

import (
	"fmt"
	"math/big"
	"strings"
)

// Kind names of host memory, as the bandwidth bench and the CLI spell them.
const (
	KindPageable       = "pageable"        // Go heap []byte through the driver's pageable path
	KindPinned         = "pinned"          // pinmem.Alloc, cuMemHostAlloc default flags
	KindPortable       = "portable"        // cuMemHostAlloc with Portable
	KindWriteCombined  = "write-combined"  // cuMemHostAlloc with WriteCombined
	KindRegisteredMmap = "registered-mmap" // pinmem.Alloc with MethodMmapRegister
	KindRegisteredGo   = "registered-go"   // pinmem.Register of a Go heap slice
	KindMapped         = "mapped"          // zero-copy: a kernel reads/writes host memory through its device pointer
	KindStaged         = "staged"          // Go heap slice copied through pinned stages (package transfer)
)

// Directions of the bandwidth bench.
const (
	DirH2D   = "h2d"   // host to device
	DirD2H   = "d2h"   // device to host
	DirBidir = "bidir" // both at once on two streams; the figure is the sum
)

// AllKinds returns every host memory kind, in report order.
func AllKinds() []string {
	return []string{KindPageable, KindPinned, KindPortable, KindWriteCombined,
		KindRegisteredMmap, KindRegisteredGo, KindMapped, KindStaged}
}

// AllDirs returns every direction, in report order.
func AllDirs() []string { return []string{DirH2D, DirD2H, DirBidir} }

var kindAliases = map[string]string{
	"pageable": KindPageable, "heap": KindPageable,
	"pinned": KindPinned, "default": KindPinned, "hostalloc": KindPinned,
	"portable":       KindPortable,
	"write-combined": KindWriteCombined, "writecombined": KindWriteCombined, "wc": KindWriteCombined,
	"registered-mmap": KindRegisteredMmap, "mmap": KindRegisteredMmap, "mmap-register": KindRegisteredMmap,
	"registered-go": KindRegisteredGo, "go": KindRegisteredGo, "register": KindRegisteredGo, "registered": KindRegisteredGo,
	"mapped": KindMapped, "zerocopy": KindMapped, "zero-copy": KindMapped,
	"staged": KindStaged,
}

var dirAliases = map[string]string{
	"h2d": DirH2D, "htod": DirH2D,
	"d2h": DirD2H, "dtoh": DirD2H,
	"bidir": DirBidir, "bi": DirBidir, "both": DirBidir,
}

// ParseKinds parses a comma-separated list of kinds ("pinned,wc,mapped";
// "all" for every kind). Aliases are accepted (wc, mmap, go, zerocopy, ...);
// duplicates are dropped and the result is in report order.
func ParseKinds(s string) ([]string, error) {
	return parseList(s, "kind", kindAliases, AllKinds())
}

// ParseDirs parses a comma-separated list of directions (h2d, d2h, bidir,
// or "all").
func ParseDirs(s string) ([]string, error) {
	return parseList(s, "direction", dirAliases, AllDirs())
}

func parseList(s, what string, aliases map[string]string, all []string) ([]string, error) {
	seen := map[string]bool{}
	nonEmpty := false
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		if p == "" {
			continue
		}
		nonEmpty = true
		if p == "all" {
			for _, k := range all {
				seen[k] = true
			}
			continue
		}
		k, ok := aliases[p]
		if !ok {
			return nil, invalid("unknown %s %q (want one of %s, or all)", what, p, strings.Join(all, ", "))
		}
		seen[k] = true
	}
	if !nonEmpty {
		return nil, invalid("empty %s list", what)
	}
	var out []string
	for _, k := range all {
		if seen[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

// MaxSize is the largest size ParseSize accepts: 1 TiB.
const MaxSize = 1 << 40

// sizeUnits are ParseSize's units, lower case: binary ones with or without
// "i", decimal ones spelled with "B".
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

const sizeUnitList = "B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"

// ParseSize parses a byte count: a plain number of bytes, or a number with
// a binary suffix (K, KiB, M, MiB, G, GiB, T, TiB: powers of 1024) or a
// decimal one (KB, MB, GB, TB: powers of 1000), case-insensitive, e.g.
// "64KiB", "16m", "1.5GiB". The result must be a whole number of bytes
// from 1 to MaxSize; the arithmetic is exact ("1.1KB" is 1100 bytes).
// Errors match ErrInvalid and say what is wrong.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, invalid("empty size")
	case len(t) > 40:
		return 0, invalid("size %.40q...: too long", t)
	case t[0] == '-':
		return 0, invalid("size %q is negative", s)
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	mult, ok := sizeUnits[strings.ToLower(unit)]
	switch {
	case num == "":
		return 0, invalid("size %q: no number (want e.g. 4096, 64KiB, 1.5GiB, 1GB)", s)
	case !ok:
		return 0, invalid("size %q: unknown unit %q (want %s)", s, unit, sizeUnitList)
	}
	whole, frac, _ := strings.Cut(num, ".")
	if strings.Contains(frac, ".") || whole == "" && frac == "" {
		return 0, invalid("size %q: bad number %q", s, num)
	}
	// v = whole.frac * mult, exactly: (whole*10^k + frac) * mult / 10^k.
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	v, _ := new(big.Int).SetString(whole+frac, 10) // digits only: cannot fail
	v.Mul(v, big.NewInt(mult))
	q, r := new(big.Int).QuoRem(v, scale, new(big.Int))
	switch {
	case r.Sign() != 0:
		return 0, invalid("size %q is not a whole number of bytes", s)
	case q.Sign() == 0:
		return 0, invalid("size %q is zero (want at least 1 byte)", s)
	case q.Cmp(big.NewInt(MaxSize)) > 0:
		return 0, invalid("size %q is too large (at most %s)", s, FormatSize(MaxSize))
	}
	return q.Int64(), nil
}

// ParseSizes parses a comma-separated list of sizes (see ParseSize),
// keeping its order and dropping duplicates.
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	seen := map[int64]bool{}
	for _, p := range strings.Split(s, ",") {
		if strings.TrimSpace(p) == "" {
			continue
		}
		n, err := ParseSize(p)
		if err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, invalid("empty size list")
	}
	return out, nil
}

// FormatSize formats n bytes compactly: "64KiB", "1MiB", "1.5GiB" or
// "1000B" (binary units when they give at most one decimal).
func FormatSize(n int64) string {
	units := []struct {
		v    int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}}
	for _, u := range units {
		if n >= u.v {
			if n%u.v == 0 {
				return fmt.Sprintf("%d%s", n/u.v, u.name)
			}
			if (n*10)%u.v == 0 {
				return fmt.Sprintf("%.1f%s", float64(n)/float64(u.v), u.name)
			}
		}
	}
	return fmt.Sprintf("%dB", n)
}
