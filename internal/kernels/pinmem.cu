// pinmem.cu: the CUDA kernels of pinmem.
//
// Compiled to PTX on a GPU machine with scripts/compile-kernels
// (nvcc -ptx -arch=compute_75 -O3); the PTX is committed as kernels/pinmem.ptx
// and embedded in the Go package kernels, whose test checks that the PTX header
// carries the SHA-256 of this file. Edit this file, then regenerate the PTX.
//
// Rules for every kernel here:
//   - extern "C" so the names in PTX are not mangled (cuModuleGetFunction looks
//     them up by these exact names);
//   - arguments are plain scalars and pointers, launched with cuLaunchKernel:
//     "unsigned long long" parameters are 8 bytes, uint32_t 4 bytes, uint8_t
//     1 byte (a launcher that passes a pointer to a little-endian uint32 for a
//     uint8_t parameter also works: only the first byte is read);
//   - sizes are 64-bit and every loop is a grid-stride loop, so any grid and
//     block shape gives the same result (the launchers use 256 threads a block
//     and a few blocks per SM);
//   - pointers may be device memory or device pointers of mapped (zero-copy)
//     host memory.
//
// The integer hash pattern() has a Go twin, kernels.Pattern, and the checksum
// a Go twin, kernels.Checksum: keep them identical.

#include <stdint.h>

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// pattern returns the 32-bit word expected at index i of a buffer filled with
// seed: the splitmix64 finalizer of (seed * golden64) ^ i ^ 0x632BE59BD9B4E019,
// folded to 32 bits (the constant keeps pattern(0, 0) away from zero).
// Go twin: kernels.Pattern. Cheap (a few integer multiplies), and every word
// differs, so misplaced, stale or torn data is caught by a word-by-word check.
__device__ __forceinline__ uint32_t pattern(uint32_t seed, unsigned long long i)
{
    unsigned long long x = ((unsigned long long)seed * 0x9E3779B97F4A7C15ULL) ^ i ^ 0x632BE59BD9B4E019ULL;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return (uint32_t)(x ^ (x >> 32));
}

