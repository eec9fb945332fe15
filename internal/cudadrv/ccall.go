//go:build linux && (amd64 || arm64)

package cudadrv

import (
	"slices"
	"unsafe"

	"github.com/ebitengine/purego"
)

// purego.SyscallN adds its own marshalling (a pooled 42-word frame, two
// 32-word copies and a defer) on top of the runtime's cgocall, on every
// driver call. ccall passes at most maxCArgs integer arguments in a 14-word
// frame on the caller's stack and enters C through the same runtime.cgocall
// (so the scheduler sees a syscall, exactly as with purego), which makes a
// call cheaper and allocation-free. The frame layout is fixed by
// ccall_amd64.s / ccall_arm64.s.

// maxCArgs is the most integer arguments ccall passes (cuLaunchKernel has 11).
const maxCArgs = 12

// cframe is what the trampoline reads: the function, its arguments, and the
// slot it writes the return register to. Offsets: fn 0, args 8..96, r1 104.
type cframe struct {
	fn   uintptr
	args [maxCArgs]uintptr
	r1   uintptr
}

//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// ccall calls the C function fn with args and returns its first return
// register. No argument may be the address of a Go stack variable (use
// ccallOut), and pointers among args must be kept alive by the caller.
//
// args does not escape: the variadic slice stays on the caller's stack, so
// a call allocates nothing (purego.SyscallN's arguments escape; the purego
// path copies them first).
func ccall(fn uintptr, args ...uintptr) uintptr {
	if len(args) > maxCArgs || viaPurego() {
		return ccallPurego(fn, slices.Clone(args))
	}
	f := cframe{fn: fn}
	copy(f.args[:], args)
	q := cseq{frames: &f, n: 1}
	runtime_cgocall(ccallSeqTrampABI0, unsafe.Pointer(&q))
	return f.r1
}

// ccallPurego is ccall through purego.SyscallN.
//
//go:noinline
func ccallPurego(fn uintptr, args []uintptr) uintptr {
	r1, _, _ := purego.SyscallN(fn, args...)
	return r1
}

// cseq is what the sequence trampoline reads: cframes to call in order,
// stopping after the first that returns a non-zero (CUresult) value.
// Offsets: frames 0, n 8, done 16 (how many returned zero).
type cseq struct {
	frames *cframe
	n      int
	done   int
}

// ccallSeqTrampABI0 holds the address of the trampoline that runs a cseq.
var ccallSeqTrampABI0 uintptr

// ccallSeq calls each frame's function in order with one runtime.cgocall,
// stopping at the first non-zero 32-bit result. It returns how many
// returned zero and the failing result (Success when none failed).
func ccallSeq(frames []cframe) (int, Result) {
	if len(frames) == 0 {
		return 0, Success
	}
	if viaPurego() {
		return ccallSeqSlow(frames)
	}
	q := cseq{frames: &frames[0], n: len(frames)}
	runtime_cgocall(ccallSeqTrampABI0, unsafe.Pointer(&q))
	if q.done < len(frames) {
		return q.done, Result(int32(frames[q.done].r1))
	}
	return q.done, Success
}
