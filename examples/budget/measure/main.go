// Command measure, the budget example's measurement program, re-measures
// advice of the article pinmem grew from, on CUDA page-locked memory: keep
// pinned memory under half of physical memory, and watch it through
// /proc/meminfo (MemTotal, Mlocked).
//
// pinmem enforces the first part itself: every process has a pinned-memory
// budget (by default half of the physical memory it may use; PINMEM_BUDGET or
// pinmem.SetBudget change it), and a request that would go over it fails with
// an error matching pinmem.ErrBudget before anything is pinned. For the second
// part pinmem keeps a ledger of what it pinned (pinmem.Stats); this program
// prints it beside what the kernel reports.
//
// It sets a small budget (-budget), then, for each way pinmem pins memory
// (cuMemHostAlloc, and mmap + cuMemHostRegister), pins -chunk sized buffers
// until the next one would exceed the budget, and prints:
//
//   - pinmem's ledger (bytes and buffers pinned) against the change in
//     /proc/meminfo's Shmem, Mlocked and MemAvailable, and RLIMIT_MEMLOCK;
//   - the error the request over the budget got, with its figures;
//   - the ledger after every buffer was freed.
//
// The first buffer of each way is copied to the GPU and back and compared,
// and the ledger's figures are checked (exact bytes pinned, back to where it
// started after Free): a wrong figure is an error, not output.
//
// Usage:
//
//	go run ./examples/budget/measure [-budget 1GiB] [-chunk 128MiB]
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/examples/internal/harness"
	"github.com/pinmem/pinmem/internal/budgetspec"
)

type config struct {
	budget int64 // the budget set for the run
	chunk  int   // bytes per buffer (a multiple of 2 MiB)
}

func main() {
	harness.Main("budget", parseFlags, func(cfg config) error {
		_, err := run(context.Background(), cfg, os.Stdout)
		return err
	})
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := harness.Flags("budget", stderr)
	budget := fs.String("budget", "1GiB", "the pinned-memory budget for the run (syntax: 512MiB, 2GiB, 5%)")
	chunk := fs.String("chunk", "128MiB", "bytes per buffer, a multiple of 2 MiB")
	if err := harness.Parse(fs, args); err != nil {
		return config{}, err
	}
	mem, err := readMeminfo()
	if err != nil {
		return config{}, err
	}
	b, err := budgetspec.Parse(*budget, uint64(mem["MemTotal"]))
	if err != nil {
		return config{}, fmt.Errorf("-budget: %w", err)
	}
	c, err := budgetspec.Parse(*chunk, uint64(mem["MemTotal"]))
	if err != nil || c <= 0 || c%(2<<20) != 0 {
		return config{}, fmt.Errorf("-chunk %q: want a positive multiple of 2 MiB", *chunk)
	}
	if c > b {
		return config{}, fmt.Errorf("-chunk %s is larger than -budget %s", *chunk, *budget)
	}
	return config{budget: b, chunk: int(c)}, nil
}

// Round is what pinning up to the budget with one method showed.
type Round struct {
	Method    pinmem.Method
	Buffers   int   // buffers pinned before the budget refused one
	Ledger    int64 // pinmem.Stats().Pinned.Bytes growth while they were pinned
	Refusal   *pinmem.BudgetError
	Shmem     int64 // /proc/meminfo changes, bytes
	Mlocked   int64
	Available int64
}

func run(ctx context.Context, cfg config, w io.Writer) (rounds []Round, err error) {
	g, err := harness.OpenGPU(0)
	if err != nil {
		return nil, err
	}
	d, err := g.Ctx.Alloc(cfg.chunk)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.Free()) }()

	mem, err := readMeminfo()
	if err != nil {
		return nil, err
	}
	memlock := readMemlock()
	def := pinmem.Budget()
	fmt.Fprintf(w, "budget: MemTotal %s; pinmem's default budget %s (%.0f%% of MemTotal; %s sets another); RLIMIT_MEMLOCK %s\n",
		gib(mem["MemTotal"]), gib(def), 100*float64(def)/float64(mem["MemTotal"]), pinmem.EnvBudget, memlock)

	// A smaller budget for this run; the previous one comes back at the end.
	prev := pinmem.SetBudget(cfg.budget)
	defer pinmem.SetBudget(prev)
	fmt.Fprintf(w, "budget set to %s; pinning %s buffers until the budget refuses one\n", gib(cfg.budget), gib(int64(cfg.chunk)))
	fmt.Fprintf(w, "%-22s %8s %12s %12s %12s %14s\n", "method", "buffers", "ledger", "Shmem", "Mlocked", "MemAvailable")
	for _, m := range []pinmem.Method{pinmem.MethodHostAlloc, pinmem.MethodMmapRegister} {
		if err := ctx.Err(); err != nil {
			return rounds, err
		}
		r, err := pinToBudget(d, cfg, m)
		if err != nil {
			return rounds, fmt.Errorf("%v: %w", m, err)
		}
		rounds = append(rounds, r)
		fmt.Fprintf(w, "%-22s %8d %12s %12s %12s %14s\n", m, r.Buffers, gib(r.Ledger), delta(r.Shmem), delta(r.Mlocked), delta(r.Available))
	}
	e := rounds[0].Refusal
	fmt.Fprintf(w, "the request over the budget: %v\n", e)
	fmt.Fprintf(w, "  errors.Is(err, pinmem.ErrBudget) = true; *pinmem.BudgetError: Requested %s, Pinned %s, Limit %s\n",
		gib(e.Requested), gib(e.Pinned), gib(e.Limit))
	fmt.Fprintf(w, "after Free the ledger holds %s in %d buffers\n", gib(pinmem.Stats().Pinned.Bytes), pinmem.Stats().Pinned.Buffers)
	fmt.Fprintln(w, "article:  keep pinned memory under half of physical memory; watch it in /proc/meminfo (MemTotal, Mlocked)")
	fmt.Fprintf(w, "measured: pinmem's default budget is %.0f%% of MemTotal and refuses requests beyond it;", 100*float64(def)/float64(mem["MemTotal"]))
	for _, r := range rounds {
		fmt.Fprintf(w, " %v: %s pinned, Mlocked %s;", r.Method, gib(r.Ledger), delta(r.Mlocked))
	}
	fmt.Fprintln(w, " the ledger (pinmem.Stats) is the exact account")
	return rounds, nil
}

