// Package diag collects what pinmem can see of a machine: the NVIDIA
// driver (found or not, and why), its version, every GPU with the
// properties that matter for host memory, and whether pinmem's kernels
// load. For each GPU it reports its NUMA node as sysfs and the driver see
// it, and the node pinmem places the device's staging memory on (see
// internal/numaplan). It backs the `pinmem doctor` command and works on machines with no
// GPU at all.
package diag

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/kernels"
	"github.com/pinmem/pinmem/internal/numaplan"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

// Report is everything doctor prints.
type Report struct {
	GoVersion     string   `json:"go_version"`
	Platform      string   `json:"platform"`
	Library       string   `json:"driver_library"`
	DriverFound   bool     `json:"driver_found"`
	DriverError   string   `json:"driver_error,omitempty"`
	DriverVersion int      `json:"driver_version,omitempty"` // e.g. 13000
	KernelsNeed   int      `json:"kernels_min_driver"`
	Devices       []Device `json:"devices"`
	Host          Host     `json:"host"`
	Notes         []string `json:"notes,omitempty"`
	// Checks are the verdicts (ok, warning, problem) with advice; Budget is
	// the pinned-memory budget in force; Commands say which pinmem
	// commands will work here.
	Checks   []Check   `json:"checks"`
	Budget   Budget    `json:"budget"`
	Commands []Command `json:"commands"`
}

// Host is what the host says about memory that matters for pinning.
type Host struct {
	MemTotal       uint64 `json:"mem_total_bytes"`
	MemAvailable   uint64 `json:"mem_available_bytes"`
	PhysicalMemory uint64 `json:"physical_memory_bytes"` // min(MemTotal, cgroup limit): the base of pinmem's default budget
	CgroupLimit    string `json:"cgroup_limit"`          // for people: "max", "unknown" or a size
	// CgroupLimitBytes is the cgroup memory limit in bytes, 0 when there is none or it is unknown.
	CgroupLimitBytes uint64   `json:"cgroup_limit_bytes"`
	MemlockLimit     string   `json:"memlock_limit"` // RLIMIT_MEMLOCK's soft limit, for people
	THP              string   `json:"transparent_hugepages"`
	NUMANodes        int      `json:"numa_nodes"`
	CPUs             int      `json:"cpus"`
	Errors           []string `json:"errors,omitempty"`
}

// Device is one GPU in the report. Its JSON (MarshalJSON) names every
// field in snake_case with the unit where a value has one.
type Device struct {
	cuda.Properties
	KernelsLoad  bool
	KernelsError string
	// PCIe link as sysfs reports it: generation and lanes, now and at most;
	// LinkBandwidth is the raw bandwidth per direction, GB/s.
	LinkGen       int
	LinkWidth     int
	LinkMaxGen    int
	LinkMaxWidth  int
	LinkBandwidth float64
	SysfsNUMANode int
	// StagingNUMANode is the NUMA node pinmem places staging memory for
	// this device on (its own mappings, pinmem.NUMAAuto), -1 for none;
	// StagingPlacement says why.
	StagingNUMANode  int
	StagingPlacement string
	Error            string
}

