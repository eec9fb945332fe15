package numaplan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/sysinfo"
)

// fixture writes a sysfs tree with the given online nodes (one CPU each)
// and one PCI device at bus with numa_node pciNode.
func fixture(t *testing.T, online string, nodes []string, bus string, pciNode string) sysinfo.Reader {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if online != "" {
		write("sys/devices/system/node/online", online)
	}
	for i, n := range nodes {
		write("sys/devices/system/node/node"+n+"/cpulist", string(rune('0'+i)))
	}
	if bus != "" {
		write("sys/bus/pci/devices/"+bus+"/numa_node", pciNode)
	}
	return sysinfo.Reader{Root: root}
}

func TestFor(t *testing.T) {
	const bus = "0000:1b:00.0"
	for _, tc := range []struct {
		name       string
		r          sysinfo.Reader
		busID      string
		driverNode int
		node       int
		reason     string
	}{
		{"no topology", sysinfo.Reader{Root: t.TempDir()}, bus, 1, -1, "unknown"},
		{"one node", fixture(t, "0", []string{"0"}, bus, "0"), bus, 0, -1, "one NUMA node"},
		{"sysfs node", fixture(t, "0-1", []string{"0", "1"}, bus, "1"), bus, 0, 1, "sysfs"},
		{"driver node", fixture(t, "0-1", []string{"0", "1"}, bus, "-1"), bus, 1, 1, "driver"},
		{"no bus id", fixture(t, "0-1", []string{"0", "1"}, bus, "1"), "", 0, 0, "driver"},
		{"node not online", fixture(t, "0-1", []string{"0", "1"}, bus, "5"), bus, 7, -1, "unknown"},
		{"nothing known", fixture(t, "0-1", []string{"0", "1"}, bus, "-1"), bus, -3, -1, "unknown"},
	} {
		p := For(tc.r, tc.busID, tc.driverNode)
		if p.Node != tc.node || !strings.Contains(p.Reason, tc.reason) || p.DriverNode < -1 {
			t.Errorf("%s: %+v, want node %d (%q)", tc.name, p, tc.node, tc.reason)
		}
	}
}
