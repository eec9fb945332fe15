package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

// readReports reads result files (as `--format json` writes them); "-" is
// stdin, read once, and the wait for it ends with ctx (the first signal),
// as the command's error. A file that cannot be read or is not a valid
// report is a usage error naming it.
func readReports(ctx context.Context, paths []string, stdin ...io.Reader) ([]bench.Report, error) {
	var out []bench.Report
	if n := countOf(paths, "-"); n > 1 || n == 1 && len(stdin) == 0 {
		return nil, usagef("-: standard input can be read once")
	}
	for _, p := range paths {
		if p == "-" {
			rep, err := readStdin(ctx, stdin[0])
			if ctx.Err() != nil {
				return nil, fmt.Errorf("reading standard input: %w", ctx.Err())
			}
			if err != nil {
				return nil, usagef("standard input: %v", err)
			}
			out = append(out, rep)
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, usagef("%s: %v", p, unwrapPath(err))
		}
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			_ = f.Close()
			return nil, usagef("%s: is a directory (want a result file written with --format json)", p)
		}
		rep, err := bench.ReadReport(f)
		_ = f.Close()
		if err != nil {
			return nil, usagef("%s: %v", p, err)
		}
		out = append(out, rep)
	}
	return out, nil
}

// readingStdin is set while a command waits on standard input: the first
// signal then says it stops reading, not that a measurement stops.
var readingStdin atomic.Bool

// readStdin reads a report from r on a goroutine of its own, so that the
// wait ends when ctx does (a read from a terminal or a pipe does not); the
// goroutine is left blocked on the read, and the process exits.
func readStdin(ctx context.Context, r io.Reader) (bench.Report, error) {
	readingStdin.Store(true)
	defer readingStdin.Store(false)
	type result struct {
		rep bench.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := bench.ReadReport(r)
		done <- result{rep, err}
	}()
	select {
	case res := <-done:
		return res.rep, res.err
	case <-ctx.Done():
		return bench.Report{}, ctx.Err()
	}
}

// skipShippedJSON leaves out of several files the JSON files that sit
// beside result files but are not results (docs/results/*.json holds
// them): JSON Schemas and doctor's report, each with a line on standard
// error. A single file, or a list of nothing else, is left to be refused
// with the reason.
func skipShippedJSON(cmd *cobra.Command, paths []string) ([]string, error) {
	if len(paths) < 2 {
		return paths, nil
	}
	var keep []string
	for _, p := range paths {
		if what := otherJSON(p); what != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "pinmem report: skipping %s: %s, not a result file\n", p, what)
			continue
		}
		keep = append(keep, p)
	}
	if len(keep) == 0 {
		return nil, usagef("no result files among %s", strings.Join(paths, " "))
	}
	return keep, nil
}

// otherJSON says which JSON file pinmem ships beside result files path
// is ("a JSON Schema", "pinmem doctor's report"), or "" for any other
// file.
func otherJSON(path string) string {
	if path == "-" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var top map[string]json.RawMessage
	if json.NewDecoder(io.LimitReader(f, bench.MaxReportBytes)).Decode(&top) != nil {
		return ""
	}
	_, schema := top["$schema"]
	_, checks := top["checks"]
	_, meta := top["meta"]
	switch {
	case schema:
		return "a JSON Schema"
	case checks && !meta:
		return "pinmem doctor's report"
	}
	return ""
}

// countOf counts s in list.
func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// reportArgs wants at least min result files (min is 1: the message
// asks for one).
func reportArgs(min int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min {
			return usagef("%s: name a result file written with --format json (or - for standard input)", cmd.CommandPath())
		}
		return nil
	}
}

func jsonFiles(_ *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	return []string{"json"}, cobra.ShellCompDirectiveFilterFileExt
}