// deviceJSON is Device as doctor's JSON writes it
// (docs/results/doctor.schema.json): cuda.Properties has no JSON names of
// its own, so they are given here, with units.
type deviceJSON struct {
	Ordinal                       int     `json:"ordinal"`
	Name                          string  `json:"name"`
	ComputeCapability             string  `json:"compute_capability"` // "9.0"
	Multiprocessors               int     `json:"multiprocessors"`
	AsyncEngines                  int     `json:"async_engines"`
	CanMapHostMemory              bool    `json:"can_map_host_memory"`
	Integrated                    bool    `json:"integrated"`
	UnifiedAddressing             bool    `json:"unified_addressing"`
	HostRegisterSupported         bool    `json:"host_register_supported"`
	ReadOnlyHostRegisterSupported bool    `json:"read_only_host_register_supported"`
	PageableMemoryAccess          bool    `json:"pageable_memory_access"`
	PageableUsesHostPageTables    bool    `json:"pageable_uses_host_page_tables"`
	CanUseHostPointerForRegMem    bool    `json:"can_use_host_pointer_for_registered_mem"`
	ConcurrentManagedAccess       bool    `json:"concurrent_managed_access"`
	PCIBusID                      string  `json:"pci_bus_id"`
	MemoryBytes                   uint64  `json:"memory_bytes"`
	ClockRateKHz                  int     `json:"clock_rate_khz"`
	MemoryClockKHz                int     `json:"memory_clock_khz"`
	MemoryBusWidthBits            int     `json:"memory_bus_width_bits"`
	NUMAID                        int     `json:"numa_id"`      // the device's own NUMA node, -1 when it is none
	HostNUMAID                    int     `json:"host_numa_id"` // the nearest host NUMA node, -1 when unknown
	KernelsLoad                   bool    `json:"kernels_load"`
	KernelsError                  string  `json:"kernels_error,omitempty"`
	LinkGen                       int     `json:"pcie_gen,omitempty"`
	LinkWidth                     int     `json:"pcie_width,omitempty"`
	LinkMaxGen                    int     `json:"pcie_max_gen,omitempty"`
	LinkMaxWidth                  int     `json:"pcie_max_width,omitempty"`
	LinkBandwidth                 float64 `json:"pcie_gbps,omitempty"`
	SysfsNUMANode                 int     `json:"sysfs_numa_node"`
	StagingNUMANode               int     `json:"staging_numa_node"`
	StagingPlacement              string  `json:"staging_placement"`
	Error                         string  `json:"error,omitempty"`
}

// MarshalJSON writes d with snake_case names (deviceJSON).
func (d Device) MarshalJSON() ([]byte, error) {
	p := d.Properties
	return json.Marshal(deviceJSON{
		Ordinal: p.Ordinal, Name: p.Name, ComputeCapability: fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor),
		Multiprocessors: p.Multiprocessors, AsyncEngines: p.AsyncEngines,
		CanMapHostMemory: p.CanMapHostMemory, Integrated: p.Integrated, UnifiedAddressing: p.UnifiedAddressing,
		HostRegisterSupported: p.HostRegisterSupported, ReadOnlyHostRegisterSupported: p.ReadOnlyHostRegisterSupported,
		PageableMemoryAccess: p.PageableMemoryAccess, PageableUsesHostPageTables: p.PageableUsesHostPageTables,
		CanUseHostPointerForRegMem: p.CanUseHostPointerForRegMem, ConcurrentManagedAccess: p.ConcurrentManagedAccess,
		PCIBusID: p.PCIBusID, MemoryBytes: p.TotalMemory, ClockRateKHz: p.ClockRateKHz, MemoryClockKHz: p.MemoryClockKHz,
		MemoryBusWidthBits: p.MemoryBusWidth, NUMAID: p.NUMAID, HostNUMAID: p.HostNUMAID,
		KernelsLoad: d.KernelsLoad, KernelsError: d.KernelsError,
		LinkGen: d.LinkGen, LinkWidth: d.LinkWidth, LinkMaxGen: d.LinkMaxGen, LinkMaxWidth: d.LinkMaxWidth, LinkBandwidth: d.LinkBandwidth,
		SysfsNUMANode: d.SysfsNUMANode, StagingNUMANode: d.StagingNUMANode, StagingPlacement: d.StagingPlacement, Error: d.Error,
	})
}

// reader is where diag reads sysfs (tests point it at fixtures).
var reader = sysinfo.Reader{}

// Collect gathers the report and its verdicts. It never fails: what
// cannot be read is recorded in the report.
func Collect() *Report {
	r := collect()
	r.evaluate()
	return r
}

