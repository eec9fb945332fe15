package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/internal/tools/bench"
)

func init() {
	benchSubcommands = append(benchSubcommands, newBenchAll)
}

// Parts of the suite measured outside internal/tools/bench: the weight loader
// (bench load, with PyTorch beside it) and the image pipeline example.
const (
	partLoad          = "load"
	partImagePipeline = "imagepipeline"
)

// allPartsList returns every part's name, what it measures and its weight
// in a time budget, in run order, for --list.
func allPartsList() [][3]string {
	var out [][3]string
	for _, p := range bench.SuiteParts() {
		out = append(out, [3]string{p.Name, p.About, fmt.Sprint(p.Weight)})
	}
	ow := fmt.Sprint(outsideWeight)
	out = append(out,
		[3]string{partLoad, "a file to the GPU by the weight loader against plain reads and PyTorch (needs --weights FILE)", ow},
		[3]string{partImagePipeline, "the image pipeline example against the C baseline's loops and the copy bounds (needs --imagepipeline BIN)", ow})
	return out
}

// suiteFlags are bench all's flags.
type suiteFlags struct {
	out, tests, plotExt, cref, weights, python, imagepipeline string
	device, samples                                           int
	list, quick, quiet                                        bool
	budget                                                    time.Duration
}

// defaultBudget is bench all's time budget: a full run fits one
// 10-minute GPU job with the build and doctor beside it.
const defaultBudget = 8 * time.Minute

// outsideWeight is the share of a time budget of each test measured
// outside internal/tools/bench (load, imagepipeline), against the parts'
// weights (bench.SuitePart.Weight).
const outsideWeight = 1.0

func newBenchAll() *cobra.Command {
	var f suiteFlags
	c := &cobra.Command{
		Use:   "all --out DIR",
		Short: "Measure every headline figure in one run: one report and one plot per test in DIR",
		Long: `all runs every test of the suite, one after another on one GPU, and writes
each test's report (DIR/NAME.json) and plot (DIR/NAME.png) as soon as the test
ends: what was measured stays when the run is interrupted (that test's report
is marked partial, and the tests after it are not run). Every report carries
the schema version, the tool's version and VCS revision, the host, driver and
device, and each row's same-run reference and ratio (ref, ratio).

  -l lists the tests; -t NAME,NAME runs only those (as nvbandwidth's -l, -t).

--budget bounds the whole run's time (default 8m, so that a full run fits a
10-minute GPU job; 0: no bound). Each test gets a share of what is left, by
its weight (-l shows them): bw 3, copier 3, blocks 2, concurrency, pin,
overlap, load and imagepipeline 1, zerocopy and matrix 0.5. Within its share
a test keeps every row and bounds each row's samples (at least 2; the row's
note says when the budget cut them); blocks of more than 256 KiB go in lists
of 1 GiB (512 blocks of 2 MiB), not 4096 blocks. A test that ran over leaves
the later ones less; the final line says the run's time against the budget.

With --cref DIR (cref/build -o DIR) the C reference programs run in the same
run: pinned and pageable rows beside cref/bw's, block copies beside
cref/blocks' loop. With --weights FILE the weight loader reads FILE (as
"pinmem bench load FILE") and, when --python has PyTorch and safetensors,
scripts/torch-load.py loads the same file beside it. With --imagepipeline BIN
(go build -o BIN ./examples/imagepipeline/measure) the image pipeline runs on
the same device: its rows go to DIR/imagepipeline.json like every test's,
its table to DIR/imagepipeline.txt.

Render the docs from the run with:
  pinmem report --format markdown DIR/*.json -o docs/PERF.md

` + exitHelp,
		Example: `  pinmem bench all --out results
  pinmem bench all --quick --out /tmp/r && pinmem report --format markdown /tmp/r/*.json
  pinmem bench all -l
  pinmem bench all -t copier,concurrency --out /tmp/r
  go build -o /tmp/ip ./examples/imagepipeline/measure
  pinmem bench all --out docs/results --cref cref/bin --weights model.safetensors --imagepipeline /tmp/ip`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSuite(cmd, f) },
	}
	fl := c.Flags()
	fl.StringVarP(&f.out, "out", "o", "", "directory for the reports and plots (created; files of the same names are replaced)")
	fl.StringVarP(&f.tests, "tests", "t", "all", "tests to run, comma-separated (see -l)")
	fl.BoolVarP(&f.list, "list", "l", false, "list the tests and exit")
	fl.BoolVar(&f.quick, "quick", false, "a smoke run: small sizes, two samples (not figures to publish)")
	fl.IntVar(&f.samples, "samples", 0, "timed samples per measurement (0: each test's default); under --budget, at most this many")
	fl.DurationVar(&f.budget, "budget", defaultBudget, "time for the whole run, shared by the tests by weight (0: no bound)")
	fl.IntVar(&f.device, "device", 0, "GPU ordinal to measure")
	fl.StringVar(&f.plotExt, "plot-format", "png", "format of the plots: png or svg")
	fl.StringVar(&f.cref, "cref", "", "directory of the built C reference programs (cref/build -o DIR)")
	fl.StringVar(&f.weights, "weights", "", "a weights file for the load test (safetensors)")
	fl.StringVar(&f.python, "python", "python3", "Python with PyTorch and safetensors for the load test's reference (runs scripts/torch-load.py: run from the repository root)")
	fl.StringVar(&f.imagepipeline, "imagepipeline", "", "the built image pipeline measurement (go build -o BIN ./examples/imagepipeline/measure)")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress on standard error")
	_ = c.RegisterFlagCompletionFunc("plot-format", fixedCompletion("png", "svg"))
	return c
}

