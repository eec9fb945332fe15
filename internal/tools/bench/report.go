package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Meta describes where, how and by what results were measured: the
// provenance every saved report carries (docs/results/SCHEMA.md).
type Meta struct {
	Schema  int          `json:"schema_version"`    // SchemaVersion of the writer
	Command string       `json:"command,omitempty"` // e.g. "pinmem bench"
	Tool    Tool         `json:"tool"`              // the program and build that measured
	Argv    []string     `json:"argv,omitempty"`    // the command line
	Time    string       `json:"time,omitempty"`    // when the run started (RFC 3339)
	Partial bool         `json:"partial"`           // the run was interrupted or ended early: not every configured measurement is present
	Device  string       `json:"device,omitempty"`  // e.g. "NVIDIA H200 (device 0, PCI 0000:1a:00.0)"
	Driver  string       `json:"driver,omitempty"`  // e.g. "CUDA 13.0"
	Timing  string       `json:"timing,omitempty"`  // how copies were timed, and why if not with spin-wait
	Host    Host         `json:"host"`              // the machine
	Devices []DeviceInfo `json:"devices,omitempty"` // every GPU measured
	Config  any          `json:"config,omitempty"`  // the measurement's configuration (a *Config struct, or a decoded object)
	Part    string       `json:"part,omitempty"`    // the suite test (pinmem bench all -t) this report is
	Note    string       `json:"note,omitempty"`    // what a reader must know about the whole run (a quick run, a fake driver)
}

// Report is what the JSON output holds: the metadata and every result.
type Report struct {
	Meta    Meta     `json:"meta"`
	Results []Result `json:"results"`
}

// TableOptions tune WriteTable.
type TableOptions struct {
	// Baseline is the kind the ratio column compares with ("pinned" for
	// the bandwidth bench); empty leaves the column out.
	Baseline string
}

