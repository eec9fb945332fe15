package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// palette colours the series of a plot, one per kind (colour-blind-safe
// Tableau 10 order).
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// SVG layout, in pixels.
const (
	svgWidth   = 760
	panelH     = 300
	marginL    = 64
	marginR    = 170
	marginT    = 40
	marginB    = 48
	titleSpace = 36
)

// WriteSVG plots bandwidth against size (log-scaled x axis), one panel per
// direction and one line per kind, for the results in GB/s that are not
// skipped. The SVG is written by hand: no plotting library. It returns an
// error when there is nothing to plot.
func WriteSVG(w io.Writer, title string, results []Result) error {
	type point struct {
		size int64
		v    float64
	}
	var dirs []string
	var kinds []string
	series := map[string]map[string][]point{} // dir -> kind -> points
	var sizes []int64
	for _, r := range results {
		if r.Skipped || r.Unit != GBps || r.Size <= 0 || r.Median <= 0 {
			continue
		}
		if series[r.Dir] == nil {
			series[r.Dir] = map[string][]point{}
			dirs = append(dirs, r.Dir)
		}
		if !slices.Contains(kinds, r.Kind) {
			kinds = append(kinds, r.Kind)
		}
		series[r.Dir][r.Kind] = append(series[r.Dir][r.Kind], point{r.Size, r.Median})
		if !slices.Contains(sizes, r.Size) {
			sizes = append(sizes, r.Size)
		}
	}
	if len(dirs) == 0 {
		return invalid("nothing to plot (no bandwidth results)")
	}
	slices.Sort(sizes)
	lo, hi := math.Log2(float64(sizes[0])), math.Log2(float64(sizes[len(sizes)-1]))
	if hi-lo < 1 {
		lo, hi = lo-0.5, hi+0.5
	}
	plotW := float64(svgWidth - marginL - marginR)
	plotH := float64(panelH - marginT - marginB)
	xOf := func(size int64) float64 {
		return marginL + (math.Log2(float64(size))-lo)/(hi-lo)*plotW
	}
	height := titleSpace + len(dirs)*panelH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgWidth, height)
	fmt.Fprintf(&b, `<text class="title" x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginL, esc(title))
	for pi, dir := range dirs {
		top := float64(titleSpace + pi*panelH)
		ymax := 0.0
		for _, pts := range series[dir] {
			for _, p := range pts {
				ymax = max(ymax, p.v)
			}
		}
		step := niceStep(ymax / 5)
		ymax = math.Ceil(ymax*1.05/step) * step
		yOf := func(v float64) float64 { return top + marginT + plotH - v/ymax*plotH }
		fmt.Fprintf(&b, `<g class="panel" id="panel-%s">`+"\n", esc(dir))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", marginL, top+marginT-10, esc(dirTitle(dir)))
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", marginL, top+marginT, plotW, plotH)
		for v := 0.0; v <= ymax+step/2; v += step {
			y := yOf(v)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, y, marginL+plotW, y)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y+4, trimFloat(v))
		}
		for _, s := range sizes {
			x := xOf(s)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, top+marginT, x, top+marginT+plotH)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, top+marginT+plotH+16, esc(FormatSize(s)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">size (log scale)</text>`+"\n", marginL+plotW/2, top+marginT+plotH+34)
		fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">GB/s</text>`+"\n", top+marginT+plotH/2)
		li := 0
		for ki, kind := range kinds {
			pts := series[dir][kind]
			if len(pts) == 0 {
				continue
			}
			slices.SortFunc(pts, func(a, c point) int { return int(a.size - c.size) })
			col := palette[ki%len(palette)]
			var coords []string
			for _, p := range pts {
				coords = append(coords, fmt.Sprintf("%.1f,%.1f", xOf(p.size), yOf(p.v)))
			}
			fmt.Fprintf(&b, `<polyline class="series" data-kind="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n",
				esc(kind), col, strings.Join(coords, " "))
			for _, p := range pts {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s %s: %s GB/s</title></circle>`+"\n",
					xOf(p.size), yOf(p.v), col, esc(kind), esc(dir), esc(FormatSize(p.size)), formatValue(p.v))
			}
			ly := top + marginT + 8 + float64(li)*18
			lx := float64(svgWidth - marginR + 14)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", lx, ly, lx+18, ly, col)
			fmt.Fprintf(&b, `<text class="legend" x="%.1f" y="%.1f">%s</text>`+"\n", lx+24, ly+4, esc(kind))
			li++
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func dirTitle(dir string) string {
	switch dir {
	case DirH2D:
		return "host to device"
	case DirD2H:
		return "device to host"
	case DirBidir:
		return "bidirectional (sum of both directions)"
	}
	return dir
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func esc(s string) string { return html.EscapeString(s) }
