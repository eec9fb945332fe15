//go:build linux && (amd64 || arm64) && pinmem_purego

package cudadrv

import "sync/atomic"

// PuregoSwitch reports whether UsePuregoCalls can route driver calls
// through purego.SyscallN: only in builds with the pinmem_purego tag, which
// benchmarks use to compare the two paths in one run. Other builds have no
// switch on the call path at all.
const PuregoSwitch = true

var usePurego atomic.Bool

func viaPurego() bool { return usePurego.Load() }

// UsePuregoCalls makes every later driver call go through purego.SyscallN
// (true) or pinmem's own trampoline (false, the default), and returns the
// previous setting.
func UsePuregoCalls(on bool) (prev bool) { return usePurego.Swap(on) }
