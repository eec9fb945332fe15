package bench

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Unit is the unit of a result's values.
type Unit string

// Units of results.
const (
	GBps Unit = "GB/s" // 10^9 bytes per second; higher is better
	Ms   Unit = "ms"   // milliseconds; lower is better
	FPS  Unit = "FPS"  // frames (pipeline chunks) per second; higher is better
	// CPUsPerGB is CPU seconds (user and system, the whole process) spent
	// per 10^9 bytes moved; lower is better.
	CPUsPerGB Unit = "CPU-s/GB"
)

// HigherIsBetter reports whether a larger value of u is a better result.
func (u Unit) HigherIsBetter() bool { return u != Ms && u != CPUsPerGB }

// Timing methods recorded in Result.Timing.
const (
	TimingSpin   = "spin-wait+events" // stream held by spin_wait while the work was queued (nvbandwidth's way)
	TimingEvents = "events"           // plain events: queueing overhead may be included
	TimingWall   = "wall"             // host wall clock around synchronous work
	// TimingComputed marks a row computed from other rows (a bound), not
	// measured: it has no samples and is not verified.
	TimingComputed = "computed"
)

// Result is one measurement: a bench, a kind of host memory (or method or
// variant), a direction (or operation), a size and the summary of its
// samples.
type Result struct {
	Bench    string  `json:"bench"`    // "bw", "pin", "overlap", "vecadd", "zerocopy"
	Kind     string  `json:"kind"`     // host memory kind, pinning method or pipeline variant
	Dir      string  `json:"dir"`      // "h2d", "d2h", "bidir"; or the operation ("pin", "unpin", "reuse=4", ...)
	Size     int64   `json:"size"`     // bytes per copy (bw), per buffer (pin) or in all (overlap, vecadd)
	Unit     Unit    `json:"unit"`     // unit of Median, Min and Max
	Median   float64 `json:"median"`   // median of the samples
	Min      float64 `json:"min"`      // smallest sample
	Max      float64 `json:"max"`      // largest sample
	Samples  int     `json:"samples"`  // timed samples (0 when skipped)
	Verified bool    `json:"verified"` // every byte of at least one sample was checked and correct
	Timing   string  `json:"timing"`   // TimingSpin, TimingEvents or TimingWall
	Skipped  bool    `json:"skipped"`  // the measurement could not run; Note says why
	// VerifyFailed is set when a sample's data came back wrong: the figures
	// are not to be trusted and Note says what differed.
	VerifyFailed bool `json:"verify_failed"`
	// Path is the way the data went where the kind leaves it open: for
	// the copier kinds, the transfer.Copier's path at this size, from its
	// Stats ("pageable", "staged", "direct", or a mix with byte shares).
	Path string `json:"path,omitempty"`
	// Ref is the kind this row is compared with in the same run (see
	// References) and Ratio how much better this row is than Ref (above 1
	// is better, whatever the unit); both are empty when the row has no
	// reference in its run.
	Ref   string  `json:"ref,omitempty"`
	Ratio float64 `json:"ratio,omitempty"`
	// Paired says that Ratio was measured side by side with Ref in the
	// row's own samples (the median of the samples' ratios: see
	// PairedTiming), not computed from the two rows' medians; it is kept
	// as measured.
	Paired bool   `json:"paired,omitempty"`
	Note   string `json:"note,omitempty"` // anything the figures need to be read right
}

// verifyFailedMark starts the note of every result whose data came back
// wrong.
const verifyFailedMark = "VERIFY FAILED"

// Failed reports whether r's data failed verification (VerifyFailed, or a
// note that says so).
func (r Result) Failed() bool {
	return !r.Skipped && (r.VerifyFailed || strings.Contains(r.Note, verifyFailedMark))
}

// markFailures sets VerifyFailed on every result whose note reports a
// verification failure, so that the JSON says it in a field.
func markFailures(rs []Result) {
	for i := range rs {
		if rs[i].Failed() {
			rs[i].VerifyFailed = true
		}
	}
}

// String returns a one-line summary, as progress lines print it.
func (r Result) String() string {
	if r.Skipped {
		return fmt.Sprintf("%s %s %s %s: skipped: %s", r.Bench, r.Kind, r.Dir, FormatSize(r.Size), r.Note)
	}
	v := "verified"
	switch {
	case r.Timing == TimingComputed:
		return fmt.Sprintf("%s %s %s %s: %s %s (computed, not measured)", r.Bench, r.Kind, r.Dir, FormatSize(r.Size), formatValue(r.Median), r.Unit)
	case !r.Verified:
		v = "NOT verified"
	}
	return fmt.Sprintf("%s %s %s %s: %s %s (min %s, max %s, %d samples, %s)",
		r.Bench, r.Kind, r.Dir, FormatSize(r.Size), formatValue(r.Median), r.Unit,
		formatValue(r.Min), formatValue(r.Max), r.Samples, v)
}

// Summary is the median, minimum and maximum of a set of samples.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// Summarize returns the median (the mean of the two middle values for an
// even count), minimum and maximum of vals. NaNs are ignored; an empty set
// gives zeros.
func Summarize(vals []float64) Summary {
	v := make([]float64, 0, len(vals))
	for _, x := range vals {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Summary{}
	}
	sort.Float64s(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return Summary{Median: med, Min: v[0], Max: v[n-1], N: n}
}

// Rate returns the bandwidth in GB/s (10^9 bytes per second) of moving
// bytes in d; zero for a non-positive duration.
func Rate(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// Millis returns d in milliseconds.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fill sets the summary fields of r from the samples.
func (r *Result) fill(vals []float64) {
	s := Summarize(vals)
	r.Median, r.Min, r.Max, r.Samples = s.Median, s.Min, s.Max, s.N
}

// skipped returns a skipped result with the reason in its note.
func skipped(bench, kind, dir string, size int64, unit Unit, why string) Result {
	return Result{Bench: bench, Kind: kind, Dir: dir, Size: size, Unit: unit, Skipped: true, Note: why}
}

// Ratio returns how much better r is than base, as a factor where above 1
// means better: r/base for GB/s and FPS, base/r for ms. ok is false when
// either result has no value or the units differ.
func Ratio(r, base Result) (ratio float64, ok bool) {
	if r.Skipped || base.Skipped || r.Unit != base.Unit || r.Median <= 0 || base.Median <= 0 {
		return 0, false
	}
	if r.Unit.HigherIsBetter() {
		return r.Median / base.Median, true
	}
	return base.Median / r.Median, true
}

// Baseline finds, for every result, the result of kind baseline with the
// same bench, direction, size and unit, and returns the ratios (see Ratio)
// by index; results without a baseline get no entry.
func Baseline(results []Result, baseline string) map[int]float64 {
	type key struct {
		bench, dir string
		size       int64
		unit       Unit
	}
	base := map[key]Result{}
	for _, r := range results {
		if r.Kind == baseline && !r.Skipped {
			base[key{r.Bench, r.Dir, r.Size, r.Unit}] = r
		}
	}
	out := map[int]float64{}
	for i, r := range results {
		b, ok := base[key{r.Bench, r.Dir, r.Size, r.Unit}]
		if !ok {
			continue
		}
		if x, ok := Ratio(r, b); ok {
			out[i] = x
		}
	}
	return out
}
