package sysinfo

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The fuzz targets below run as ordinary tests on their seeds; .ci/run
// also runs each with -fuzz for a bounded time. Every target checks that
// an error is typed (ErrSyntax or ErrRange) and that a result satisfies
// the format's bounds, and round-trips where a formatter exists.

// seedFiles adds the content of every fixture file named name under
// testdata, and of the live system file live when it is readable.
func seedFiles(f *testing.F, name, live string) {
	f.Helper()
	err := filepath.WalkDir("testdata", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			b, rerr := os.ReadFile(p)
			if rerr != nil {
				return rerr
			}
			f.Add(b)
		}
		return err
	})
	if err != nil {
		f.Fatal(err)
	}
	if live != "" {
		if b, err := os.ReadFile(live); err == nil {
			f.Add(b)
		}
	}
}

// typed fails unless err matches ErrSyntax or ErrRange.
func typed(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrRange) {
		t.Fatalf("%s: error %v matches neither ErrSyntax nor ErrRange", what, err)
	}
}

// formatCPUList writes a sorted list in the kernel's form ("0-3,8").
func formatCPUList(l []int) string {
	var b strings.Builder
	for i := 0; i < len(l); {
		j := i
		for j+1 < len(l) && l[j+1] == l[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(l[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(l[j]))
		}
		i = j + 1
	}
	return b.String()
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range append([]string{"", "0", "0-3", "0-1,4,6-7\n", "3-1", "1,1", "-1", "0-65536", "0-9223372036854775807", "1,,2", "0-3,2-5"}, hugeCPULists[:4]...) {
		f.Add([]byte(s))
	}
	seedFiles(f, "online", "/sys/devices/system/cpu/online")
	seedFiles(f, "cpulist", "/sys/devices/system/node/node0/cpulist")
	f.Fuzz(func(t *testing.T, b []byte) {
		s := string(b)
		l, err := ParseCPUList(s)
		if err != nil {
			typed(t, fmt.Sprintf("ParseCPUList(%q)", s), err)
			if l != nil {
				t.Fatalf("ParseCPUList(%q) = %v with error %v", s, l, err)
			}
			return
		}
		if len(l) > MaxCPUIndex+1 {
			t.Fatalf("ParseCPUList(%q): %d entries", s, len(l))
		}
		for i, c := range l {
			if c < 0 || c > MaxCPUIndex || i > 0 && c <= l[i-1] {
				t.Fatalf("ParseCPUList(%q) = %v: entry %d (%d) out of order or range", s, l, i, c)
			}
		}
		back, err := ParseCPUList(formatCPUList(l))
		if err != nil || !slices.Equal(back, l) {
			t.Fatalf("ParseCPUList(%q) = %v, but its formatted form %q parses to %v, %v", s, l, formatCPUList(l), back, err)
		}
	})
}

// FuzzKeyValueFiles covers /proc/meminfo, /proc/self/status and the NUMA
// nodes' meminfo: a parsed file written back as "key: value" lines parses
// to the same map, and the typed structs agree with the map.
func FuzzKeyValueFiles(f *testing.F) {
	seedFiles(f, "meminfo", "/proc/meminfo")
	seedFiles(f, "status", "/proc/self/status")
	f.Add([]byte("A: 1 MB\nUid:\t0\t0\t0\t0\nB: 2\nC: 3 kB\nName: x\nD:\n"))
	f.Add([]byte("A: 18446744073709551615 kB\n"))
	f.Add([]byte("Node 0 MemTotal: 8 kB\nNode 0 MemFree: 4 kB\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseKeyValueFile("fuzz", b)
		if err != nil {
			typed(t, "parseKeyValueFile", err)
			return
		}
		var out strings.Builder
		for k, v := range m {
			if k == "" || strings.ContainsAny(k, ":\n") {
				t.Fatalf("key %q", k)
			}
			if strings.HasPrefix(k, "Node ") || strings.TrimSpace(k) != k {
				continue // would be read back differently; not a real key
			}
			fmt.Fprintf(&out, "%s: %d\n", k, v)
		}
		back, err := parseKeyValueFile("fuzz", []byte(out.String()))
		if err != nil {
			t.Fatalf("written back: %v\n%s", err, out.String())
		}
		for k, v := range back {
			if m[k] != v {
				t.Fatalf("key %q: %d, written back %d", k, m[k], v)
			}
		}
		if mi, err := parseMeminfo("fuzz", b); err != nil {
			typed(t, "parseMeminfo", err)
		} else if mi.MemTotal != m["MemTotal"] || mi.Shmem != m["Shmem"] || mi.HugePagesTotal != m["HugePages_Total"] || mi.CommittedAS != m["Committed_AS"] || !mi.Has("MemTotal") {
			t.Fatalf("Meminfo %+v disagrees with the fields %v", mi, m)
		}
		if ps, err := parseProcStatus("fuzz", b); err != nil {
			typed(t, "parseProcStatus", err)
		} else if ps.VmRSS != m["VmRSS"] || ps.RssShmem != m["RssShmem"] || ps.VmSwap != m["VmSwap"] || !ps.Has("VmRSS") {
			t.Fatalf("ProcStatus %+v disagrees with the fields %v", ps, m)
		}
	})
}

// FuzzCgroupFiles covers /proc/self/cgroup and the limit files
// (memory.max, memory.limit_in_bytes).
func FuzzCgroupFiles(f *testing.F) {
	seedFiles(f, "cgroup", "/proc/self/cgroup")
	seedFiles(f, "memory.max", "/sys/fs/cgroup/memory.max")
	seedFiles(f, "memory.limit_in_bytes", "")
	for _, s := range []string{"max", "-1", "9223372036854771712", "18446744073709551615", "18446744073709551616", "lots", "0::/\n1:memory:/a\n", "garbage"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v2, v1, err := parseProcCgroup("fuzz", b)
		if err != nil {
			typed(t, "parseProcCgroup", err)
		} else {
			lines := strings.Split(string(b), "\n")
			if v2 != "" && !slices.ContainsFunc(lines, func(l string) bool { return strings.TrimSpace(l) == "0::"+v2 }) {
				t.Fatalf("v2 path %q is on no 0:: line", v2)
			}
			if v1 != "" && !slices.ContainsFunc(lines, func(l string) bool { return strings.HasSuffix(strings.TrimSpace(l), ":"+v1) }) {
				t.Fatalf("v1 path %q ends no line", v1)
			}
		}
		s := strings.TrimSpace(string(b))
		for _, v := range []CgroupVersion{CgroupV1, CgroupV2} {
			lim, err := parseCgroupLimit(s, v)
			if err != nil {
				typed(t, "parseCgroupLimit", err)
				continue
			}
			if lim.IsUnlimited() {
				// v2: "max", or a byte count equal to the largest one
				// (leading zeros included).
				if n, err := strconv.ParseUint(s, 10, 64); v == CgroupV2 && s != "max" && (err != nil || n != math.MaxUint64) {
					t.Fatalf("v2 limit %q parsed as unlimited", s)
				}
				continue
			}
			if v == CgroupV1 && uint64(lim) >= cgroupV1Unlimited {
				t.Fatalf("v1 limit %q = %d, want unlimited", s, lim)
			}
			if back, err := parseCgroupLimit(lim.String(), v); err != nil || back != lim {
				t.Fatalf("limit %q = %v, but %q parses to %v, %v", s, lim, lim.String(), back, err)
			}
		}
	})
}

