/*
 * blocks.c: the C reference for pinmem's block copies (package blocks,
 * blocks.Copier.Copy): thousands of blocks scattered on both sides, as an
 * inference server pages a KV cache between pinned host memory and the GPU.
 * It copies one direction at a time; BenchmarkGPUBlocks in blocks/gpu_test.go
 * runs it (PINMEM_CREF_BLOCKS) beside the Go copies of the same sizes.
 *
 * usage: blocks [--samples N] [--blocks B] [--size S]...
 *
 * For each block size (default 16K, 64K and 256K; --size may be repeated)
 * and each direction it copies B blocks (default 4096) whose places are
 * shuffled on the host side and, independently, on the device side:
 *   - "loop": one cuMemcpyHtoDAsync / cuMemcpyDtoHAsync per block on one
 *     non-blocking stream, the way a plain C program pages blocks;
 *   - "batch": one cuMemcpyBatchAsync of all blocks (CUDA 12.8+ headers;
 *     cuda.h maps the name to cuMemcpyBatchAsync_v2 on CUDA 13, which has
 *     no failIdx), when the driver has it;
 *   - "contiguous": one copy of the same number of bytes, the upper bound.
 * Each sample is timed on the host from the first call to the end of
 * cuStreamSynchronize (CLOCK_MONOTONIC), N samples (default 11) after one
 * warm-up, reported as GB/s (1e9 bytes/s) with the median issue time per
 * block. Every block of the last sample is verified (memcmp against the
 * block it came from).
 * Output, one JSON line each:
 *   {"bench":"blocks","kind":"loop","size":16384,"dir":"h2d","unit":"gbps",
 *    "samples":11,"median":9.1,"min":8.8,"max":9.4,"blocks":4096,
 *    "issue_ns_per_block":1500,"verified":true}
 */
#include "common.h"

/* perm fills p with a shuffle of 0..n-1 (xorshift, fixed seed). */
static void perm(int* p, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        p[i] = i;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = n - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1));
        int t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

enum { KIND_LOOP, KIND_BATCH, KIND_CONTIGUOUS };
static const char* kind_name[] = {"loop", "batch", "contiguous"};

typedef struct {
    CUstream stream;
    CUdeviceptr dev;  /* B blocks */
    uint8_t* host;    /* B blocks, pinned: the host side */
    uint8_t* ref;     /* B blocks, pinned: the pattern, for filling and checking */
    int *hp, *dp;     /* block i: host slot hp[i], device slot dp[i] */
    int blocks;
    size_t bs;
    CUdeviceptr *dsts, *srcs;
    size_t* sizes;
} env_t;

/* issue queues one sample's copies of kind k in direction h2d (1) or d2h (0). */
static void issue(env_t* e, int k, int h2d)
{
    size_t bs = e->bs;
    if (k == KIND_CONTIGUOUS) {
        size_t n = bs * (size_t)e->blocks;
        if (h2d) {
            CK(cuMemcpyHtoDAsync(e->dev, e->host, n, e->stream));
        } else {
            CK(cuMemcpyDtoHAsync(e->host, e->dev, n, e->stream));
        }
        return;
    }
    if (k == KIND_LOOP) {
        for (int i = 0; i < e->blocks; i++) {
            CUdeviceptr d = e->dev + (CUdeviceptr)e->dp[i] * bs;
            uint8_t* h = e->host + (size_t)e->hp[i] * bs;
            if (h2d) {
                CK(cuMemcpyHtoDAsync(d, h, bs, e->stream));
            } else {
                CK(cuMemcpyDtoHAsync(h, d, bs, e->stream));
            }
        }
        return;
    }
#if CUDA_VERSION >= 12080
    for (int i = 0; i < e->blocks; i++) {
        CUdeviceptr d = e->dev + (CUdeviceptr)e->dp[i] * bs;
        CUdeviceptr h = (CUdeviceptr)(uintptr_t)(e->host + (size_t)e->hp[i] * bs);
        e->dsts[i] = h2d ? d : h;
        e->srcs[i] = h2d ? h : d;
        e->sizes[i] = bs;
    }
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t idx = 0;
#if CUDA_VERSION >= 13000
    CK(cuMemcpyBatchAsync(e->dsts, e->srcs, e->sizes, (size_t)e->blocks, &attr, &idx, 1, e->stream));
#else
    size_t fail = 0;
    CK(cuMemcpyBatchAsync(e->dsts, e->srcs, e->sizes, (size_t)e->blocks, &attr, &idx, 1, &fail, e->stream));
#endif
#else
    die("built without cuMemcpyBatchAsync (CUDA 12.8+ headers)");
#endif
}

