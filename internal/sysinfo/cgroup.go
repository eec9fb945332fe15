package sysinfo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// CgroupVersion says which cgroup hierarchy carries the memory controller.
type CgroupVersion int

const (
	// CgroupNone means the process is in no memory cgroup (no
	// /proc/self/cgroup, or no line for the memory controller).
	CgroupNone CgroupVersion = 0
	// CgroupV1 is the legacy hierarchy (memory.limit_in_bytes).
	CgroupV1 CgroupVersion = 1
	// CgroupV2 is the unified hierarchy (memory.max).
	CgroupV2 CgroupVersion = 2
)

// String returns "none", "v1" or "v2".
func (v CgroupVersion) String() string {
	switch v {
	case CgroupNone:
		return "none"
	case CgroupV1:
		return "v1"
	case CgroupV2:
		return "v2"
	}
	return "CgroupVersion(" + strconv.Itoa(int(v)) + ")"
}

// cgroupV1Unlimited: cgroup v1 prints "no limit" as PAGE_COUNTER_MAX pages
// (9223372036854771712 with 4 KiB pages); any value this large is no limit.
const cgroupV1Unlimited = 1 << 62

// CgroupMemory is the memory limit and usage of the calling process's cgroup.
type CgroupMemory struct {
	// Version is the hierarchy the memory controller is on.
	Version CgroupVersion
	// Path is the cgroup path from /proc/self/cgroup ("/user.slice/...").
	Path string
	// Dir is the system path of the process's own cgroup directory
	// (for example /sys/fs/cgroup/user.slice/...), without the Reader's Root.
	Dir string
	// Limit is the tightest memory limit on the way from Dir up to the root
	// of the mounted hierarchy: a parent's limit binds its children too.
	// Unlimited when no level sets one (or there is no cgroup).
	Limit Limit
	// LimitDir is the system path of the directory whose limit is Limit;
	// empty when Limit is Unlimited.
	LimitDir string
	// Usage is the memory charged to the process's own cgroup in bytes
	// (memory.current in v2, memory.usage_in_bytes in v1). Valid only when
	// UsageKnown is true.
	Usage uint64
	// UsageKnown reports whether Usage could be read.
	UsageKnown bool
}

// System paths the cgroup reader uses.
const (
	ProcCgroupPath    = "/proc/self/cgroup"
	ProcMountinfoPath = "/proc/self/mountinfo"
	// DefaultCgroupV2Mount is where the unified hierarchy is assumed to be
	// mounted when /proc/self/mountinfo does not say.
	DefaultCgroupV2Mount = "/sys/fs/cgroup"
	// DefaultCgroupV1MemoryMount is where the v1 memory hierarchy is assumed
	// to be mounted when /proc/self/mountinfo does not say.
	DefaultCgroupV1MemoryMount = "/sys/fs/cgroup/memory"
)

