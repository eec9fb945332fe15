// kernel.cu: the kernel of the imagepipeline example.
//
// scripts/compile-kernels turns this file into kernel.ptx beside it (nvcc -ptx
// -arch=compute_75 -O3) and writes the SHA-256 of this file on the PTX's first
// line; the example embeds kernel.ptx and its test checks that the hash still
// matches this file. The C baseline (cref/imagepipeline.c) loads the same PTX.
// Edit this file, then regenerate the PTX on a machine with nvcc.
//
// Parameters, in cuLaunchKernel order: in and out (device pointers, 8 bytes
// each), width and height (unsigned int, 4 bytes each).

// blur3x3_rgba blurs an RGBA frame of width x height pixels (4 bytes a pixel,
// rows packed, no padding) with a 3x3 box filter: each channel of out is the
// rounded mean of that channel over the pixel and its eight neighbours, where
// coordinates outside the frame are clamped to the nearest edge pixel:
//   out = (sum of the 9 values + 4) / 9   (integer division)
// in and out must not overlap. A grid-stride loop over pixels: any grid and
// block shape gives the same result. The example's Go function blurRef
// computes the same thing on the CPU to check every frame.
extern "C" __global__ void blur3x3_rgba(const uchar4* in, uchar4* out, unsigned int width, unsigned int height)
{
    const unsigned long long npix = (unsigned long long)width * height;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; p < npix; p += stride) {
        const int x = (int)(p % width);
        const int y = (int)(p / width);
        unsigned int r = 0, g = 0, b = 0, a = 0;
        for (int dy = -1; dy <= 1; dy++) {
            int yy = y + dy;
            yy = yy < 0 ? 0 : (yy >= (int)height ? (int)height - 1 : yy);
            for (int dx = -1; dx <= 1; dx++) {
                int xx = x + dx;
                xx = xx < 0 ? 0 : (xx >= (int)width ? (int)width - 1 : xx);
                const uchar4 v = in[(unsigned long long)yy * width + (unsigned long long)xx];
                r += v.x;
                g += v.y;
                b += v.z;
                a += v.w;
            }
        }
        out[p] = make_uchar4((unsigned char)((r + 4u) / 9u), (unsigned char)((g + 4u) / 9u),
                             (unsigned char)((b + 4u) / 9u), (unsigned char)((a + 4u) / 9u));
    }
}
