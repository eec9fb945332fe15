package sysinfo

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fixture(name string) Reader { return Reader{Root: filepath.Join("testdata", name)} }

const kB = 1024

func TestMeminfo(t *testing.T) {
	m, err := fixture("v2nested").Meminfo()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]uint64{
		"MemTotal":       {m.MemTotal, 16384000 * kB},
		"MemFree":        {m.MemFree, 8000000 * kB},
		"MemAvailable":   {m.MemAvailable, 12000000 * kB},
		"Shmem":          {m.Shmem, 2097152 * kB},
		"Mlocked":        {m.Mlocked, 512 * kB},
		"Unevictable":    {m.Unevictable, 1024 * kB},
		"AnonHugePages":  {m.AnonHugePages, 409600 * kB},
		"HugePagesTotal": {m.HugePagesTotal, 16},
		"HugePagesFree":  {m.HugePagesFree, 8},
		"HugePagesRsvd":  {m.HugePagesRsvd, 1},
		"Hugepagesize":   {m.Hugepagesize, 2 << 20},
		"Hugetlb":        {m.Hugetlb, 32 << 20},
		"CommittedAS":    {m.CommittedAS, 4000000 * kB},
	}
	for name, v := range want {
		if v[0] != v[1] {
			t.Errorf("%s = %d, want %d", name, v[0], v[1])
		}
	}
	if !m.Has("ShmemHugePages") || m.Has("KReclaimable") {
		t.Errorf("Has: ShmemHugePages %v (want true), KReclaimable %v (want false)", m.Has("ShmemHugePages"), m.Has("KReclaimable"))
	}
}

func TestMeminfoErrors(t *testing.T) {
	tests := []struct {
		root, want string
		notExist   bool
	}{
		{"bad", "no MemTotal line", false},
		{"thpnever", "meminfo", true},
	}
	for _, tc := range tests {
		_, err := fixture(tc.root).Meminfo()
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, fs.ErrNotExist) != tc.notExist {
			t.Errorf("%s: Meminfo error = %v, want one containing %q (not exist: %v)", tc.root, err, tc.want, tc.notExist)
		}
	}
}

func TestProcStatus(t *testing.T) {
	s, err := fixture("v2nested").ProcStatus()
	if err != nil {
		t.Fatal(err)
	}
	got := [...]uint64{s.VmRSS, s.RssAnon, s.RssFile, s.RssShmem, s.VmLck, s.VmPin, s.VmHWM, s.VmSize, s.VmSwap}
	want := [...]uint64{2100000 * kB, 50000 * kB, 20000 * kB, 2030000 * kB, 0, 0, 2200000 * kB, 2900000 * kB, 0}
	if got != want {
		t.Errorf("ProcStatus = %v, want %v", got, want)
	}
	if !s.Has("VmPin") || s.Fields["Threads"] != 12 || s.Has("Name") {
		t.Errorf("Fields = %v", s.Fields)
	}
	if _, err := fixture("bad").ProcStatus(); err == nil || !strings.Contains(err.Error(), "no VmRSS") {
		t.Errorf("bad status: err = %v", err)
	}
	if _, err := fixture("nocgroup").ProcStatus(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing status: err = %v, want fs.ErrNotExist", err)
	}
}

func TestParseKeyValueFileUnits(t *testing.T) {
	f, err := parseKeyValueFile("x", []byte("A: 1 MB\nUid:\t0\t0\t0\t0\nB: 2\nC: 3 kB\nName: x\nD:\n"))
	if err != nil || !reflect.DeepEqual(f, map[string]uint64{"B": 2, "C": 3072}) {
		t.Errorf("parseKeyValueFile = %v, %v", f, err)
	}
	if _, err := parseKeyValueFile("x", []byte("A: 18446744073709551615 kB\n")); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("overflow: err = %v", err)
	}
}

