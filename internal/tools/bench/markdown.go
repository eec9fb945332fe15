package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// The markdown rendering of one run: docs/PERF.md and the README's figure
// table are this, so that no figure in the docs is written by hand.

// partInfo describes a suite test for the reader: its title and how to
// measure it alone.
type partInfo struct {
	name, title, command string
}

// partInfos lists the tests in the order the docs show them.
var partInfos = []partInfo{
	{"bw", "Bandwidth by kind of host memory", "pinmem bench"},
	{"copier", "The Copier against the driver, every size", "pinmem bench all -t copier"},
	{"concurrency", "Many goroutines at once", "pinmem bench all -t concurrency"},
	{"pin", "The cost of pinning", "pinmem bench pin"},
	{"overlap", "The pipeline and vector add", "pinmem bench overlap"},
	{"zerocopy", "Zero-copy against an explicit copy", "pinmem zerocopy"},
	{"blocks", "Scattered block copies", "pinmem bench blocks"},
	{"matrix", "Every GPU alone and at once", "pinmem bench matrix"},
	{"load", "Model weights to the GPU", "pinmem bench load FILE"},
	{"imagepipeline", "The image pipeline", "go run ./examples/imagepipeline/measure"},
}

// partOf returns the suite test a report is: its meta.part, or for
// reports written by a single command, the test that command matches.
func partOf(m Meta) string {
	if m.Part != "" {
		return m.Part
	}
	switch m.Command {
	case "pinmem bench":
		return "bw"
	case "pinmem bench pin":
		return "pin"
	case "pinmem bench overlap":
		return "overlap"
	case "pinmem zerocopy":
		return "zerocopy"
	case "pinmem bench matrix":
		return "matrix"
	case "pinmem bench blocks":
		return "blocks"
	case "pinmem bench load":
		return "load"
	}
	return strings.TrimPrefix(m.Command, "pinmem ")
}

// kindNotes say what a kind is where its name alone does not.
var kindNotes = map[string]string{
	KindPageable:     "Go heap memory, the driver's asynchronous pageable copy, timed by events",
	KindPageableSync: "Go heap memory, the driver's synchronous copy, timed by the wall clock",
	KindCopier:       "Go heap memory moved by a default transfer.Copier, timed by the wall clock",
	// The image pipeline's kinds (bench imagepipeline); its pinned-Nstreams
	// and bound share their names with the overlap bench's.
	"naive":              "Go frames, copied in and out synchronously, one frame at a time",
	"pipeline":           "Go frames staged through pinned buffers by a transfer.Pipeline",
	KindImageStagedBound: "the rate of Go memory staged through pinned memory on this host, from the CPU's copy and the copy engine's: each row's note says how (measured with the two started together, or computed from their rates)",
	VariantBound:         "computed from the measured bidirectional bandwidth, not measured",
}

// MarkdownRun checks that reports come from one run of one build on one
// device and returns the revision, date (YYYY-MM-DD) and device they
// share. Reports of different revisions, devices or drivers are refused
// with an error matching ErrInvalid: one rendering states one commit.
func MarkdownRun(reps []Report) (revision, date, device string, err error) {
	if len(reps) == 0 {
		return "", "", "", invalid("no reports to render")
	}
	first := reps[0].Meta
	for _, r := range reps[1:] {
		m := r.Meta
		switch {
		case m.Tool.Revision != first.Tool.Revision:
			return "", "", "", invalid("reports of different revisions (%q and %q): render one run", first.Tool.Revision, m.Tool.Revision)
		case m.Device != first.Device || m.Driver != first.Driver:
			return "", "", "", invalid("reports of different devices or drivers (%s, %s and %s, %s): render one run", first.Device, first.Driver, m.Device, m.Driver)
		}
	}
	date = "unknown date"
	for _, r := range reps {
		if len(r.Meta.Time) >= 10 && (date == "unknown date" || r.Meta.Time[:10] < date) {
			date = r.Meta.Time[:10]
		}
	}
	return first.Tool.Revision, date, first.Device, nil
}

// shortRev is the first 7 characters of a revision, or "an unrecorded
// revision".
func shortRev(rev string) string {
	switch {
	case rev == "":
		return "an unrecorded revision"
	case len(rev) > 7:
		return rev[:7]
	}
	return rev
}

