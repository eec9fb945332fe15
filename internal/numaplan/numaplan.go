// Package numaplan chooses the NUMA node on which pinmem places host
// memory for a device: pinmem's automatic placement and the doctor command
// share it.
package numaplan

import (
	"slices"

	"github.com/pinmem/pinmem/internal/sysinfo"
)

// Plan is what is known about a device's NUMA locality and where staging
// memory for it goes.
type Plan struct {
	// HostNodes are the host's online NUMA nodes (nil when unknown).
	HostNodes []int `json:"host_nodes"`
	// SysfsNode is the device's node from sysfs, -1 when unknown.
	SysfsNode int `json:"sysfs_node"`
	// DriverNode is the driver's HOST_NUMA_ID of the device, -1 when unknown.
	DriverNode int `json:"driver_node"`
	// Node is where memory for the device is placed by default, -1 for no
	// placement.
	Node int `json:"node"`
	// Reason says how Node was chosen, or why there is none.
	Reason string `json:"reason"`
}

// For returns the plan of the device with PCI bus id busID ("" when
// unknown) and the driver's host NUMA id driverNode (-1 when unknown),
// reading the host through r: the sysfs node, else the driver's node, and
// none on a host with fewer than two nodes.
func For(r sysinfo.Reader, busID string, driverNode int) Plan {
	p := Plan{SysfsNode: -1, DriverNode: driverNode, Node: -1}
	if driverNode < 0 {
		p.DriverNode = -1
	}
	if nodes, _ := r.NUMANodes(); len(nodes) > 0 {
		for _, n := range nodes {
			p.HostNodes = append(p.HostNodes, n.ID)
		}
	}
	if busID != "" {
		if l, err := r.PCIeLink(busID); err == nil || l.NUMANode >= 0 {
			p.SysfsNode = l.NUMANode
		}
	}
	switch {
	case len(p.HostNodes) == 0:
		p.Reason = "NUMA topology unknown (no " + sysinfo.NodeOnlinePath + ")"
	case len(p.HostNodes) == 1:
		p.Reason = "host has one NUMA node: no placement needed"
	case p.SysfsNode >= 0 && slices.Contains(p.HostNodes, p.SysfsNode):
		p.Node, p.Reason = p.SysfsNode, "device's NUMA node from sysfs"
	case p.DriverNode >= 0 && slices.Contains(p.HostNodes, p.DriverNode):
		p.Node, p.Reason = p.DriverNode, "device's host NUMA id from the driver"
	default:
		p.Reason = "device's NUMA node unknown (sysfs numa_node -1, no driver host NUMA id)"
	}
	return p
}
