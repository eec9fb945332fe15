package sysinfo

import (
	"fmt"
)

// ProcStatus holds the memory figures of /proc/self/status, in bytes. A field
// the kernel does not print is zero: use [ProcStatus.Has] to tell.
type ProcStatus struct {
	// VmRSS is the resident set size: RssAnon + RssFile + RssShmem.
	VmRSS uint64
	// RssAnon is resident anonymous memory. Memory later registered with
	// cuMemHostRegister stays counted here, unchanged by the registration.
	RssAnon uint64
	// RssFile is resident file-backed memory.
	RssFile uint64
	// RssShmem is resident shared memory. Memory from cuMemHostAlloc is
	// counted here (driver 580): it grows by the size pinned.
	RssShmem uint64
	// VmLck is memory locked with mlock(2). CUDA pinned memory does NOT show
	// up here.
	VmLck uint64
	// VmPin is memory pinned by the kernel's pin_user_pages accounting. CUDA
	// pinned memory does NOT show up here either (driver 580).
	VmPin uint64
	// VmHWM is the peak resident set size.
	VmHWM uint64
	// VmSize is the virtual address space size.
	VmSize uint64
	// VmSwap is anonymous memory swapped out.
	VmSwap uint64

	// Fields holds every numeric line of the file by name, in bytes for kB
	// lines (other numeric lines, such as Threads, as printed).
	Fields map[string]uint64
}

// Has reports whether the kernel printed the field key (as named in the file).
func (s *ProcStatus) Has(key string) bool {
	_, ok := s.Fields[key]
	return ok
}

// ProcStatusPath is the system path ProcStatus reads.
const ProcStatusPath = "/proc/self/status"

// ProcStatus reads /proc/self/status. It fails if the file cannot be read or
// has no VmRSS line (kernel threads have none).
func (r Reader) ProcStatus() (*ProcStatus, error) {
	data, err := r.readFile(ProcStatusPath)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: reading process status: %w", err)
	}
	return parseProcStatus(r.path(ProcStatusPath), data)
}

// parseProcStatus parses the content of /proc/self/status read from path p.
func parseProcStatus(p string, data []byte) (*ProcStatus, error) {
	f, err := parseKeyValueFile(p, data)
	if err != nil {
		return nil, err
	}
	if _, ok := f["VmRSS"]; !ok {
		return nil, fmt.Errorf("sysinfo: %s: no VmRSS line: %w", p, ErrSyntax)
	}
	return &ProcStatus{
		VmRSS:    f["VmRSS"],
		RssAnon:  f["RssAnon"],
		RssFile:  f["RssFile"],
		RssShmem: f["RssShmem"],
		VmLck:    f["VmLck"],
		VmPin:    f["VmPin"],
		VmHWM:    f["VmHWM"],
		VmSize:   f["VmSize"],
		VmSwap:   f["VmSwap"],
		Fields:   f,
	}, nil
}
