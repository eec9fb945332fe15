package pinmem

import (
	"fmt"
	"slices"
	"sync"

	"github.com/pinmem/pinmem/cuda"
	"github.com/pinmem/pinmem/internal/hostptr"
	"github.com/pinmem/pinmem/internal/numaplan"
	"github.com/pinmem/pinmem/internal/sysinfo"
)

// NUMA placement of pinned memory.
//
// On a host with several NUMA nodes, a GPU's DMA to and from host memory is
// fastest when the memory sits on the node the GPU hangs off: memory on
// another socket crosses the inter-socket link on every transfer. pinmem's
// own mappings (MethodMmapRegister, and MethodAuto from AutoMmapThreshold
// on) are therefore bound to a node before their pages are touched:
// with mbind(2) (MPOL_PREFERRED by default, MPOL_BIND with WithNUMABind),
// or, where mbind is refused (a container's seccomp profile without
// CAP_SYS_NICE, a kernel without NUMA), by faulting the pages in from
// threads bound to the node's CPUs (the kernel's first-touch policy).
// Without WithNUMANode the node is chosen automatically: the device's own
// node from sysfs (/sys/bus/pci/devices/<bus id>/numa_node), else the
// driver's CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, and only when the host has more
// than one node. Placement never fails an allocation: when it cannot be
// done the buffer is allocated anyway, unplaced, and Buffer.Placement says
// why.
//
// cuMemHostAlloc memory (small buffers, WriteCombined, MethodHostAlloc) is
// placed by the driver, which allocates it on the calling thread's node:
// pinmem cannot control it and reports it as unplaced. Register pins memory
// the caller already faulted in, wherever it is.

// NUMA node choices for WithNUMANode.
const (
	// NUMAAuto places pinmem's own mappings on the device's NUMA node when
	// the host has more than one node. It is the default.
	NUMAAuto = -2
	// NUMANone turns NUMA placement off: the kernel places pages where the
	// touching threads run.
	NUMANone = -1
)

// WithNUMANode places pinmem's own mappings on NUMA node n (a node number,
// NUMAAuto or NUMANone). It has no effect on cuMemHostAlloc memory, whose
// placement the driver decides, nor on Register. A negative n other than
// NUMAAuto and NUMANone is an error (of Register too); a node the host does not have
// is not: the buffer is allocated unplaced and Buffer.Placement says why.
func WithNUMANode(n int) Option {
	return func(o *options) { o.NUMA.Node, o.NUMA.Set = n, true }
}

// WithNUMABind makes placement strict: mbind with MPOL_BIND, so the pages
// come only from the chosen node (an allocation larger than the node's free
// memory then fails when pages are faulted in, instead of spilling over to
// other nodes as MPOL_PREFERRED, the default, lets it).
func WithNUMABind(on bool) Option { return func(o *options) { o.NUMA.Bind = on } }

// Placement methods reported in Placement.Method.
const (
	PlaceNone       = "none"            // not placed (see Placement.Note)
	PlaceMbindPref  = "mbind-preferred" // mbind(MPOL_PREFERRED) before the first touch
	PlaceMbindBind  = "mbind-bind"      // mbind(MPOL_BIND) before the first touch
	PlaceFirstTouch = "first-touch"     // pages faulted in by threads bound to the node's CPUs
)

// Placement says where a buffer's pages were placed and how.
type Placement struct {
	// Node is the NUMA node the memory was bound to, or -1 when it was not
	// placed.
	Node int `json:"node"`
	// Requested is the node asked for: a node, NUMAAuto or NUMANone.
	Requested int `json:"requested"`
	// Method is PlaceNone, PlaceMbindPref, PlaceMbindBind or PlaceFirstTouch.
	Method string `json:"method"`
	// Note says why the memory was not placed, or what was tried first.
	Note string `json:"note,omitempty"`
}

// String describes the placement in one line.
func (p Placement) String() string {
	s := "not placed"
	if p.Node >= 0 {
		s = fmt.Sprintf("NUMA node %d (%s)", p.Node, p.Method)
	}
	if p.Note != "" {
		s += ": " + p.Note
	}
	return s
}

