package sysinfo

import (
	"fmt"
)

// Meminfo holds the system-wide memory figures of /proc/meminfo. Sizes are in
// bytes (the file's kB figures times 1024); the HugePages* fields are page
// counts, as in the file. A field the kernel does not print is zero: use
// [Meminfo.Has] to tell "zero" from "absent".
type Meminfo struct {
	// MemTotal is usable RAM: physical memory minus reserved and kernel code.
	MemTotal uint64
	// MemFree is RAM not used for anything.
	MemFree uint64
	// MemAvailable is the kernel's estimate of memory available for new work
	// without swapping. Pinned pages cannot be reclaimed, so both
	// cuMemHostAlloc and cuMemHostRegister lower it: it is the one host figure
	// that moves for registered memory.
	MemAvailable uint64
	// Buffers is memory in block-device buffers.
	Buffers uint64
	// Cached is the page cache (includes Shmem).
	Cached uint64
	// SwapTotal is the total swap space.
	SwapTotal uint64
	// SwapFree is unused swap space.
	SwapFree uint64
	// Shmem is shared memory (tmpfs, shm, shared anonymous). Memory from
	// cuMemHostAlloc is counted here (driver 580): it grows by the size pinned.
	Shmem uint64
	// Unevictable is memory the kernel cannot reclaim. CUDA pinned memory
	// does NOT show up here.
	Unevictable uint64
	// Mlocked is memory locked with mlock(2). CUDA pinned memory does NOT
	// show up here: the driver pins pages without mlock.
	Mlocked uint64
	// AnonHugePages is anonymous memory backed by transparent huge pages.
	AnonHugePages uint64
	// ShmemHugePages is shared memory backed by transparent huge pages.
	ShmemHugePages uint64
	// HugePagesTotal is the size of the hugetlbfs pool, in pages.
	HugePagesTotal uint64
	// HugePagesFree is the number of pool pages not yet allocated.
	HugePagesFree uint64
	// HugePagesRsvd is the number of pool pages reserved but not yet faulted in.
	HugePagesRsvd uint64
	// HugePagesSurp is the number of pool pages above the configured size.
	HugePagesSurp uint64
	// Hugepagesize is the default hugetlbfs page size in bytes.
	Hugepagesize uint64
	// Hugetlb is the total memory consumed by huge pages of all sizes, in bytes.
	Hugetlb uint64
	// CommitLimit is the overcommit limit in bytes.
	CommitLimit uint64
	// CommittedAS is the memory currently committed (Committed_AS) in bytes.
	CommittedAS uint64

	// Fields holds every numeric line of the file by its name as printed
	// ("MemTotal", "HugePages_Total", ...), in bytes for kB lines.
	Fields map[string]uint64
}

// Has reports whether the kernel printed the field key (as named in the file).
func (m *Meminfo) Has(key string) bool {
	_, ok := m.Fields[key]
	return ok
}

// MeminfoPath is the system path Meminfo reads.
const MeminfoPath = "/proc/meminfo"

// Meminfo reads /proc/meminfo. It fails if the file cannot be read or has no
// MemTotal line.
func (r Reader) Meminfo() (*Meminfo, error) {
	data, err := r.readFile(MeminfoPath)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: reading meminfo: %w", err)
	}
	return parseMeminfo(r.path(MeminfoPath), data)
}

// parseMeminfo parses the content of /proc/meminfo read from path p.
func parseMeminfo(p string, data []byte) (*Meminfo, error) {
	f, err := parseKeyValueFile(p, data)
	if err != nil {
		return nil, err
	}
	if _, ok := f["MemTotal"]; !ok {
		return nil, fmt.Errorf("sysinfo: %s: no MemTotal line: %w", p, ErrSyntax)
	}
	return &Meminfo{
		MemTotal:       f["MemTotal"],
		MemFree:        f["MemFree"],
		MemAvailable:   f["MemAvailable"],
		Buffers:        f["Buffers"],
		Cached:         f["Cached"],
		SwapTotal:      f["SwapTotal"],
		SwapFree:       f["SwapFree"],
		Shmem:          f["Shmem"],
		Unevictable:    f["Unevictable"],
		Mlocked:        f["Mlocked"],
		AnonHugePages:  f["AnonHugePages"],
		ShmemHugePages: f["ShmemHugePages"],
		HugePagesTotal: f["HugePages_Total"],
		HugePagesFree:  f["HugePages_Free"],
		HugePagesRsvd:  f["HugePages_Rsvd"],
		HugePagesSurp:  f["HugePages_Surp"],
		Hugepagesize:   f["Hugepagesize"],
		Hugetlb:        f["Hugetlb"],
		CommitLimit:    f["CommitLimit"],
		CommittedAS:    f["Committed_AS"],
		Fields:         f,
	}, nil
}
