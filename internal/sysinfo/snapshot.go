package sysinfo

import (
	"fmt"
	"time"
)

// FieldError is the error of reading one field of an [Info].
type FieldError struct {
	// Field is the name of the Info field that is unknown or incomplete.
	Field string
	// Err is what went wrong; it names the path or value.
	Err error
}

// Error returns "Field: Err".
func (e FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns Err, so errors.Is(fe, fs.ErrNotExist) works.
func (e FieldError) Unwrap() error { return e.Err }

// Info is everything sysinfo knows about the machine, read at one time by
// [Reader.Snapshot]. A field that could not be read is nil (or, for
// PhysicalMemory, 0) and has an entry in Errors; fields that are partly read
// keep what was read and also have an entry.
type Info struct {
	// Time is when the snapshot was taken.
	Time time.Time
	// Memory is /proc/meminfo.
	Memory *Meminfo
	// Process is /proc/self/status.
	Process *ProcStatus
	// Memlock is RLIMIT_MEMLOCK of the calling process (nil if unknown).
	// CUDA pinned memory is not charged to it.
	Memlock *Rlimit
	// Cgroup is the process's memory cgroup, its limit and usage.
	Cgroup *CgroupMemory
	// PhysicalMemory is the smaller of Memory.MemTotal and Cgroup.Limit in
	// bytes: the base of pinmem's default budget (half of it). If the cgroup
	// could not be read it is MemTotal (with the cgroup error listed); 0 if
	// MemTotal is unknown.
	PhysicalMemory uint64
	// THP is the transparent huge page setting.
	THP *THP
	// NUMA are the online NUMA nodes (nil if unknown).
	NUMA []NUMANode
	// CPUs counts the processors.
	CPUs CPUs
	// GPUs are the PCIe links of the NVIDIA GPUs found in sysfs, by bus id.
	GPUs []PCIeLink
	// Errors lists one entry per field that is unknown or incomplete.
	Errors []FieldError
}

// Snapshot reads every fact this package knows about. It never fails: what
// cannot be read is left unknown and listed in Info.Errors.
func (r Reader) Snapshot() Info {
	in := Info{Time: time.Now()}
	add := func(field string, err error) {
		if err != nil {
			in.Errors = append(in.Errors, FieldError{Field: field, Err: err})
		}
	}
	var err error
	in.Memory, err = r.Meminfo()
	add("Memory", err)
	in.Process, err = r.ProcStatus()
	add("Process", err)
	if rl, err := r.MemlockLimit(); err != nil {
		add("Memlock", err)
	} else {
		in.Memlock = &rl
	}
	in.Cgroup, err = r.CgroupMemory()
	add("Cgroup", err)
	if in.Memory != nil {
		lim := Unlimited
		if in.Cgroup != nil {
			lim = in.Cgroup.Limit
		}
		in.PhysicalMemory = physicalMemory(in.Memory.MemTotal, lim)
	}
	in.THP, err = r.THP()
	add("THP", err)
	in.NUMA, err = r.NUMANodes()
	add("NUMA", err)
	in.CPUs, err = r.CPUs()
	add("CPUs", err)
	ids, err := r.NVIDIAGPUs()
	add("GPUs", err)
	for _, id := range ids {
		l, err := r.PCIeLink(id)
		if err != nil {
			add("GPUs", fmt.Errorf("GPU %s: %w", id, err))
		}
		in.GPUs = append(in.GPUs, l)
	}
	return in
}

// Snapshot reads every fact about the live system (Reader{}.Snapshot).
func Snapshot() Info { return Reader{}.Snapshot() }

// PhysicalMemory returns the smaller of MemTotal and the cgroup memory limit
// of the live system (Reader{}.PhysicalMemory).
func PhysicalMemory() (uint64, error) { return Reader{}.PhysicalMemory() }