// markdownHeader is the provenance every rendering starts with.
func markdownHeader(b *strings.Builder, reps []Report, rev, date, device string) {
	m := reps[0].Meta
	at := "at commit " + shortRev(rev)
	if rev == "" {
		at = "at an unrecorded revision"
	}
	fmt.Fprintf(b, "Measured by pinmem %s on %s: %s", at, date, device)
	if m.Driver != "" {
		fmt.Fprintf(b, ", driver %s", m.Driver)
	}
	if gbps, label := m.LinkGBps(); gbps > 0 {
		fmt.Fprintf(b, ", %s (%s GB/s each way)", label, formatValue(gbps))
	}
	if m.Host.CPUModel != "" {
		fmt.Fprintf(b, "; host %s, %d cores", m.Host.CPUModel, m.Host.Cores)
	}
	b.WriteString(".\n")
	var notes []string
	for _, r := range reps {
		if r.Meta.Note != "" && !slices.Contains(notes, r.Meta.Note) {
			notes = append(notes, r.Meta.Note)
		}
		if r.Meta.Partial {
			notes = append(notes, partOf(r.Meta)+": PARTIAL, the run was interrupted")
		}
	}
	for _, n := range notes {
		fmt.Fprintf(b, "\n> %s\n", n)
	}
}

