// Command measure, the allocfail example's complete run, shows what failing
// allocations look like through pinmem, and how to handle them, as the
// article pinmem grew from (on CUDA page-locked memory) asks: an allocation
// of pinned memory can fail, and its result must always be checked.
//
// It provokes, one after the other:
//
//  1. a request over pinmem's pinned-memory budget: refused before anything
//     is pinned, with a *pinmem.BudgetError (errors.Is pinmem.ErrBudget);
//  2. a device allocation larger than the GPU's memory: the driver's
//     CUDA_ERROR_OUT_OF_MEMORY, matching cuda.ErrOutOfMemory;
//  3. a pinned host allocation larger than the host's RAM and swap, with the
//     budget lifted: the kernel refuses the mapping (ENOMEM), and pinmem
//     returns a *pinmem.OutOfMemoryError (errors.Is cuda.ErrOutOfMemory).
//     This runs only where the kernel refuses such mappings up front
//     (vm.overcommit_memory 0 or 2); elsewhere it says why it did not;
//  4. with -cgroup, a pin beyond a memory cgroup's limit: a child process
//     joins a new cgroup with a small memory.max and pins more than that.
//     Where no cgroup can be created (no cgroup v2, no delegated memory
//     controller, no permission) it says so and pins nothing.
//
// Each case prints the error and what a program does about it. A case that
// does not fail the way it should is an error exit.
//
// Usage:
//
//	go run ./examples/allocfail/measure [-cgroup] [-cgroup-limit 64MiB]
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/internal/budgetspec"
)

type config struct {
	cgroup      bool  // run case 4
	cgroupLimit int64 // memory.max of the child's cgroup
}

