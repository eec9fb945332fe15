package bench

import (
	"fmt"
	"regexp"
	"strings"
)

// Claims: the sentences of the README that state what the figures show.
// Each sits between <!-- claim NAME --> and <!-- /claim --> and is
// rendered from the reports of one run (FillDoc), with its ratio and the
// run it comes from, so that no claim outlives the figures it states.

// claimRenderers render each claim from the reports of one run; a claim
// whose rows the run lacks says so.
var claimRenderers = map[string]func(reps []Report) string{
	"pinned": claimPinned,
	"copier": claimCopier,
	"pin":    claimPin,
}

// ClaimNames returns the names of the claims FillDoc renders.
func ClaimNames() []string {
	return []string{"copier", "pin", "pinned"}
}

// runOf names the run of reps in a claim: the device's model and the
// commit.
func runOf(reps []Report) string {
	dev, _, _ := strings.Cut(reps[0].Meta.Device, " (")
	return dev + ", commit " + shortRev(reps[0].Meta.Tool.Revision)
}

// findRow returns the measured row of reps with bench, kind, dir and
// size, preferring the report of part (the test that measures it at
// every size).
func findRow(reps []Report, part, bench, kind, dir string, size int64) (Result, bool) {
	var found Result
	ok := false
	for _, rep := range reps {
		for _, r := range rep.Results {
			if r.Skipped || r.Bench != bench || r.Kind != kind || r.Dir != dir || r.Size != size {
				continue
			}
			if !ok || partOf(rep.Meta) == part {
				found, ok = r, true
			}
		}
	}
	return found, ok
}

// ratioText is a ratio as the docs write it: two decimals and an x.
func ratioText(x float64) string { return fmt.Sprintf("%.2fx", x) }

// claimPinned: pinned memory's rate to the GPU at 256 MiB against the
// link's raw rate and pageable memory's.
func claimPinned(reps []Report) string {
	const size = 256 << 20
	p, ok1 := findRow(reps, "bw", "bw", KindPinned, DirH2D, size)
	g, ok2 := findRow(reps, "bw", "bw", KindPageable, DirH2D, size)
	if !ok1 || !ok2 {
		return "(the figures below lack pinned and pageable rows at 256 MiB)"
	}
	x, _ := Ratio(p, g)
	s := fmt.Sprintf("pinned memory went to the GPU at %s GB/s at 256 MiB, %s the rate of pageable memory", formatValue(p.Median), ratioText(x))
	if link, label := reps[0].Meta.LinkGBps(); link > 0 {
		s += fmt.Sprintf(" and %.0f%% of the %s link's raw rate", 100*p.Median/link, label)
	}
	return s + " (" + runOf(reps) + ")"
}

// claimCopier: the Copier against pinned memory, each way, at 256 MiB
// and 1 GiB where measured.
func claimCopier(reps []Report) string {
	var parts []string
	for _, size := range []int64{256 << 20, 1 << 30} {
		var xs []string
		for _, dir := range []string{DirH2D, DirD2H} {
			c, ok1 := findRow(reps, "copier", "bw", KindCopier, dir, size)
			p, ok2 := findRow(reps, "copier", "bw", KindPinned, dir, size)
			if x, ok := Ratio(c, p); ok1 && ok2 && ok {
				xs = append(xs, ratioText(x))
			}
		}
		if len(xs) == 2 {
			parts = append(parts, fmt.Sprintf("%s to the GPU and %s back at %s", xs[0], xs[1], FormatSize(size)))
		}
	}
	if len(parts) == 0 {
		return "(the figures below lack Copier and pinned rows at 256 MiB or 1 GiB)"
	}
	return "against pinned memory's rate, Go memory through a `Copier` moved at " + strings.Join(parts, ", ") + " (" + runOf(reps) + ")"
}

// claimPin: pinning by mmap + cuMemHostRegister against cuMemHostAlloc,
// at 1 GiB and more.
func claimPin(reps []Report) string {
	var xs []string
	for _, size := range []int64{1 << 30, 4 << 30} {
		m, ok1 := findRow(reps, "pin", "pin", PinMmapRegister, OpPin, size)
		h, ok2 := findRow(reps, "pin", "pin", PinHostAlloc, OpPin, size)
		if x, ok := Ratio(m, h); ok1 && ok2 && ok {
			xs = append(xs, fmt.Sprintf("%s at %s", ratioText(x), FormatSize(size)))
		}
	}
	if len(xs) == 0 {
		return "(the figures below lack pinning rows at 1 or 4 GiB)"
	}
	return "faster than `cuMemHostAlloc` by " + strings.Join(xs, " and ") + " (" + runOf(reps) + ")"
}

// claimRegion matches one rendered claim: its name and text.
var claimRegion = regexp.MustCompile(`<!-- claim ([a-z0-9-]+) -->(?s:(.*?))<!-- /claim -->`)

// Markers of the README's figure table, which WriteSummary renders.
const (
	FiguresBegin = "<!-- figures: rendered from the result files of docs/results by `pinmem report --into README.md FILE...`; do not edit -->\n"
	FiguresEnd   = "<!-- end of figures -->\n"
)

// FillDoc returns doc, a markdown document, with its rendered regions
// rewritten from the reports of one run (MarkdownRun): the figure table
// between FiguresBegin and FiguresEnd, where it has one, and every claim
// between <!-- claim NAME --> and <!-- /claim -->. A claim of an unknown
// name, or a figure table opened and not closed, is an error matching
// ErrInvalid.
func FillDoc(doc []byte, reps []Report) ([]byte, error) {
	if _, _, _, err := MarkdownRun(reps); err != nil {
		return nil, err
	}
	out := string(doc)
	if pre, rest, ok := strings.Cut(out, FiguresBegin); ok {
		_, post, ok := strings.Cut(rest, FiguresEnd)
		if !ok {
			return nil, invalid("the figure table opened by %q is not closed by %q", strings.TrimSpace(FiguresBegin), strings.TrimSpace(FiguresEnd))
		}
		var b strings.Builder
		if err := WriteSummary(&b, reps); err != nil {
			return nil, err
		}
		out = pre + FiguresBegin + b.String() + FiguresEnd + post
	}
	var bad error
	out = claimRegion.ReplaceAllStringFunc(out, func(m string) string {
		name := claimRegion.FindStringSubmatch(m)[1]
		render, ok := claimRenderers[name]
		if !ok {
			bad = invalid("unknown claim %q (want one of %s)", name, strings.Join(ClaimNames(), ", "))
			return m
		}
		return "<!-- claim " + name + " -->" + render(reps) + "<!-- /claim -->"
	})
	if bad != nil {
		return nil, bad
	}
	return []byte(out), nil
}