// selectSuite returns the internal/tools/bench parts and the outside parts the
// -t list names.
func selectSuite(list string) ([]bench.SuitePart, []string, error) {
	all := bench.SuiteParts()
	extra := []string{partLoad, partImagePipeline}
	var names, outside []string
	for _, n := range strings.Split(list, ",") {
		n = strings.ToLower(strings.TrimSpace(n))
		if contains(extra, n) {
			outside = append(outside, n)
		} else if n != "" {
			names = append(names, n)
		}
	}
	if strings.TrimSpace(list) == "all" || strings.TrimSpace(list) == "" {
		return all, extra, nil
	}
	if len(names) == 0 {
		return nil, outside, nil
	}
	var known []string
	for _, p := range allPartsList() {
		known = append(known, p[0])
	}
	for _, n := range names {
		if !contains(known, n) {
			return nil, nil, usagef("-t: unknown test %q (want %s, or all; -l lists them)", n, strings.Join(known, ", "))
		}
	}
	parts, err := bench.SelectParts(all, strings.Join(names, ","))
	if err != nil {
		return nil, nil, usage(err)
	}
	return parts, outside, nil
}

func runSuite(cmd *cobra.Command, f suiteFlags) (err error) {
	if f.list {
		return listSuite(cmd.OutOrStdout())
	}
	parts, outside, err := selectSuite(f.tests)
	if err != nil {
		return err
	}
	if err := f.check(outside); err != nil {
		return err
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return usagef("--out %s: %v", f.out, unwrapPath(err))
	}
	if err := checkOutPath("--out", filepath.Join(f.out, "bw.json")); err != nil {
		return err
	}
	if err := checkBudgetEnv(); err != nil {
		return err
	}
	r := &suiteRun{cmd: cmd, f: f, total: len(parts) + len(outside), start: time.Now()}
	for _, p := range parts {
		r.weightsLeft += p.Weight
	}
	for _, name := range outside {
		if r.outsideInput(name) != "" {
			r.weightsLeft += outsideWeight
		}
	}
	// Progress: a line per test as it starts and ends, and one per
	// finished measurement (the session's).
	var lines io.Writer
	if !f.quiet {
		lines = &indented{w: cmd.ErrOrStderr(), start: true}
	}
	r.s, err = bench.Open(cmd.Context(), f.device, bench.SessionConfig{Progress: lines})
	if err != nil {
		return err
	}
	defer closeSession(r.s, &err)
	r.env = bench.SuiteEnv{Quick: f.quick, Samples: f.samples, CRefDir: f.cref, Progress: lines,
		Open: func(ctx context.Context, cfg bench.SessionConfig) (*bench.Session, error) {
			cfg.Progress = lines
			return bench.Open(ctx, f.device, cfg)
		}}
	for i, p := range parts {
		if err := r.part(i+1, p); err != nil {
			return err
		}
	}
	for j, name := range outside {
		if err := r.outside(len(parts)+j+1, name); err != nil {
			return err
		}
	}
	took := time.Since(r.start).Round(time.Second).String()
	if f.budget > 0 {
		took += " of a budget of " + f.budget.String()
	}
	r.say("done in %s: %s; render it with: pinmem report --format markdown %s", took, f.out, filepath.Join(f.out, "*.json"))
	if len(r.problems) > 0 {
		return &problemError{errors.Join(r.problems...).Error()}
	}
	return nil
}

// listSuite writes -l's list: every test and what it measures.
func listSuite(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range allPartsList() {
		fmt.Fprintf(tw, "%s\tweight %s\t%s\n", p[0], p[2], p[1])
	}
	return tw.Flush()
}