// global_index and global_stride give the grid-stride loop bounds in 64 bits.
__device__ __forceinline__ unsigned long long global_index(void)
{
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long global_stride(void)
{
    return (unsigned long long)gridDim.x * blockDim.x;
}

// block_sum_add reduces v over the thread block and has thread 0 atomically add
// the block's total to *out: one atomic per block. Works for any blockDim.x
// (partial last warps included). Every thread of the block must call it.
__device__ void block_sum_add(unsigned long long v, unsigned long long* out)
{
    __shared__ unsigned long long warp_sums[32];
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const unsigned int warp = tid >> 5;
    const unsigned int nthreads = blockDim.x;
    const unsigned int nwarps = (nthreads + 31u) >> 5;
    // Lanes that exist in this warp (the last warp may be partial).
    const unsigned int wsize = (nthreads - warp * 32u) < 32u ? (nthreads - warp * 32u) : 32u;
    const unsigned int mask = wsize == 32u ? 0xFFFFFFFFu : ((1u << wsize) - 1u);

    for (unsigned int off = 16; off > 0; off >>= 1) {
        unsigned long long other = __shfl_down_sync(mask, v, off);
        if (lane + off < wsize) {
            v += other;
        }
    }
    if (lane == 0) {
        warp_sums[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        // nwarps <= 32; warp 0 is full whenever nwarps > 1.
        unsigned long long s = lane < nwarps ? warp_sums[lane] : 0ULL;
        for (unsigned int off = 16; off > 0; off >>= 1) {
            unsigned long long other = __shfl_down_sync(mask, s, off);
            if (lane + off < wsize) {
                s += other;
            }
        }
        if (lane == 0 && s != 0ULL) {
            atomicAdd(out, s);
        }
    }
}

// add_bytes4 adds delta to each of the four bytes of w, each wrapping modulo
// 256 with no carry into its neighbour (SWAR).
__device__ __forceinline__ uint32_t add_bytes4(uint32_t w, uint32_t delta4)
{
    const uint32_t low = (w & 0x7F7F7F7Fu) + (delta4 & 0x7F7F7F7Fu);
    return low ^ ((w ^ delta4) & 0x80808080u);
}

// ---------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------

// fill_u32 writes dst[i] = pattern(seed, i) for i in [0, n).
// Hosts verify the result word by word with kernels.Pattern.
extern "C" __global__ void fill_u32(uint32_t* dst, unsigned long long n, uint32_t seed)
{
    const unsigned long long stride = global_stride();
    for (unsigned long long i = global_index(); i < n; i += stride) {
        dst[i] = pattern(seed, i);
    }
}

// checksum_u32 adds to *out the sum over i in [0, n) of
// (uint64)(src[i] ^ (uint32)i), modulo 2^64. The XOR with the index makes the
// sum sensitive to words in the wrong place. Each block reduces its part and
// adds it with one atomicAdd, so *out must be zeroed before the launch (or
// hold a running total). Go twin: kernels.Checksum.
extern "C" __global__ void checksum_u32(const uint32_t* src, unsigned long long n,
                                        unsigned long long* out)
{
    const unsigned long long stride = global_stride();
    unsigned long long acc = 0;
    for (unsigned long long i = global_index(); i < n; i += stride) {
        acc += (unsigned long long)(src[i] ^ (uint32_t)i);
    }
    block_sum_add(acc, out);
}

// copy_u8 copies n bytes from src to dst (the ranges must not overlap). Correct
// for any alignment and size. When src and dst have the same offset modulo 16,
// the unaligned head and tail are copied bytewise and the body with 16-byte
// vector loads and stores; otherwise every byte is copied on its own.
// Used to read and write mapped (zero-copy) host memory through its device
// pointer, and as an SM-driven copy between device buffers.
extern "C" __global__ void copy_u8(uint8_t* dst, const uint8_t* src, unsigned long long n)
{
    const unsigned long long gid = global_index();
    const unsigned long long stride = global_stride();
    const unsigned long long s = (unsigned long long)(uintptr_t)src;
    const unsigned long long d = (unsigned long long)(uintptr_t)dst;

    if (((s ^ d) & 15ULL) != 0ULL) {
        for (unsigned long long i = gid; i < n; i += stride) {
            dst[i] = src[i];
        }
        return;
    }
    unsigned long long head = (16ULL - (s & 15ULL)) & 15ULL;
    if (head > n) {
        head = n;
    }
    const unsigned long long nvec = (n - head) >> 4;
    const unsigned long long tail_start = head + (nvec << 4);
    const unsigned long long tail = n - tail_start;

    for (unsigned long long i = gid; i < head; i += stride) {
        dst[i] = src[i];
    }
    const uint4* vs = (const uint4*)(src + head);
    uint4* vd = (uint4*)(dst + head);
    for (unsigned long long i = gid; i < nvec; i += stride) {
        vd[i] = vs[i];
    }
    for (unsigned long long i = gid; i < tail; i += stride) {
        dst[tail_start + i] = src[tail_start + i];
    }
}

// add_u8 adds delta to every byte of data[0:n) in place, wrapping modulo 256.
// The body runs on 16-byte words (per-byte SWAR addition), the unaligned head
// and tail bytewise. This is the "light kernel" between the copies of a
// pipeline: it touches every byte once, so a result is easy to verify
// (out[i] == in[i] + delta).
extern "C" __global__ void add_u8(uint8_t* data, unsigned long long n, uint8_t delta)
{
    const unsigned long long gid = global_index();
    const unsigned long long stride = global_stride();
    const unsigned long long p = (unsigned long long)(uintptr_t)data;
    const uint32_t delta4 = (uint32_t)delta * 0x01010101u;

    unsigned long long head = (16ULL - (p & 15ULL)) & 15ULL;
    if (head > n) {
        head = n;
    }
    const unsigned long long nvec = (n - head) >> 4;
    const unsigned long long tail_start = head + (nvec << 4);
    const unsigned long long tail = n - tail_start;

    for (unsigned long long i = gid; i < head; i += stride) {
        data[i] = (uint8_t)(data[i] + delta);
    }
    uint4* v = (uint4*)(data + head);
    for (unsigned long long i = gid; i < nvec; i += stride) {
        uint4 w = v[i];
        w.x = add_bytes4(w.x, delta4);
        w.y = add_bytes4(w.y, delta4);
        w.z = add_bytes4(w.z, delta4);
        w.w = add_bytes4(w.w, delta4);
        v[i] = w;
    }
    for (unsigned long long i = gid; i < tail; i += stride) {
        data[tail_start + i] = (uint8_t)(data[tail_start + i] + delta);
    }
}

// read_sum_u32 reads every word of src[0:n) and adds their plain sum
// (modulo 2^64) to *out with one atomicAdd per block; *out must be zeroed
// before the launch. The body uses 16-byte loads (the words before the first
// 16-byte boundary and after the last are read one by one). The sum is
// written out, so the compiler cannot drop the loads: this measures how fast
// the SMs can read memory, e.g. mapped host memory over PCIe.
// Go twin of the result: kernels.Sum.
extern "C" __global__ void read_sum_u32(const uint32_t* src, unsigned long long n,
                                        unsigned long long* out)
{
    const unsigned long long gid = global_index();
    const unsigned long long stride = global_stride();
    const unsigned long long p = (unsigned long long)(uintptr_t)src;

    // src is 4-byte aligned; words until the next 16-byte boundary.
    unsigned long long head = ((16ULL - (p & 15ULL)) & 15ULL) >> 2;
    if (head > n) {
        head = n;
    }
    const unsigned long long nvec = (n - head) >> 2;
    const unsigned long long tail_start = head + (nvec << 2);
    const unsigned long long tail = n - tail_start;

    unsigned long long acc = 0;
    for (unsigned long long i = gid; i < head; i += stride) {
        acc += src[i];
    }
    const uint4* v = (const uint4*)(src + head);
    for (unsigned long long i = gid; i < nvec; i += stride) {
        const uint4 w = v[i];
        acc += (unsigned long long)w.x + w.y + w.z + w.w;
    }
    for (unsigned long long i = gid; i < tail; i += stride) {
        acc += src[tail_start + i];
    }
    block_sum_add(acc, out);
}

// read_globaltimer returns the GPU's global nanosecond timer.
__device__ __forceinline__ unsigned long long read_globaltimer(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// spin_wait holds its stream until the host releases it: thread 0 of block 0
// polls *flag (normally mapped host memory the host writes to) until it is
// nonzero, or until timeout_ns nanoseconds of %globaltimer have passed. It then
// writes *status = 1 (released by the flag) or 2 (timed out); status may also
// be mapped host memory. Launch it with one block of one thread. Work queued on
// the stream behind it starts only when the flag is set, so a host can queue a
// start event, a batch of copies and an end event, then release them at once
// (the nvbandwidth way of timing), or test stream ordering. A timeout_ns of 0
// checks the flag once. Other threads, if any, return at once.
extern "C" __global__ void spin_wait(volatile uint32_t* flag, unsigned long long timeout_ns,
                                     uint32_t* status)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned long long start = read_globaltimer();
    uint32_t result = 1;
    while (*flag == 0u) {
        if (read_globaltimer() - start >= timeout_ns) {
            result = 2;
            break;
        }
        __nanosleep(200);
    }
    *(volatile uint32_t*)status = result;
    __threadfence_system();
}