func newReport() *cobra.Command {
	var (
		o        output
		baseline string
		into     string
	)
	c := &cobra.Command{
		Use:   "report FILE.json...",
		Short: "Render saved results as a table, CSV, JSON, markdown, SVG or PNG (no GPU needed)",
		Long: `report reads result files written with --format json by bench, bench pin,
bench overlap, bench matrix, bench blocks, bench load or zerocopy, or by bench
all (DIR/*.json), on this machine or another, and renders them: table, csv
or json (one file's results after another's; json merges them into one report
with the first file's metadata) or a plot, svg or png, of every measurement
they hold (one panel per measurement and direction), captioned with the
device, driver, revision and date. "-" reads a report from standard input. Among several files, the JSON files that sit beside
results but are none (JSON Schemas, doctor's report: docs/results/*.json
takes them in) are left out with a line on standard error.

markdown renders the reports of one run (pinmem bench all) as docs/PERF.md:
provenance (one commit, one date, the device), the headline table, and every
row with its same-run reference and ratio; summary is the headline table
alone (the README's). --into DOC.md rewrites, in place, what DOC.md shows of
the run: the headline table between its figure markers and each claim
between <!-- claim NAME --> and <!-- /claim --> (the README's sentences that
state a ratio: copier, pin, pinned). Reports of different revisions, devices
or drivers are refused. A png needs --out. Nothing here needs a GPU. Files that are not
valid reports are refused with one line saying where and why (exit status 2).

` + exitHelp,
		Example: `  pinmem report bw.json
  pinmem report docs/results/bw.json --format png -o bw.png
  pinmem report bw.json pin.json --format csv
  pinmem report --format markdown docs/results/*.json -o docs/PERF.md
  pinmem report --into README.md docs/results/*.json
  pinmem bench --format json | pinmem report - -o bw.svg`,
		Args:              reportArgs(1),
		ValidArgsFunction: jsonFiles,
		RunE: func(cmd *cobra.Command, args []string) error {
			if into != "" {
				return fillDoc(cmd, into, args)
			}
			return runReport(cmd, &o, baseline, args)
		},
	}
	o.register(c, []string{"table", "json", "csv", "markdown", "summary", "svg", "png"}, false)
	c.Flags().StringVar(&baseline, "baseline", "", "kind, method or variant the table's ratio column compares with (empty: none)")
	c.Flags().StringVar(&into, "into", "", "rewrite the figure table and the claims of this markdown file (the README) from the results, in place")
	return c
}

// runReport renders the reports in files as o says.
func runReport(cmd *cobra.Command, o *output, baseline string, files []string) error {
	if _, err := o.check(); err != nil {
		return err
	}
	if o.format == "png" && (o.out == "" || o.out == "-") {
		return usagef("--format png writes binary data: name a file with --out")
	}
	files, err := skipShippedJSON(cmd, files)
	if err != nil {
		return err
	}
	reps, err := readReports(cmd.Context(), files, cmd.InOrStdin())
	if err != nil {
		return err
	}
	var rs []bench.Result
	for _, r := range reps {
		rs = append(rs, r.Results...)
	}
	if baseline != "" && !slices.ContainsFunc(rs, func(r bench.Result) bool { return r.Kind == baseline }) {
		return usagef("--baseline %q: no result of that kind, method or variant in %s", baseline, strings.Join(files, ", "))
	}
	var buf bytes.Buffer
	if err := renderReports(&buf, o.format, baseline, files, reps, rs); err != nil {
		return err
	}
	return o.write(cmd, buf.Bytes())
}

// fillDoc rewrites the rendered regions of the markdown file doc (the
// figure table, the claims) from the reports of one run in files.
func fillDoc(cmd *cobra.Command, doc string, files []string) error {
	for _, f := range []string{"format", "out", "baseline"} {
		if cmd.Flags().Changed(f) {
			return usagef("--into %s rewrites that file: --%s does not apply", doc, f)
		}
	}
	if err := checkOutPath("--into", doc); err != nil {
		return err
	}
	old, err := os.ReadFile(doc)
	if err != nil {
		return usagef("--into %s: %v", doc, unwrapPath(err))
	}
	files, err = skipShippedJSON(cmd, files)
	if err != nil {
		return err
	}
	reps, err := readReports(cmd.Context(), files, cmd.InOrStdin())
	if err != nil {
		return err
	}
	out, err := bench.FillDoc(old, reps)
	if err != nil {
		return usagef("--into %s: %v", doc, err)
	}
	return writeAtomic(doc, out)
}

// renderReports writes the reports read from files, whose rows together
// are rs, in format.
func renderReports(buf *bytes.Buffer, format, baseline string, files []string, reps []bench.Report, rs []bench.Result) error {
	m := reps[0].Meta
	switch format {
	case "markdown":
		if err := bench.WriteMarkdown(buf, reps); err != nil {
			return usage(err)
		}
	case "summary":
		if err := bench.WriteSummary(buf, reps); err != nil {
			return usage(err)
		}
	case "csv":
		var srcs []bench.CSVSource
		for i, r := range reps {
			srcs = append(srcs, bench.CSVSource{File: files[i], Meta: r.Meta, Results: r.Results})
		}
		return bench.WriteCSV(buf, srcs...)
	case "svg", "png":
		return bench.WritePlot(buf, bench.ImageFormat(format), m, rs)
	case "table":
		return writeReportTables(buf, baseline, files, reps)
	default:
		for _, r := range reps[1:] {
			m.Partial = m.Partial || r.Meta.Partial
		}
		return bench.Write(buf, bench.Format(format), m, rs, bench.TableOptions{})
	}
	return nil
}

