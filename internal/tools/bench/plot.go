package bench

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ImageFormat is a plot file format.
type ImageFormat string

// Plot formats.
const (
	ImageSVG ImageFormat = "svg"
	ImagePNG ImageFormat = "png"
)

// ImageFormatOf returns the plot format a file name asks for by its
// extension (.svg or .png), or an error matching ErrInvalid.
func ImageFormatOf(path string) (ImageFormat, error) {
	switch {
	case strings.HasSuffix(strings.ToLower(path), ".svg"):
		return ImageSVG, nil
	case strings.HasSuffix(strings.ToLower(path), ".png"):
		return ImagePNG, nil
	}
	return "", invalid("plot file %q: want a name ending in .svg or .png", path)
}

// Plot layout: each panel is panelW by panelH, above a caption of
// captionH; PNGs are drawn at plotDPI.
const (
	panelW   = 9 * vg.Inch
	panelH   = 4.2 * vg.Inch
	captionH = 0.3 * vg.Inch
	plotDPI  = 110
)

// Caption says what measured a plot's figures: the device, driver,
// pinmem revision and date, and the run's note (a fake driver, a quick
// run).
func Caption(m Meta) string {
	dev := m.Device
	if dev == "" {
		dev = "unknown device"
	}
	parts := []string{dev}
	if m.Driver != "" {
		parts = append(parts, "driver "+m.Driver)
	}
	rev := "revision unknown"
	if m.Tool.Revision != "" {
		rev = "revision " + shortRev(m.Tool.Revision)
		if m.Tool.Modified != nil && *m.Tool.Modified {
			rev += " (modified)"
		}
	}
	parts = append(parts, "pinmem "+rev)
	if len(m.Time) >= 10 {
		parts = append(parts, m.Time[:10])
	}
	c := strings.Join(parts, ", ")
	if m.Partial {
		c += "; PARTIAL run"
	}
	if IsFakeDevice(m.Device) {
		c += "; FAKE DRIVER: not a GPU's figures"
	}
	return c
}

// palette colours the series of a plot (colour-blind-safe Tableau 10 order).
var palette = []color.RGBA{
	{0x4e, 0x79, 0xa7, 0xff}, {0xf2, 0x8e, 0x2b, 0xff}, {0xe1, 0x57, 0x59, 0xff}, {0x76, 0xb7, 0xb2, 0xff},
	{0x59, 0xa1, 0x4f, 0xff}, {0xed, 0xc9, 0x48, 0xff}, {0xb0, 0x7a, 0xa1, 0xff}, {0xff, 0x9d, 0xa7, 0xff},
	{0x9c, 0x75, 0x5f, 0xff}, {0x79, 0x70, 0x6e, 0xff},
}

// dashes and glyphs keep series apart where their lines lie on top of each
// other (the pinned-memory family measures about the same).
var dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)},
	{vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}, {vg.Points(4), vg.Points(4)}}

var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.RingGlyph{},
	draw.CrossGlyph{}, draw.PlusGlyph{}, draw.PyramidGlyph{}, draw.BoxGlyph{}}

// styleSeries gives series i its colour, dash pattern and marker.
func styleSeries(i int, l *plotter.Line, s *plotter.Scatter) {
	c := palette[i%len(palette)]
	if l != nil {
		l.Color, l.Width, l.Dashes = c, vg.Points(1.6), dashes[i%len(dashes)]
	}
	if s != nil {
		s.Color, s.Shape, s.Radius = c, glyphs[i%len(glyphs)], vg.Points(3.2)
	}
}

