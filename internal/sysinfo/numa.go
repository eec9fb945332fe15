package sysinfo

import (
	"fmt"
	"path"
	"runtime"
	"strconv"
	"strings"
)

// System paths of the NUMA and CPU topology.
const (
	NodeOnlinePath = "/sys/devices/system/node/online"
	NodeDir        = "/sys/devices/system/node"
	CPUOnlinePath  = "/sys/devices/system/cpu/online"
)

// NUMANode describes one online NUMA node. Pinned buffers are fastest when
// they sit on the node the GPU hangs off ([PCIeLink.NUMANode]).
type NUMANode struct {
	// ID is the node number.
	ID int
	// CPUs are the CPUs of the node, from nodeN/cpulist; nil if unreadable.
	CPUs []int
	// MemTotal is the node's memory in bytes (nodeN/meminfo); valid only when
	// MemKnown is true.
	MemTotal uint64
	// MemFree is the node's free memory in bytes; valid only when MemKnown.
	MemFree uint64
	// MemKnown reports whether nodeN/meminfo could be read.
	MemKnown bool
}

// NUMANodes reads the online NUMA nodes from /sys/devices/system/node/online
// and each node's cpulist and meminfo. It fails if the online list cannot be
// read (a kernel built without NUMA has none); a node whose cpulist or
// meminfo is unreadable is still listed, and the error is returned with the
// nodes.
func (r Reader) NUMANodes() ([]NUMANode, error) {
	s, err := r.readString(NodeOnlinePath)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: reading online NUMA nodes: %w", err)
	}
	ids, err := ParseCPUList(s)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: %s: %w", r.path(NodeOnlinePath), err)
	}
	var errs []error
	nodes := make([]NUMANode, 0, len(ids))
	for _, id := range ids {
		n := NUMANode{ID: id}
		dir := path.Join(NodeDir, "node"+strconv.Itoa(id))
		cl := path.Join(dir, "cpulist")
		if s, err := r.readString(cl); err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: NUMA node %d: %w", id, err))
		} else if cpus, err := ParseCPUList(s); err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: %s: %w", r.path(cl), err))
		} else {
			n.CPUs = cpus
		}
		mp := path.Join(dir, "meminfo")
		if data, err := r.readFile(mp); err != nil {
			errs = append(errs, fmt.Errorf("sysinfo: NUMA node %d: %w", id, err))
		} else if f, err := parseKeyValueFile(r.path(mp), data); err != nil {
			errs = append(errs, err)
		} else if total, ok := f["MemTotal"]; !ok {
			errs = append(errs, fmt.Errorf("sysinfo: %s: no MemTotal line", r.path(mp)))
		} else {
			n.MemTotal, n.MemFree, n.MemKnown = total, f["MemFree"], true
		}
		nodes = append(nodes, n)
	}
	return nodes, joinErrs(errs)
}

// CPUs counts the processors.
type CPUs struct {
	// Usable is runtime.NumCPU: the CPUs this process may run on (its
	// affinity mask), which can be fewer than Online.
	Usable int
	// Online are the online CPUs from /sys/devices/system/cpu/online; nil
	// if unreadable.
	Online []int
}

// CPUs reads the online CPU list and adds runtime.NumCPU. Usable is always
// set; an unreadable or malformed online list is returned as an error with
// Online nil.
func (r Reader) CPUs() (CPUs, error) {
	c := CPUs{Usable: runtime.NumCPU()}
	s, err := r.readString(CPUOnlinePath)
	if err != nil {
		return c, fmt.Errorf("sysinfo: reading online CPUs: %w", err)
	}
	on, err := ParseCPUList(s)
	if err != nil {
		return c, fmt.Errorf("sysinfo: %s: %w", r.path(CPUOnlinePath), err)
	}
	c.Online = on
	return c, nil
}

// maxListEntries bounds ParseCPUList so a corrupt range cannot allocate
// without limit.
const maxListEntries = 1 << 20

// ParseCPUList parses a kernel list such as "0-3,8,10-11" (cpulist, node
// online) into sorted numbers. An empty string is an empty list.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []int{}, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("list %q: bad entry %q", s, part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a {
				return nil, fmt.Errorf("list %q: bad range %q", s, part)
			}
		}
		if len(out)+(b-a+1) > maxListEntries {
			return nil, fmt.Errorf("list %q: more than %d entries", s, maxListEntries)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	for i := 1; i < len(out); i++ {
		if out[i] <= out[i-1] {
			return nil, fmt.Errorf("list %q: entries not in increasing order", s)
		}
	}
	return out, nil
}
