// Package kernel holds the CUDA kernel of the zerocopy example and of its
// measurement program (../measure): per-channel normalisation of an HWC float32 batch. kernel.ptx is what
// scripts/compile-kernels made of kernel.cu with nvcc; its first line carries
// the SHA-256 of kernel.cu, which the example's tests check.
package kernel

import _ "embed"

// Name is the kernel's function name in the PTX.
const Name = "normalize_hwc"

// PTX is kernel.ptx: load it with cuda.Context.LoadModule, which has the
// driver compile it for the GPU at hand.
//
//go:embed kernel.ptx
var PTX []byte

// Source is kernel.cu, the CUDA C that PTX was generated from.
//
//go:embed kernel.cu
var Source []byte

// Channels is the number of channels of a pixel: the input is HWC float32,
// channel i%Channels at index i.
const Channels = 3

// ImageNet's per-channel mean and standard deviation, as in kernel.cu.
var (
	Mean = [Channels]float32{0.485, 0.456, 0.406}
	Std  = [Channels]float32{0.229, 0.224, 0.225}
)

// Normalize is the kernel on the CPU, its reference: out[i] is in[i] less
// its channel's mean, over its channel's standard deviation.
func Normalize(out, in []float32) {
	for i, x := range in {
		out[i] = (x - Mean[i%Channels]) / Std[i%Channels]
	}
}