// check refuses flags out of range and inputs that are not there; outside
// is the outside parts selected.
func (f suiteFlags) check(outside []string) error {
	if f.out == "" {
		return usagef("--out DIR: name the directory for the reports")
	}
	if f.plotExt != "png" && f.plotExt != "svg" {
		return usagef("--plot-format %q: want png or svg", f.plotExt)
	}
	if f.samples < 0 || f.samples > bench.MaxSamples {
		return usagef("--samples %d: must be from 0 to %d", f.samples, bench.MaxSamples)
	}
	if f.device < 0 {
		return usagef("--device %d: must be 0 or more", f.device)
	}
	if f.budget < 0 || f.budget > 0 && f.budget < 10*time.Second {
		return usagef("--budget %v: want 0 (no bound) or at least 10s", f.budget)
	}
	if f.cref != "" {
		if fi, err := os.Stat(f.cref); err != nil || !fi.IsDir() {
			return usagef("--cref %s: not a directory (build the C reference with cref/build -o DIR)", f.cref)
		}
	}
	return f.checkOutside(outside)
}

// checkOutside refuses an outside part named in -t without its input (with
// every test, the ones without their input are skipped with a line), and
// an --imagepipeline that is not an executable file.
func (f suiteFlags) checkOutside(outside []string) error {
	named := strings.TrimSpace(f.tests) != "all" && strings.TrimSpace(f.tests) != ""
	if named && contains(outside, partLoad) && f.weights == "" {
		return usagef("-t %s: the load test needs --weights FILE (a safetensors file)", partLoad)
	}
	if named && contains(outside, partImagePipeline) && f.imagepipeline == "" {
		return usagef("-t %s: needs --imagepipeline BIN (go build -o BIN ./examples/imagepipeline/measure)", partImagePipeline)
	}
	if f.imagepipeline != "" {
		if fi, err := os.Stat(f.imagepipeline); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return usagef("--imagepipeline %s: not an executable file (go build -o BIN ./examples/imagepipeline/measure)", f.imagepipeline)
		}
	}
	return nil
}

// suiteRun is one run of bench all: its session, the tests' environment
// and the problems found so far, which do not end the run.
type suiteRun struct {
	cmd      *cobra.Command
	f        suiteFlags
	s        *bench.Session
	env      bench.SuiteEnv
	total    int // tests to run
	problems []error
	// start is when the run began; weightsLeft the budget weights of the
	// tests not yet run (share).
	start       time.Time
	weightsLeft float64
}

// share returns the next test's share of the time budget left, weight
// being its weight, and takes the weight off (0: no budget).
func (r *suiteRun) share(weight float64) time.Duration {
	defer func() { r.weightsLeft -= weight }()
	if r.f.budget <= 0 {
		return 0
	}
	return bench.SuiteShare(r.f.budget-time.Since(r.start), weight, r.weightsLeft)
}

// shareText says a test's share for its progress line.
func shareText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return " (budget " + d.Round(time.Second).String() + ")"
}

// outsideInput is the input an outside test needs ("" when not given).
func (r *suiteRun) outsideInput(name string) string {
	if name == partImagePipeline {
		return r.f.imagepipeline
	}
	return r.f.weights
}

// say writes a progress line unless --quiet.
func (r *suiteRun) say(format string, args ...any) {
	if !r.f.quiet {
		fmt.Fprintf(r.cmd.ErrOrStderr(), "pinmem bench all: "+format+"\n", args...)
	}
}

// part runs the n-th test, an internal/tools/bench part, and writes its report;
// an error it returns ends the run.
func (r *suiteRun) part(n int, p bench.SuitePart) error {
	env := r.env
	env.Budget = r.share(p.Weight)
	r.say("[%d/%d] %s: %s%s", n, r.total, p.Name, p.About, shareText(env.Budget))
	t0 := time.Now()
	rs, cfg, runErr := p.Run(r.cmd.Context(), r.s, env)
	r.s.SetSampleBudget(0, 1)
	m := meta(r.s.Meta("pinmem bench all -t "+p.Name), map[string]any{"suite": env, "test": cfg})
	m.Part = p.Name
	if r.f.quick {
		m.Note = strings.TrimPrefix(m.Note+"; "+quickNote, "; ")
	}
	if err := writePart(r.f, p.Name, m, rs, runErr); err != nil {
		return err
	}
	r.say("[%d/%d] %s: %d rows in %s -> %s", n, r.total, p.Name, len(rs), time.Since(t0).Round(time.Millisecond), filepath.Join(r.f.out, p.Name+".json"))
	if runErr != nil {
		return r.failed(p.Name, runErr)
	}
	// A test whose every row was skipped (no kernels, one GPU for the
	// matrix) is said, not a failure of the run; wrong data is.
	if err := verdict(rs); err != nil && slices.ContainsFunc(rs, bench.Result.Failed) {
		r.problems = append(r.problems, fmt.Errorf("%s: %w", p.Name, err))
	} else if err != nil {
		r.say("[%d/%d] %s: %v", n, r.total, p.Name, err)
	}
	return nil
}