func main() {
	// A child started by case 4 runs only its part (see cgroup.go).
	if dir := os.Getenv(envCgroupChild); dir != "" {
		os.Exit(cgroupChild(dir, os.Stdout))
	}
	harness.Main("allocfail", parseFlags, func(cfg config) error {
		_, err := run(context.Background(), cfg, os.Stdout)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("allocfail", stderr)
	cg := fs.Bool("cgroup", false, "also pin beyond a new memory cgroup's limit, in a child process")
	limit := fs.String("cgroup-limit", "64MiB", "memory.max of that cgroup")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	l, err := budgetspec.Parse(*limit, 0)
	if err != nil || l < 1<<20 {
		return config{}, fmt.Errorf("-cgroup-limit %q: want at least 1MiB", *limit)
	}
	return config{cgroup: *cg, cgroupLimit: l}, nil
}

// Outcome is what one case saw.
type Outcome struct {
	Case string
	Ran  bool   // false when the machine does not allow the case
	Why  string // why it did not run
	Err  error  // the error the allocation returned
	Note string // what happened, where no error value tells it (case 4)
}

func run(ctx context.Context, cfg config, w io.Writer) (out []Outcome, err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return nil, err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return nil, err
	}
	props, err := dev.Properties()
	if err != nil {
		return nil, err
	}

	cases := []struct {
		name string
		fn   func() (Outcome, error)
	}{
		{"budget", func() (Outcome, error) { return overBudget(w) }},
		{"device", func() (Outcome, error) { return deviceOOM(w, gpu, props.TotalMemory) }},
		{"host", func() (Outcome, error) { return hostOOM(w) }},
	}
	if cfg.cgroup {
		cases = append(cases, struct {
			name string
			fn   func() (Outcome, error)
		}{"cgroup", func() (Outcome, error) { return cgroupCase(ctx, w, cfg.cgroupLimit) }})
	}
	for i, c := range cases {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		fmt.Fprintf(w, "%d. %s\n", i+1, c.name)
		o, err := c.fn()
		o.Case = c.name
		out = append(out, o)
		if err != nil {
			return out, fmt.Errorf("case %s: %w", c.name, err)
		}
	}
	fmt.Fprintln(w, "article:  pinned allocations can fail; always check the result")
	fmt.Fprintf(w, "measured: %s\n", summary(out))
	return out, nil
}

// errKind names what err matches, the way a program tells the cases apart.
func errKind(err error) string {
	var be *pinmem.BudgetError
	var oom *pinmem.OutOfMemoryError
	switch {
	case errors.As(err, &be):
		return "*pinmem.BudgetError (pinmem.ErrBudget)"
	case errors.As(err, &oom):
		return "*pinmem.OutOfMemoryError (cuda.ErrOutOfMemory, " + oom.Op + ")"
	case errors.Is(err, cuda.ErrOutOfMemory):
		return "cuda.ErrOutOfMemory"
	default:
		return fmt.Sprintf("%T", err)
	}
}

func summary(out []Outcome) string {
	var parts []string
	for _, o := range out {
		switch {
		case !o.Ran:
			parts = append(parts, o.Case+": not run ("+o.Why+")")
		case o.Note != "":
			parts = append(parts, o.Case+": "+o.Note)
		case o.Err == nil:
			parts = append(parts, o.Case+": no error")
		default:
			parts = append(parts, o.Case+": "+errKind(o.Err))
		}
	}
	return strings.Join(parts, "; ")
}

// overBudget asks for twice a small budget.
func overBudget(w io.Writer) (o Outcome, err error) {
	const budget = 64 << 20
	prev := pinmem.SetBudget(budget)
	defer pinmem.SetBudget(prev)
	o.Ran = true
	buf, err := pinmem.Alloc(2*budget, 0)
	if err == nil {
		return o, errors.Join(errors.New("a request for twice the budget succeeded"), buf.Free())
	}
	o.Err = err
	// The handling: a budget error carries the figures to decide with (wait
	// for buffers to come back, use smaller buffers, or fall back to
	// pageable memory, which works, only slower).
	var be *pinmem.BudgetError
	if !errors.Is(err, pinmem.ErrBudget) || !errors.As(err, &be) {
		return o, fmt.Errorf("got %v (%T), want a *pinmem.BudgetError", err, err)
	}
	fmt.Fprintf(w, "   pinmem.Alloc(128 MiB) under a 64 MiB budget: %v\n", err)
	fmt.Fprintf(w, "   handled: errors.As(err, &budgetErr): requested %d, pinned %d, limit %d: wait for buffers to come back,\n",
		be.Requested, be.Pinned, be.Limit)
	fmt.Fprintln(w, "   use smaller ones, or fall back to ordinary Go memory (a transfer.Copier still copies it, through its stages)")
	return o, nil
}

// deviceOOM asks the driver for twice the GPU's memory.
func deviceOOM(w io.Writer, gpu *cuda.Context, total uint64) (o Outcome, err error) {
	o.Ran = true
	n := 2 * total
	if n > math.MaxInt/2 || n == 0 {
		n = 1 << 46
	}
	d, err := gpu.Alloc(int(n))
	if err == nil {
		return o, errors.Join(fmt.Errorf("a device allocation of %d bytes succeeded", n), d.Free())
	}
	o.Err = err
	if !errors.Is(err, cuda.ErrOutOfMemory) {
		return o, fmt.Errorf("got %v, want an error matching cuda.ErrOutOfMemory", err)
	}
	free, _, _ := gpu.MemInfo()
	fmt.Fprintf(w, "   Context.Alloc(%.0f GiB) on a %.0f GiB GPU: %v\n", float64(n)/(1<<30), float64(total)/(1<<30), err)
	fmt.Fprintf(w, "   handled: errors.Is(err, cuda.ErrOutOfMemory): %.1f GiB are free (Context.MemInfo): process the data in smaller pieces\n",
		float64(free)/(1<<30))
	return o, nil
}

// hostOOM asks for more pinned memory than RAM and swap, with the budget
// lifted, through pinmem's own mapping (mmap + cuMemHostRegister), which the
// kernel refuses at once under heuristic or strict overcommit.
func hostOOM(w io.Writer) (o Outcome, err error) {
	mode, err := os.ReadFile("/proc/sys/vm/overcommit_memory")
	if err != nil {
		o.Why = "cannot read vm.overcommit_memory: " + err.Error()
		fmt.Fprintf(w, "   not run: %s\n", o.Why)
		return o, nil
	}
	if m := strings.TrimSpace(string(mode)); m != "0" && m != "2" {
		o.Why = "vm.overcommit_memory is " + m + ": the kernel would accept the mapping and the pin could end in the OOM killer"
		fmt.Fprintf(w, "   not run: %s\n", o.Why)
		return o, nil
	}
	mem, err := meminfo()
	if err != nil {
		return o, err
	}
	size := mem["MemTotal"] + mem["SwapTotal"] + 1<<30
	size = (size + 2<<20 - 1) &^ (2<<20 - 1)
	prev := pinmem.SetBudget(math.MaxInt64)
	defer pinmem.SetBudget(prev)
	o.Ran = true
	buf, err := pinmem.Alloc(int(size), 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	if err == nil {
		return o, errors.Join(fmt.Errorf("pinning %d bytes, more than RAM and swap, succeeded", size), buf.Free())
	}
	o.Err = err
	var oom *pinmem.OutOfMemoryError
	if !errors.Is(err, cuda.ErrOutOfMemory) || !errors.As(err, &oom) {
		return o, fmt.Errorf("got %v (%T), want a *pinmem.OutOfMemoryError", err, err)
	}
	fmt.Fprintf(w, "   pinmem.Alloc(%.1f GiB) with RAM + swap %.1f GiB and no budget: %v\n",
		float64(size)/(1<<30), float64(mem["MemTotal"]+mem["SwapTotal"])/(1<<30), err)
	fmt.Fprintf(w, "   handled: errors.As(err, &oomErr): %s failed for %d bytes (%v): ask for less, and keep a budget\n",
		oom.Op, oom.Requested, oom.Err)
	return o, nil
}

// meminfo returns /proc/meminfo's fields in bytes.
func meminfo() (map[string]int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if !ok || len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			if len(fields) > 1 && fields[1] == "kB" {
				v *= 1024
			}
			m[key] = v
		}
	}
	if m["MemTotal"] <= 0 {
		return nil, errors.New("/proc/meminfo has no MemTotal")
	}
	return m, sc.Err()
}