// WritePlot draws every measurement of results that has a plot, one panel
// per bench and direction or operation, stacked: bandwidth against size per
// kind (bw), block copies against block size per strategy (blocks),
// pinning cost against size per method (pin), the pipeline's FPS
// per variant (overlap), vector-add time (vecadd), zero-copy against explicit
// copies per reuse factor (zerocopy), the device matrix (matrix) and the
// loader against plain reads, one panel per unit (load). Sizes
// are log-scaled, bars and points carry min/max marks, bandwidth panels draw
// the PCIe limit when m records the link, and a panel says when its timing
// fell back to plain events. It returns an error matching ErrInvalid when
// there is nothing to plot.
func WritePlot(w io.Writer, f ImageFormat, m Meta, results []Result) error {
	panels, err := buildPanels(m, results)
	if err != nil {
		return err
	}
	if len(panels) == 0 {
		return invalid("nothing to plot (no results with figures)")
	}
	width, height := panelW, panelH*vg.Length(len(panels))+captionH
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch f {
	case ImageSVG:
		c = vgsvg.New(width, height)
	case ImagePNG:
		img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
		c = vgimg.PngCanvas{Canvas: img}
	default:
		return invalid("unknown plot format %q (want svg or png)", f)
	}
	full := draw.New(c)
	// The caption: where and by what the figures were measured.
	sty := panels[0].Title.TextStyle
	sty.Font.Size = vg.Points(9)
	sty.Color = color.Gray{0x33}
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YBottom
	full.FillText(sty, vg.Point{X: vg.Points(8), Y: vg.Points(6)}, Caption(m))
	dc := draw.Crop(full, 0, 0, captionH, 0)
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(10), PadY: vg.Points(16)}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i][0])
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return err
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// group collects the results of one panel.
type group struct {
	bench, dir string
	rs         []Result
}

// groups splits the plottable results by bench and direction, in order of
// first appearance. Overlap's ms rows are left out where FPS rows exist.
func groups(results []Result) []*group {
	var out []*group
	idx := map[[2]string]*group{}
	hasFPS := slices.ContainsFunc(results, func(r Result) bool { return r.Bench == "overlap" && r.Unit == FPS })
	for _, r := range results {
		if r.Skipped || r.Median <= 0 || hasFPS && r.Bench == "overlap" && r.Unit != FPS {
			continue
		}
		dir := r.Dir
		switch r.Bench {
		case "zerocopy", "overlap", "vecadd", "matrix":
			dir = "" // one panel for the whole bench
		}
		k := [2]string{r.Bench, dir}
		g := idx[k]
		if g == nil {
			g = &group{bench: r.Bench, dir: dir}
			idx[k] = g
			out = append(out, g)
		}
		g.rs = append(g.rs, r)
	}
	return out
}

// buildPanels makes the panels of results, one per group (see groups) in
// order; the loader's groups make one panel per unit, and groups of
// benches without a plot make none.
func buildPanels(m Meta, results []Result) ([]*plot.Plot, error) {
	var out []*plot.Plot
	for _, g := range groups(results) {
		if g.bench == "load" {
			// The loader's rows mix units (GB/s, CPU-s/GB, ms to the first
			// tensor): one bar panel per unit.
			for _, sub := range byUnit(g) {
				p, err := barPanel(sub)
				if err != nil {
					return nil, err
				}
				out = append(out, p)
			}
			continue
		}
		p, err := groupPanel(m, g)
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		if note := timingNote(m, g.rs); note != "" {
			p.Title.Text += "\n" + note
		}
		out = append(out, p)
	}
	return out, nil
}

// groupPanel makes the panel of g as its bench plots, or returns a nil
// panel for a bench that has no plot.
func groupPanel(m Meta, g *group) (*plot.Plot, error) {
	var p *plot.Plot
	var err error
	switch {
	case oneSize(g.rs) && (g.bench == "bw" || g.bench == "pin" || g.bench == "blocks" || g.bench == "concurrency"):
		// One size: bars, not a one-point line on a log axis.
		p, err = barPanel(g)
	case g.bench == "bw":
		p, err = sizePanel(m, g, "bandwidth, "+dirTitle(g.dir), "GB/s (higher is better)", false)
	case g.bench == "blocks":
		p, err = sizePanel(m, g, "scattered block copies by strategy, against one contiguous copy, "+dirTitle(g.dir), "GB/s (higher is better)", false)
		if err == nil {
			p.X.Label.Text = "block size (bytes, log scale)"
		}
	case g.bench == "concurrency":
		d, n, _ := strings.Cut(g.dir, "/")
		p, err = sizePanel(m, g, "goroutines at once ("+strings.TrimSuffix(n, "g")+"), "+dirTitle(d)+": a shared Copier against the driver's copy", "GB/s in all (higher is better)", false)
		if err == nil {
			p.X.Label.Text = "bytes per goroutine per copy (log scale)"
		}
	case g.bench == "pin":
		p, err = sizePanel(m, g, "pinning cost: "+opTitle(g.dir), "ms (log scale, lower is better)", true)
	case g.bench == "zerocopy":
		p, err = reusePanel(g)
	case g.bench == "overlap" || g.bench == "vecadd" || g.bench == "matrix" || g.bench == "imagepipeline":
		p, err = barPanel(g)
	}
	return p, err
}

