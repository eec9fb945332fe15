package sysinfo

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
)

// PCIDevicesDir is the system directory holding one entry per PCI device.
const PCIDevicesDir = "/sys/bus/pci/devices"

// NVIDIAVendorID is NVIDIA's PCI vendor id.
const NVIDIAVendorID = 0x10de

// PCIeLink describes the PCIe link of one device. Speeds and widths that the
// kernel reports as unknown (for example "Unknown" speed while the link is
// down, or on a virtual device) are 0.
type PCIeLink struct {
	// BusID is the device's address in sysfs form, "0000:1b:00.0".
	BusID string
	// CurrentSpeed is the negotiated link speed in GT/s (16 for Gen4,
	// 32 for Gen5). GPUs lower it when idle, so it can read below MaxSpeed.
	CurrentSpeed float64
	// CurrentWidth is the negotiated number of lanes.
	CurrentWidth int
	// MaxSpeed is the fastest speed the device supports, in GT/s.
	MaxSpeed float64
	// MaxWidth is the widest link the device supports, in lanes.
	MaxWidth int
	// NUMANode is the NUMA node the device is attached to, or -1 when the
	// kernel does not know (single-node machines, most VMs).
	NUMANode int
}

// CurrentGen returns the PCIe generation of the current speed (0 if unknown).
func (l PCIeLink) CurrentGen() int { return PCIeGen(l.CurrentSpeed) }

// MaxGen returns the PCIe generation of the maximum speed (0 if unknown).
func (l PCIeLink) MaxGen() int { return PCIeGen(l.MaxSpeed) }

// CurrentBandwidth returns the theoretical per-direction bandwidth of the
// current link in GB/s (10^9 bytes per second), 0 if unknown.
func (l PCIeLink) CurrentBandwidth() float64 {
	return PCIeBandwidth(l.CurrentSpeed, l.CurrentWidth)
}

// MaxBandwidth returns the theoretical per-direction bandwidth of the link at
// its maximum speed and width in GB/s (10^9 bytes per second), 0 if unknown.
func (l PCIeLink) MaxBandwidth() float64 {
	return PCIeBandwidth(l.MaxSpeed, l.MaxWidth)
}

// PCIeGen maps a link speed in GT/s to its PCIe generation (2.5 -> 1,
// 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6). It returns 0 for any other value.
func PCIeGen(gts float64) int {
	switch gts {
	case 2.5:
		return 1
	case 5:
		return 2
	case 8:
		return 3
	case 16:
		return 4
	case 32:
		return 5
	case 64:
		return 6
	}
	return 0
}

// PCIeBandwidth returns the theoretical per-direction bandwidth in GB/s
// (10^9 bytes per second) of a link of width lanes at gts GT/s, after line
// encoding: 8b/10b up to 5 GT/s (Gen1-2), 128b/130b from 8 to 32 GT/s
// (Gen3-5) and 1b/1b FLIT mode at 64 GT/s and above (Gen6; FLIT framing,
// CRC and FEC overhead is not subtracted). Gen5 x16 gives 63.0 GB/s,
// Gen4 x16 31.5 GB/s. It returns 0 if gts or width is not positive.
func PCIeBandwidth(gts float64, width int) float64 {
	if gts <= 0 || width <= 0 {
		return 0
	}
	var eff float64
	switch {
	case gts <= 5:
		eff = 8.0 / 10.0
	case gts < 64:
		eff = 128.0 / 130.0
	default:
		eff = 1
	}
	return gts * eff * float64(width) / 8
}

// MaxLinkSpeed is the fastest link speed ParseLinkSpeed accepts, in GT/s:
// well above PCIe 7.0's 128 GT/s, far below a corrupt value.
const MaxLinkSpeed = 1024

// ParseLinkSpeed parses a sysfs link speed such as "32.0 GT/s PCIe",
// "2.5 GT/s" or "8 GT/s" into GT/s. "Unknown" (any case, with or without
// "speed") parses to 0 with no error. A speed that is not a decimal number
// of GT/s gives an error matching ErrSyntax; one above MaxLinkSpeed,
// ErrRange.
func ParseLinkSpeed(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(strings.ToLower(s), "unknown") {
		return 0, nil
	}
	f := strings.Fields(s)
	if len(f) < 2 || f[1] != "GT/s" {
		return 0, fmt.Errorf("link speed %.64q is not \"<n> GT/s\": %w", s, ErrSyntax)
	}
	// Digits and one point only: ParseFloat alone would take "NaN", "Inf",
	// "1e3" and "0x1p4".
	if strings.Trim(f[0], "0123456789.") != "" || strings.Count(f[0], ".") > 1 {
		return 0, fmt.Errorf("link speed %.64q has a bad number %.32q: %w", s, f[0], ErrSyntax)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("link speed %.64q has a bad number %.32q: %w", s, f[0], ErrSyntax)
	}
	if v > MaxLinkSpeed {
		return 0, fmt.Errorf("link speed %.64q above %d GT/s: %w", s, MaxLinkSpeed, ErrRange)
	}
	return v, nil
}

