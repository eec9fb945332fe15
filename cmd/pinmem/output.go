package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/budgetspec"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/units"
)

// checkOutPath checks, before any measurement, that path can be written
// atomically: its directory exists and takes new files, and path itself is
// not a directory, a symbolic link or another non-regular file. flag names
// the flag in the message. "" (no file) and "-" (standard output) pass.
func checkOutPath(flag, path string) error {
	if path == "" || path == "-" {
		return nil
	}
	if fi, err := os.Lstat(path); err == nil {
		switch {
		case fi.IsDir():
			return usagef("%s %s: is a directory (want a file name)", flag, path)
		case fi.Mode()&fs.ModeSymlink != 0:
			return usagef("%s %s: is a symbolic link; pinmem replaces files atomically and does not write through links (remove it or name the target)", flag, path)
		case !fi.Mode().IsRegular():
			return usagef("%s %s: is not a regular file", flag, path)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return usagef("%s %s: %v", flag, path, unwrapPath(err))
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usagef("%s %s: directory %s does not exist", flag, path, dir)
	case err != nil:
		return usagef("%s %s: %v", flag, path, unwrapPath(err))
	case !fi.IsDir():
		return usagef("%s %s: %s is not a directory", flag, path, dir)
	}
	// The honest test of "can a file be created here": create one.
	f, err := os.CreateTemp(dir, ".pinmem-check-*")
	if err != nil {
		return usagef("%s %s: directory %s is not writable (%v)", flag, path, dir, unwrapPath(err))
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return nil
}

// unwrapPath drops the operation and path of a *fs.PathError (the message
// names the path already).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// writeAtomic replaces path with data: a temporary file in the same
// directory is written, synced and renamed over path, and the directory is
// synced, so that a reader sees the old file or the new one, never a part.
// A symbolic link at path is refused, not followed (checkOutPath says so
// before the run).
func writeAtomic(path string, data []byte) (err error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s: is a symbolic link; not writing through it", path)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// output is where a command's report goes: --format, --out/-o, --plot.
type output struct {
	format  string
	out     string
	plot    string
	formats []string // the formats this command accepts
	flags   *pflag.FlagSet
}

// extFormats are the formats file name extensions imply.
var extFormats = map[string]string{
	".json": "json", ".csv": "csv", ".txt": "table", ".md": "markdown", ".svg": "svg", ".png": "png",
}

func (o *output) register(c *cobra.Command, formats []string, withPlot bool) {
	o.formats = formats
	o.flags = c.Flags()
	f := c.Flags()
	var exts []string
	for _, e := range slices.Sorted(maps.Keys(extFormats)) {
		if contains(formats, extFormats[e]) {
			exts = append(exts, "FILE"+e+": "+extFormats[e])
		}
	}
	f.StringVar(&o.format, "format", formats[0], "output format: "+strings.Join(formats, ", ")+"; -o FILE.EXT sets it from the extension")
	f.StringVarP(&o.out, "out", "o", "", "write the report to this file, atomically, in the format its extension names ("+strings.Join(exts, ", ")+"); - is standard output")
	_ = c.RegisterFlagCompletionFunc("format", fixedCompletion(formats...))
	if withPlot {
		f.StringVar(&o.plot, "plot", "", "also write a plot of the results to this file (.svg or .png)")
	}
}

// check validates the output flags and paths before any measurement.
// The format is --format, or the one -o's extension names: both given and
// different is refused, as is an extension whose format the command does
// not write. "-" and /dev/stdout are standard output.
func (o *output) check() (bench.Format, error) {
	if o.out == "/dev/stdout" {
		o.out = "-"
	}
	if base := filepath.Base(o.out); o.out != "" && filepath.Ext(base) == "" && contains(append(o.formats, "text", "table"), strings.ToLower(base)) {
		return "", usagef("-o %s: a file named after a format; for that format use --format %s (and -o FILE.%s for a file)", o.out, base, base)
	}
	if o.out != os.DevNull {
		if err := checkOutPath("--out", o.out); err != nil {
			return "", err
		}
	}
	if err := o.checkExtKnown(); err != nil {
		return "", err
	}
	ff, err := o.chosenFormat()
	if err != nil {
		return "", err
	}
	if err := o.checkPlot(); err != nil {
		return "", err
	}
	return bench.Format(ff), nil
}

// checkExtKnown refuses, unless --format says the format, an -o file
// whose extension names no format (r.yaml) or that has none: the format
// is never guessed. Standard output and /dev/null (the report discarded)
// need no extension.
func (o *output) checkExtKnown() error {
	if o.out == "" || o.out == "-" || o.out == os.DevNull || o.flags != nil && o.flags.Changed("format") {
		return nil
	}
	var exts []string
	for _, e := range slices.Sorted(maps.Keys(extFormats)) {
		if contains(o.formats, extFormats[e]) {
			exts = append(exts, e)
		}
	}
	ext := strings.ToLower(filepath.Ext(filepath.Base(o.out)))
	switch _, known := extFormats[ext]; {
	case ext == "":
		return usagef("-o %s: no extension to say the format (want %s, or --format FORMAT)", o.out, strings.Join(exts, ", "))
	case !known:
		return usagef("-o %s: unknown extension %s (want %s, or --format FORMAT)", o.out, ext, strings.Join(exts, ", "))
	}
	return nil
}

// chosenFormat returns the format --format names, or -o's extension
// (which becomes --format), "text" meaning "table".
func (o *output) chosenFormat() (string, error) {
	ff := strings.ToLower(strings.TrimSpace(o.format))
	if ext, ok := extFormats[strings.ToLower(filepath.Ext(o.out))]; ok && o.out != "-" {
		if err := o.checkExt(ext, ff); err != nil {
			return "", err
		}
		ff = ext
		o.format = ext
	}
	if ff == "text" {
		ff = "table"
	}
	if !contains(o.formats, ff) {
		return "", usagef("--format %q: want one of %s", o.format, strings.Join(o.formats, ", "))
	}
	return ff, nil
}

// checkExt refuses -o's extension, naming format ext, when the command
// does not write it or --format, given as ff, names another.
func (o *output) checkExt(ext, ff string) error {
	explicit := o.flags != nil && o.flags.Changed("format")
	switch {
	case !contains(o.formats, ext):
		hint := ""
		if o.plot == "" && (ext == "svg" || ext == "png") && !contains(o.formats, "png") {
			hint = " (--plot FILE writes an image)"
		}
		return usagef("-o %s: this command does not write %s; it writes %s%s", o.out, ext, strings.Join(o.formats, ", "), hint)
	case explicit && ext != ff && !(ff == "text" && ext == "table"):
		return usagef("-o %s names %s but --format is %s: drop one or make them agree", o.out, ext, o.format)
	}
	return nil
}

// checkPlot refuses a --plot that is not an image file name or that is
// --out's file.
func (o *output) checkPlot() error {
	if o.plot == "" {
		return nil
	}
	if _, err := bench.ImageFormatOf(o.plot); err != nil {
		return usagef("--plot: %v", err)
	}
	if err := checkOutPath("--plot", o.plot); err != nil {
		return err
	}
	if o.out != "" && filepath.Clean(o.plot) == filepath.Clean(o.out) {
		return usagef("--plot and --out name the same file %s", o.out)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// write sends data to --out (atomically) or to stdout; -o /dev/null
// discards it.
func (o *output) write(cmd *cobra.Command, data []byte) error {
	if o.out == "" || o.out == "-" {
		_, err := cmd.OutOrStdout().Write(data)
		return err
	}
	if o.out == os.DevNull {
		return nil
	}
	if err := writeAtomic(o.out, data); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// emit writes the report in every chosen output (the report, the plot)
// and then says whether the run succeeded: runErr (a run that ended early:
// the report is marked partial) comes first; then a run whose every result
// was skipped, or with a failed verification, is a measurement problem.
func (o *output) emit(cmd *cobra.Command, f bench.Format, m bench.Meta, rs []bench.Result, opts bench.TableOptions, runErr error) error {
	m.Partial = runErr != nil
	m.Timing = bench.TimingOf(m, rs)
	var buf bytes.Buffer
	var err error
	if f == bench.FormatTable && m.Command == "pinmem bench matrix" && opts.Baseline == "" {
		err = bench.WriteMatrix(&buf, m, rs)
	} else {
		err = bench.Write(&buf, f, m, rs, opts)
	}
	if err != nil {
		return errors.Join(runErr, err)
	}
	errs := []error{runErr, o.write(cmd, buf.Bytes())}
	if o.plot != "" {
		errs = append(errs, writePlot(o.plot, m, rs))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return verdict(rs)
}

// verdict says whether finished results show a measurement problem.
func verdict(rs []bench.Result) error {
	var failed []string
	skipped := 0
	for _, r := range rs {
		if r.Failed() {
			failed = append(failed, fmt.Sprintf("%s %s %s %s", r.Bench, r.Kind, r.Dir, bench.FormatSize(r.Size)))
		}
		if r.Skipped {
			skipped++
		}
	}
	switch {
	case len(failed) > 0:
		return &problemError{fmt.Sprintf("verification failed in %d result(s): %s; the figures are not to be trusted", len(failed), strings.Join(failed, ", "))}
	case len(rs) == 0:
		return &problemError{"nothing was measured"}
	case skipped == len(rs):
		return &problemError{fmt.Sprintf("every result was skipped (first: %s)", rs[0].Note)}
	}
	return nil
}

// writePlot writes the plot of the results to path, in the format its
// extension names. Results with nothing to plot write no file and are not
// an error when some other output got the report.
func writePlot(path string, m bench.Meta, rs []bench.Result) error {
	f, err := bench.ImageFormatOf(path)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := bench.WritePlot(&buf, f, m, rs); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := writeAtomic(path, buf.Bytes()); err != nil {
		return fmt.Errorf("writing the plot: %w", err)
	}
	return nil
}

// checkBudgetEnv refuses a PINMEM_BUDGET that does not parse: every pinned
// measurement would otherwise be skipped.
func checkBudgetEnv() error {
	v, ok := os.LookupEnv(pinmem.EnvBudget)
	if !ok || strings.TrimSpace(v) == "" {
		return nil
	}
	if _, err := budgetspec.Parse(v, 1<<40); err != nil {
		var ue *units.Error
		if errors.As(err, &ue) {
			err = ue // the size's own message, without the wrapping sentinels
		}
		return usagef("%s=%q: %v", pinmem.EnvBudget, v, err)
	}
	return nil
}

// fixedCompletion completes a flag with a fixed list of values (for comma
// lists, the last element).
func fixedCompletion(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		prefix := ""
		if i := strings.LastIndex(toComplete, ","); i >= 0 {
			prefix = toComplete[:i+1]
		}
		var out []string
		for _, v := range values {
			out = append(out, prefix+v)
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
}

// aliasFlags maps alternative flag spellings onto the canonical ones:
// --dir is --dirs, --size is --sizes.
func aliasFlags(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	switch name {
	case "dir":
		name = "dirs"
	case "size":
		name = "sizes"
	}
	return pflag.NormalizedName(name)
}