// CgroupMemory finds the process's memory cgroup and reads its limit and
// usage. With cgroup v2 ("0::/path" in /proc/self/cgroup) it reads
// memory.max ("max" = unlimited); with cgroup v1 (a line naming the memory
// controller, which takes precedence on hybrid systems) it reads
// memory.limit_in_bytes, treating values of 2^62 and above as unlimited. It
// walks from the process's directory up to the hierarchy's mount point and
// keeps the smallest limit. The mount point and mount root come from
// /proc/self/mountinfo, or default to /sys/fs/cgroup (v2) and
// /sys/fs/cgroup/memory (v1).
//
// A process in no cgroup is not an error: the result has Version CgroupNone
// and Limit Unlimited. An unreadable usage file is not an error either
// (UsageKnown is false). Errors are returned for unreadable or malformed
// cgroup, mountinfo or limit files and for a cgroup directory that does not
// exist.
func (r Reader) CgroupMemory() (*CgroupMemory, error) {
	data, err := r.readFile(ProcCgroupPath)
	if errors.Is(err, fs.ErrNotExist) {
		return &CgroupMemory{Version: CgroupNone, Limit: Unlimited}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sysinfo: reading cgroup membership: %w", err)
	}
	v2Path, v1Path, err := parseProcCgroup(r.path(ProcCgroupPath), data)
	if err != nil {
		return nil, err
	}
	cg := &CgroupMemory{Limit: Unlimited}
	switch {
	case v1Path != "":
		cg.Version, cg.Path = CgroupV1, v1Path
	case v2Path != "":
		cg.Version, cg.Path = CgroupV2, v2Path
	default:
		return &CgroupMemory{Version: CgroupNone, Limit: Unlimited}, nil
	}
	files := cgroupFiles[cg.Version]
	mountPoint, mountRoot, err := r.cgroupMount(cg.Version, files.mount)
	if err != nil {
		return nil, err
	}
	if cg.Dir, err = r.cgroupDir(cg.Path, mountPoint, mountRoot); err != nil {
		return nil, err
	}
	if err := r.smallestLimit(cg, mountPoint, files.limit); err != nil {
		return nil, err
	}
	if s, err := r.readString(path.Join(cg.Dir, files.usage)); err == nil {
		if u, perr := strconv.ParseUint(s, 10, 64); perr == nil {
			cg.Usage, cg.UsageKnown = u, true
		}
	}
	return cg, nil
}

// smallestLimit walks from cg.Dir up to the mount point and keeps, in cg,
// the smallest limit of the limit files found on the way.
func (r Reader) smallestLimit(cg *CgroupMemory, mountPoint, limitFile string) error {
	for d := cg.Dir; ; d = path.Dir(d) {
		lim, ok, err := r.readCgroupLimit(path.Join(d, limitFile), cg.Version)
		if err != nil {
			return err
		}
		if ok && lim < cg.Limit {
			cg.Limit, cg.LimitDir = lim, d
		}
		if d == mountPoint || d == "/" || d == "." || !strings.HasPrefix(d, mountPoint) {
			return nil
		}
	}
}

// cgroupFiles are, by cgroup version, the files of a memory cgroup's
// limit and usage, and where the hierarchy is mounted when mountinfo does
// not say.
var cgroupFiles = map[CgroupVersion]struct{ limit, usage, mount string }{
	CgroupV1: {"memory.limit_in_bytes", "memory.usage_in_bytes", DefaultCgroupV1MemoryMount},
	CgroupV2: {"memory.max", "memory.current", DefaultCgroupV2Mount},
}

// cgroupMount returns the mount point of the hierarchy of version v and
// the hierarchy's directory mounted there, from mountinfo, or defMount and
// "/" when mountinfo does not say.
func (r Reader) cgroupMount(v CgroupVersion, defMount string) (mountPoint, mountRoot string, err error) {
	mi, err := r.readFile(ProcMountinfoPath)
	if errors.Is(err, fs.ErrNotExist) {
		return defMount, "/", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("sysinfo: reading mountinfo: %w", err)
	}
	mp, mr, found, err := findCgroupMount(r.path(ProcMountinfoPath), mi, v)
	if err != nil {
		return "", "", err
	}
	if !found {
		return defMount, "/", nil
	}
	return mp, mr, nil
}

// cgroupDir returns the directory of the cgroup at cgPath (relative to the
// hierarchy's root) under the mount of the subtree starting at mountRoot.
func (r Reader) cgroupDir(cgPath, mountPoint, mountRoot string) (string, error) {
	rel := cgPath
	if mountRoot != "/" && (rel == mountRoot || strings.HasPrefix(rel, mountRoot+"/")) {
		rel = strings.TrimPrefix(rel, mountRoot)
	}
	dir := path.Join(mountPoint, rel)
	if r.isDir(dir) {
		return dir, nil
	}
	// Inside a cgroup namespace or a container whose mount root does not
	// match the path, the mount point itself is the process's cgroup.
	if !r.isDir(mountPoint) {
		return "", fmt.Errorf("sysinfo: cgroup %s directory %s not found (mount point %s missing too)", cgPath, r.path(dir), r.path(mountPoint))
	}
	return mountPoint, nil
}

