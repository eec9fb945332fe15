// Command pinmem shows what a machine can do with pinned host memory and
// NVIDIA GPUs: `pinmem doctor` reports the driver and every GPU;
// `pinmem bench` measures transfers, pinning cost and overlap.
//
// The command is thin: every subcommand maps flags onto the pinmem
// library. A command that needs a GPU on a machine without one exits with
// status 1 and one line saying so, never a stack trace.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pinmem/pinmem/cuda"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	// The first SIGINT or SIGTERM cancels the context: a measurement stops
	// after its current sample and the results so far are written. Handling
	// then goes back to the default, so a second signal ends the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	root := newRoot()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pinmem:", describe(err))
		return 1
	}
	return 0
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "pinmem",
		Short:         "Pinned host memory and host<->GPU transfers, measured",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newDoctor())
	for _, c := range extraCommands {
		root.AddCommand(c())
	}
	return root
}

// extraCommands lets other files of the command add subcommands.
var extraCommands []func() *cobra.Command

// describe turns an error into the one line a user sees.
func describe(err error) string {
	switch {
	case errors.Is(err, cuda.ErrNoDriver):
		return "no NVIDIA driver found: this command needs a GPU (" + err.Error() + ")"
	case errors.Is(err, cuda.ErrNoDevice):
		return "no CUDA device found: this command needs a GPU (" + err.Error() + ")"
	case errors.Is(err, context.Canceled):
		return "interrupted: stopped after the current sample; the results measured so far were written"
	}
	return err.Error()
}
