// kernel.cu: the kernel of the vectoradd example.
//
// scripts/compile-kernels turns this file into kernel.ptx beside it (nvcc -ptx
// -arch=compute_75 -O3) and writes the SHA-256 of this file on the PTX's first
// line; the example embeds kernel.ptx and its test checks that the hash still
// matches this file. Edit this file, then regenerate the PTX on a machine with
// nvcc.
//
// extern "C" keeps the name unmangled, so Module.Function("vector_add") finds
// it. Parameters, in cuLaunchKernel order: three device pointers (8 bytes
// each) and an element count (unsigned long long, 8 bytes).

// vector_add sets c[i] = a[i] + b[i] for i in [0, n). A grid-stride loop: any
// grid and block shape gives the same result.
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, unsigned long long n)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        c[i] = a[i] + b[i];
    }
}