// pinToBudget pins chunk-sized buffers with method m until the budget
// refuses one, then frees them all.
func pinToBudget(d *cuda.DeviceBuffer, cfg config, m pinmem.Method) (r Round, err error) {
	r.Method = m
	start := pinmem.Stats().Pinned
	before, err := readMeminfo()
	if err != nil {
		return r, err
	}
	var bufs []*pinmem.Buffer
	defer func() {
		for _, b := range bufs {
			err = errors.Join(err, b.Free())
		}
		if err == nil {
			if now := pinmem.Stats().Pinned; now != start {
				err = fmt.Errorf("after Free the ledger holds %d bytes in %d buffers, want %d in %d as before", now.Bytes, now.Buffers, start.Bytes, start.Buffers)
			}
		}
	}()
	for {
		b, err := pinmem.Alloc(cfg.chunk, 0, pinmem.WithMethod(m))
		var be *pinmem.BudgetError
		if errors.As(err, &be) && errors.Is(err, pinmem.ErrBudget) {
			r.Refusal = be
			break
		}
		if err != nil {
			return r, err
		}
		bufs = append(bufs, b)
		if len(bufs) == 1 {
			if err := roundTrip(d, b.Bytes()); err != nil {
				return r, err
			}
		} else {
			touch(b.Bytes()) // the memory is there, like the first buffer's
		}
	}
	after, err := readMeminfo()
	if err != nil {
		return r, err
	}
	r.Buffers = len(bufs)
	r.Ledger = pinmem.Stats().Pinned.Bytes - start.Bytes
	r.Shmem = after["Shmem"] - before["Shmem"]
	r.Mlocked = after["Mlocked"] - before["Mlocked"]
	r.Available = after["MemAvailable"] - before["MemAvailable"]
	// The ledger counts exactly the bytes handed to the driver; the budget
	// let through every buffer that fit.
	if want := int64(len(bufs)) * int64(cfg.chunk); r.Ledger != want {
		return r, fmt.Errorf("the ledger grew by %d bytes for %d buffers of %d, want %d", r.Ledger, len(bufs), cfg.chunk, want)
	}
	if fit := (cfg.budget - start.Bytes) / int64(cfg.chunk); int64(len(bufs)) != fit {
		return r, fmt.Errorf("the budget let %d buffers through, want %d", len(bufs), fit)
	}
	if r.Refusal.Limit != cfg.budget || r.Refusal.Requested != int64(cfg.chunk) {
		return r, fmt.Errorf("the refusal names limit %d and request %d, want %d and %d", r.Refusal.Limit, r.Refusal.Requested, cfg.budget, cfg.chunk)
	}
	return r, nil
}

// roundTrip copies b to the device and back into a Go slice and compares.
func roundTrip(d *cuda.DeviceBuffer, b []byte) error {
	for i := range b {
		b[i] = byte(i*13 + i>>9)
	}
	if _, err := d.WriteAt(b, 0); err != nil {
		return err
	}
	back := make([]byte, len(b))
	if _, err := d.ReadAt(back, 0); err != nil {
		return err
	}
	if !bytes.Equal(back, b) {
		return errors.New("the bytes copied to the GPU and back differ")
	}
	return nil
}

// touch writes one byte per 4 KiB page.
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
}

// readMeminfo returns /proc/meminfo's fields in bytes.
func readMeminfo() (map[string]int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, fmt.Errorf("this example reads /proc/meminfo (Linux): %w", err)
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "MemTotal:       131072000 kB"
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v *= 1024
		}
		m[key] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if m["MemTotal"] <= 0 {
		return nil, errors.New("/proc/meminfo has no MemTotal")
	}
	return m, nil
}

// readMemlock returns the soft RLIMIT_MEMLOCK as /proc/self/limits shows it.
func readMemlock() string {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max locked memory"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return gib(v)
			}
			return f[0] // "unlimited"
		}
	}
	return "unknown"
}

// gib formats a byte count (or change) in MiB or GiB.
func gib(n int64) string {
	a := n
	if a < 0 {
		a = -a
	}
	if a >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// delta formats a change in bytes with its sign.
func delta(n int64) string {
	if n >= 0 {
		return "+" + gib(n)
	}
	return gib(n)
}