// escapeMountinfo escapes as the kernel does in mountinfo: space, tab,
// newline and backslash as \ooo.
func escapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, `\%03o`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FuzzMountinfo: the cgroup mount search never fails on content it can
// scan, finds only mounts of the right type, and unescaping undoes the
// kernel's escaping.
func FuzzMountinfo(f *testing.F) {
	seedFiles(f, "mountinfo", "/proc/self/mountinfo")
	f.Add([]byte("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"))
	f.Add([]byte("35 25 0:30 /docker/a\\040b /sys/fs/cgroup/mem\\134ory ro - cgroup cgroup rw,memory\n"))
	f.Add([]byte(" - \n - cgroup2\n1 2 3 4 - cgroup\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range []CgroupVersion{CgroupV1, CgroupV2} {
			mp, root, found, err := findCgroupMount("fuzz", b, v)
			if err != nil {
				typed(t, "findCgroupMount", err)
				continue
			}
			if !found && (mp != "" || root != "") {
				t.Fatalf("not found but %q, %q", mp, root)
			}
			if found && !slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
				pre, post, _ := strings.Cut(l, " - ")
				pf := strings.Fields(pre)
				return len(pf) >= 5 && strings.HasPrefix(strings.TrimSpace(post), "cgroup") &&
					unescapeMountinfo(pf[4]) == mp && unescapeMountinfo(pf[3]) == root
			}) {
				t.Fatalf("v%d mount %q (root %q) is on no cgroup line", v, mp, root)
			}
		}
		s := string(b)
		if got := unescapeMountinfo(escapeMountinfo(s)); got != s {
			t.Fatalf("unescape(escape(%q)) = %q", s, got)
		}
		if u := unescapeMountinfo(s); len(u) > len(s) {
			t.Fatalf("unescapeMountinfo(%q) grew to %q", s, u)
		}
	})
}

