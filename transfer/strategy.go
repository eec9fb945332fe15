package transfer

import (
	"fmt"
	"slices"
	"sync"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

// DefaultThreshold is the default size from which a Copier takes one
// pinned stage for a pageable transfer only up to 32 MiB, and its pinned
// ring above: 16 MiB. Below it, any transfer that one stage holds takes
// one stage. Measured on an H200 (PCIe Gen5 x16, samples interleaved,
// BenchmarkCopierVsDriver and BenchmarkSingleStage), a Copier at 16 MiB
// moved 1.9 times the driver's pageable copy both ways, and from 64 MiB
// on 2.5 times and more.
const DefaultThreshold = 16 << 20

// Thresholds are the sizes, in bytes, below which a Copier moves a
// pageable transfer that one stage holds through one pinned stage (the
// short path, see Copier) whatever the stage size; from them, one stage
// only up to 32 MiB, else the pinned ring. They marshal to JSON, so that
// the result of Calibrate can be stored and passed back with
// WithThresholds. 0 gives the short path only to transfers up to 32 MiB;
// math.MaxInt64 gives it every transfer that one stage holds.
type Thresholds struct {
	HtoD int64 `json:"htod_bytes"` // host-to-device
	DtoH int64 `json:"dtoh_bytes"` // device-to-host
}

// DefaultThresholds are the thresholds a Copier uses unless told
// otherwise: DefaultThreshold both ways.
var DefaultThresholds = Thresholds{HtoD: DefaultThreshold, DtoH: DefaultThreshold}

// of returns the threshold of direction d.
func (t Thresholds) of(d Direction) int64 {
	if d == DeviceToHost {
		return t.DtoH
	}
	return t.HtoD
}

// WithThresholds sets the sizes below which a pageable transfer that one
// stage holds takes one stage (default DefaultThresholds; neither may be
// negative, else New returns an *OptionError).
func WithThresholds(t Thresholds) Option { return func(o *options) { o.thr = t } }

// OptionError is returned by New (and NewMulti, Calibrate) for an option
// value it refuses. It matches cuda.ErrInvalidValue.
type OptionError struct {
	Option string // the option's name, e.g. "WithThresholds"
	Value  string // its value as given
	Reason string // why it was refused
}

// Error names the option, its value and the reason.
func (e *OptionError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("transfer: %s(%s): %s: %v", e.Option, e.Value, e.Reason, cuda.ErrInvalidValue)
}

// Is matches cuda.ErrInvalidValue.
func (e *OptionError) Is(target error) bool { return e != nil && target == cuda.ErrInvalidValue }

// cacheBufs are the buffers registration caches registered. The registry
// lookup leaves them to their cache, which holds them for the length of a
// copy (another Copier's cache could evict one in the middle of it).
var cacheBufs sync.Map // *pinmem.Buffer -> struct{}

// regSpans appends to spans the parts of host that lie in b, and to cuts
// the offsets in host of the boundaries of b's registrations.
func regSpans(host []byte, b *pinmem.Buffer, spans []span, cuts []int) ([]span, []int) {
	lo := addr(host)
	hi := lo + uintptr(len(host))
	for _, seg := range b.Segments() {
		if len(seg) == 0 {
			continue
		}
		sl := addr(seg)
		sh := sl + uintptr(len(seg))
		if sl >= hi || sh <= lo {
			continue
		}
		a, z := int(max(sl, lo)-lo), int(min(sh, hi)-lo)
		spans = append(spans, span{a, z})
		cuts = append(cuts, a, z)
	}
	return spans, cuts
}

// lookupSpansIf appends the parts of host that lie in buffers pinmem
// pinned (pinmem.Lookup) and ok accepts (nil: all), except those of
// registration caches, and the boundaries of their registrations.
func lookupSpansIf(host []byte, spans []span, cuts []int, ok func(*pinmem.Buffer) bool) ([]span, []int) {
	off := 0
	for off < len(host) {
		b, found := pinmem.Lookup(host[off:])
		if !found {
			break
		}
		mem := b.Bytes()
		end := int(addr(mem) + uintptr(len(mem)) - addr(host))
		if end <= off { // freed meanwhile
			break
		}
		if _, cached := cacheBufs.Load(b); !cached && (ok == nil || ok(b)) {
			spans, cuts = regSpans(host, b, spans, cuts)
		}
		off = end
	}
	return spans, cuts
}

// segCuts returns the offsets in b.Bytes() at which one registration of b
// ends and the next begins (none for a buffer of one registration).
// Staging buffers larger than a registration (over 4 GiB) are copied
// piece by piece at these offsets.
func segCuts(b *pinmem.Buffer) []int {
	segs := b.Segments()
	var cuts []int
	off := 0
	for _, s := range segs[:max(len(segs)-1, 0)] {
		off += len(s)
		cuts = append(cuts, off)
	}
	return cuts
}

// eachPiece calls f for the parts of [lo, hi) between the sorted cut
// offsets, in order, until f fails.
func eachPiece(cuts []int, lo, hi int, f func(lo, hi int) error) error {
	for _, c := range cuts {
		if c <= lo {
			continue
		}
		if c >= hi {
			break
		}
		if err := f(lo, c); err != nil {
			return err
		}
		lo = c
	}
	return f(lo, hi)
}

// splitAtCuts splits sorted, disjoint spans at the cut offsets inside them,
// so that no span crosses a registration boundary.
func splitAtCuts(spans []span, cuts []int) []span {
	if len(cuts) == 0 || len(spans) == 0 {
		return spans
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []span
	k := 0
	for _, s := range spans {
		for k < len(cuts) && cuts[k] <= s.lo {
			k++
		}
		lo := s.lo
		for j := k; j < len(cuts) && cuts[j] < s.hi; j++ {
			out = append(out, span{lo, cuts[j]})
			lo = cuts[j]
		}
		out = append(out, span{lo, s.hi})
	}
	return out
}

// mayBePinned reports, cheaply, whether part of host could be copied
// directly: it lies in a buffer made known with AddPinned or pinned by
// pinmem, or the registration cache would consider it.
func (c *copier) mayBePinned(host []byte) bool {
	if c.cache != nil && len(host) >= c.cache.min {
		return true
	}
	c.pinMu.RLock()
	n := len(c.pinned)
	c.pinMu.RUnlock()
	if n > 0 {
		return true
	}
	b, ok := pinmem.Lookup(host)
	return ok && c.pinnedHere(b)
}

// strategy forces a transfer's handling of pageable memory (Calibrate).
type strategy uint8

const (
	byThreshold strategy = iota // as the thresholds say
	forceStaged                 // stage every pageable byte
	forceShort                  // the short path (one stage when one is idle, else the ring) at every size
)
