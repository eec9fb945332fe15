package bench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

// SchemaVersion is the version of the result JSON (Report) this package
// writes; ReadReport refuses files of a newer version. The schema is
// documented in docs/results/SCHEMA.md.
const SchemaVersion = 1

// Tool says which build of which program produced a report.
type Tool struct {
	Name      string `json:"name"`               // "pinmem"
	Version   string `json:"version"`            // module version ("v0.1.0", "(devel)")
	Revision  string `json:"revision,omitempty"` // VCS revision the binary was built from
	Modified  *bool  `json:"modified,omitempty"` // the working tree had uncommitted changes (nil: unknown, no VCS information)
	GoVersion string `json:"go_version"`         // e.g. "go1.26.0"
	Platform  string `json:"platform,omitempty"` // GOOS/GOARCH of the build, e.g. "linux/amd64"
	// Changelog is the CHANGELOG.md version whose changes the build's
	// source contains: its latest version, with "+unreleased" when the
	// source has changes listed under [Unreleased] after it.
	Changelog string `json:"changelog,omitempty"`
}

// Host is what a report records about the machine.
type Host struct {
	OS          string `json:"os"`           // runtime.GOOS/GOARCH
	CPUModel    string `json:"cpu_model"`    // /proc/cpuinfo "model name" ("" when unknown)
	Cores       int    `json:"cores"`        // CPUs the process may run on
	MemoryBytes uint64 `json:"memory_bytes"` // MemTotal
	Kernel      string `json:"kernel"`       // /proc/sys/kernel/osrelease
	NUMANodes   int    `json:"numa_nodes"`   // online NUMA nodes (0 when unknown)
}

// DeviceInfo is what a report records about one GPU and its driver.
type DeviceInfo struct {
	Ordinal           int     `json:"ordinal"`
	Name              string  `json:"name"`
	PCIBusID          string  `json:"pci_bus_id,omitempty"`
	ComputeCapability string  `json:"compute_capability"`
	MemoryBytes       uint64  `json:"memory_bytes"`
	DriverVersion     int     `json:"driver_version,omitempty"` // CUDA version the driver supports, e.g. 13000
	PCIeGen           int     `json:"pcie_gen,omitempty"`       // current link generation (sysfs)
	PCIeWidth         int     `json:"pcie_width,omitempty"`     // current lanes
	PCIeMaxGen        int     `json:"pcie_max_gen,omitempty"`
	PCIeMaxWidth      int     `json:"pcie_max_width,omitempty"`
	PCIeGBps          float64 `json:"pcie_gbps,omitempty"` // raw bandwidth per direction of the link at its maximum, GB/s
}

// HostFacts reads the host part of a report. Figures that cannot be read
// are left zero or empty.
func HostFacts() Host {
	info := sysinfo.Snapshot()
	h := Host{OS: runtime.GOOS + "/" + runtime.GOARCH, Cores: info.CPUs.Usable, NUMANodes: len(info.NUMA)}
	if h.Cores == 0 {
		h.Cores = runtime.NumCPU()
	}
	if info.Memory != nil {
		h.MemoryBytes = info.Memory.MemTotal
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				h.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	return h
}

// deviceInfo describes the session's device, with its PCIe link when sysfs
// knows it.
func deviceInfo(p cuda.Properties) DeviceInfo {
	d := DeviceInfo{Ordinal: p.Ordinal, Name: p.Name, PCIBusID: p.PCIBusID,
		ComputeCapability: fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor), MemoryBytes: p.TotalMemory}
	if v, err := cuda.DriverVersion(); err == nil {
		d.DriverVersion = v
	}
	if p.PCIBusID != "" {
		if l, err := (sysinfo.Reader{}).PCIeLink(p.PCIBusID); err == nil || l.MaxWidth > 0 {
			d.PCIeGen, d.PCIeWidth = l.CurrentGen(), l.CurrentWidth
			d.PCIeMaxGen, d.PCIeMaxWidth = l.MaxGen(), l.MaxWidth
			d.PCIeGBps = l.MaxBandwidth()
		}
	}
	return d
}

// LinkGBps returns the PCIe limit per direction that applies to every
// device of the report (the smallest known), or 0 when no link is known.
func (m Meta) LinkGBps() (gbps float64, label string) {
	for _, d := range m.Devices {
		if d.PCIeGBps > 0 && (gbps == 0 || d.PCIeGBps < gbps) {
			gbps, label = d.PCIeGBps, fmt.Sprintf("PCIe Gen%d x%d", d.PCIeMaxGen, d.PCIeMaxWidth)
		}
	}
	return gbps, label
}
