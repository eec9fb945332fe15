package diag

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/internal/budgetspec"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/units"
)

// Level is a check's verdict.
type Level string

// Verdicts, from good to bad.
const (
	OK      Level = "ok"      // nothing to do
	Warning Level = "warning" // works, but slower or riskier than it could be
	Problem Level = "problem" // something pinmem needs is missing or wrong
)

// Check is one verdict of doctor: what was checked, the verdict, what was
// found and one line of advice (empty when OK).
type Check struct {
	Name   string `json:"name"`
	Level  Level  `json:"level"`
	Detail string `json:"detail"`
	Advice string `json:"advice,omitempty"`
}

// Budget is the pinned-memory budget in force and where it comes from.
type Budget struct {
	Bytes  int64  `json:"bytes"`           // the limit (math.MaxInt64: none)
	Source string `json:"source"`          // "PINMEM_BUDGET=40%", "default: half of physical memory", ...
	Error  string `json:"error,omitempty"` // why PINMEM_BUDGET was not used
}

// Command says whether a pinmem command will work on this machine.
type Command struct {
	Name  string `json:"name"`
	Works bool   `json:"works"`
	Note  string `json:"note,omitempty"`
}

// physicalMemory returns the budget base; a test hook.
var physicalMemory = func(h Host) uint64 { return h.PhysicalMemory }

// budgetOf returns the effective budget and its source.
func budgetOf(h Host) Budget {
	b := Budget{Bytes: pinmem.Budget()}
	env, set := os.LookupEnv(pinmem.EnvBudget)
	switch {
	case set && strings.TrimSpace(env) != "":
		if _, err := budgetspec.Parse(env, max(physicalMemory(h), 1)); err != nil {
			b.Error = strings.TrimPrefix(err.Error(), "budget: ")
			b.Source = fmt.Sprintf("default (half of physical memory): %s=%q does not parse", pinmem.EnvBudget, env)
		} else {
			b.Source = fmt.Sprintf("%s=%s", pinmem.EnvBudget, env)
		}
	case physicalMemory(h) == 0:
		b.Source = "none: physical memory unknown"
	default:
		b.Source = "default: half of physical memory"
	}
	return b
}

// evaluate fills in the report's checks, budget and commands.
func (r *Report) evaluate() {
	r.Budget = budgetOf(r.Host)
	gpu := r.DriverFound && r.DriverVersion != 0 && len(r.Devices) > 0
	r.checkDriver()
	kernelsEverywhere := gpu
	for _, d := range r.Devices {
		if !r.checkDevice(d) {
			kernelsEverywhere = false
		}
	}
	r.checkTHP()
	r.checkBudget()
	if len(r.Host.Errors) > 0 {
		r.add("host facts", Warning, strings.Join(r.Host.Errors, "; "), "some host figures are unknown; doctor's other verdicts may be incomplete")
	}
	r.Commands = commandsFor(gpu, r.Budget.Error == "", kernelsEverywhere)
}

// add appends a check.
func (r *Report) add(name string, l Level, detail, advice string) {
	r.Checks = append(r.Checks, Check{Name: name, Level: l, Detail: detail, Advice: advice})
}

// checkDriver checks the driver, its devices and its version.
func (r *Report) checkDriver() {
	switch {
	case !r.DriverFound:
		r.add("driver", Problem, "no NVIDIA driver found ("+r.DriverError+")",
			"install the NVIDIA driver, or set "+cudadrv.EnvLibrary+" to the path of libcuda.so.1")
		return
	case r.DriverError != "":
		r.add("driver", Problem, "driver found but not usable: "+r.DriverError, "check that the driver and kernel module versions match (nvidia-smi)")
		return
	}
	r.add("driver", OK, fmt.Sprintf("%s, CUDA %s", r.Library, verString(r.DriverVersion)), "")
	if len(r.Devices) == 0 {
		r.add("devices", Problem, "the driver sees no CUDA device", "check nvidia-smi and CUDA_VISIBLE_DEVICES")
	} else {
		r.add("devices", OK, fmt.Sprintf("%d CUDA device(s)", len(r.Devices)), "")
	}
	if r.DriverVersion < r.KernelsNeed {
		r.add("driver version", Warning, fmt.Sprintf("CUDA %s; pinmem's kernels need CUDA %s", verString(r.DriverVersion), verString(r.KernelsNeed)),
			"upgrade the driver for spin-wait timing, mapped, overlap and zerocopy benches")
	}
}

// checkDevice checks a device, its kernels and its PCIe link; it reports
// whether the device is usable and loads the kernels.
func (r *Report) checkDevice(d Device) (kernels bool) {
	name := fmt.Sprintf("GPU %d", d.Ordinal)
	if d.Error != "" {
		r.add(name, Problem, d.Error, "check nvidia-smi for this device")
		return false
	}
	if !d.KernelsLoad {
		r.add(name+" kernels", Warning, "kernels do not load: "+d.KernelsError, "copies are timed with plain events and kernel benches are skipped; upgrade the driver")
	}
	switch {
	case d.LinkWidth == 0:
		r.add(name+" PCIe link", Warning, "link unknown (no sysfs entry)", "bandwidth plots will have no PCIe limit line")
	case d.LinkWidth < d.LinkMaxWidth:
		r.add(name+" PCIe link", Problem, fmt.Sprintf("x%d of x%d lanes", d.LinkWidth, d.LinkMaxWidth),
			"the card runs on fewer lanes than it has: reseat it or use a full-width slot")
	case d.LinkGen < d.LinkMaxGen:
		r.add(name+" PCIe link", Warning, fmt.Sprintf("Gen%d x%d, card supports Gen%d", d.LinkGen, d.LinkWidth, d.LinkMaxGen),
			"an idle GPU lowers its link speed; if it stays low under load, check the slot and BIOS settings")
	default:
		r.add(name+" PCIe link", OK, fmt.Sprintf("Gen%d x%d, %.1f GB/s per direction raw", d.LinkGen, d.LinkWidth, d.LinkBandwidth), "")
	}
	return d.KernelsLoad
}