var sysfsBusID = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$`)

// FuzzPCIeFiles covers the sysfs PCIe files: link speeds, widths and NUMA
// node numbers, bus ids.
func FuzzPCIeFiles(f *testing.F) {
	for _, name := range []string{"current_link_speed", "max_link_speed", "current_link_width", "numa_node", "class", "vendor"} {
		seedFiles(f, name, "")
	}
	for _, s := range []string{"32.0 GT/s PCIe", "2.5 GT/s", "Unknown", "NaN GT/s", "Inf GT/s", "1e3 GT/s", "-1 GT/s", "00000000:1B:00.0", "1b:00.1", "0000:1b:20.0", "-2", "16"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := string(b)
		if v, err := ParseLinkSpeed(s); err != nil {
			typed(t, "ParseLinkSpeed", err)
		} else {
			if math.IsNaN(v) || v < 0 || v > MaxLinkSpeed {
				t.Fatalf("ParseLinkSpeed(%q) = %v", s, v)
			}
			back, err := ParseLinkSpeed(strconv.FormatFloat(v, 'f', -1, 64) + " GT/s")
			if err != nil || back != v {
				t.Fatalf("ParseLinkSpeed(%q) = %v, but written back it parses to %v, %v", s, v, back, err)
			}
			if bw := PCIeBandwidth(v, 32); bw < 0 || bw > MaxLinkSpeed*32/8 {
				t.Fatalf("PCIeBandwidth(%v, 32) = %v", v, bw)
			}
		}
		if id, err := NormalizePCIBusID(s); err != nil {
			typed(t, "NormalizePCIBusID", err)
		} else if again, err := NormalizePCIBusID(id); err != nil || again != id || !sysfsBusID.MatchString(id) {
			t.Fatalf("NormalizePCIBusID(%q) = %q; again %q, %v", s, id, again, err)
		}
		if v, err := parseSysfsInt(strings.TrimSpace(s), -1, 32); err != nil {
			typed(t, "parseSysfsInt", err)
		} else if back, err := parseSysfsInt(strconv.Itoa(v), -1, 32); v < -1 || v > 32 || err != nil || back != v {
			t.Fatalf("parseSysfsInt(%q) = %d; written back %d, %v", s, v, back, err)
		}
	})
}

// FuzzTHP covers the transparent huge page choice files: the selected word
// is one of the file's words, without its brackets.
func FuzzTHP(f *testing.F) {
	seedFiles(f, "enabled", "/sys/kernel/mm/transparent_hugepage/enabled")
	seedFiles(f, "defrag", "/sys/kernel/mm/transparent_hugepage/defrag")
	f.Add([]byte("[]"))
	f.Add([]byte("[[x]]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := string(b)
		w, err := bracketed(s)
		if err != nil {
			typed(t, "bracketed", err)
			return
		}
		if w == "" || !slices.Contains(strings.Fields(s), "["+w+"]") {
			t.Fatalf("bracketed(%q) = %q", s, w)
		}
	})
}