/* check verifies the last sample: every block where it belongs. */
static int check(env_t* e, int k, int h2d, uint8_t* back)
{
    size_t bs = e->bs, n = bs * (size_t)e->blocks;
    if (h2d) {
        CK(cuMemcpyDtoH(back, e->dev, n));
        for (int i = 0; i < e->blocks; i++) {
            size_t d = k == KIND_CONTIGUOUS ? (size_t)i : (size_t)e->dp[i];
            size_t h = k == KIND_CONTIGUOUS ? (size_t)i : (size_t)e->hp[i];
            if (memcmp(back + d * bs, e->ref + h * bs, bs) != 0) {
                fprintf(stderr, "error: %s h2d: device slot %zu does not hold host block %zu\n", kind_name[k], d, h);
                return 0;
            }
        }
        return 1;
    }
    for (int i = 0; i < e->blocks; i++) {
        size_t d = k == KIND_CONTIGUOUS ? (size_t)i : (size_t)e->dp[i];
        size_t h = k == KIND_CONTIGUOUS ? (size_t)i : (size_t)e->hp[i];
        if (memcmp(e->host + h * bs, e->ref + d * bs, bs) != 0) {
            fprintf(stderr, "error: %s d2h: host slot %zu does not hold device block %zu\n", kind_name[k], h, d);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char** argv)
{
    int samples = 11, blocks = 4096, nsizes = 0;
    size_t sizes[16];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = parse_int(argv[i], argv[i + 1]);
            i++;
        } else if (strcmp(argv[i], "--blocks") == 0 && i + 1 < argc) {
            blocks = parse_int(argv[i], argv[i + 1]);
            i++;
        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc && nsizes < 16) {
            sizes[nsizes++] = (size_t)parse_size(argv[i + 1]);
            i++;
        } else {
            fprintf(stderr, "usage: blocks [--samples N] [--blocks B] [--size S]...\n");
            return 2;
        }
    }
    if (nsizes == 0) {
        sizes[0] = 16 * 1024;
        sizes[1] = 64 * 1024;
        sizes[2] = 256 * 1024;
        nsizes = 3;
    }
    CUcontext ctx;
    CUdevice dev = open_device("blocks", &ctx);
    int drv = 0;
    CK(cuDriverGetVersion(&drv));
    int have_batch = CUDA_VERSION >= 12080 && drv >= CUDA_VERSION;

    size_t maxbs = 0;
    for (int s = 0; s < nsizes; s++) {
        maxbs = sizes[s] > maxbs ? sizes[s] : maxbs;
    }
    size_t total = maxbs * (size_t)blocks;
    env_t e;
    memset(&e, 0, sizeof e);
    e.blocks = blocks;
    CK(cuStreamCreate(&e.stream, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&e.dev, total));
    void *host = NULL, *ref = NULL, *back = NULL;
    CK(cuMemHostAlloc(&host, total, 0));
    CK(cuMemHostAlloc(&ref, total, 0));
    CK(cuMemHostAlloc(&back, total, 0));
    e.host = host;
    e.ref = ref;
    e.hp = xmalloc(sizeof(int) * (size_t)blocks);
    e.dp = xmalloc(sizeof(int) * (size_t)blocks);
    e.dsts = xmalloc(sizeof(CUdeviceptr) * (size_t)blocks);
    e.srcs = xmalloc(sizeof(CUdeviceptr) * (size_t)blocks);
    e.sizes = xmalloc(sizeof(size_t) * (size_t)blocks);
    perm(e.hp, blocks, 1);
    perm(e.dp, blocks, 2);
    fill_pattern(ref, total, 7);
    double* v = xmalloc(sizeof(double) * (size_t)samples);
    double* iss = xmalloc(sizeof(double) * (size_t)samples);
    char extra[160];

    for (int s = 0; s < nsizes; s++) {
        e.bs = sizes[s];
        size_t n = e.bs * (size_t)blocks;
        for (int h2d = 1; h2d >= 0; h2d--) {
            for (int k = KIND_LOOP; k <= KIND_CONTIGUOUS; k++) {
                if (k == KIND_BATCH && !have_batch) {
                    continue;
                }
                /* The source holds the pattern, the destination is cleared. */
                if (h2d) {
                    memcpy(e.host, ref, n);
                    CK(cuMemsetD8(e.dev, 0, n));
                } else {
                    CK(cuMemcpyHtoD(e.dev, ref, n));
                    memset(e.host, 0, n);
                }
                for (int i = -1; i < samples; i++) { /* i == -1 warms up */
                    CK(cuStreamSynchronize(e.stream));
                    double t0 = now_ns();
                    issue(&e, k, h2d);
                    double t1 = now_ns();
                    CK(cuStreamSynchronize(e.stream));
                    double t2 = now_ns();
                    if (i >= 0) {
                        v[i] = (double)n / (t2 - t0); /* bytes per ns = GB/s */
                        iss[i] = (t1 - t0) / (k == KIND_CONTIGUOUS ? 1 : blocks);
                    }
                }
                if (!check(&e, k, h2d, back)) {
                    return 1;
                }
                stats_t is = stats(iss, samples);
                snprintf(extra, sizeof extra, ",\"blocks\":%d,\"issue_ns_per_block\":%.1f,\"verified\":true",
                         k == KIND_CONTIGUOUS ? 1 : blocks, is.median);
                print_result("blocks", kind_name[k], (unsigned long long)e.bs, h2d ? "h2d" : "d2h", "gbps", samples,
                             stats(v, samples), extra);
            }
        }
    }

    free(iss);
    free(v);
    free(e.sizes);
    free(e.srcs);
    free(e.dsts);
    free(e.dp);
    free(e.hp);
    CK(cuMemFreeHost(back));
    CK(cuMemFreeHost(ref));
    CK(cuMemFreeHost(host));
    CK(cuMemFree(e.dev));
    CK(cuStreamDestroy(e.stream));
    close_device(dev);
    return 0;
}
