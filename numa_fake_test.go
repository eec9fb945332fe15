package pinmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/fakedrv"
	"github.com/pinmem/pinmem/internal/sysinfo"
	"github.com/pinmem/pinmem/internal/tools/testutil"
)

// numaFixture writes a sysfs tree with nodes (node -> cpulist) and PCI
// devices (bus id -> numa_node) under a temporary root.
func numaFixture(t *testing.T, nodes map[int]string, pci map[string]int) sysinfo.Reader {
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
	var ids []string
	for id := 0; id < 64; id++ {
		cpus, ok := nodes[id]
		if !ok {
			continue
		}
		ids = append(ids, fmt.Sprint(id))
		dir := fmt.Sprintf("sys/devices/system/node/node%d", id)
		write(dir+"/cpulist", cpus+"\n")
		write(dir+"/meminfo", fmt.Sprintf("Node %d MemTotal:       1048576 kB\nNode %d MemFree:        524288 kB\n", id, id))
	}
	if len(ids) > 0 {
		write("sys/devices/system/node/online", strings.Join(ids, ",")+"\n")
	}
	for id, node := range pci {
		dir := "sys/bus/pci/devices/" + id
		write(dir+"/numa_node", fmt.Sprintf("%d\n", node))
		write(dir+"/current_link_speed", "32.0 GT/s PCIe\n")
		write(dir+"/current_link_width", "16\n")
		write(dir+"/max_link_speed", "32.0 GT/s PCIe\n")
		write(dir+"/max_link_width", "16\n")
	}
	return sysinfo.Reader{Root: root}
}

// useNUMA points pinmem's NUMA reader at r and replaces mbind and first
// touch with recorders until t ends.
type numaCalls struct {
	mbind      []string
	firstTouch []string
	mbindErr   error
	touchErr   error
}

func useNUMA(t *testing.T, r sysinfo.Reader) *numaCalls {
	t.Helper()
	c := &numaCalls{}
	prevR, prevM, prevT := numaReader, mbindFunc, firstTouchFunc
	numaReader = r
	numaPlans.Clear()
	mbindFunc = func(p unsafe.Pointer, n uintptr, node int, strict bool) error {
		c.mbind = append(c.mbind, fmt.Sprintf("node=%d strict=%v len=%d", node, strict, n))
		return c.mbindErr
	}
	firstTouchFunc = func(p unsafe.Pointer, n uintptr, cpus []int, threads int) error {
		c.firstTouch = append(c.firstTouch, fmt.Sprintf("cpus=%v len=%d", cpus, n))
		if c.touchErr != nil {
			return c.touchErr
		}
		return firstTouch(p, n, []int{firstAllowedCPU(t)}, threads)
	}
	t.Cleanup(func() {
		numaReader, mbindFunc, firstTouchFunc = prevR, prevM, prevT
		numaPlans.Clear()
	})
	return c
}

// firstAllowedCPU returns a CPU this process may run on (the fixture's
// CPUs may not exist here).
func firstAllowedCPU(t *testing.T) int {
	if runtime.GOOS != "linux" {
		return 0
	}
	cpus, err := (sysinfo.Reader{}).CPUs()
	if err != nil || len(cpus.Online) == 0 {
		return 0
	}
	return cpus.Online[0]
}

// fourGPUsTwoNodes: devices 0 and 1 on node 0, 2 and 3 on node 1.
func fourGPUsTwoNodes(t *testing.T) (*fakedrv.Driver, sysinfo.Reader) {
	specs := []fakedrv.DeviceSpec{
		{PCIBusID: "0000:1B:00.0"}, {PCIBusID: "0000:1C:00.0"},
		{PCIBusID: "0000:9A:00.0"}, {PCIBusID: "0000:9B:00.0"},
	}
	d := testutil.UseFake(t, fakedrv.Options{Devices: specs})
	r := numaFixture(t, map[int]string{0: "0-7", 1: "8-15"},
		map[string]int{"0000:1b:00.0": 0, "0000:1c:00.0": 0, "0000:9a:00.0": 1, "0000:9b:00.0": 1})
	return d, r
}

