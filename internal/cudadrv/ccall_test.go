package cudadrv_test

import (
	"testing"

	"github.com/ebitengine/purego"

	"github.com/pinmem/pinmem/internal/cudadrv"
	"github.com/pinmem/pinmem/internal/cudadrv/cgoref"
)

// libcLabs returns the address of libc's labs, a C function that does
// next to nothing, for measuring the cost of crossing into C.
func libcLabs(tb testing.TB) uintptr {
	tb.Helper()
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		tb.Skipf("libc.so.6: %v", err)
	}
	fn, err := purego.Dlsym(h, "labs")
	if err != nil {
		tb.Skipf("labs: %v", err)
	}
	return fn
}

// TestCCallLibc calls a real C function through the trampoline, with the
// argument in the first register and the full argument count.
func TestCCallLibc(t *testing.T) {
	labs := libcLabs(t)
	for _, x := range []int64{-42, 42, 0, -1 << 40} {
		want := x
		if want < 0 {
			want = -want
		}
		if got := int64(cudadrv.CCall(labs, uintptr(x))); got != want {
			t.Errorf("labs(%d) = %d through ccall", x, got)
		}
		args := make([]uintptr, 12)
		args[0] = uintptr(x)
		if got := int64(cudadrv.CCall(labs, args...)); got != want {
			t.Errorf("labs(%d) with 12 arguments = %d through ccall", x, got)
		}
	}
}

// BenchmarkCallPath measures the cost of one call into C (libc labs): the
// trampoline pinmem uses, purego.SyscallN, and cgo (only when built with
// cgo, CGO_ENABLED=1). Measured on the CI machine: see docs/PERF.md.
func BenchmarkCallPath(b *testing.B) {
	labs := libcLabs(b)
	b.Run("trampoline", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			cudadrv.CCall(labs, uintptr(i))
		}
	})
	b.Run("purego", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			purego.SyscallN(labs, uintptr(i))
		}
	})
	b.Run("cgo", func(b *testing.B) {
		if !cgoref.Available {
			b.Skip("built without cgo")
		}
		for i := 0; i < b.N; i++ {
			cgoref.Labs(int64(i))
		}
	})
}