// writeReportTables writes each report as a table under its file's name;
// a matrix as a matrix unless a baseline asks for ratios.
func writeReportTables(buf *bytes.Buffer, baseline string, files []string, reps []bench.Report) error {
	for i, r := range reps {
		if i > 0 {
			buf.WriteString("\n")
		}
		fmt.Fprintf(buf, "# %s\n", files[i])
		var err error
		if r.Meta.Command == "pinmem bench matrix" && baseline == "" {
			err = bench.WriteMatrix(buf, r.Meta, r.Results)
		} else {
			err = bench.WriteTable(buf, r.Meta, r.Results, bench.TableOptions{Baseline: baseline})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func newCompare() *cobra.Command {
	var (
		o         output
		threshold string
		devices   bool
		verbose   bool
	)
	c := &cobra.Command{
		Use:   "compare A.json B.json",
		Short: "Compare two saved runs: each result of B as a ratio to A",
		Long: `compare pairs the results of two result files (two machines, or before and
after a change) that have the same bench, kind, direction, size and unit, and
prints both medians and B's speed relative to A: above 1 means B is better
(faster transfers, less time), whatever the unit. With --threshold, a result
where B is worse than A by more than the threshold, and whose samples (min to
max) do not overlap A's, is a regression: compare lists them and exits with
status 1: the last line gives their count and the worst few (every one with
-v; the table marks each REGRESSION). A difference within the samples' spread
is marked noise. Files with no result in common exit with status 1 too.

--format json writes {"a", "b" (the files), "meta_a", "meta_b" (their
metadata), "only_a", "only_b" (rows in one file only), "results" (one object
per pair)}, as docs/results/compare.schema.json describes.

Files from different devices or drivers are refused (exit status 2): their
ratios say nothing about a change. --across-devices compares them anyway (two
machines side by side), with a warning on standard error.

` + exitHelp,
		Example: `  pinmem compare before.json after.json
  pinmem compare a100.json h200.json --format csv
  pinmem compare main.json branch.json --threshold 5%`,
		Args:              func(cmd *cobra.Command, args []string) error { return exactFiles(cmd, args, 2) },
		ValidArgsFunction: jsonFiles,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := o.check()
			if err != nil {
				return err
			}
			th, err := parseThreshold(threshold)
			if err != nil {
				return usagef("--threshold: %v", err)
			}
			reps, err := readReports(cmd.Context(), args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if why := bench.SameSetup(reps[0].Meta, reps[1].Meta); why != "" {
				if !devices {
					return usagef("%s and %s: %s; --across-devices compares two machines side by side", args[0], args[1], why)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "pinmem: WARNING: %s: the ratios compare two setups, not a change\n", why)
			}
			cs, onlyA, onlyB := bench.Compare(reps[0].Results, reps[1].Results)
			var buf bytes.Buffer
			if err := writeComparison(&buf, f, args, reps, cs, onlyA, onlyB, th); err != nil {
				return err
			}
			if err := o.write(cmd, buf.Bytes()); err != nil {
				return err
			}
			if len(cs) == 0 {
				return &problemError{fmt.Sprintf("%s and %s have no result in common", args[0], args[1])}
			}
			if msg := regressions(cs, th, threshold, verbose); msg != "" {
				return &problemError{msg}
			}
			return nil
		},
	}
	o.register(c, reportFormats, false)
	c.Flags().StringVar(&threshold, "threshold", "", "a result of B worse than A by more than this (5% or 0.05), beyond the samples' spread, is a regression: exit status 1")
	c.Flags().BoolVar(&devices, "across-devices", false, "compare files from different devices or drivers (two machines), with a warning")
	c.Flags().BoolVarP(&verbose, "verbose", "v", false, "list every regression in the last line, not the worst few")
	return c
}

// worstRegressions is how many regressions compare's last line names
// without -v.
const worstRegressions = 5

// regressions returns compare's last line for the comparisons of cs
// worse than the threshold th (given as text) and beyond the samples'
// spread: their count and the worst few, or every one with verbose; ""
// when there is none.
func regressions(cs []bench.Comparison, th float64, text string, verbose bool) string {
	if th < 0 {
		return ""
	}
	var worse []bench.Comparison
	for _, c := range cs {
		if c.OK && c.Ratio < 1-th && !c.Noise {
			worse = append(worse, c)
		}
	}
	if len(worse) == 0 {
		return ""
	}
	slices.SortStableFunc(worse, func(a, b bench.Comparison) int { return cmp.Compare(a.Ratio, b.Ratio) })
	shown := worse
	if !verbose && len(worse) > worstRegressions {
		shown = worse[:worstRegressions]
	}
	var names []string
	for _, c := range shown {
		names = append(names, fmt.Sprintf("%s %s %s %s %.3fx", c.Bench, c.Kind, c.Dir, bench.FormatSize(c.Size), c.Ratio))
	}
	msg := fmt.Sprintf("%d regression(s) beyond %s", len(worse), text)
	if len(shown) < len(worse) {
		return fmt.Sprintf("%s; the worst %d: %s; and %d more (-v lists every one; the table marks them REGRESSION)", msg, len(shown), strings.Join(names, "; "), len(worse)-len(shown))
	}
	return msg + ": " + strings.Join(names, "; ")
}

func exactFiles(cmd *cobra.Command, args []string, n int) error {
	if len(args) != n {
		return usagef("%s needs exactly %d result files (got %d)", cmd.CommandPath(), n, len(args))
	}
	return nil
}

// parseThreshold parses "5%" or "0.05" into a fraction in [0, 1); ""
// means no threshold (-1).
func parseThreshold(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return -1, nil
	}
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q: want a percentage such as 5%% or a fraction such as 0.05", s)
	}
	if pct {
		v /= 100
	}
	if !pct && v >= 1 && v < 100 {
		return 0, fmt.Errorf("%q: a fraction is below 1; for %s percent write %s%%", s, s, s)
	}
	if v < 0 || v >= 1 {
		return 0, fmt.Errorf("%q: want at least 0%% and below 100%%", s)
	}
	return v, nil
}

// comparisonJSON is compare's JSON output (docs/results/compare.schema.json).
type comparisonJSON struct {
	A       string          `json:"a"` // the files compared
	B       string          `json:"b"`
	MetaA   bench.Meta      `json:"meta_a"`
	MetaB   bench.Meta      `json:"meta_b"`
	OnlyA   int             `json:"only_a"` // rows of one file only, not compared
	OnlyB   int             `json:"only_b"`
	Results []comparisonRow `json:"results"`
}

// comparisonRow is one line of compare's JSON output.
type comparisonRow struct {
	Bench      string     `json:"bench"`
	Kind       string     `json:"kind"`
	Dir        string     `json:"dir"`
	Size       int64      `json:"size"`
	Unit       bench.Unit `json:"unit"`
	A          float64    `json:"a"`
	B          float64    `json:"b"`
	Ratio      *float64   `json:"ratio"` // null when either side has no value
	Noise      bool       `json:"noise"` // the samples' ranges overlap
	Regression bool       `json:"regression"`
}

func writeComparison(buf *bytes.Buffer, f bench.Format, files []string, reps []bench.Report, cs []bench.Comparison, onlyA, onlyB int, th float64) error {
	rows := make([]comparisonRow, 0, len(cs))
	for _, c := range cs {
		r := comparisonRow{Bench: c.Bench, Kind: c.Kind, Dir: c.Dir, Size: c.Size, Unit: c.Unit, A: c.A, B: c.B, Noise: c.Noise}
		if c.OK {
			x := c.Ratio
			r.Ratio = &x
			r.Regression = th >= 0 && x < 1-th && !c.Noise
		}
		rows = append(rows, r)
	}
	switch f {
	case bench.FormatJSON:
		enc := json.NewEncoder(buf)
		enc.SetIndent("", "  ")
		return enc.Encode(comparisonJSON{files[0], files[1], reps[0].Meta, reps[1].Meta, onlyA, onlyB, rows})
	case bench.FormatCSV:
		w := csv.NewWriter(buf)
		_ = w.Write([]string{"bench", "kind", "dir", "size_bytes", "unit", "a", "b", "ratio", "noise", "regression"})
		g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
		for _, r := range rows {
			ratio := ""
			if r.Ratio != nil {
				ratio = g(*r.Ratio)
			}
			_ = w.Write([]string{r.Bench, r.Kind, r.Dir, strconv.FormatInt(r.Size, 10), string(r.Unit), g(r.A), g(r.B), ratio, strconv.FormatBool(r.Noise), strconv.FormatBool(r.Regression)})
		}
		w.Flush()
		return w.Error()
	}
	fmt.Fprintf(buf, "# A: %s (%s, %s)\n# B: %s (%s, %s)\n# B/A: above 1 means B is better\n",
		files[0], reps[0].Meta.Command, reps[0].Meta.Device, files[1], reps[1].Meta.Command, reps[1].Meta.Device)
	tw := tabwriter.NewWriter(buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "BENCH\tKIND\tDIR\tSIZE\tUNIT\tA\tB\tB/A\t")
	for _, r := range rows {
		ratio := "-"
		if r.Ratio != nil {
			ratio = strconv.FormatFloat(*r.Ratio, 'f', 3, 64) + "x"
			switch {
			case r.Regression:
				ratio += " REGRESSION"
			case r.Noise:
				ratio += " (noise)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Bench, r.Kind, r.Dir, bench.FormatSize(r.Size), r.Unit,
			strconv.FormatFloat(r.A, 'f', 2, 64), strconv.FormatFloat(r.B, 'f', 2, 64), ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if onlyA > 0 || onlyB > 0 {
		fmt.Fprintf(buf, "# %d result(s) only in A, %d only in B (not compared)\n", onlyA, onlyB)
	}
	return nil
}
