// Package kernel holds the CUDA kernel of the imagepipeline example and of its
// measurement program (../measure): a 3x3 box blur of an RGBA frame. kernel.ptx is what
// scripts/compile-kernels made of kernel.cu with nvcc; its first line carries
// the SHA-256 of kernel.cu, which the example's tests check.
package kernel

import _ "embed"

// Name is the kernel's function name in the PTX.
const Name = "blur3x3_rgba"

// PTX is kernel.ptx: load it with cuda.Context.LoadModule, which has the
// driver compile it for the GPU at hand.
//
//go:embed kernel.ptx
var PTX []byte

// Source is kernel.cu, the CUDA C that PTX was generated from.
//
//go:embed kernel.cu
var Source []byte

// Blur is the kernel on the CPU, its reference: a 3x3 box blur: each channel of a
// pixel becomes (the sum over its 3x3 neighbourhood + 4) / 9, coordinates
// clamped to the frame.
func Blur(dst, src []byte, width, height int) {
	row := width * 4
	clampRow := func(y int) int { return min(max(y, 0), height-1) * row }
	for y := range height {
		rows := [3]int{clampRow(y - 1), clampRow(y), clampRow(y + 1)}
		for x := range width {
			cols := [3]int{max(x-1, 0) * 4, x * 4, min(x+1, width-1) * 4}
			for c := range 4 {
				sum := 0
				for _, r := range rows {
					for _, cl := range cols {
						sum += int(src[r+cl+c])
					}
				}
				dst[y*row+x*4+c] = byte((sum + 4) / 9)
			}
		}
	}
}
