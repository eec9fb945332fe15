// Package pinopt holds the settings pinmem's options (pinmem.Option) record
// and their validation, so that pinmem.Alloc and pinmem.Register and every
// other constructor that takes pinmem options (pool.New through
// pool.WithFlags) refuse the same values for the same reasons, each when
// the options are given to it.
package pinopt

import (
	"fmt"

	"github.com/pinmem/pinmem/cuda"
)

// Allocation methods, numbered as pinmem.Method numbers them.
const (
	MethodAuto uint8 = iota
	MethodHostAlloc
	MethodMmapRegister
)

// NUMA node choices, with the values of pinmem.NUMAAuto and pinmem.NUMANone.
const (
	NUMAAuto = -2
	NUMANone = -1
)

// MaxThreads bounds the threads option: more goroutines than this only
// cost.
const MaxThreads = 1 << 16

// Options are the settings of pinmem.Alloc and pinmem.Register as the
// options set them; the zero value is every default.
type Options struct {
	Dev     *cuda.Device // WithDevice; nil: device 0
	DevSet  bool         // WithDevice was given
	Method  uint8        // WithMethod: a pinmem.Method
	Huge    *bool        // WithHugePages; nil: on where the kernel offers them
	Threads int          // WithThreads; 0: not given
	ThrSet  bool         // WithThreads was given
	NUMA    NUMA         // WithNUMANode, WithNUMABind
}

// NUMA are the NUMA placement settings of pinmem's own mappings.
type NUMA struct {
	Node int  // WithNUMANode: a node, NUMAAuto or NUMANone; meaningful when Set
	Set  bool // WithNUMANode was given
	Bind bool // WithNUMABind: MPOL_BIND instead of MPOL_PREFERRED
}

// Requested returns the node asked for: Node, or NUMAAuto when
// WithNUMANode was not given.
func (n NUMA) Requested() int {
	if !n.Set {
		return NUMAAuto
	}
	return n.Node
}

// Refusal names an option whose value is refused, for the caller to report
// as a *pinmem.OptionError of its own function.
type Refusal struct {
	Option string // the option's name, e.g. "WithThreads"
	Value  string // its argument as given, e.g. "0"
	Reason string // why it is refused
}

// Build applies opts to zero Options and validates the result. A nil
// option, or a value pinmem.Alloc cannot use, is refused: the options are
// then partly applied and must not be used.
func Build[F ~func(*Options)](opts []F) (Options, *Refusal) {
	var o Options
	for i, fn := range opts {
		if fn == nil {
			return o, &Refusal{Option: "Option", Value: "nil", Reason: fmt.Sprintf("option %d is nil", i)}
		}
		fn(&o)
	}
	return o, o.Validate()
}

// Validate returns the first option whose value o refuses, or nil.
func (o *Options) Validate() *Refusal {
	switch {
	case o.DevSet && o.Dev == nil:
		return &Refusal{Option: "WithDevice", Value: "nil", Reason: "no device"}
	case o.Method > MethodMmapRegister:
		return &Refusal{Option: "WithMethod", Value: fmt.Sprint(o.Method),
			Reason: "unknown method (want MethodAuto, MethodHostAlloc or MethodMmapRegister)"}
	case o.ThrSet && (o.Threads < 1 || o.Threads > MaxThreads):
		return &Refusal{Option: "WithThreads", Value: fmt.Sprint(o.Threads), Reason: fmt.Sprintf("want 1..%d goroutines", MaxThreads)}
	case o.NUMA.Set && o.NUMA.Node < 0 && o.NUMA.Node != NUMAAuto && o.NUMA.Node != NUMANone:
		return &Refusal{Option: "WithNUMANode", Value: fmt.Sprint(o.NUMA.Node), Reason: "want a node number, NUMAAuto or NUMANone"}
	}
	return nil
}