// byUnit splits g into groups of one unit each, in order of first appearance.
func byUnit(g *group) []*group {
	var out []*group
	idx := map[Unit]int{}
	for _, r := range g.rs {
		i, ok := idx[r.Unit]
		if !ok {
			i = len(out)
			idx[r.Unit] = i
			out = append(out, &group{bench: g.bench, dir: g.dir})
		}
		out[i].rs = append(out[i].rs, r)
	}
	return out
}

// oneSize reports whether every result has the same size.
func oneSize(rs []Result) bool {
	for _, r := range rs {
		if r.Size != rs[0].Size {
			return false
		}
	}
	return true
}

// timingNote says when copies that are normally held by spin-wait were
// timed with plain events instead: the session had no spin-wait (m.Timing
// says so) or a hold timed out (the result's note says so). Pageable
// copies are always timed with events and need no note.
func timingNote(m Meta, rs []Result) string {
	if !slices.ContainsFunc(rs, func(r Result) bool { return r.Timing == TimingEvents }) {
		return ""
	}
	if strings.HasPrefix(m.Timing, sessionEventsTiming) {
		return "note: timed with plain events (spin-wait unavailable): launch overhead may be included"
	}
	for _, r := range rs {
		if strings.Contains(r.Note, "spin-wait timed out") {
			return "note: a spin-wait hold timed out: some samples include queueing time"
		}
	}
	return ""
}

func newPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	return p
}

// series is one line of a panel: points with min/max.
type series struct {
	name string
	xys  plotter.XYs
	errs plotter.YErrors
}

func (s *series) add(x float64, r Result) {
	s.xys = append(s.xys, plotter.XY{X: x, Y: r.Median})
	s.errs = append(s.errs, struct{ Low, High float64 }{r.Median - r.Min, r.Max - r.Median})
}

// sortX orders a series' points by x.
func (s *series) sortX() {
	idx := make([]int, len(s.xys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case s.xys[a].X < s.xys[b].X:
			return -1
		case s.xys[a].X > s.xys[b].X:
			return 1
		}
		return 0
	})
	xys, errs := make(plotter.XYs, len(idx)), make(plotter.YErrors, len(idx))
	for i, j := range idx {
		xys[i], errs[i] = s.xys[j], s.errs[j]
	}
	s.xys, s.errs = xys, errs
}

// collect builds one series per kind, x from xOf.
func collect(rs []Result, xOf func(Result) float64) []*series {
	var out []*series
	by := map[string]*series{}
	for _, r := range rs {
		s := by[r.Kind]
		if s == nil {
			s = &series{name: r.Kind}
			by[r.Kind] = s
			out = append(out, s)
		}
		s.add(xOf(r), r)
	}
	for _, s := range out {
		s.sortX()
	}
	return out
}

// addSeries draws each series as a line with markers and min/max bars.
func addSeries(p *plot.Plot, ss []*series) error {
	for i, s := range ss {
		l, sc, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return err
		}
		styleSeries(i, l, sc)
		eb, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{s.xys, s.errs})
		if err != nil {
			return err
		}
		eb.Color, eb.CapWidth = palette[i%len(palette)], vg.Points(5)
		p.Add(l, sc, eb)
		p.Legend.Add(s.name, l, sc)
	}
	return nil
}

// sizePanel plots median (with min/max) against size on a log2 axis, one
// line per kind or method; bandwidth panels (bw, blocks) get the PCIe
// limit line.
func sizePanel(m Meta, g *group, title, ylabel string, logY bool) (*plot.Plot, error) {
	p := newPlot(title)
	p.X.Label.Text = "size (bytes, log scale)"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	var sizes []int64
	for _, r := range g.rs {
		if !slices.Contains(sizes, r.Size) {
			sizes = append(sizes, r.Size)
		}
	}
	slices.Sort(sizes)
	p.X.Tick.Marker = sizeTicks(sizes)
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
	}
	ss := collect(g.rs, func(r Result) float64 { return float64(r.Size) })
	if err := addSeries(p, ss); err != nil {
		return nil, err
	}
	if g.bench == "bw" || g.bench == "blocks" {
		if gbps, label := m.LinkGBps(); gbps > 0 {
			limit := gbps
			if g.dir == DirBidir {
				limit *= 2
			}
			lo, hi := float64(sizes[0]), float64(sizes[len(sizes)-1])
			if lo == hi {
				lo, hi = lo/2, hi*2
			}
			l, err := plotter.NewLine(plotter.XYs{{X: lo, Y: limit}, {X: hi, Y: limit}})
			if err != nil {
				return nil, err
			}
			l.Color, l.Width, l.Dashes = color.Gray{0x55}, vg.Points(1.2), []vg.Length{vg.Points(1), vg.Points(3)}
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s limit (%s GB/s)", label, formatValue(limit)), l)
			p.Y.Max = max(p.Y.Max, limit*1.08)
		}
	}
	if sizes[0] == sizes[len(sizes)-1] {
		p.X.Min, p.X.Max = float64(sizes[0])/2, float64(sizes[0])*2
	}
	return p, nil
}

