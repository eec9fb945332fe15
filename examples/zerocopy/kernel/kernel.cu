// kernel.cu: the kernel of the zerocopy example.
//
// scripts/compile-kernels turns this file into kernel.ptx beside it (nvcc -ptx
// -arch=compute_75 -O3) and writes the SHA-256 of this file on the PTX's first
// line; the example embeds kernel.ptx and its test checks that the hash still
// matches this file. Edit this file, then regenerate the PTX on a machine with
// nvcc.
//
// Parameters, in cuLaunchKernel order: in and out (device pointers, 8 bytes
// each; in may be the device pointer of mapped host memory), n (unsigned long
// long, 8 bytes) and passes (unsigned int, 4 bytes).

// The per-channel mean and standard deviation of ImageNet, the usual
// normalisation of a ResNet-50 input.
__constant__ float channel_mean[3] = {0.485f, 0.456f, 0.406f};
__constant__ float channel_std[3] = {0.229f, 0.224f, 0.225f};

// normalize_hwc normalises n float32 values laid out as pixels of three
// channels (HWC: R, G, B, R, G, B, ...): out[i] = (in[i] - mean[c]) / std[c]
// with c = i % 3. It sweeps the whole input passes times (passes >= 1), writing
// the same result each time: a stand-in for a kernel that reads its input more
// than once. in and out are not declared __restrict__, so the compiler cannot
// assume a pass's stores leave in unchanged and must load in again on every
// pass: when in is mapped host memory, every pass reads it over the bus.
extern "C" __global__ void normalize_hwc(const float* in, float* out, unsigned long long n, unsigned int passes)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned int p = 0; p < passes; p++) {
        for (unsigned long long i = first; i < n; i += stride) {
            const unsigned int c = (unsigned int)(i % 3ULL);
            out[i] = (in[i] - channel_mean[c]) / channel_std[c];
        }
    }
}