// parseSysfsInt parses a sysfs integer file's content that must lie in
// [lo, hi] (link widths, numa_node).
func parseSysfsInt(s string, lo, hi int) (int, error) {
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%.64q is not an integer: %w", s, ErrSyntax)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%d is not from %d to %d: %w", v, lo, hi, ErrRange)
	}
	return v, nil
}

// NormalizePCIBusID turns a PCI bus id as the NVIDIA driver prints it
// ("00000000:1B:00.0", from cuDeviceGetPCIBusId or nvidia-smi) into the sysfs
// form "0000:1b:00.0": lower case, a domain of at least four hex digits.
// An id without a domain ("1b:00.0") gets domain 0000.
func NormalizePCIBusID(id string) (string, error) {
	s := strings.ToLower(strings.TrimSpace(id))
	parts := strings.Split(s, ":")
	var dom, bus, devfn string
	switch len(parts) {
	case 2:
		dom, bus, devfn = "0", parts[0], parts[1]
	case 3:
		dom, bus, devfn = parts[0], parts[1], parts[2]
	default:
		return "", fmt.Errorf("sysinfo: PCI bus id %.64q is not [domain:]bus:device.function: %w", id, ErrSyntax)
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	d, err1 := strconv.ParseUint(dom, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 16, 8)
	if !ok || dom == "" || err1 != nil || err2 != nil || err3 != nil || err4 != nil || v > 0x1f || f > 7 {
		return "", fmt.Errorf("sysinfo: PCI bus id %.64q is not [domain:]bus:device.function: %w", id, ErrSyntax)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, b, v, f), nil
}

// PCIeLink reads the link of the PCI device busID (either the driver's form
// "00000000:1B:00.0" or sysfs form) from /sys/bus/pci/devices/<id>/:
// current_link_speed, current_link_width, max_link_speed, max_link_width and
// numa_node. It fails if the id is malformed or the device directory does not
// exist. A file that is missing or malformed leaves its field 0 (NUMANode -1)
// and its error is returned, joined with the others, together with the
// partly filled link.
func (r Reader) PCIeLink(busID string) (PCIeLink, error) {
	id, err := NormalizePCIBusID(busID)
	if err != nil {
		return PCIeLink{}, err
	}
	l := PCIeLink{BusID: id, NUMANode: -1}
	dir := path.Join(PCIDevicesDir, id)
	if _, err := os.Stat(r.path(dir)); err != nil {
		return l, fmt.Errorf("sysinfo: PCI device %s: %w", id, err)
	}
	var errs []error
	speed := func(name string, dst *float64) {
		p := path.Join(dir, name)
		s, err := r.readString(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: PCI device %s: %w", id, err))
			return
		}
		v, err := ParseLinkSpeed(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: %s: %w", r.path(p), err))
			return
		}
		*dst = v
	}
	integer := func(name string, dst *int, lo, hi int) {
		p := path.Join(dir, name)
		s, err := r.readString(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: PCI device %s: %w", id, err))
			return
		}
		v, err := parseSysfsInt(s, lo, hi)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: %s: %w", r.path(p), err))
			return
		}
		*dst = v
	}
	// Widths: PCIe links have at most 32 lanes; 0 while a link is down.
	// numa_node: -1 when unknown, at most MaxCPUIndex.
	speed("current_link_speed", &l.CurrentSpeed)
	integer("current_link_width", &l.CurrentWidth, 0, 32)
	speed("max_link_speed", &l.MaxSpeed)
	integer("max_link_width", &l.MaxWidth, 0, 32)
	integer("numa_node", &l.NUMANode, -1, MaxCPUIndex)
	return l, joinErrs(errs)
}

// NVIDIAGPUs lists the sysfs bus ids ("0000:1b:00.0") of the NVIDIA display
// and 3D controllers (vendor 0x10de, PCI class 0x03xxxx) under
// /sys/bus/pci/devices, sorted. NVIDIA audio and USB functions of the same
// card are left out. It needs no driver.
func (r Reader) NVIDIAGPUs() ([]string, error) {
	ents, err := os.ReadDir(r.path(PCIDevicesDir))
	if err != nil {
		return nil, fmt.Errorf("sysinfo: listing PCI devices: %w", err)
	}
	var ids []string
	var errs []error
	for _, e := range ents {
		dir := path.Join(PCIDevicesDir, e.Name())
		vendor, err := r.readString(path.Join(dir, "vendor"))
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: PCI device %s: %w", e.Name(), err))
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimPrefix(vendor, "0x"), 16, 16); err != nil || v != NVIDIAVendorID {
			continue
		}
		class, err := r.readString(path.Join(dir, "class"))
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: PCI device %s: %w", e.Name(), err))
			continue
		}
		c, err := strconv.ParseUint(strings.TrimPrefix(class, "0x"), 16, 32)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: %s: class %.64q is not hex: %w", r.path(path.Join(dir, "class")), class, ErrSyntax))
			continue
		}
		if c>>16 == 0x03 { // display controller: VGA 0x0300, 3D 0x0302
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, joinErrs(errs)
}

// joinErrs is errors.Join, named for readability at call sites.
func joinErrs(errs []error) error { return errors.Join(errs...) }
