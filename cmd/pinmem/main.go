// Command pinmem shows what a machine can do with pinned host memory and
// NVIDIA GPUs: `pinmem doctor` reports the driver and every GPU;
// `pinmem bench` measures transfers, pinning cost and overlap; `pinmem
// report` and `pinmem compare` render and compare saved results on any
// machine.
//
// The command is thin: every subcommand maps flags onto the pinmem
// library. Errors are one line on standard error, never a stack trace, and
// the exit status says what kind of failure it was (see exitHelp).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/tools/bench"
	"github.com/pinmem/pinmem/internal/units"
)

// Exit statuses of the command; exitHelp documents them.
const (
	exitOK          = 0 // success
	exitProblem     = 1 // a measurement problem: verification failed, every result skipped, a result errored, a regression
	exitUsage       = 2 // bad command line, flag value, output path, PINMEM_BUDGET or input file
	exitNoGPU       = 3 // no NVIDIA driver or no CUDA device for a command that needs one
	exitInterrupted = 130
	// An interrupted run exits 128 + the signal number: 130 for SIGINT, 143 for SIGTERM.
)

// exitHelp is the exit status section of `pinmem --help`.
const exitHelp = `Exit status:
  0    success
  1    measurement problem: verification failed, every result was skipped,
       a measurement failed, compare --threshold found a regression,
       compare found no result in common, or doctor --strict found a problem
  2    usage error: unknown command or flag, bad flag value, an output path
       that cannot be written, PINMEM_BUDGET unparsable, an unreadable or
       malformed result file
  3    no NVIDIA driver or no CUDA device (doctor still exits 0: it reports;
       doctor --strict exits 3)
  130  interrupted by SIGINT (143 for SIGTERM): the run stopped after the
       current sample and wrote what it had measured, marked "partial"; a
       second signal exits at once`

func main() {
	os.Exit(run(os.Args[1:]))
}

// interrupted is the number of the signal that stopped the run (0: none).
var interrupted atomic.Int32

// canceledBySignal, when not nil, is called once the first signal has
// canceled the run: tests wait on it instead of polling interrupted.
var canceledBySignal func()

// argv is the command line a report records.
var argv []string

func run(args []string) int {
	interrupted.Store(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first SIGINT or SIGTERM cancels ctx: a measurement stops after its
	// current sample and the results so far are written, marked partial.
	// A second signal exits at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	finished := make(chan struct{})
	defer func() {
		signal.Stop(sigs)
		close(done)
		<-finished
	}()
	go func() {
		defer close(finished)
		select {
		case s := <-sigs:
			interrupted.Store(int32(signalStatus(s) - 128))
			cancel()
			if canceledBySignal != nil {
				canceledBySignal()
			}
			if readingStdin.Load() {
				fmt.Fprintf(os.Stderr, "pinmem: %v: no longer reading standard input\n", s)
			} else {
				fmt.Fprintf(os.Stderr, "pinmem: %v: stopping after the current sample and writing the results so far (%v again quits at once)\n", s, s)
			}
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "pinmem: %v again: quitting without writing results\n", s)
			os.Exit(signalStatus(s))
		case <-done:
		}
	}()
	return execute(ctx, args, os.Stdout, os.Stderr)
}

// execute runs the command tree with args and returns the exit status,
// printing an error as one line on stderr.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	argv = append([]string{"pinmem"}, args...)
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	code := status(err)
	line := describe(err)
	if code == exitUsage {
		path := "pinmem"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		line += fmt.Sprintf(" (see '%s --help')", path)
	}
	fmt.Fprintln(stderr, "pinmem:", line)
	return code
}

func signalStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return exitInterrupted
}

// usageError is a bad command line: it exits with exitUsage.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usage marks err as a usage error.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err}
}

// usagef formats a usage error.
func usagef(format string, args ...any) error { return usage(fmt.Errorf(format, args...)) }

// problemError is a run that finished but whose results show a problem: it
// exits with exitProblem.
type problemError struct{ msg string }

func (e *problemError) Error() string { return e.msg }

