// Command allocfail shows what failed allocations look like through pinmem,
// and what a program does about each: an allocation of pinned (or device)
// memory can fail, and its result must always be checked. It provokes, one
// after the other:
//
//  1. a request over pinmem's pinned-memory budget: refused before anything
//     is pinned, with a *pinmem.BudgetError (errors.Is pinmem.ErrBudget);
//  2. a device allocation larger than the GPU's memory: the driver's
//     CUDA_ERROR_OUT_OF_MEMORY, matching cuda.ErrOutOfMemory;
//  3. pinned host memory beyond the host's RAM and swap, with the budget
//     lifted: a *pinmem.OutOfMemoryError (errors.Is cuda.ErrOutOfMemory).
//     It runs only where the kernel refuses such a mapping up front
//     (vm.overcommit_memory 0 or 2), and says why not elsewhere.
//
// The complete run, with a fourth case (a pin beyond a memory cgroup's
// limit, in a child process) and the article's claim beside what it saw, is
// ./measure: go run ./examples/allocfail/measure -cgroup
//
// On a machine without an NVIDIA driver or GPU it prints one line saying so
// and exits with status 3, as the pinmem command does.
package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

func main() {
	if err := run(os.Stdout); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
			fmt.Fprintln(os.Stderr, "allocfail: this needs an NVIDIA GPU:", err)
			os.Exit(3) // as the pinmem command: no NVIDIA driver or no CUDA device
		}
		fmt.Fprintln(os.Stderr, "allocfail:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	gpu, err := dev.PrimaryContext()
	if err != nil {
		return err
	}

	// 1. Over the budget: twice a budget of 64 MiB.
	prev := pinmem.SetBudget(64 << 20)
	buf, err := pinmem.Alloc(128<<20, 0)
	pinmem.SetBudget(prev)
	var budgetErr *pinmem.BudgetError
	if !errors.As(err, &budgetErr) {
		return errors.Join(fmt.Errorf("over the budget: got %v, want a *pinmem.BudgetError", err), free(buf))
	}
	fmt.Fprintf(w, "1. %v\n   handled: %d bytes are pinned of a budget of %d: wait for buffers to come back, use smaller ones,\n"+
		"   or copy from ordinary Go memory (a transfer.Copier stages it)\n", err, budgetErr.Pinned, budgetErr.Limit)

	// 2. Twice the GPU's memory.
	_, total, err := gpu.MemInfo()
	if err != nil {
		return err
	}
	d, err := gpu.Alloc(int(min(2*total, 1<<46)))
	if !errors.Is(err, cuda.ErrOutOfMemory) {
		if err == nil {
			err = d.Free()
		}
		return fmt.Errorf("twice the GPU's memory: got %v, want cuda.ErrOutOfMemory", err)
	}
	fmt.Fprintf(w, "2. %v\n   handled: errors.Is(err, cuda.ErrOutOfMemory): process the data in smaller pieces\n", err)

	// 3. More pinned memory than RAM and swap, without a budget.
	if why := overcommitRefuses(); why != "" {
		fmt.Fprintf(w, "3. not run: %s\n", why)
		return nil
	}
	size, err := ramAndSwap()
	if err != nil {
		return err
	}
	size = (size + 1<<30 + 2<<20 - 1) &^ (2<<20 - 1) // a GiB more, whole 2 MiB pages
	prev = pinmem.SetBudget(math.MaxInt64)
	buf, err = pinmem.Alloc(int(size), 0, pinmem.WithMethod(pinmem.MethodMmapRegister))
	pinmem.SetBudget(prev)
	var oomErr *pinmem.OutOfMemoryError
	if !errors.As(err, &oomErr) {
		return errors.Join(fmt.Errorf("more than RAM and swap: got %v, want a *pinmem.OutOfMemoryError", err), free(buf))
	}
	fmt.Fprintf(w, "3. %v\n   handled: errors.As(err, &oomErr): %s failed for %d bytes: ask for less, and keep a budget\n",
		err, oomErr.Op, oomErr.Requested)
	return nil
}

// free frees a buffer that an allocation expected to fail returned.
func free(b *pinmem.Buffer) error {
	if b == nil {
		return nil
	}
	return b.Free()
}

// overcommitRefuses returns why case 3 cannot run here, or "": only under
// heuristic or strict overcommit does the kernel refuse the mapping at once
// (under "always" the pin could end in the OOM killer).
func overcommitRefuses() string {
	mode, err := os.ReadFile("/proc/sys/vm/overcommit_memory")
	if err != nil {
		return "cannot read vm.overcommit_memory: " + err.Error()
	}
	if m := strings.TrimSpace(string(mode)); m != "0" && m != "2" {
		return "vm.overcommit_memory is " + m + ": the kernel would accept the mapping"
	}
	return ""
}

// ramAndSwap returns MemTotal + SwapTotal from /proc/meminfo, in bytes.
func ramAndSwap() (int64, error) {
	text, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[0] == "MemTotal:" || f[0] == "SwapTotal:") && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %q: %w", line, err)
			}
			sum += kb << 10
		}
	}
	return sum, nil
}
