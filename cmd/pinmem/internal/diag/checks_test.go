package diag

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pinmem/pinmem"
	"github.com/pinmem/pinmem/cuda"
)

func level(r *Report, name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// healthy is a report of a machine with one GPU and nothing to fix.
func healthy() *Report {
	return &Report{DriverFound: true, DriverVersion: 13000, KernelsNeed: 13000, Library: "libcuda.so.1",
		Host: Host{THP: "madvise", PhysicalMemory: 64 << 30, MemAvailable: 60 << 30},
		Devices: []Device{{Properties: cuda.Properties{Name: "GPU"}, KernelsLoad: true,
			LinkGen: 5, LinkWidth: 16, LinkMaxGen: 5, LinkMaxWidth: 16, LinkBandwidth: 63}}}
}

// TestEvaluate: each condition gives its verdict with advice, and the
// commands that need what is missing are marked as not working.
func TestEvaluate(t *testing.T) {
	t.Setenv(pinmem.EnvBudget, "1GiB") // the default is half of this host's memory, which the fixture does not describe
	r := healthy()
	r.evaluate()
	if r.Problems() != 0 {
		t.Errorf("healthy machine: %+v", r.Checks)
	}
	for _, c := range r.Checks {
		if c.Level != OK {
			t.Errorf("healthy machine: %+v", c)
		}
	}
	for _, c := range r.Commands {
		if !c.Works {
			t.Errorf("healthy machine: %+v", c)
		}
	}
	cases := []struct {
		name  string
		env   string
		edit  func(*Report)
		check string
		want  Level
		cmd   string // a command that must not work, if any
	}{
		{"narrow link", "", func(r *Report) { r.Devices[0].LinkWidth = 8 }, "GPU 0 PCIe link", Problem, ""},
		{"slow link", "", func(r *Report) { r.Devices[0].LinkGen = 1 }, "GPU 0 PCIe link", Warning, ""},
		{"no link", "", func(r *Report) { r.Devices[0].LinkWidth = 0 }, "GPU 0 PCIe link", Warning, ""},
		{"huge pages off", "", func(r *Report) { r.Host.THP = "never" }, "huge pages", Warning, ""},
		{"bad budget", "lots", func(*Report) {}, "budget", Problem, "bench"},
		{"budget over cgroup", "32GiB", func(r *Report) { r.Host.CgroupLimitBytes = 16 << 30 }, "budget", Warning, ""},
		{"budget over available", "32GiB", func(r *Report) { r.Host.MemAvailable = 8 << 30 }, "budget", Warning, ""},
		{"old driver", "", func(r *Report) { r.DriverVersion = 12000 }, "driver version", Warning, ""},
		{"no kernels", "", func(r *Report) { r.Devices[0].KernelsLoad = false; r.Devices[0].KernelsError = "x" }, "GPU 0 kernels", Warning, "zerocopy"},
		{"no driver", "", func(r *Report) { r.DriverFound = false; r.DriverVersion = 0; r.Devices = nil }, "driver", Problem, "bench pin"},
		{"no device", "", func(r *Report) { r.Devices = nil }, "devices", Problem, "bench matrix"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(pinmem.EnvBudget, c.env)
			pinmem.SetBudget(0) // read PINMEM_BUDGET again
			defer pinmem.SetBudget(0)
			r := healthy()
			c.edit(r)
			r.evaluate()
			got, ok := level(r, c.check)
			if !ok || got.Level != c.want || got.Advice == "" && c.want != OK {
				t.Errorf("check %q = %+v (found %v), want %s with advice", c.check, got, ok, c.want)
			}
			if c.cmd != "" {
				for _, cm := range r.Commands {
					if cm.Name == c.cmd && (cm.Works || cm.Note == "") {
						t.Errorf("command %+v, want it marked as not working with a reason", cm)
					}
				}
			}
			var b bytes.Buffer
			if err := r.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), string(c.want)+" ") || !strings.Contains(b.String(), "pinned-memory budget:") {
				t.Errorf("text lacks the verdict or the budget:\n%s", b.String())
			}
		})
	}
}
