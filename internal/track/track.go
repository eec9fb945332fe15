// Package track records every driver object pinmem creates (streams,
// events, modules, device memory, pinned allocations and registrations) so
// that tests can prove nothing leaked and say where a leaked object was
// created, as cilium/ebpf's testutils do for file descriptors.
//
// Counting is always on and costs one mutex-protected map update per
// creation or release; creation stacks are captured only after
// EnableStacks(true) (test binaries turn it on in TestMain).
package track

import (
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Kind is the sort of object tracked.
type Kind int

// Kinds of tracked objects.
const (
	Stream Kind = iota
	Event
	Module
	DeviceMemory
	HostAlloc    // pinned memory from cuMemHostAlloc
	Registration // host memory page-locked with cuMemHostRegister
	Context      // a context pinmem created (not a retained primary context)
	numKinds
)

var kindNames = [...]string{"stream", "event", "module", "device memory", "pinned allocation", "registration", "context"}

func (k Kind) String() string {
	if k >= 0 && k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Object is one live tracked object.
type Object struct {
	Kind  Kind
	ID    uint64 // the driver handle or address
	Size  int64  // bytes, for memory; 0 otherwise
	Stack string // creation stack, when stacks were enabled at creation
}

type key struct {
	k  Kind
	id uint64
}

// record is a live object as kept: its creation stack as program
// counters, formatted only when a report asks. A formatted stack is some
// 6 KiB per object; a process that pins and unpins all day (a pool's
// misses) would make that much garbage per driver object, which the Go
// heap keeps until its next collection.
type record struct {
	size int64
	pcs  []uintptr
}

var (
	mu     sync.Mutex
	live   = map[key]record{}
	stacks atomic.Bool
)

// maxFrames bounds the frames a creation stack keeps.
const maxFrames = 32

// EnableStacks turns capture of creation stacks on or off.
func EnableStacks(on bool) { stacks.Store(on) }

// Add records a live object. Adding the same kind and ID twice replaces the record.
func Add(k Kind, id uint64, size int64) {
	r := record{size: size}
	if stacks.Load() {
		var pcs [maxFrames]uintptr
		n := runtime.Callers(2, pcs[:]) // from Add's caller
		r.pcs = slices.Clone(pcs[:n])
	}
	mu.Lock()
	live[key{k, id}] = r
	mu.Unlock()
}

// Remove forgets a live object. It reports whether it was recorded.
func Remove(k Kind, id uint64) bool {
	mu.Lock()
	_, ok := live[key{k, id}]
	delete(live, key{k, id})
	mu.Unlock()
	return ok
}

// Count returns how many objects of kind k are live and their total size.
func Count(k Kind) (n int, bytes int64) {
	mu.Lock()
	defer mu.Unlock()
	for kk, r := range live {
		if kk.k == k {
			n++
			bytes += r.size
		}
	}
	return n, bytes
}

// Totals are the live objects of each kind and their bytes.
type Totals struct {
	N     [numKinds]int
	Bytes [numKinds]int64
}

// CountAll returns the live objects of every kind, in one pass.
func CountAll() Totals {
	var t Totals
	mu.Lock()
	defer mu.Unlock()
	for k, o := range live {
		t.N[k.k]++
		t.Bytes[k.k] += o.size
	}
	return t
}

// Live returns every live object, ordered by kind and ID.
func Live() []Object {
	mu.Lock()
	out := make([]Object, 0, len(live))
	pcs := make([][]uintptr, 0, len(live))
	for k, r := range live {
		out = append(out, Object{Kind: k.k, ID: k.id, Size: r.size})
		pcs = append(pcs, r.pcs)
	}
	mu.Unlock()
	for i := range out {
		out[i].Stack = format(pcs[i])
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Report describes the live objects, with their creation stacks, or
// returns "" when there are none.
func Report() string {
	objs := Live()
	if len(objs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d driver object(s) still live:\n", len(objs))
	for _, o := range objs {
		fmt.Fprintf(&b, "- %s %#x", o.Kind, o.ID)
		if o.Size > 0 {
			fmt.Fprintf(&b, " (%d bytes)", o.Size)
		}
		b.WriteString("\n")
		if o.Stack != "" {
			b.WriteString(o.Stack)
		} else {
			b.WriteString("    (no creation stack: stacks were not enabled)\n")
		}
	}
	return b.String()
}

// Stack formats the calling goroutine's stack, skipping skip frames (as
// runtime.Callers counts them), in the form Report prints.
func Stack(skip int) string {
	var pcs [maxFrames]uintptr
	n := runtime.Callers(skip, pcs[:])
	return format(pcs[:n])
}

// format formats the frames of pcs as Report prints them ("" for none).
func format(pcs []uintptr) string {
	if len(pcs) == 0 {
		return ""
	}
	frames := runtime.CallersFrames(pcs)
	var b strings.Builder
	for {
		f, more := frames.Next()
		fmt.Fprintf(&b, "    %s\n        %s:%d\n", f.Function, f.File, f.Line)
		if !more {
			break
		}
	}
	return b.String()
}