// status maps an error to the exit status.
func status(err error) int {
	var ue *usageError
	var pe *problemError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, context.Canceled):
		if n := interrupted.Load(); n > 0 {
			return 128 + int(n)
		}
		return exitInterrupted
	case errors.As(err, &ue), errors.Is(err, bench.ErrInvalid), errors.Is(err, units.ErrInvalid),
		strings.HasPrefix(err.Error(), "unknown command "):
		return exitUsage
	case errors.Is(err, cuda.ErrNoDriver), errors.Is(err, cuda.ErrNoDevice):
		return exitNoGPU
	case errors.As(err, &pe):
		return exitProblem
	}
	return exitProblem
}

// describe turns an error into the one line a user sees.
func describe(err error) string {
	var line string
	switch {
	case errors.Is(err, cuda.ErrNoDriver):
		line = "no NVIDIA driver found: this command needs a GPU (" + err.Error() + ")"
	case errors.Is(err, cuda.ErrNoDevice):
		line = "no CUDA device found: this command needs a GPU (" + err.Error() + ")"
	case errors.Is(err, context.Canceled) && strings.HasPrefix(err.Error(), "reading standard input"):
		line = "interrupted while reading standard input: nothing was written"
	case errors.Is(err, context.Canceled):
		line = "interrupted: stopped after the current sample; the results measured so far were written, marked partial"
	default:
		line = err.Error()
	}
	// cobra's suggestion for a mistyped command, on the same line.
	if msg, sugs, ok := strings.Cut(line, "\n\nDid you mean this?\n"); ok {
		line = msg + " (did you mean " + strings.Join(strings.Fields(sugs), " or ") + "?)"
	}
	return strings.Join(strings.Fields(line), " ")
}

// flagValueError matches pflag's message for a value that does not parse.
var flagValueError = regexp.MustCompile(`^invalid argument "(.*)" for "(.*)" flag: (?:strconv\.Parse(Int|Uint|Float|Bool): parsing ".*": (?:invalid syntax|value out of range)|time: .*)$`)

// flagError says what a flag wants, not which Go parser refused its value.
func flagError(err error) error {
	m := flagValueError.FindStringSubmatch(err.Error())
	if m == nil {
		return usage(err)
	}
	want := map[string]string{"Int": "a whole number", "Uint": "a whole number of 0 or more", "Float": "a number", "Bool": "true or false", "": "a duration such as 90s or 8m"}[m[3]]
	if strings.Contains(err.Error(), "value out of range") {
		want += " in range"
	}
	return usagef("%s %q: want %s", m[2], m[1], want)
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "pinmem",
		Short: "Pinned host memory and host<->GPU transfers, measured",
		Long: `pinmem measures what a machine can do with pinned host memory and NVIDIA GPUs.

  pinmem doctor                    what the driver, each GPU and the host offer
  pinmem bench all --out DIR       every headline figure in one run (-l lists, -t picks)
  pinmem bench                     host<->GPU bandwidth for every kind of host memory
  pinmem bench pin|overlap|matrix  pinning cost, the pipeline, every GPU at once
  pinmem bench blocks              scattered block copies (package blocks) against contiguous copies
  pinmem bench load FILE           a file to the GPU against plain reads of it
  pinmem zerocopy                  zero-copy reads against an explicit copy
  pinmem report FILE.json...       render saved results (table, csv, json, markdown, svg, png)
  pinmem compare A.json B.json     two runs side by side, as ratios
  pinmem version                   the build: version, revision, Go, platform

Sizes everywhere (flags and PINMEM_BUDGET): 4096, 64K = 64KiB = 65536,
1M = 1MiB, 1G = 1GiB (powers of 1024); 1KB = 1000, 1MB, 1GB (powers of 1000).

` + exitHelp,
		Version:       versionLine(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return flagError(err) })
	root.AddCommand(newDoctor(), newVersion(), newReport(), newCompare())
	for _, c := range extraCommands {
		root.AddCommand(c())
	}
	addExitHelp(root)
	return root
}

// addExitHelp ends every command's help with the exit statuses, once.
func addExitHelp(c *cobra.Command) {
	if !strings.Contains(c.Long, "Exit status:") {
		long := c.Long
		if long == "" {
			long = c.Short
		}
		c.Long = strings.TrimRight(long, "\n") + "\n\n" + exitHelp
	}
	for _, sub := range c.Commands() {
		addExitHelp(sub)
	}
}

// extraCommands lets other files of the command add subcommands.
var extraCommands []func() *cobra.Command

// noArgs refuses positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
		}
		return usagef("%s takes no arguments (got %q)", cmd.CommandPath(), args[0])
	}
	return nil
}