// WriteMarkdown renders the reports of one run (MarkdownRun) as the
// performance document: provenance, the headline table (WriteSummary's),
// then one section per test with every row, its same-run reference and
// the ratio to it.
func WriteMarkdown(w io.Writer, reps []Report) error {
	rev, date, device, err := MarkdownRun(reps)
	if err != nil {
		return err
	}
	reps = sortedReports(reps)
	var b strings.Builder
	b.WriteString("# Performance\n\n")
	b.WriteString("<!-- Rendered from the result files of docs/results by `pinmem report --format markdown FILE... -o docs/PERF.md` (docs/results/measure.sh): do not edit; a test checks that this file is what the JSON renders. -->\n\n")
	markdownHeader(&b, reps, rev, date, device)
	b.WriteString("\nEvery figure below is the median of its samples, with the smallest and largest sample; a ratio is this row against the reference named beside it, measured in the same run (above 1 is better, whatever the unit). The JSON, with every note, and the plots are in [results/](results/). To measure again: `scripts/gpu-suite build` here, then `.gpu/run figures` on the GPU machine, or `pinmem bench all --out DIR` anywhere.\n\n")
	b.WriteString("## Headline figures\n\n")
	writeSummary(&b, reps)
	for _, r := range reps {
		p := partOf(r.Meta)
		title, command := p, r.Meta.Command
		for _, pi := range partInfos {
			if pi.name == p {
				title, command = pi.title, pi.command
			}
		}
		fmt.Fprintf(&b, "\n## %s\n\n`%s`", title, command)
		if t := TimingOf(r.Meta, r.Results); t != "" {
			fmt.Fprintf(&b, "; timing: %s", t)
		}
		b.WriteString(".\n\n")
		writeRows(&b, r.Results)
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// sortedReports orders reports as partInfos does, unknown tests last.
func sortedReports(reps []Report) []Report {
	out := slices.Clone(reps)
	idx := func(r Report) int {
		p := partOf(r.Meta)
		for i, pi := range partInfos {
			if pi.name == p {
				return i
			}
		}
		return len(partInfos)
	}
	slices.SortStableFunc(out, func(a, b Report) int { return idx(a) - idx(b) })
	return out
}

// mdEscape keeps a cell's text from breaking the table.
func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// writeRows writes one table of every row of a test, with the kinds'
// descriptions under it.
func writeRows(b *strings.Builder, rs []Result) {
	rs = slices.Clone(rs)
	AddReferences(rs)
	b.WriteString("| kind | dir | size | median | min - max | unit | vs reference | note |\n|---|---|--:|--:|--:|---|--:|---|\n")
	var kinds []string
	for _, r := range rs {
		if !slices.Contains(kinds, r.Kind) {
			kinds = append(kinds, r.Kind)
		}
		if r.Skipped {
			fmt.Fprintf(b, "| %s | %s | %s | skipped | | %s | | %s |\n", r.Kind, r.Dir, FormatSize(r.Size), r.Unit, mdEscape(r.Note))
			continue
		}
		ratio := ""
		if r.Ref != "" {
			ratio = strconv.FormatFloat(r.Ratio, 'f', 2, 64) + "x " + r.Ref
		}
		note := r.Note
		if r.Path != "" {
			note = joinNotes([]string{"path: " + r.Path, note})
		}
		switch {
		case r.Timing == TimingComputed, r.Bench == "overlap" && r.Kind == VariantBound:
			note = joinNotes([]string{"computed, not measured", note})
		case !r.Verified:
			note = joinNotes([]string{"NOT verified", note})
		}
		if r.Kind == KindPageable && r.Dir == DirBidir && r.Timing == TimingEvents {
			note = joinNotes([]string{note, "measured before pageable bidir ran two goroutines: one thread queued both directions, so they ran one after the other and the halves above are the total split in two"})
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s - %s | %s | %s | %s |\n", r.Kind, r.Dir, FormatSize(r.Size),
			formatValue(r.Median), formatValue(r.Min), formatValue(r.Max), r.Unit, ratio, mdEscape(note))
	}
	first := true
	for _, k := range kinds {
		if n, ok := kindNotes[k]; ok {
			if first {
				b.WriteString("\n")
				first = false
			}
			fmt.Fprintf(b, "- %s: %s\n", k, n)
		}
	}
}

// headline selects the rows of the headline table: per test, the kinds
// and directions shown, at the largest size measured (sizes: also these).
type headline struct {
	part  string
	kinds []string
	dirs  []string
	sizes []int64 // nil: the largest size of each kind and direction
}

var headlines = []headline{
	{part: "bw", kinds: []string{KindPinned, KindPageable, KindCopier}, dirs: []string{DirH2D, DirD2H, DirBidir}},
	{part: "copier", kinds: []string{KindCopier, KindStagedBound}, dirs: []string{DirH2D, DirD2H}, sizes: []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30}},
	{part: "concurrency", kinds: []string{KindCopier}},
	{part: "pin", kinds: []string{PinHostAlloc, PinMmapRegister}, dirs: []string{OpPin, OpUnpin}},
	{part: "overlap"},
	{part: "zerocopy", dirs: []string{"reuse=1"}},
	{part: "blocks", kinds: []string{BlockKindAuto}},
	{part: "load", kinds: []string{"loader", "checkpoint", "torch"}},
	{part: "imagepipeline", kinds: []string{"naive", "pinned-4streams", "pipeline"}},
}

// WriteSummary writes the headline table of the reports of one run: a
// few rows of each test, each with its same-run reference, preceded by
// the provenance line.
func WriteSummary(w io.Writer, reps []Report) error {
	rev, date, device, err := MarkdownRun(reps)
	if err != nil {
		return err
	}
	var b strings.Builder
	markdownHeader(&b, sortedReports(reps), rev, date, device)
	b.WriteString("\n")
	writeSummary(&b, sortedReports(reps))
	_, err = io.WriteString(w, b.String())
	return err
}

func writeSummary(b *strings.Builder, reps []Report) {
	b.WriteString("| test | kind | dir | size | median | unit | vs reference, same run |\n|---|---|---|--:|--:|---|--:|\n")
	for _, h := range headlines {
		for _, rep := range reps {
			if partOf(rep.Meta) != h.part {
				continue
			}
			rs := slices.Clone(rep.Results)
			AddReferences(rs)
			largest := map[[2]string]int64{}
			for _, r := range rs {
				k := [2]string{r.Kind, r.Dir}
				if !r.Skipped && r.Size > largest[k] {
					largest[k] = r.Size
				}
			}
			for _, r := range rs {
				switch {
				case r.Skipped,
					h.kinds != nil && !slices.Contains(h.kinds, r.Kind),
					h.dirs != nil && !slices.Contains(h.dirs, r.Dir),
					h.sizes != nil && !slices.Contains(h.sizes, r.Size),
					h.sizes == nil && r.Size != largest[[2]string{r.Kind, r.Dir}],
					r.Bench == "overlap" && r.Unit == Ms:
					continue
				}
				ratio := ""
				if r.Ref != "" {
					ratio = strconv.FormatFloat(r.Ratio, 'f', 2, 64) + "x " + r.Ref
				}
				fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", h.part, r.Kind, r.Dir, FormatSize(r.Size), formatValue(r.Median), r.Unit, ratio)
			}
		}
	}
}
