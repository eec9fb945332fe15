package diag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// fixture writes a two-node host with four GPUs, two per node, and returns
// its reader.
func fixture(t *testing.T, nodes int) sysinfo.Reader {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/devices/system/node/online", fmt.Sprintf("0-%d\n", nodes-1))
	for n := range nodes {
		write(fmt.Sprintf("sys/devices/system/node/node%d/cpulist", n), fmt.Sprintf("%d-%d\n", 8*n, 8*n+7))
		write(fmt.Sprintf("sys/devices/system/node/node%d/meminfo", n), fmt.Sprintf("Node %d MemTotal: 1048576 kB\nNode %d MemFree: 524288 kB\n", n, n))
	}
	for i, id := range []string{"0000:1b:00.0", "0000:1c:00.0", "0000:9a:00.0", "0000:9b:00.0"} {
		dir := "sys/bus/pci/devices/" + id + "/"
		write(dir+"numa_node", fmt.Sprintf("%d\n", min(i/2, nodes-1)))
		write(dir+"current_link_speed", "32.0 GT/s PCIe\n")
		write(dir+"current_link_width", "16\n")
		write(dir+"max_link_speed", "32.0 GT/s PCIe\n")
		write(dir+"max_link_width", "16\n")
	}
	return sysinfo.Reader{Root: root}
}

func fourGPUs(t *testing.T) {
	attrs := func(host int) map[cudadrv.DeviceAttribute]int {
		a := fakedrv.DefaultAttrs()
		a[cudadrv.AttrHostNUMAID] = host
		return a
	}
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{
		{PCIBusID: "0000:1B:00.0", Attrs: attrs(0)}, {PCIBusID: "0000:1C:00.0", Attrs: attrs(0)},
		{PCIBusID: "0000:9A:00.0", Attrs: attrs(1)}, {PCIBusID: "0000:9B:00.0", Attrs: attrs(1)},
	}})
}

func TestCollectNUMAFourGPUsTwoNodes(t *testing.T) {
	fourGPUs(t)
	prev := reader
	reader = fixture(t, 2)
	defer func() { reader = prev }()
	r := Collect()
	if len(r.Devices) != 4 || r.Host.NUMANodes != 2 {
		t.Fatalf("%d devices, %d NUMA nodes", len(r.Devices), r.Host.NUMANodes)
	}
	for i, d := range r.Devices {
		want := i / 2
		if d.SysfsNUMANode != want || d.HostNUMAID != want || d.StagingNUMANode != want {
			t.Errorf("GPU %d: sysfs %d, driver %d, staging %d; want %d", i, d.SysfsNUMANode, d.HostNUMAID, d.StagingNUMANode, want)
		}
		if d.LinkWidth != 16 || d.LinkGen != 5 {
			t.Errorf("GPU %d: link Gen%d x%d", i, d.LinkGen, d.LinkWidth)
		}
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := squeeze(text.String())
	for _, want := range []string{"[GPU 3]", "NUMA node sysfs 1, driver (host NUMA id) 1", "staging memory NUMA node 1 (device's NUMA node from sysfs"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Devices []struct {
			Staging int    `json:"staging_numa_node"`
			Why     string `json:"staging_placement"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Devices) != 4 || back.Devices[2].Staging != 1 || back.Devices[2].Why == "" {
		t.Fatalf("JSON devices %+v", back.Devices)
	}
}

func TestCollectNUMAOneNode(t *testing.T) {
	fourGPUs(t)
	prev := reader
	reader = fixture(t, 1)
	defer func() { reader = prev }()
	r := Collect()
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for i, d := range r.Devices {
		if d.StagingNUMANode != -1 || !strings.Contains(d.StagingPlacement, "one NUMA node") {
			t.Errorf("GPU %d: staging %d (%s)", i, d.StagingNUMANode, d.StagingPlacement)
		}
	}
	if !strings.Contains(squeeze(text.String()), "staging memory not placed (host has one NUMA node") {
		t.Errorf("text report:\n%s", text.String())
	}
}

// squeeze collapses runs of spaces (tabwriter's padding) to one.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestJSONNames: every name in doctor's JSON is snake_case, and a device's
// figures carry their units and values (memory in bytes, the compute
// capability as the bench reports write it).
func TestJSONNames(t *testing.T) {
	fourGPUs(t)
	prev := reader
	reader = fixture(t, 2)
	defer func() { reader = prev }()
	var js bytes.Buffer
	if err := Collect().WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if !snake.MatchString(k) {
					t.Errorf("%s.%s: not snake_case", path, k)
				}
				walk(path+"."+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), x)
			}
		}
	}
	walk("doctor", doc)
	dev := doc["devices"].([]any)[2].(map[string]any)
	if dev["name"] == "" || dev["memory_bytes"].(float64) <= 0 || dev["compute_capability"] == "0.0" || dev["host_numa_id"].(float64) != 1 || dev["pcie_gen"].(float64) != 5 {
		t.Errorf("device 2 in JSON: %v", dev)
	}
	if host := doc["host"].(map[string]any); host["mem_total_bytes"] == nil {
		t.Errorf("host in JSON: %v", host)
	}
}