// Placement returns where the buffer's memory was placed. Only pinmem's own
// mappings (KindMmapRegister) are ever placed; other kinds report
// PlaceNone with the reason.
func (b *Buffer) Placement() Placement {
	if b == nil || b.s == nil {
		return Placement{Node: -1, Requested: NUMANone, Method: PlaceNone, Note: "nil buffer"}
	}
	if b.s.numa != nil {
		return *b.s.numa
	}
	note := "cuMemHostAlloc memory: the driver places it, pinmem cannot"
	if b.s.kind == KindGoRegister {
		note = "registered Go memory: already placed by whoever touched it"
	}
	return Placement{Node: -1, Requested: NUMANone, Method: PlaceNone, Note: note}
}

// numaReader is where NUMA facts are read (tests point it at fixtures).
var numaReader = sysinfo.Reader{}

var numaPlans sync.Map // *cuda.Device -> numaplan.Plan (for numaReader at the time)

// planNUMA returns the NUMA facts of dev read through r and the node the
// automatic placement chooses for it. ok is false when the device's
// properties could not be read (the plan then has no driver node and must
// not be cached).
func planNUMA(dev *cuda.Device, r sysinfo.Reader) (p numaplan.Plan, ok bool) {
	busID, driverNode := "", -1
	if dev != nil {
		props, err := dev.Properties()
		if err != nil {
			return numaplan.For(r, "", -1), false
		}
		busID, driverNode = props.PCIBusID, props.HostNUMAID
	}
	return numaplan.For(r, busID, driverNode), true
}

// planFor returns (and caches) the plan of dev from numaReader. A plan made
// without the device's properties (a failed read) is not cached, so that
// a transient failure does not decide placement for good.
func planFor(dev *cuda.Device) numaplan.Plan {
	if p, ok := numaPlans.Load(dev); ok {
		return p.(numaplan.Plan)
	}
	p, ok := planNUMA(dev, numaReader)
	if ok {
		numaPlans.Store(dev, p)
	}
	return p
}

// nodeCPUs returns the CPUs of node from numaReader (nil when unknown).
func nodeCPUs(node int) []int {
	nodes, _ := numaReader.NUMANodes()
	for _, n := range nodes {
		if n.ID == node {
			return n.CPUs
		}
	}
	return nil
}

// mbindFunc binds [p, p+length) to node (a variable for tests).
var mbindFunc = mbind

// firstTouchFunc faults in [p, p+length) from threads bound to cpus (a
// variable for tests).
var firstTouchFunc = firstTouch

// placeMapping places a fresh, untouched mapping for the target device as
// o asks. It never fails: what could not be done is in the result's Note.
func placeMapping(t target, p hostptr.Ptr, length uintptr, o options) *Placement {
	req := o.NUMA.Requested()
	pl := &Placement{Node: -1, Requested: req, Method: PlaceNone}
	node := req
	switch {
	case req == NUMANone:
		pl.Note = "placement turned off (WithNUMANode(NUMANone))"
		return pl
	case req == NUMAAuto:
		plan := planFor(t.dev)
		if plan.Node < 0 {
			pl.Note = plan.Reason
			return pl
		}
		node = plan.Node
	default:
		nodes, _ := numaReader.NUMANodes()
		if len(nodes) > 0 && !slices.ContainsFunc(nodes, func(n sysinfo.NUMANode) bool { return n.ID == node }) {
			pl.Note = fmt.Sprintf("host has no NUMA node %d", node)
			return pl
		}
	}
	err := mbindFunc(p, length, node, o.NUMA.Bind)
	if err == nil {
		pl.Node, pl.Method = node, PlaceMbindPref
		if o.NUMA.Bind {
			pl.Method = PlaceMbindBind
		}
		return pl
	}
	cpus := nodeCPUs(node)
	if len(cpus) == 0 {
		pl.Note = fmt.Sprintf("mbind to node %d failed (%v) and the node's CPUs are unknown: not placed", node, err)
		return pl
	}
	if terr := firstTouchFunc(p, length, cpus, o.Threads); terr != nil {
		pl.Note = fmt.Sprintf("mbind to node %d failed (%v); first touch on its CPUs failed too (%v): not placed", node, err, terr)
		return pl
	}
	pl.Node, pl.Method = node, PlaceFirstTouch
	pl.Note = fmt.Sprintf("mbind failed (%v)", err)
	return pl
}