// outside runs the n-th test, one measured outside internal/tools/bench, or
// skips it with a line when its input was not given.
func (r *suiteRun) outside(n int, name string) error {
	input, flag, run := r.outsideInput(name), "--weights FILE", func() error { return suiteLoad(r.cmd, r.f) }
	if name == partImagePipeline {
		flag, run = "--imagepipeline BIN", func() error {
			return suiteImagePipeline(r.cmd.Context(), r.f, r.s, r.env)
		}
	}
	if input == "" {
		r.say("[%d/%d] %s: skipped (no %s)", n, r.total, name, flag)
		return nil
	}
	r.say("[%d/%d] %s: %s%s", n, r.total, name, input, shareText(r.share(outsideWeight)))
	if err := run(); err != nil {
		return r.failed(name, err)
	}
	return nil
}

// failed returns err when it ends the whole run, or keeps it as a problem
// of the test name.
func (r *suiteRun) failed(name string, err error) error {
	if isFatalRun(err) {
		return err
	}
	r.problems = append(r.problems, fmt.Errorf("%s: %w", name, err))
	return nil
}

// imagePipelineTiming is how the image pipeline's rows are timed.
const imagePipelineTiming = "host wall clock around each run of frames, every output frame checked after it (examples/imagepipeline/measure); the bounds are computed from copy rates measured beside them"

// indented writes lines to w, each led by two spaces: the measurements of
// a test under the test's own line.
type indented struct {
	w     io.Writer
	start bool // the next byte starts a line
}

func (in *indented) Write(b []byte) (int, error) {
	var out []byte
	for _, c := range b {
		if in.start {
			out = append(out, ' ', ' ')
		}
		out = append(out, c)
		in.start = c == '\n'
	}
	if _, err := in.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// quickNote is the note of every report of a --quick run.
const quickNote = "quick run (--quick): small sizes and two samples, not figures to publish"

// isFatalRun reports whether a test's error ends the whole run: the run
// was interrupted, or the device is gone.
func isFatalRun(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || status(err) == exitNoGPU
}

// writePart writes one test's report and plot into the output directory.
func writePart(f suiteFlags, name string, m bench.Meta, rs []bench.Result, runErr error) error {
	m.Partial = runErr != nil
	m.Timing = bench.TimingOf(m, rs)
	var buf bytes.Buffer
	if err := bench.Write(&buf, bench.FormatJSON, m, rs, bench.TableOptions{}); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(f.out, name+".json"), buf.Bytes()); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	buf.Reset()
	if err := bench.WritePlot(&buf, bench.ImageFormat(f.plotExt), m, rs); errors.Is(err, bench.ErrInvalid) {
		return nil // nothing to plot (every row skipped): the report says why
	} else if err != nil {
		return fmt.Errorf("plot of %s: %w", name, err)
	}
	return writeAtomic(filepath.Join(f.out, name+"."+f.plotExt), buf.Bytes())
}

// suiteLoad runs `pinmem bench load FILE` into DIR/load.json and adds
// PyTorch's load of the same file (scripts/torch-load.py) as kind "torch"
// when --python has it.
func suiteLoad(cmd *cobra.Command, f suiteFlags) error {
	path := filepath.Join(f.out, partLoad+".json")
	args := []string{"bench", "load", f.weights, "--quiet", "--format", "json", "-o", path, "--device", fmt.Sprint(f.device)}
	if f.samples > 0 {
		args = append(args, "--samples", fmt.Sprint(f.samples))
	}
	var stderr bytes.Buffer
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(io.Discard)
	root.SetErr(&stderr)
	runErr := root.ExecuteContext(cmd.Context())
	rep, err := readReports(cmd.Context(), []string{path})
	if err != nil {
		return errors.Join(runErr, err)
	}
	r := rep[0]
	torch := torchRow(cmd.Context(), f)
	r.Results = append(r.Results, torch)
	r.Meta.Part = partLoad
	var buf bytes.Buffer
	if err := bench.Write(&buf, bench.FormatJSON, r.Meta, r.Results, bench.TableOptions{}); err != nil {
		return err
	}
	if err := writeAtomic(path, buf.Bytes()); err != nil {
		return err
	}
	return runErr
}