// checkTHP checks transparent huge pages.
func (r *Report) checkTHP() {
	switch r.Host.THP {
	case "never":
		r.add("huge pages", Warning, "transparent huge pages: never",
			"mmap-register touches and registers 4 KiB pages; echo madvise > /sys/kernel/mm/transparent_hugepage/enabled")
	case "unknown", "":
		r.add("huge pages", Warning, "transparent huge pages: unknown", "")
	default:
		r.add("huge pages", OK, "transparent huge pages: "+r.Host.THP, "")
	}
}

// checkBudget checks the pinned-memory budget against the memory there is.
func (r *Report) checkBudget() {
	b := r.Budget
	switch {
	case b.Error != "":
		r.add("budget", Problem, b.Error, "fix "+pinmem.EnvBudget+" (e.g. 40%, 16GiB) or unset it; pinmem bench refuses to run with it")
	case b.Bytes == math.MaxInt64:
		r.add("budget", Warning, "no limit ("+b.Source+")", "set "+pinmem.EnvBudget+" (e.g. 40%) so that pinning cannot take all memory")
	case r.Host.CgroupLimitBytes > 0 && uint64(b.Bytes) > r.Host.CgroupLimitBytes:
		r.add("budget", Warning, fmt.Sprintf("%s (%s) is above the cgroup limit %s", human(b.Bytes), b.Source, human(int64(min(r.Host.CgroupLimitBytes, math.MaxInt64)))),
			"lower "+pinmem.EnvBudget+": pinning up to the budget would get the process OOM-killed")
	case r.Host.MemAvailable > 0 && uint64(b.Bytes) > r.Host.MemAvailable:
		r.add("budget", Warning, fmt.Sprintf("%s (%s) is more than the %s available now", human(b.Bytes), b.Source, human(int64(min(r.Host.MemAvailable, math.MaxInt64)))),
			"other processes use memory: large pinned buffers may fail or push the host into swap")
	default:
		r.add("budget", OK, fmt.Sprintf("%s (%s)", human(b.Bytes), b.Source), "")
	}
}

// commandsFor says which of pinmem's commands work: the measuring ones
// need a GPU and a budget that parses, and some need the kernels on every
// device.
func commandsFor(gpu, budgetOK, kernelsEverywhere bool) []Command {
	measure := func(name, extra string, needKernels bool) Command {
		c := Command{Name: name, Works: gpu && budgetOK}
		switch {
		case !gpu:
			c.Note = "needs an NVIDIA driver and a GPU"
		case !budgetOK:
			c.Note = "refused until " + pinmem.EnvBudget + " parses"
		case needKernels && !kernelsEverywhere:
			c.Works, c.Note = false, "needs pinmem's kernels to load"
		case !kernelsEverywhere:
			c.Note = extra
		}
		return c
	}
	return []Command{
		{Name: "doctor", Works: true}, {Name: "version", Works: true},
		{Name: "report", Works: true, Note: "renders saved results, no GPU needed"},
		{Name: "compare", Works: true, Note: "no GPU needed"},
		measure("bench all", "the tests that need the kernels are skipped", false),
		measure("bench", "plain event timing; the mapped kind is skipped", false),
		measure("bench pin", "", false),
		measure("bench matrix", "plain event timing", false),
		measure("bench blocks", "", false),
		measure("bench load", "", false),
		measure("bench overlap", "", true),
		measure("zerocopy", "", true),
	}
}

// Problems counts the checks whose verdict is Problem.
func (r *Report) Problems() int {
	n := 0
	for _, c := range r.Checks {
		if c.Level == Problem {
			n++
		}
	}
	return n
}

// writeChecks prints the verdicts, the budget and the commands.
func (r *Report) writeChecks(w io.Writer) {
	fmt.Fprintf(w, "\nchecks\n")
	for _, c := range r.Checks {
		fmt.Fprintf(w, "  %-8s %s: %s\n", c.Level, c.Name, c.Detail)
		if c.Advice != "" {
			fmt.Fprintf(w, "  %-8s   -> %s\n", "", c.Advice)
		}
	}
	fmt.Fprintf(w, "\npinned-memory budget: %s (%s)\n", budgetString(r.Budget.Bytes), r.Budget.Source)
	fmt.Fprintf(w, "\ncommands\n")
	for _, c := range r.Commands {
		mark := "works"
		if !c.Works {
			mark = "will not work"
		}
		line := fmt.Sprintf("  %-14s %s", c.Name, mark)
		if c.Note != "" {
			line += ": " + c.Note
		}
		fmt.Fprintln(w, line)
	}
}

func budgetString(b int64) string {
	if b == math.MaxInt64 {
		return "no limit"
	}
	return human(b)
}

// limitString is a limit for people: "unlimited" or a size (human).
func limitString(l sysinfo.Limit) string {
	if l.IsUnlimited() {
		return "unlimited"
	}
	return human(int64(min(uint64(l), math.MaxInt64)))
}

// human formats a byte count for people, one way everywhere: "2 GiB" and
// "64 MiB" where the unit is exact, else "11.8 GiB".
func human(n int64) string {
	if s := units.FormatSize(n); strings.HasSuffix(s, "iB") && len(s) <= 8 {
		return s[:len(s)-3] + " " + s[len(s)-3:]
	}
	switch {
	case n >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return units.FormatSize(n)
}