// sizeTicks labels the measured sizes (at most about ten of them).
func sizeTicks(sizes []int64) plot.Ticker {
	return plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		step := max(1, (len(sizes)+9)/10)
		var ts []plot.Tick
		for i, s := range sizes {
			label := ""
			if i%step == 0 {
				label = FormatSize(s)
			}
			ts = append(ts, plot.Tick{Value: float64(s), Label: label})
		}
		return ts
	})
}

// reusePanel plots zero-copy against explicit copies per reuse factor.
func reusePanel(g *group) (*plot.Plot, error) {
	p := newPlot("zero-copy vs explicit copy, " + FormatSize(g.rs[0].Size) + " read R times")
	p.X.Label.Text = "reuse factor R (kernel passes over the data, log scale)"
	p.Y.Label.Text = "ms (lower is better)"
	p.X.Scale = plot.LogScale{}
	p.Y.Min = 0
	var reuses []int64
	ss := collect(g.rs, func(r Result) float64 {
		n, _ := strconv.ParseInt(strings.TrimPrefix(r.Dir, "reuse="), 10, 64)
		n = max(n, 1)
		if !slices.Contains(reuses, n) {
			reuses = append(reuses, n)
		}
		return float64(n)
	})
	slices.Sort(reuses)
	p.X.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ts []plot.Tick
		for _, n := range reuses {
			ts = append(ts, plot.Tick{Value: float64(n), Label: strconv.FormatInt(n, 10)})
		}
		return ts
	})
	if len(reuses) == 1 {
		p.X.Min, p.X.Max = float64(reuses[0])/2, float64(reuses[0])*2
	}
	return p, addSeries(p, ss)
}

// barPanel draws one bar per kind (overlap, vecadd) or per kind and
// direction (matrix), with min/max marks and the figure above the bar.
func barPanel(g *group) (*plot.Plot, error) {
	unit := g.rs[0].Unit
	p := newPlot(barTitle(g))
	better := "higher is better"
	if !unit.HigherIsBetter() {
		better = "lower is better"
	}
	p.Y.Label.Text = fmt.Sprintf("%s (%s)", unit, better)
	p.Y.Min = 0
	b, err := addBars(p, g, unit)
	if err != nil {
		return nil, err
	}
	if err := addBarMarks(p, b); err != nil {
		return nil, err
	}
	if err := addBoundLines(p, b.bounds, len(b.cats)); err != nil {
		return nil, err
	}
	p.NominalX(b.cats...)
	if len(b.cats) > 6 {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
	}
	return p, nil
}

// barTitle is the title of g's bar panel, which says what one bar
// measured.
func barTitle(g *group) string {
	switch g.bench {
	case "overlap":
		return "pipeline (H2D, kernel, D2H per chunk): " + FormatSize(g.rs[0].Size) + " in all"
	case "vecadd":
		return "vector add end to end: " + FormatSize(g.rs[0].Size) + " moved"
	case "matrix":
		return "host<->GPU matrix, " + FormatSize(g.rs[0].Size) + " per copy: each device alone and all at once"
	case "imagepipeline":
		return "image pipeline (frame in, blur, frame out), " + g.dir + " frames of " + FormatSize(g.rs[0].Size)
	}
	return g.bench + ", " + dirTitle(g.dir) + ", " + FormatSize(g.rs[0].Size)
}

