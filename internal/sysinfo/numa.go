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
			errs = append(errs, fmt.Errorf("sysinfo: %s: no MemTotal line: %w", r.path(mp), ErrSyntax))
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

// MaxCPUIndex is the largest CPU or NUMA node number ParseCPUList accepts.
// Linux allows at most 8192 CPUs (NR_CPUS) and 1024 nodes: a larger number
// is a corrupt file, and the bound keeps a parsed list under 65537 entries
// whatever the input.
const MaxCPUIndex = 1 << 16

// ParseCPUList parses a kernel list such as "0-3,8,10-11" (cpulist, node
// online) into sorted numbers. An empty string is an empty list. Entries
// must be increasing and not overlap; a number above MaxCPUIndex gives an
// error matching ErrRange, any other malformed list one matching ErrSyntax.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []int{}, nil
	}
	num := func(x, part string) (int, error) {
		if x == "" || strings.TrimLeft(x, "0123456789") != "" {
			return 0, fmt.Errorf("list %.64q: bad entry %.32q: %w", s, part, ErrSyntax)
		}
		n, err := strconv.Atoi(x)
		if err != nil || n > MaxCPUIndex {
			return 0, fmt.Errorf("list %.64q: entry %.32q above %d: %w", s, part, MaxCPUIndex, ErrRange)
		}
		return n, nil
	}
	var out []int
	next := 0 // the least number the next entry may start at
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := num(lo, part)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = num(hi, part); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("list %.64q: bad range %.32q: %w", s, part, ErrSyntax)
			}
		}
		if a < next {
			return nil, fmt.Errorf("list %.64q: entries not in increasing order at %.32q: %w", s, part, ErrSyntax)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
		next = b + 1
	}
	return out, nil
}