func TestCgroupMemory(t *testing.T) {
	tests := []struct {
		root       string
		version    CgroupVersion
		path, dir  string
		limit      Limit
		limitDir   string
		usage      uint64
		usageKnown bool
		physical   uint64
	}{
		{"v2nested", CgroupV2, "/parent/child", "/sys/fs/cgroup/parent/child", 4 << 30, "/sys/fs/cgroup/parent", 123456789, true, 4 << 30},
		{"v2child", CgroupV2, "/a/b/c", "/sys/fs/cgroup/a/b/c", 256 << 20, "/sys/fs/cgroup/a/b/c", 0, false, 256 << 20},
		{"v2ns", CgroupV2, "/", "/sys/fs/cgroup", Unlimited, "", 4096, true, 1 << 30},
		{"v2root", CgroupV2, "/", "/sys/fs/cgroup", Unlimited, "", 0, false, 1 << 30},
		{"v1docker", CgroupV1, "/docker/abc", "/sys/fs/cgroup/memory", 512 << 20, "/sys/fs/cgroup/memory", 1000, true, 512 << 20},
		{"v1unlimited", CgroupV1, "/process_api/7e7d", "/sys/fs/cgroup/memory/process_api/7e7d", Unlimited, "", 137408512, true, 16 << 30},
		{"nocgroup", CgroupNone, "", "", Unlimited, "", 0, false, 2 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.root, func(t *testing.T) {
			r := fixture(tc.root)
			cg, err := r.CgroupMemory()
			if err != nil {
				t.Fatal(err)
			}
			want := CgroupMemory{Version: tc.version, Path: tc.path, Dir: tc.dir, Limit: tc.limit, LimitDir: tc.limitDir, Usage: tc.usage, UsageKnown: tc.usageKnown}
			if *cg != want {
				t.Errorf("CgroupMemory =\n %+v, want\n %+v", *cg, want)
			}
			pm, err := r.PhysicalMemory()
			if err != nil || pm != tc.physical {
				t.Errorf("PhysicalMemory = %d, %v; want %d", pm, err, tc.physical)
			}
		})
	}
}

func TestCgroupMemoryErrors(t *testing.T) {
	_, err := fixture("bad").CgroupMemory()
	if err == nil || !strings.Contains(err.Error(), `"lots"`) || !strings.Contains(err.Error(), "memory.max") {
		t.Errorf("bad memory.max: err = %v", err)
	}
	if _, err := fixture("bad").PhysicalMemory(); err == nil {
		t.Error("PhysicalMemory of bad fixture: no error")
	}

	root := t.TempDir()
	write(t, root, "proc/self/cgroup", "0::/gone\n")
	if _, err := (Reader{Root: root}).CgroupMemory(); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing cgroup dir: err = %v", err)
	}
	write(t, root, "proc/self/cgroup", "garbage\n")
	if _, err := (Reader{Root: root}).CgroupMemory(); err == nil || !strings.Contains(err.Error(), `"garbage"`) {
		t.Errorf("malformed /proc/self/cgroup: err = %v", err)
	}
}