// bars records the bars addBars drew, for the marks and lines drawn over
// them; bar i is at x = i.
type bars struct {
	cats   []string        // each bar's category, its x axis label
	xys    plotter.XYs     // each bar's median
	errs   plotter.YErrors // each bar's distances down to its min and up to its max
	vals   plotter.Values  // each bar's median, for its label
	bounds []Result        // the bounds, drawn as lines rather than bars
}

// addBars adds to p one bar per result of g in unit, in order, and keeps
// its bounds (isBound) for addBoundLines.
func addBars(p *plot.Plot, g *group, unit Unit) (bars, error) {
	// One bar per category: the kind, or for the matrix the kind in each
	// direction, coloured by direction. Each bar is its own chart at an
	// integer x so that its min/max mark and label sit on it.
	var b bars
	var sets []string
	for _, r := range g.rs {
		if r.Unit != unit {
			continue
		}
		if isBound(r) {
			b.bounds = append(b.bounds, r) // a line across the bars it bounds
			continue
		}
		set, cat := "", r.Kind
		if g.bench == "matrix" {
			set, cat = r.Dir, r.Kind+" "+r.Dir
		}
		si := slices.Index(sets, set)
		first := si < 0
		if first {
			sets = append(sets, set)
			si = len(sets) - 1
		}
		x := float64(len(b.cats))
		b.cats = append(b.cats, cat)
		bc, err := plotter.NewBarChart(plotter.Values{r.Median}, vg.Points(min(56, 420/float64(len(g.rs)))))
		if err != nil {
			return bars{}, err
		}
		bc.XMin = x
		bc.Color = palette[si%len(palette)]
		bc.LineStyle.Width = vg.Points(0.5)
		p.Add(bc)
		if set != "" && first {
			p.Legend.Add(set, bc)
		}
		b.xys = append(b.xys, plotter.XY{X: x, Y: r.Median})
		b.errs = append(b.errs, struct{ Low, High float64 }{r.Median - r.Min, r.Max - r.Median})
		b.vals = append(b.vals, r.Median)
	}
	return b, nil
}

// addBarMarks adds to p the min/max mark of every bar of b and its figure
// above the mark.
func addBarMarks(p *plot.Plot, b bars) error {
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{b.xys, b.errs})
	if err != nil {
		return err
	}
	eb.CapWidth = vg.Points(6)
	p.Add(eb)
	top := make(plotter.XYs, len(b.xys))
	for i, xy := range b.xys {
		top[i] = plotter.XY{X: xy.X, Y: xy.Y + b.errs[i].High}
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: top, Labels: valueLabels(b.vals)})
	if err != nil {
		return err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].Font.Size = vg.Points(8)
		labels.TextStyle[i].XAlign = draw.XCenter
	}
	labels.Offset = vg.Point{Y: vg.Points(4)}
	p.Add(labels)
	return nil
}

// isBound reports whether r is a bound of the other rows of its chart: a
// computed row (VariantBound, TimingComputed) or the measured staged
// bound.
func isBound(r Result) bool {
	return r.Kind == VariantBound || r.Timing == TimingComputed || r.Kind == KindStagedBound
}

// addBoundLines adds to p a dashed line across the ncats bars for each
// row of bounds, with a legend entry that says whether it was computed.
func addBoundLines(p *plot.Plot, bounds []Result, ncats int) error {
	for i, b := range bounds {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: b.Median}, {X: float64(ncats) - 0.5, Y: b.Median}})
		if err != nil {
			return err
		}
		l.Color, l.Width, l.Dashes = color.Gray{0x33}, vg.Points(1.4), dashes[1+i%(len(dashes)-1)]
		p.Add(l)
		how := "computed, not measured"
		if b.Kind == KindStagedBound && b.Timing != TimingComputed {
			how = "measured"
		}
		p.Legend.Add(fmt.Sprintf("%s %s %s (%s)", b.Kind, formatValue(b.Median), b.Unit, how), l)
		p.Y.Max = max(p.Y.Max, b.Median*1.15) // room for the legend above the line
	}
	return nil
}

func valueLabels(vs plotter.Values) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		if v > 0 && !math.IsNaN(v) {
			out[i] = formatValue(v)
		}
	}
	return out
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

func opTitle(op string) string {
	switch op {
	case OpPin:
		return "obtaining pinned memory"
	case OpUnpin:
		return "releasing it"
	case OpTouch:
		return "allocating and touching a Go slice (for reference)"
	}
	return op
}
