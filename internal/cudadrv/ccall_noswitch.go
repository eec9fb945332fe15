//go:build linux && (amd64 || arm64) && !pinmem_purego

package cudadrv

// PuregoSwitch reports whether UsePuregoCalls can route driver calls
// through purego.SyscallN: only in builds with the pinmem_purego tag, which
// benchmarks use to compare the two paths in one run. In this build every
// call takes pinmem's trampoline and the call path tests no switch.
const PuregoSwitch = false

func viaPurego() bool { return false }

// UsePuregoCalls does nothing in this build (see PuregoSwitch) and reports
// false: every call goes through pinmem's trampoline.
func UsePuregoCalls(bool) (prev bool) { return false }