// torchRow runs scripts/torch-load.py on the weights file: its GB/s as a
// load row of kind "torch", or a skipped row saying why not.
func torchRow(ctx context.Context, f suiteFlags) bench.Result {
	// The row's size is the file's for one file, as the loader's rows, so
	// that they pair up as reference and row; for a checkpoint (a folder
	// or its index) the tensor bytes the script reports, as the loader's
	// checkpoint row.
	r := bench.Result{Bench: "load", Kind: bench.KindTorch, Dir: "warm", Unit: bench.GBps, Timing: bench.TimingWall}
	if fi, err := os.Stat(f.weights); err == nil && !isCheckpoint(f.weights, fi) {
		r.Size = fi.Size()
	}
	script := filepath.Join("scripts", "torch-load.py")
	var out, stderr bytes.Buffer
	c := exec.CommandContext(ctx, f.python, script, f.weights, "--device", fmt.Sprintf("cuda:%d", f.device))
	c.Stdout, c.Stderr = &out, &stderr
	if err := c.Run(); err != nil {
		r.Skipped = true
		r.Note = "PyTorch reference not run (" + f.python + " " + script + "): " + strings.Join(strings.Fields(stderr.String()+" "+err.Error()), " ")
		return r
	}
	t, err := bench.ParseTorchLoad(out.Bytes(), r.Size)
	if err != nil {
		r.Skipped, r.Note = true, "PyTorch reference: "+err.Error()
		return r
	}
	return t
}

// imagePipelineArgs are the arguments bench all runs the image pipeline
// example with: its figures as result rows (-json), on the run's device,
// the run's samples as its timed runs, small frames for --quick, and the
// C baseline beside it with --cref.
func imagePipelineArgs(f suiteFlags) []string {
	args := []string{"-json", "-device", fmt.Sprint(f.device)}
	if f.quick {
		args = append(args, "-res", "320x240", "-frames", "16", "-reps", "2")
	}
	if f.samples > 0 {
		args = append(args, "-reps", fmt.Sprint(f.samples))
	}
	if f.cref != "" {
		args = append(args, "-cref", filepath.Join(f.cref, "imagepipeline"))
	}
	return args
}

// suiteImagePipeline runs the image pipeline example (imagePipelineArgs):
// its rows, each with its same-run reference (the C baseline's loop, the
// copy bound or the staged bound), become DIR/imagepipeline.json and its
// plot like every other test's; its table is kept in
// DIR/imagepipeline.txt.
func suiteImagePipeline(ctx context.Context, f suiteFlags, s *bench.Session, env bench.SuiteEnv) error {
	args := imagePipelineArgs(f)
	var out, text bytes.Buffer
	c := exec.CommandContext(ctx, f.imagepipeline, args...)
	c.Stdout, c.Stderr = &out, &text
	c.WaitDelay = 5 * time.Second // after an interrupt, do not wait on children that keep its output open
	runErr := c.Run()
	if err := writeAtomic(filepath.Join(f.out, partImagePipeline+".txt"), text.Bytes()); err != nil {
		return err
	}
	if runErr != nil {
		why := strings.TrimSpace(text.String())
		if i := strings.LastIndexByte(why, '\n'); i >= 0 {
			why = why[i+1:]
		}
		runErr = fmt.Errorf("%s %s: %w: %s", f.imagepipeline, strings.Join(args, " "), runErr, why)
		if ctx.Err() != nil {
			// Interrupted: the program was stopped, the run ends as
			// interrupted, not as a failed test.
			runErr = fmt.Errorf("%s: %w", f.imagepipeline, ctx.Err())
		}
	}
	rs, err := bench.ParseResultLines(out.Bytes())
	if err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("%s -json: %w", f.imagepipeline, err))
	}
	if len(rs) == 0 && runErr != nil {
		return runErr
	}
	m := meta(s.Meta("pinmem bench all -t "+partImagePipeline), map[string]any{"suite": env, "test": map[string]any{"program": f.imagepipeline, "args": args}})
	m.Part = partImagePipeline
	// The program times its runs itself; the session's timing is not its.
	m.Timing = imagePipelineTiming
	if f.quick {
		m.Note = strings.TrimPrefix(m.Note+"; "+quickNote, "; ")
	}
	if err := writePart(f, partImagePipeline, m, rs, runErr); err != nil {
		return err
	}
	if runErr == nil {
		if err := verdict(rs); err != nil && slices.ContainsFunc(rs, bench.Result.Failed) {
			return err
		}
	}
	return runErr
}