func collect() *Report {
	r := &Report{
		Devices:     []Device{}, // [] in JSON without a GPU, not null
		GoVersion:   runtime.Version(),
		Platform:    runtime.GOOS + "/" + runtime.GOARCH,
		Library:     cudadrv.LibraryPath(),
		KernelsNeed: kernels.MinDriverVersion,
		Host:        collectHost(),
	}
	v, err := cuda.DriverVersion()
	if err != nil {
		r.DriverError = err.Error()
		if errors.Is(err, cuda.ErrNoDevice) {
			r.DriverFound = true
		}
		return r
	}
	r.DriverFound = true
	r.DriverVersion = v
	n, err := cuda.DeviceCount()
	if err != nil {
		r.Notes = append(r.Notes, "listing devices: "+err.Error())
		return r
	}
	for i := range n {
		d, err := cuda.GetDevice(i)
		if err != nil {
			r.Notes = append(r.Notes, "listing devices: "+err.Error())
			return r
		}
		r.Devices = append(r.Devices, collectDevice(d))
	}
	if v < kernels.MinDriverVersion {
		r.Notes = append(r.Notes, fmt.Sprintf("driver supports CUDA %s but pinmem's kernels need %s: pinning and copies work, kernel-based features do not",
			verString(v), verString(kernels.MinDriverVersion)))
	}
	return r
}

func collectHost() Host {
	info := reader.Snapshot()
	h := Host{PhysicalMemory: info.PhysicalMemory, NUMANodes: len(info.NUMA), CPUs: info.CPUs.Usable,
		CgroupLimit: "unknown", MemlockLimit: "unknown", THP: "unknown"}
	if info.Memory != nil {
		h.MemTotal, h.MemAvailable = info.Memory.MemTotal, info.Memory.MemAvailable
	}
	if info.Cgroup != nil {
		h.CgroupLimit = limitString(info.Cgroup.Limit)
		if !info.Cgroup.Limit.IsUnlimited() {
			h.CgroupLimitBytes = uint64(info.Cgroup.Limit)
		}
	}
	if info.Memlock != nil {
		h.MemlockLimit = limitString(info.Memlock.Soft)
	}
	if info.THP != nil {
		h.THP = info.THP.Enabled
	}
	for _, e := range info.Errors {
		h.Errors = append(h.Errors, e.Error())
	}
	return h
}

func collectDevice(d *cuda.Device) Device {
	out := Device{SysfsNUMANode: -1, StagingNUMANode: -1}
	p, err := d.Properties()
	out.Properties = p
	if err != nil {
		out.Error = err.Error()
		return out
	}
	plan := numaplan.For(reader, p.PCIBusID, p.HostNUMAID)
	out.StagingNUMANode, out.StagingPlacement = plan.Node, plan.Reason
	out.SysfsNUMANode = plan.SysfsNode
	if l, err := reader.PCIeLink(p.PCIBusID); err == nil || l.CurrentWidth > 0 {
		out.LinkGen, out.LinkWidth = l.CurrentGen(), l.CurrentWidth
		out.LinkMaxGen, out.LinkMaxWidth = l.MaxGen(), l.MaxWidth
		out.LinkBandwidth = l.CurrentBandwidth()
		out.SysfsNUMANode = l.NUMANode
	}
	ctx, err := d.PrimaryContext()
	if err != nil {
		out.KernelsError = err.Error()
		return out
	}
	m, err := ctx.LoadModule(kernels.PTX())
	if err != nil {
		out.KernelsError = err.Error()
		return out
	}
	out.KernelsLoad = true
	if err := m.Destroy(); err != nil {
		out.KernelsError = "unloading: " + err.Error()
	}
	return out
}