// isDir reports whether the system path p is a directory.
func (r Reader) isDir(p string) bool {
	st, err := os.Stat(r.path(p))
	return err == nil && st.IsDir()
}

// readCgroupLimit reads one limit file. A missing file (the root cgroup has
// no memory.max) gives ok == false and no error.
func (r Reader) readCgroupLimit(p string, v CgroupVersion) (lim Limit, ok bool, err error) {
	s, err := r.readString(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sysinfo: reading cgroup limit: %w", err)
	}
	lim, err = parseCgroupLimit(s, v)
	if err != nil {
		return 0, false, fmt.Errorf("sysinfo: %s: %w", r.path(p), err)
	}
	return lim, true, nil
}

// parseCgroupLimit parses the content of memory.max (v2: a byte count or
// "max") or memory.limit_in_bytes (v1: a byte count, 2^62 and above or -1
// meaning no limit).
func parseCgroupLimit(s string, v CgroupVersion) (Limit, error) {
	if v == CgroupV2 && s == "max" {
		return Unlimited, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		// v1 prints -1 on some kernels for "no limit".
		if v == CgroupV1 && s == "-1" {
			return Unlimited, nil
		}
		return 0, fmt.Errorf("cgroup limit %.64q is not a byte count or \"max\": %w", s, ErrSyntax)
	}
	if v == CgroupV1 && n >= cgroupV1Unlimited {
		return Unlimited, nil
	}
	return Limit(n), nil
}

// parseProcCgroup returns the v2 path ("0::/path") and the path of the v1
// hierarchy carrying the memory controller, either possibly empty.
func parseProcCgroup(p string, data []byte) (v2, v1 string, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			return "", "", fmt.Errorf("sysinfo: %s: malformed line %.64q (want id:controllers:path): %w", p, line, ErrSyntax)
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				v1 = f[2]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("sysinfo: reading %s: %w: %w", p, ErrSyntax, err)
	}
	return v2, v1, nil
}

// findCgroupMount finds the mount of the hierarchy of version v in
// /proc/self/mountinfo and returns its mount point and root.
func findCgroupMount(p string, data []byte, v CgroupVersion) (mountPoint, root string, found bool, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 1 {
			continue
		}
		fstype := qf[0]
		switch {
		case v == CgroupV2 && fstype == "cgroup2":
		case v == CgroupV1 && fstype == "cgroup" && len(qf) >= 3 && hasOption(qf[2], "memory"):
		default:
			continue
		}
		return unescapeMountinfo(pf[4]), unescapeMountinfo(pf[3]), true, nil
	}
	if err := sc.Err(); err != nil {
		return "", "", false, fmt.Errorf("sysinfo: reading %s: %w: %w", p, ErrSyntax, err)
	}
	return "", "", false, nil
}

// hasOption reports whether the comma-separated option list opts holds o.
func hasOption(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// PhysicalMemory returns the memory this process can actually use: the
// smaller of MemTotal and the cgroup memory limit. pinmem's default pinned
// memory budget is half of it. It fails if MemTotal or the cgroup limit
// cannot be read; a process in no cgroup, or in one without a limit, gets
// MemTotal.
func (r Reader) PhysicalMemory() (uint64, error) {
	mi, err := r.Meminfo()
	if err != nil {
		return 0, err
	}
	cg, err := r.CgroupMemory()
	if err != nil {
		return 0, err
	}
	return physicalMemory(mi.MemTotal, cg.Limit), nil
}

// physicalMemory is the smaller of memTotal and lim.
func physicalMemory(memTotal uint64, lim Limit) uint64 {
	if !lim.IsUnlimited() && uint64(lim) < memTotal {
		return uint64(lim)
	}
	return memTotal
}
