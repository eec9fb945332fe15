//go:build !(linux && (amd64 || arm64))

package cudadrv

import "github.com/ebitengine/purego"

// PuregoSwitch is false here: there is no trampoline to switch from.
const PuregoSwitch = false

// UsePuregoCalls reports true and changes nothing here: on this platform
// every driver call goes through purego.SyscallN.
func UsePuregoCalls(bool) (prev bool) { return true }

// ccall calls fn through purego where pinmem has no trampoline of its own.
func ccall(fn uintptr, args ...uintptr) uintptr {
	r1, _, _ := purego.SyscallN(fn, args...)
	return r1
}

// ccallSeq calls each frame's function in turn (no trampoline here).
func ccallSeq(frames []cframe) (int, Result) { return ccallSeqSlow(frames) }

// cframe is a call: the function, its arguments and its result.
type cframe struct {
	fn   uintptr
	args [12]uintptr
	r1   uintptr
}
