// Package kernel holds the CUDA kernel of the vectoradd example and of its
// measurement program (../measure): c[i] = a[i] + b[i] over float32 arrays. kernel.ptx is what
// scripts/compile-kernels made of kernel.cu with nvcc; its first line carries
// the SHA-256 of kernel.cu, which the example's tests check.
package kernel

import _ "embed"

// Name is the kernel's function name in the PTX.
const Name = "vector_add"

// PTX is kernel.ptx: load it with cuda.Context.LoadModule, which has the
// driver compile it for the GPU at hand.
//
//go:embed kernel.ptx
var PTX []byte

// Source is kernel.cu, the CUDA C that PTX was generated from.
//
//go:embed kernel.cu
var Source []byte