func TestLimit(t *testing.T) {
	if Unlimited.String() != "unlimited" || !Unlimited.IsUnlimited() || Limit(42).String() != "42" || Limit(42).IsUnlimited() {
		t.Error("Limit String/IsUnlimited wrong")
	}
	if uint64(Unlimited) != math.MaxUint64 {
		t.Error("Unlimited is not MaxUint64")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\`: `/x\`, `/y\04`: `/y\04`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTHP(t *testing.T) {
	tests := []struct {
		root    string
		want    THP
		wantErr bool
	}{
		{"v2nested", THP{Enabled: "madvise", Defrag: "madvise", PMDSize: 2 << 20}, false},
		{"thpnever", THP{Enabled: "never", Defrag: "never", PMDSize: 2 << 20}, false},
		{"nocgroup", THP{Enabled: "always"}, true}, // defrag and size missing
	}
	for _, tc := range tests {
		got, err := fixture(tc.root).THP()
		if (err != nil) != tc.wantErr || got == nil || *got != tc.want {
			t.Errorf("%s: THP = %+v, %v; want %+v (error: %v)", tc.root, got, err, tc.want, tc.wantErr)
		}
	}
	if _, err := fixture("bad").THP(); err == nil || !strings.Contains(err.Error(), "no [selected] mode") {
		t.Errorf("bad THP: err = %v", err)
	}
	if got, err := fixture("v1docker").THP(); got != nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing THP: %v, %v", got, err)
	}
}

func TestParseLinkSpeed(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"32.0 GT/s PCIe", 32, true},
		{"16.0 GT/s PCIe\n", 16, true},
		{"2.5 GT/s", 2.5, true},
		{"5 GT/s", 5, true},
		{"64.0 GT/s PCIe", 64, true},
		{"Unknown", 0, true},
		{"Unknown speed", 0, true},
		{"fast", 0, false},
		{"x GT/s", 0, false},
		{"8.0 Gb/s", 0, false},
		// ParseFloat alone accepted these: NaN and infinite speeds, and
		// forms sysfs never prints.
		{"NaN GT/s", 0, false},
		{"Inf GT/s", 0, false},
		{"-Inf GT/s", 0, false},
		{"1e3 GT/s", 0, false},
		{"0x10 GT/s", 0, false},
		{"-1 GT/s", 0, false},
		{"2048.0 GT/s PCIe", 0, false},
		{"1.2.3 GT/s", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseLinkSpeed(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParseLinkSpeed(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrRange) {
			t.Errorf("ParseLinkSpeed(%q) error %v is untyped", tc.in, err)
		}
	}
}

func TestPCIeBandwidth(t *testing.T) {
	tests := []struct {
		gts   float64
		width int
		want  float64
		gen   int
	}{
		{2.5, 16, 4.0, 1},
		{5, 16, 8.0, 2},
		{8, 16, 15.754, 3},
		{16, 16, 31.508, 4},
		{32, 16, 63.015, 5},
		{32, 8, 31.508, 5},
		{64, 16, 128, 6},
		{0, 16, 0, 0},
		{16, 0, 0, 4},
	}
	for _, tc := range tests {
		got := PCIeBandwidth(tc.gts, tc.width)
		if math.Abs(got-tc.want) > 0.001 {
			t.Errorf("PCIeBandwidth(%v, %d) = %.4f, want %.3f", tc.gts, tc.width, got, tc.want)
		}
		if g := PCIeGen(tc.gts); g != tc.gen {
			t.Errorf("PCIeGen(%v) = %d, want %d", tc.gts, g, tc.gen)
		}
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:1B:00.0", "0000:1b:00.0"},
		{"0000:1b:00.0", "0000:1b:00.0"},
		{"1B:00.1", "0000:1b:00.1"},
		{"00000001:C1:1F.7", "0001:c1:1f.7"},
		{"00010000:01:00.0", "10000:01:00.0"},
		{" 0000:3B:00.0\n", "0000:3b:00.0"},
		{"", ""},
		{"1b:00", ""},
		{"zz:00.0", ""},
		{"0000:1b:20.0", ""},
		{"0000:1b:00.8", ""},
		{"0:0:1b:00.0", ""},
		{":1b:00.0", ""},
	}
	for _, tc := range tests {
		got, err := NormalizePCIBusID(tc.in)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("NormalizePCIBusID(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "PCI bus id") {
			t.Errorf("NormalizePCIBusID(%q) error %q does not say what failed", tc.in, err)
		}
	}
}

// pciRoot builds a fixture tree whose /sys/bus/pci/devices holds the
// testdata/pcie devices under sysfs names (module file names may not hold ':').
func pciRoot(t *testing.T) Reader {
	t.Helper()
	root := t.TempDir()
	names := map[string]string{
		"gen4":    "0000:1b:00.0",
		"gen5":    "0000:3b:00.0",
		"unknown": "0000:5e:00.0",
		"audio":   "0000:1b:00.1",
		"nic":     "0000:af:00.0",
		"partial": "0001:02:00.0",
	}
	for src, id := range names {
		ents, err := os.ReadDir(filepath.Join("testdata", "pcie", src))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("testdata", "pcie", src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			write(t, root, filepath.Join("sys/bus/pci/devices", id, e.Name()), string(b))
		}
	}
	return Reader{Root: root}
}

func write(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPCIeLink(t *testing.T) {
	r := pciRoot(t)
	tests := []struct {
		id              string
		want            PCIeLink
		curBW, maxBW    float64
		curGen, maxGen  int
		wantErrContains string
	}{
		{"00000000:1B:00.0", PCIeLink{BusID: "0000:1b:00.0", CurrentSpeed: 16, CurrentWidth: 16, MaxSpeed: 16, MaxWidth: 16, NUMANode: 0}, 31.508, 31.508, 4, 4, ""},
		{"00000000:3B:00.0", PCIeLink{BusID: "0000:3b:00.0", CurrentSpeed: 2.5, CurrentWidth: 16, MaxSpeed: 32, MaxWidth: 16, NUMANode: 1}, 4, 63.015, 1, 5, ""},
		{"0000:5e:00.0", PCIeLink{BusID: "0000:5e:00.0", NUMANode: -1}, 0, 0, 0, 0, ""},
		{"00000001:02:00.0", PCIeLink{BusID: "0001:02:00.0", CurrentSpeed: 8, NUMANode: -1}, 0, 0, 3, 0, `"sixteen" is not an integer`},
		{"0000:99:00.0", PCIeLink{BusID: "0000:99:00.0", NUMANode: -1}, 0, 0, 0, 0, "PCI device 0000:99:00.0"},
	}
	for _, tc := range tests {
		got, err := r.PCIeLink(tc.id)
		if tc.wantErrContains == "" && err != nil || tc.wantErrContains != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErrContains)) {
			t.Errorf("PCIeLink(%q) error = %v, want containing %q", tc.id, err, tc.wantErrContains)
		}
		if got != tc.want {
			t.Errorf("PCIeLink(%q) = %+v, want %+v", tc.id, got, tc.want)
		}
		if math.Abs(got.CurrentBandwidth()-tc.curBW) > 0.001 || math.Abs(got.MaxBandwidth()-tc.maxBW) > 0.001 {
			t.Errorf("PCIeLink(%q) bandwidth = %.3f/%.3f, want %.3f/%.3f", tc.id, got.CurrentBandwidth(), got.MaxBandwidth(), tc.curBW, tc.maxBW)
		}
		if got.CurrentGen() != tc.curGen || got.MaxGen() != tc.maxGen {
			t.Errorf("PCIeLink(%q) gen = %d/%d, want %d/%d", tc.id, got.CurrentGen(), got.MaxGen(), tc.curGen, tc.maxGen)
		}
	}
	if _, err := r.PCIeLink("nonsense"); !errors.Is(err, ErrSyntax) {
		t.Errorf("PCIeLink(nonsense): %v, want ErrSyntax", err)
	}
	// A negative width or a node number below -1 is a corrupt file, not a
	// figure: ErrRange, and the field stays unknown.
	write(t, r.Root, "sys/bus/pci/devices/0000:1b:00.0/current_link_width", "-4\n")
	write(t, r.Root, "sys/bus/pci/devices/0000:1b:00.0/numa_node", "-2\n")
	l, err := r.PCIeLink("0000:1b:00.0")
	if !errors.Is(err, ErrRange) || l.CurrentWidth != 0 || l.NUMANode != -1 || l.MaxWidth != 16 {
		t.Errorf("corrupt width and node: %+v, %v; want width 0, node -1 and ErrRange", l, err)
	}
}

func TestNVIDIAGPUs(t *testing.T) {
	got, err := pciRoot(t).NVIDIAGPUs()
	want := []string{"0000:1b:00.0", "0000:3b:00.0", "0000:5e:00.0", "0001:02:00.0"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("NVIDIAGPUs = %v, %v; want %v", got, err, want)
	}
	if _, err := fixture("nocgroup").NVIDIAGPUs(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no PCI dir: err = %v", err)
	}
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"0", []int{0}, true},
		{"0-3", []int{0, 1, 2, 3}, true},
		{"0-1,4,6-7\n", []int{0, 1, 4, 6, 7}, true},
		{"", []int{}, true},
		{"3-1", nil, false},
		{"a", nil, false},
		{"1,1", nil, false},
		{"-1", nil, false},
		{"0-99999999", nil, false},
	}
	for _, tc := range tests {
		got, err := ParseCPUList(tc.in)
		if (err == nil) != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestNUMANodes(t *testing.T) {
	got, err := fixture("v2nested").NUMANodes()
	if err != nil {
		t.Fatal(err)
	}
	want := []NUMANode{
		{ID: 0, CPUs: []int{0, 1, 2, 3}, MemTotal: 8192000 * kB, MemFree: 4000000 * kB, MemKnown: true},
		{ID: 1, CPUs: []int{4, 5, 6, 7}, MemTotal: 8192000 * kB, MemFree: 4000000 * kB, MemKnown: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NUMANodes = %+v, want %+v", got, want)
	}
	if _, err := fixture("bad").NUMANodes(); err == nil || !strings.Contains(err.Error(), "bad range") {
		t.Errorf("bad node list: err = %v", err)
	}
	if _, err := fixture("nocgroup").NUMANodes(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no node dir: err = %v", err)
	}

	root := t.TempDir()
	write(t, root, "sys/devices/system/node/online", "0\n")
	got, err = Reader{Root: root}.NUMANodes()
	if len(got) != 1 || got[0].ID != 0 || got[0].MemKnown || got[0].CPUs != nil || err == nil {
		t.Errorf("node without files: %+v, %v", got, err)
	}
}

func TestCPUs(t *testing.T) {
	c, err := fixture("v2nested").CPUs()
	if err != nil || c.Usable < 1 || !reflect.DeepEqual(c.Online, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("CPUs = %+v, %v", c, err)
	}
	c, err = fixture("bad").CPUs()
	if err == nil || c.Online != nil || c.Usable < 1 {
		t.Errorf("bad CPUs = %+v, %v", c, err)
	}
}

func TestMemlockLimit(t *testing.T) {
	old := getMemlock
	t.Cleanup(func() { getMemlock = old })
	rl, err := Reader{}.MemlockLimit()
	if err != nil {
		t.Fatalf("MemlockLimit: %v", err)
	}
	if !rl.Hard.IsUnlimited() && !rl.Soft.IsUnlimited() && rl.Soft > rl.Hard {
		t.Errorf("MemlockLimit soft %v > hard %v", rl.Soft, rl.Hard)
	}
	getMemlock = func() (Rlimit, error) { return Rlimit{}, errors.New("getrlimit(RLIMIT_MEMLOCK): boom") }
	in := fixture("nocgroup").Snapshot()
	if in.Memlock != nil || !hasFieldError(in, "Memlock") {
		t.Errorf("Snapshot with failing getrlimit: Memlock %v, errors %v", in.Memlock, in.Errors)
	}
}

func hasFieldError(in Info, field string) bool {
	for _, e := range in.Errors {
		if e.Field == field {
			return true
		}
	}
	return false
}

func TestSnapshotFixture(t *testing.T) {
	in := fixture("v2nested").Snapshot()
	if in.Memory == nil || in.Process == nil || in.Cgroup == nil || in.THP == nil || in.Memlock == nil || len(in.NUMA) != 2 {
		t.Fatalf("Snapshot missing fields: %+v", in)
	}
	if in.PhysicalMemory != 4<<30 {
		t.Errorf("PhysicalMemory = %d, want %d", in.PhysicalMemory, uint64(4<<30))
	}
	// The fixture has no PCI tree: only GPUs is unknown.
	if len(in.Errors) != 1 || in.Errors[0].Field != "GPUs" || !errors.Is(in.Errors[0], fs.ErrNotExist) {
		t.Errorf("Errors = %v, want only GPUs (not exist)", in.Errors)
	}
	if in.Time.IsZero() {
		t.Error("Time not set")
	}

	empty := Reader{Root: t.TempDir()}.Snapshot()
	if empty.Memory != nil || empty.Process != nil || empty.THP != nil || empty.NUMA != nil || empty.PhysicalMemory != 0 {
		t.Errorf("empty root: %+v", empty)
	}
	if empty.Cgroup == nil || empty.Cgroup.Version != CgroupNone {
		t.Errorf("empty root cgroup = %+v, want none", empty.Cgroup)
	}
	for _, f := range []string{"Memory", "Process", "THP", "NUMA", "CPUs", "GPUs"} {
		if !hasFieldError(empty, f) {
			t.Errorf("empty root: no error for %s in %v", f, empty.Errors)
		}
	}
	for _, e := range empty.Errors {
		if !strings.Contains(e.Error(), e.Field+": sysinfo:") {
			t.Errorf("FieldError %q does not name its field", e.Error())
		}
	}

	// Cgroup unreadable: PhysicalMemory falls back to MemTotal, error listed.
	bad := fixture("bad").Snapshot()
	if bad.Memory != nil || !hasFieldError(bad, "Cgroup") {
		t.Errorf("bad fixture: %+v", bad)
	}
}

func TestSnapshotPCIe(t *testing.T) {
	r := pciRoot(t)
	in := r.Snapshot()
	if len(in.GPUs) != 4 || in.GPUs[1].MaxGen() != 5 {
		t.Errorf("GPUs = %+v", in.GPUs)
	}
	if !hasFieldError(in, "GPUs") { // the partial device
		t.Errorf("no GPUs error for the partial device: %v", in.Errors)
	}
}

// TestLiveSystem reads this machine's real files and checks only that the
// figures are sane.
func TestLiveSystem(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skipf("no /proc/meminfo on this system: %v", err)
	}
	in := Snapshot()
	for _, e := range in.Errors {
		t.Logf("live: unknown field %v", e)
	}
	if in.Memory == nil || in.Memory.MemTotal == 0 || in.Memory.MemAvailable > in.Memory.MemTotal {
		t.Fatalf("live meminfo not sane: %+v", in.Memory)
	}
	if in.Process == nil || in.Process.VmRSS == 0 || in.Process.VmRSS > in.Process.VmSize {
		t.Errorf("live status not sane: %+v", in.Process)
	}
	if in.Memlock == nil {
		t.Error("live RLIMIT_MEMLOCK unknown")
	}
	if in.Cgroup == nil {
		t.Errorf("live cgroup unreadable: %v", in.Errors)
	}
	if in.PhysicalMemory == 0 || in.PhysicalMemory > in.Memory.MemTotal {
		t.Errorf("live PhysicalMemory %d not in (0, MemTotal %d]", in.PhysicalMemory, in.Memory.MemTotal)
	}
	if pm, err := PhysicalMemory(); err == nil && pm != in.PhysicalMemory {
		t.Logf("PhysicalMemory changed between reads: %d vs %d", pm, in.PhysicalMemory)
	}
	if in.CPUs.Usable < 1 || (in.CPUs.Online != nil && len(in.CPUs.Online) < 1) {
		t.Errorf("live CPUs not sane: %+v", in.CPUs)
	}
	if in.THP != nil {
		switch in.THP.Enabled {
		case "always", "madvise", "never":
		default:
			t.Errorf("live THP mode %q", in.THP.Enabled)
		}
	}
	for _, n := range in.NUMA {
		if n.MemKnown && n.MemTotal == 0 {
			t.Errorf("live NUMA node %d has MemTotal 0", n.ID)
		}
	}
	for _, g := range in.GPUs {
		t.Logf("live GPU %s: Gen%d x%d now, Gen%d x%d max (%.1f GB/s), NUMA %d", g.BusID, g.CurrentGen(), g.CurrentWidth, g.MaxGen(), g.MaxWidth, g.MaxBandwidth(), g.NUMANode)
	}
	t.Logf("live: MemTotal %d, PhysicalMemory %d, cgroup %s limit %v, memlock %v", in.Memory.MemTotal, in.PhysicalMemory, in.Cgroup.Version, in.Cgroup.Limit, in.Memlock.Soft)
}