// formatValue prints a value with about three significant digits.
func formatValue(v float64) string {
	switch a := abs(v); {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// timingWords describe each row timing for a report's header.
var timingWords = map[string]string{
	TimingWall:     "host wall clock around the work",
	TimingEvents:   "CUDA events around the queued work",
	TimingComputed: "computed from other rows",
}

// TimingOf says how a report's rows were timed: the session's method
// (m.Timing) when any row used it, else the one method every measured row
// shares (a pin report is timed by the wall clock whatever the session
// could do). A timing a command stated itself is kept.
func TimingOf(m Meta, results []Result) string {
	if !strings.HasPrefix(m.Timing, sessionSpinTiming) && !strings.HasPrefix(m.Timing, sessionEventsTiming) {
		return m.Timing // a command's own statement (blocks, load), or none
	}
	var kinds []string
	for _, r := range results {
		if !r.Skipped && r.Timing != "" && !slices.Contains(kinds, r.Timing) {
			kinds = append(kinds, r.Timing)
		}
	}
	if len(kinds) == 1 && kinds[0] != TimingSpin {
		if w, ok := timingWords[kinds[0]]; ok {
			return w
		}
	}
	return m.Timing
}

// WriteTable writes results as an aligned text table, with a header line
// from m, a ratio column against opts.Baseline, and the notes last.
// Text columns are left-aligned and numbers right-aligned.
func WriteTable(w io.Writer, m Meta, results []Result, opts TableOptions) error {
	var b strings.Builder
	writeTableHeader(&b, m, results)
	head := []string{"BENCH", "KIND", "DIR", "SIZE", "MEDIAN", "MIN", "MAX", "UNIT", "N", "VERIFIED"}
	right := []bool{false, false, false, true, true, true, true, false, true, false}
	var ratios map[int]float64
	if opts.Baseline != "" {
		ratios = Baseline(results, opts.Baseline)
		head = append(head, "VS "+strings.ToUpper(opts.Baseline))
		right = append(right, true)
	}
	head = append(head, "NOTE")
	right = append(right, false)
	rows := [][]string{head}
	for i, r := range results {
		row := tableCells(r)
		if ratios != nil {
			if x, ok := ratios[i]; ok {
				row = append(row, strconv.FormatFloat(x, 'f', 2, 64)+"x")
			} else {
				row = append(row, "")
			}
		}
		rows = append(rows, append(row, tableNote(r)))
	}
	writeAligned(&b, rows, right)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTableHeader writes the table's comment lines: the command, device
// and driver; the timing; whether the run was partial.
func writeTableHeader(b *strings.Builder, m Meta, results []Result) {
	if m.Command != "" || m.Device != "" {
		fmt.Fprintf(b, "# %s", m.Command)
		if m.Device != "" {
			fmt.Fprintf(b, " on %s", m.Device)
		}
		if m.Driver != "" {
			fmt.Fprintf(b, ", driver %s", m.Driver)
		}
		b.WriteString("\n")
	}
	if t := TimingOf(m, results); t != "" {
		fmt.Fprintf(b, "# timing: %s\n", t)
	}
	if m.Partial {
		b.WriteString("# PARTIAL: the run was interrupted or ended early; not every configured measurement is present\n")
	}
}

// tableCells returns a result's cells from BENCH to VERIFIED.
func tableCells(r Result) []string {
	row := []string{r.Bench, r.Kind, r.Dir, FormatSize(r.Size)}
	switch {
	case r.Skipped:
		return append(row, "-", "-", "-", string(r.Unit), "0", "skipped")
	case r.Timing == TimingComputed:
		return append(row, formatValue(r.Median), "-", "-", string(r.Unit), "-", "computed")
	}
	ver := "yes"
	if !r.Verified {
		ver = "NO"
	}
	return append(row, formatValue(r.Median), formatValue(r.Min), formatValue(r.Max),
		string(r.Unit), strconv.Itoa(r.Samples), ver)
}

// tableNote is a result's note, led by its timing in brackets unless it
// was skipped or timed with spin-wait (the default).
func tableNote(r Result) string {
	if r.Skipped || r.Timing == "" || r.Timing == TimingSpin {
		return r.Note
	}
	if r.Note != "" {
		return "[" + r.Timing + "] " + r.Note
	}
	return "[" + r.Timing + "]"
}

// writeAligned writes rows as columns two spaces apart, right-aligned
// where right says, left-aligned otherwise; the last column is not padded.
func writeAligned(b *strings.Builder, rows [][]string, right []bool) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for j, c := range row {
			widths[j] = max(widths[j], len(c))
		}
	}
	for _, row := range rows {
		var line strings.Builder
		for j, c := range row {
			if j > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[j]-len(c))
			switch {
			case j == len(row)-1:
				line.WriteString(c)
			case right[j]:
				line.WriteString(pad + c)
			default:
				line.WriteString(c + pad)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteString("\n")
	}
}

// WriteJSON writes the report as indented JSON: {"meta": ..., "results": [...]}.
func WriteJSON(w io.Writer, m Meta, results []Result) error {
	if results == nil {
		results = []Result{}
	}
	markFailures(results)
	if m.Schema == 0 {
		m.Schema = SchemaVersion
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(Report{Meta: m, Results: results})
}

// CSVHeader is the first row WriteCSV writes.
var CSVHeader = []string{"file", "device", "bench", "kind", "dir", "size_bytes", "size", "unit", "median", "min", "max",
	"samples", "verified", "timing", "skipped", "path", "ref", "ratio", "note"}

// CSVSource is one report's rows for WriteCSV: the file it was read from
// ("" for a run's own output) and its metadata.
type CSVSource struct {
	File    string
	Meta    Meta
	Results []Result
}

// WriteCSV writes one row per result of every source under CSVHeader, each
// naming its file and device, so that rows of several reports stay apart.
// Numbers are written in full precision (shortest exact form).
func WriteCSV(w io.Writer, sources ...CSVSource) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, src := range sources {
		rs := slices.Clone(src.Results)
		AddReferences(rs)
		for _, r := range rs {
			ratio := ""
			if r.Ref != "" {
				ratio = f(r.Ratio)
			}
			if err := cw.Write([]string{src.File, src.Meta.Device, r.Bench, r.Kind, r.Dir, strconv.FormatInt(r.Size, 10), FormatSize(r.Size),
				string(r.Unit), f(r.Median), f(r.Min), f(r.Max), strconv.Itoa(r.Samples),
				strconv.FormatBool(r.Verified), r.Timing, strconv.FormatBool(r.Skipped), r.Path, r.Ref, ratio, r.Note}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// Format is an output format of the CLI.
type Format string

// Output formats.
const (
	FormatTable Format = "table"
	FormatJSON  Format = "json"
	FormatCSV   Format = "csv"
)

// ParseFormat accepts "table" (or "text"), "json" and "csv".
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "table", "text", "":
		return FormatTable, nil
	case "json":
		return FormatJSON, nil
	case "csv":
		return FormatCSV, nil
	}
	return "", invalid("unknown format %q (want table, json or csv)", s)
}

// Write renders results in format f. Results whose note reports a
// verification failure get VerifyFailed set, and every result its
// same-run reference (AddReferences).
func Write(w io.Writer, f Format, m Meta, results []Result, opts TableOptions) error {
	markFailures(results)
	AddReferences(results)
	switch f {
	case FormatJSON:
		return WriteJSON(w, m, results)
	case FormatCSV:
		return WriteCSV(w, CSVSource{Meta: m, Results: results})
	}
	return WriteTable(w, m, results, opts)
}