func TestFakeNUMAAutoPlacesPerDevice(t *testing.T) {
	if !mmapSupported {
		t.Skip("no mmap path here")
	}
	_, r := fourGPUsTwoNodes(t)
	calls := useNUMA(t, r)
	for ord, want := range []int{0, 0, 1, 1} {
		dev, err := cuda.GetDevice(ord)
		if err != nil {
			t.Fatal(err)
		}
		plan, _ := planNUMA(dev, r)
		if plan.Node != want || plan.SysfsNode != want || len(plan.HostNodes) != 2 {
			t.Fatalf("device %d: plan %+v, want node %d", ord, plan, want)
		}
		b, err := Alloc(8<<20, Portable, WithDevice(dev), WithMethod(MethodMmapRegister))
		if err != nil {
			t.Fatal(err)
		}
		pl := b.Placement()
		if pl.Node != want || pl.Method != PlaceMbindPref || pl.Requested != NUMAAuto {
			t.Errorf("device %d: placement %+v, want node %d by mbind", ord, pl, want)
		}
		if m := b.Bytes(); m[0] != 0 || m[len(m)-1] != 0 {
			t.Errorf("device %d: memory not zeroed", ord)
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
	if len(calls.mbind) != 4 || !strings.HasPrefix(calls.mbind[2], "node=1 strict=false") {
		t.Fatalf("mbind calls %q", calls.mbind)
	}
	// Explicit node, strict.
	b, err := Alloc(8<<20, 0, WithMethod(MethodMmapRegister), WithNUMANode(1), WithNUMABind(true))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if pl := b.Placement(); pl.Node != 1 || pl.Method != PlaceMbindBind || pl.Requested != 1 {
		t.Fatalf("explicit strict placement %+v", pl)
	}
	if got := calls.mbind[len(calls.mbind)-1]; !strings.HasPrefix(got, "node=1 strict=true") {
		t.Fatalf("last mbind call %q", got)
	}
}

func TestFakeNUMAFallbacks(t *testing.T) {
	if !mmapSupported {
		t.Skip("no mmap path here")
	}
	_, r := fourGPUsTwoNodes(t)
	calls := useNUMA(t, r)
	dev, err := cuda.GetDevice(2)
	if err != nil {
		t.Fatal(err)
	}
	alloc := func(opts ...Option) Placement {
		t.Helper()
		b, err := Alloc(4<<20+100, 0, append([]Option{WithDevice(dev), WithMethod(MethodMmapRegister)}, opts...)...)
		if err != nil {
			t.Fatalf("placement must never fail an allocation: %v", err)
		}
		defer b.Free()
		for i, v := range b.Bytes() {
			if v != 0 {
				t.Fatalf("byte %d is %#x, want zero", i, v)
			}
		}
		return b.Placement()
	}
	// mbind refused (seccomp): first touch on the node's CPUs.
	calls.mbindErr = syscall.EPERM
	pl := alloc()
	if pl.Node != 1 || pl.Method != PlaceFirstTouch || !strings.Contains(pl.Note, "mbind failed") {
		t.Fatalf("mbind refused: placement %+v", pl)
	}
	if len(calls.firstTouch) != 1 || !strings.HasPrefix(calls.firstTouch[0], "cpus=[8 9 10 11 12 13 14 15]") {
		t.Fatalf("first touch calls %q", calls.firstTouch)
	}
	// Both refused: unplaced, with both reasons.
	calls.touchErr = errors.New("sched_setaffinity: EPERM")
	pl = alloc()
	if pl.Node != -1 || pl.Method != PlaceNone || !strings.Contains(pl.Note, "mbind to node 1 failed") || !strings.Contains(pl.Note, "first touch") {
		t.Fatalf("both refused: placement %+v", pl)
	}
	calls.mbindErr, calls.touchErr = nil, nil
	// A node the host lacks, and placement turned off.
	if pl := alloc(WithNUMANode(7)); pl.Node != -1 || !strings.Contains(pl.Note, "no NUMA node 7") {
		t.Fatalf("missing node: %+v", pl)
	}
	if pl := alloc(WithNUMANode(NUMANone)); pl.Node != -1 || !strings.Contains(pl.Note, "turned off") {
		t.Fatalf("NUMANone: %+v", pl)
	}
	// A negative node that is neither NUMAAuto nor NUMANone is a bad option.
	if _, err := Alloc(8<<20, 0, WithDevice(dev), WithMethod(MethodMmapRegister), WithNUMANode(-9)); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("bad node: %v", err)
	}
	// cuMemHostAlloc memory is never placed.
	b, err := Alloc(4096, Portable, WithDevice(dev))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if pl := b.Placement(); pl.Node != -1 || pl.Method != PlaceNone || !strings.Contains(pl.Note, "cuMemHostAlloc") {
		t.Fatalf("hostalloc placement %+v", pl)
	}
	var nilBuf *Buffer
	if nilBuf.Placement().Node != -1 {
		t.Fatal("nil buffer has a node")
	}
}

func TestFakeNUMAOneNodeAndDriverID(t *testing.T) {
	if !mmapSupported {
		t.Skip("no mmap path here")
	}
	attrs := fakedrv.DefaultAttrs()
	attrs[cudadrv.AttrHostNUMAID] = 1
	none := fakedrv.DefaultAttrs()
	none[cudadrv.AttrHostNUMAID] = -1
	testutil.UseFake(t, fakedrv.Options{Devices: []fakedrv.DeviceSpec{{PCIBusID: "0000:01:00.0", Attrs: attrs}, {PCIBusID: "0000:02:00.0", Attrs: none}}})
	// Two nodes, sysfs says -1: the driver's host NUMA id decides.
	r := numaFixture(t, map[int]string{0: "0-3", 1: "4-7"}, map[string]int{"0000:01:00.0": -1, "0000:02:00.0": -1})
	calls := useNUMA(t, r)
	d0, _ := cuda.GetDevice(0)
	d1, _ := cuda.GetDevice(1)
	if p, _ := planNUMA(d0, r); p.Node != 1 || p.DriverNode != 1 || p.SysfsNode != -1 || !strings.Contains(p.Reason, "driver") {
		t.Fatalf("plan from the driver's id: %+v", p)
	}
	if p, _ := planNUMA(d1, r); p.Node != -1 || !strings.Contains(p.Reason, "unknown") {
		t.Fatalf("plan without any id: %+v", p)
	}
	b, err := Alloc(8<<20, 0, WithDevice(d0), WithMethod(MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	if b.Placement().Node != 1 {
		t.Errorf("placement %+v, want node 1", b.Placement())
	}
	b.Free()
	// One node: nothing to do, mbind never called.
	one := numaFixture(t, map[int]string{0: "0-7"}, map[string]int{"0000:01:00.0": 0})
	useNUMA(t, one)
	n := len(calls.mbind)
	b, err = Alloc(8<<20, 0, WithDevice(d0), WithMethod(MethodMmapRegister))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if pl := b.Placement(); pl.Node != -1 || !strings.Contains(pl.Note, "one NUMA node") {
		t.Fatalf("one node: %+v", pl)
	}
	if len(calls.mbind) != n {
		t.Fatal("mbind called on a one-node host")
	}
	// No NUMA information at all.
	if p, _ := planNUMA(d0, sysinfo.Reader{Root: t.TempDir()}); p.Node != -1 || !strings.Contains(p.Reason, "unknown") {
		t.Fatalf("no topology: %+v", p)
	}
}

// TestMbindLive calls the real mbind and first touch on this host: each
// either works or fails with an error, never crashes, and the memory is
// usable afterwards.
func TestMbindLive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	length := uintptr(4 << 20)
	p, _, err := mapAnon(length, false)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapAnon(p, length)
	if err := mbind(p, length, 0, false); err != nil {
		t.Logf("mbind to node 0 refused here (fallback path): %v", err)
	}
	if err := mbind(p, length, 5000, false); err == nil {
		t.Error("mbind to node 5000 accepted")
	}
	if err := firstTouch(p, length, []int{firstAllowedCPU(t)}, 4); err != nil {
		t.Logf("first touch refused here: %v", err)
	}
	mem := unsafe.Slice((*byte)(p), length)
	mem[length-1] = 1
	if mem[0] != 0 || mem[length-1] != 1 {
		t.Fatal("mapping unusable after placement")
	}
}