func nodeString(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

func verString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "pinmem doctor\t%s %s\n", r.Platform, r.GoVersion)
	h := r.Host
	fmt.Fprintf(tw, "host memory\t%.1f GiB total, %.1f GiB available; physical for pinning %.1f GiB (cgroup limit %s)\n",
		gib(h.MemTotal), gib(h.MemAvailable), gib(h.PhysicalMemory), h.CgroupLimit)
	fmt.Fprintf(tw, "RLIMIT_MEMLOCK\t%s (CUDA pinning does not count against it)\n", h.MemlockLimit)
	fmt.Fprintf(tw, "transparent huge pages\t%s\n", h.THP)
	fmt.Fprintf(tw, "CPUs / NUMA nodes\t%d / %d\n", h.CPUs, h.NUMANodes)
	if !r.DriverFound {
		fmt.Fprintf(tw, "driver\tno NVIDIA driver found (%s)\n", r.DriverError)
		fmt.Fprintf(tw, "\tpinmem can build and test here, but nothing can be pinned or copied to a GPU\n")
		fmt.Fprintf(tw, "\tset %s to the path of libcuda.so.1 if the driver is installed in an unusual place\n", cudadrv.EnvLibrary)
		if err := tw.Flush(); err != nil {
			return err
		}
		r.writeChecks(w)
		return nil
	}
	fmt.Fprintf(tw, "driver\t%s\n", r.Library)
	if r.DriverVersion != 0 {
		fmt.Fprintf(tw, "driver version\tCUDA %s (%d); kernels need CUDA %s or newer\n", verString(r.DriverVersion), r.DriverVersion, verString(r.KernelsNeed))
	}
	if r.DriverError != "" {
		fmt.Fprintf(tw, "driver error\t%s\n", r.DriverError)
	}
	fmt.Fprintf(tw, "devices\t%d\n", len(r.Devices))
	for _, d := range r.Devices {
		fmt.Fprintf(tw, "\n[GPU %d]\t%s\n", d.Ordinal, d.Name)
		if d.Error != "" {
			fmt.Fprintf(tw, "  error\t%s\n", d.Error)
			continue
		}
		fmt.Fprintf(tw, "  compute capability\t%d.%d\n", d.ComputeMajor, d.ComputeMinor)
		fmt.Fprintf(tw, "  multiprocessors\t%d\n", d.Multiprocessors)
		fmt.Fprintf(tw, "  copy engines\t%d\n", d.AsyncEngines)
		fmt.Fprintf(tw, "  memory\t%.1f GiB\n", float64(d.TotalMemory)/(1<<30))
		fmt.Fprintf(tw, "  PCI bus id\t%s\n", d.PCIBusID)
		if d.LinkWidth > 0 {
			fmt.Fprintf(tw, "  PCIe link\tGen%d x%d (max Gen%d x%d): %.1f GB/s per direction raw\n", d.LinkGen, d.LinkWidth, d.LinkMaxGen, d.LinkMaxWidth, d.LinkBandwidth)
		}
		fmt.Fprintf(tw, "  NUMA node\tsysfs %s, driver (host NUMA id) %s\n", nodeString(d.SysfsNUMANode), nodeString(d.HostNUMAID))
		if d.StagingNUMANode >= 0 {
			fmt.Fprintf(tw, "  staging memory\tNUMA node %d (%s; mbind, else first touch on its CPUs)\n", d.StagingNUMANode, d.StagingPlacement)
		} else {
			fmt.Fprintf(tw, "  staging memory\tnot placed (%s)\n", d.StagingPlacement)
		}
		fmt.Fprintf(tw, "  integrated (Tegra/Jetson)\t%s\n", yesNo(d.Integrated))
		fmt.Fprintf(tw, "  can map host memory\t%s\n", yesNo(d.CanMapHostMemory))
		fmt.Fprintf(tw, "  unified addressing\t%s\n", yesNo(d.UnifiedAddressing))
		fmt.Fprintf(tw, "  host register supported\t%s (read-only: %s)\n", yesNo(d.HostRegisterSupported), yesNo(d.ReadOnlyHostRegisterSupported))
		fmt.Fprintf(tw, "  pageable memory access\t%s (via host page tables: %s)\n", yesNo(d.PageableMemoryAccess), yesNo(d.PageableUsesHostPageTables))
		if d.KernelsLoad {
			fmt.Fprintf(tw, "  kernels\tload\n")
		} else {
			fmt.Fprintf(tw, "  kernels\tDO NOT LOAD: %s\n", d.KernelsError)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(tw, "\nnotes\t%s\n", strings.Join(r.Notes, "\n\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	r.writeChecks(w)
	return nil
}
