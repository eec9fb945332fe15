package bench

import (
	"strings"

	"github.com/pinmem/pinmem/internal/units"
)

// Kind names of host memory, as the bandwidth bench and the CLI spell them.
const (
	KindPageable      = "pageable"       // Go heap []byte: the driver's asynchronous pageable copy on a stream, timed by events
	KindPageableSync  = "pageable-sync"  // Go heap []byte: the driver's synchronous pageable copy (cuMemcpyHtoD/DtoH), timed by the wall clock
	KindPinned        = "pinned"         // pinmem.Alloc, cuMemHostAlloc default flags
	KindPortable      = "portable"       // cuMemHostAlloc with Portable
	KindWriteCombined = "write-combined" // cuMemHostAlloc with WriteCombined
	KindMmapRegister  = "mmap-register"  // pinmem.Alloc with MethodMmapRegister
	KindGoRegister    = "go-register"    // pinmem.Register of a Go heap slice
	KindMapped        = "mapped"         // zero-copy: a kernel reads/writes host memory through its device pointer
	// KindCopier is a Go heap slice moved by a default transfer.Copier:
	// what a user of package transfer gets. Each row's Path says which
	// path the Copier took at that size.
	KindCopier = "copier"
)

// Directions of the bandwidth bench.
const (
	DirH2D   = "h2d"   // host to device
	DirD2H   = "d2h"   // device to host
	DirBidir = "bidir" // both at once on two streams; the figure is the sum
)

// AllKinds returns every host memory kind, in report order.
func AllKinds() []string {
	return []string{KindPageable, KindPageableSync, KindPinned, KindPortable, KindWriteCombined,
		KindMmapRegister, KindGoRegister, KindMapped, KindCopier}
}

// AllDirs returns every direction, in report order.
func AllDirs() []string { return []string{DirH2D, DirD2H, DirBidir} }

var kindAliases = map[string]string{
	"pageable": KindPageable, "heap": KindPageable,
	"pinned": KindPinned, "default": KindPinned, "hostalloc": KindPinned,
	"portable":       KindPortable,
	"write-combined": KindWriteCombined, "writecombined": KindWriteCombined, "wc": KindWriteCombined,
	"mmap-register": KindMmapRegister, "mmap": KindMmapRegister, "registered-mmap": KindMmapRegister, "mmap-registered": KindMmapRegister,
	"go-register": KindGoRegister, "go": KindGoRegister, "register": KindGoRegister, "registered": KindGoRegister,
	"registered-go": KindGoRegister, "go-registered": KindGoRegister,
	"mapped": KindMapped, "zerocopy": KindMapped, "zero-copy": KindMapped,
	"pageable-sync": KindPageableSync, "sync": KindPageableSync,
	"copier": KindCopier, "transfer": KindCopier,
	KindStaged: KindCopier, // deprecated: the name before copier
}

// KindStaged is the deprecated name of KindCopier: results written before
// the copier kinds existed name their Copier rows so (a Copier forced to
// stage every size through its pinned ring). ParseKinds and ReadReport
// take it as KindCopier, so that old and new results pair up.
const KindStaged = "staged"

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

// ParseSize parses a byte count with the project's one size syntax (see
// package internal/units: K/KiB, M/MiB, G/GiB, T/TiB are powers of 1024,
// KB, MB, GB, TB powers of 1000), from 1 byte to MaxSize. Errors match
// ErrInvalid (and units.ErrInvalid) and say what is wrong.
func ParseSize(s string) (int64, error) {
	n, err := units.ParseSize(s, MaxSize)
	if err != nil {
		return 0, &invalidError{msg: err.Error(), wrapped: err}
	}
	return n, nil
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
// "1000B" (units.FormatSize).
func FormatSize(n int64) string { return units.FormatSize(n) }
