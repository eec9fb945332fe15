/*
 * overlap.c: the copy/compute pipeline (H2D -> kernel -> D2H per chunk), through the CUDA
 * driver API: C chunks (default 16) of S bytes (default 32 MiB), each
 * H2D -> add_u8 kernel -> D2H, issued round-robin over K streams.
 *
 * usage: overlap <path/to/pinmem.ptx> [--runs N] [--chunks C] [--chunk-size S]
 *                [--streams 1,4] [--no-spin] [--no-baseline]
 *
 * Variants (one JSON line each, median of N runs after one warm-up run):
 *   kind "pinned", streams K for each K in --streams: pinned host buffers,
 *     async copies, timed with events. Unless --no-spin, a spin_wait kernel
 *     holds the first stream while the whole batch is queued and the host then
 *     releases it (the nvbandwidth way), so host issue time is not measured.
 *   kind "pageable-sync", streams 1: malloc'd host buffers, synchronous
 *     cuMemcpyHtoD / cuMemcpyDtoH and the kernel on the legacy stream, timed
 *     with the host clock (the naive baseline).
 * Every run checks every output byte: out[i] == in[i] + delta (mod 256).
 *   {"bench":"overlap","kind":"pinned","size":33554432,"dir":"h2d+add+d2h","unit":"ms",
 *    "samples":5,"median":12.6,"min":12.5,"max":12.9,"chunks":16,"streams":4,
 *    "timer":"events","gbps":85.2,"verified":true}
 * "size" is the chunk size; "gbps" is 2 * chunks * size / median (both
 * directions' bytes).
 */
#include "common.h"
#include "ptx.h"

#define MAX_STREAMS 64
#define BLOCK 256

static CUfunction fn_add, fn_spin;
static int sms;

static void launch_add(CUdeviceptr data, unsigned long long n, uint8_t delta, CUstream st)
{
    void* args[3] = {&data, &n, &delta};
    unsigned int grid = (unsigned int)sms * 4;
    CK(cuLaunchKernel(fn_add, grid, 1, 1, BLOCK, 1, 1, 0, st, args, NULL));
}

static void launch_spin(CUdeviceptr flag, unsigned long long timeout_ns, CUdeviceptr status, CUstream st)
{
    void* args[3] = {&flag, &timeout_ns, &status};
    CK(cuLaunchKernel(fn_spin, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
}

/* add4 adds delta to each byte of w, wrapping per byte (as add_u8 does). */
static inline uint32_t add4(uint32_t w, uint32_t delta4)
{
    uint32_t low = (w & 0x7F7F7F7Fu) + (delta4 & 0x7F7F7F7Fu);
    return low ^ ((w ^ delta4) & 0x80808080u);
}

/* verify_added checks out[i] == pattern_byte(seed, i) + delta for every byte. */
static void verify_added(const uint8_t* out, size_t n, uint32_t seed, uint8_t delta, const char* what)
{
    const uint32_t delta4 = (uint32_t)delta * 0x01010101u;
    size_t words = n / 4;
    size_t first_bad = n;
    for (size_t w = 0; w < words; w++) {
        uint32_t got;
        memcpy(&got, out + 4 * w, 4);
        if (got != add4(pattern(seed, w), delta4)) {
            first_bad = 4 * w;
            break;
        }
    }
    if (first_bad == n) {
        first_bad = 4 * words;
    }
    for (size_t i = first_bad; i < n; i++) {
        uint8_t want = (uint8_t)(pattern_byte(seed, i) + delta);
        if (out[i] != want) {
            fprintf(stderr, "error: %s: output byte %zu is 0x%02x, want 0x%02x\n", what, i, out[i], want);
            fflush(stdout);
            exit(1);
        }
    }
}

static void print_overlap(const char* kind, size_t chunk, int chunks, int nstreams, const char* timer,
                          int runs, double* ms)
{
    stats_t s = stats(ms, runs);
    char extra[192];
    double gbps = 2.0 * (double)chunks * (double)chunk / (s.median * 1e6);
    snprintf(extra, sizeof extra, ",\"chunks\":%d,\"streams\":%d,\"timer\":\"%s\",\"gbps\":%.4g,\"verified\":true",
             chunks, nstreams, timer, gbps);
    print_result("overlap", kind, chunk, "h2d+add+d2h", "ms", runs, s, extra);
}

static void run_pinned(int nstreams, int chunks, size_t chunk, int runs, int spin, CUdeviceptr dev,
                       uint8_t* in, uint8_t* out, uint32_t seed, volatile uint32_t* hflag,
                       CUdeviceptr dflag, CUdeviceptr dstatus)
{
    CUstream st[MAX_STREAMS];
    CUevent done[MAX_STREAMS];
    CUevent start, end;
    for (int s = 0; s < nstreams; s++) {
        CK(cuStreamCreate(&st[s], CU_STREAM_NON_BLOCKING));
        CK(cuEventCreate(&done[s], CU_EVENT_DISABLE_TIMING));
    }
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    double* ms = xmalloc(sizeof(double) * (size_t)runs);
    size_t total = (size_t)chunks * chunk;

    for (int run = -1; run < runs; run++) { /* run -1 warms up */
        uint8_t delta = (uint8_t)(0x35 + run);
        memset(out, 0, total);
        if (spin) {
            hflag[0] = 0; /* flag */
            hflag[1] = 0; /* status */
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            launch_spin(dflag, 10ULL * 1000 * 1000 * 1000, dstatus, st[0]);
        }
        CK(cuEventRecord(start, st[0]));
        for (int s = 1; s < nstreams; s++) {
            CK(cuStreamWaitEvent(st[s], start, 0));
        }
        for (int c = 0; c < chunks; c++) {
            CUstream s = st[c % nstreams];
            size_t off = (size_t)c * chunk;
            CK(cuMemcpyHtoDAsync(dev + off, in + off, chunk, s));
            launch_add(dev + off, chunk, delta, s);
            CK(cuMemcpyDtoHAsync(out + off, dev + off, chunk, s));
        }
        for (int s = 1; s < nstreams; s++) {
            CK(cuEventRecord(done[s], st[s]));
            CK(cuStreamWaitEvent(st[0], done[s], 0));
        }
        CK(cuEventRecord(end, st[0]));
        if (spin) {
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            hflag[0] = 1; /* release the queued batch */
        }
        CK(cuEventSynchronize(end));
        float t = 0;
        CK(cuEventElapsedTime(&t, start, end));
        if (spin && hflag[1] != 1) {
            fprintf(stderr, "error: spin_wait status %u, want 1 (released); 2 means it timed out\n", hflag[1]);
            exit(1);
        }
        char what[64];
        snprintf(what, sizeof what, "pinned, %d streams", nstreams);
        verify_added(out, total, seed, delta, what);
        if (run >= 0) {
            ms[run] = (double)t;
        }
    }
    print_overlap("pinned", chunk, chunks, nstreams, spin ? "events+spin" : "events", runs, ms);
    free(ms);
    CK(cuEventDestroy(end));
    CK(cuEventDestroy(start));
    for (int s = 0; s < nstreams; s++) {
        CK(cuEventDestroy(done[s]));
        CK(cuStreamDestroy(st[s]));
    }
}

static void run_pageable(int chunks, size_t chunk, int runs, CUdeviceptr dev, uint32_t seed)
{
    size_t total = (size_t)chunks * chunk;
    uint8_t* in = xmalloc(total);
    uint8_t* out = xmalloc(total);
    fill_pattern(in, total, seed);
    double* ms = xmalloc(sizeof(double) * (size_t)runs);
    for (int run = -1; run < runs; run++) {
        uint8_t delta = (uint8_t)(0x35 + run);
        memset(out, 0, total);
        CK(cuCtxSynchronize());
        double t0 = now_ns();
        for (int c = 0; c < chunks; c++) {
            size_t off = (size_t)c * chunk;
            CK(cuMemcpyHtoD(dev + off, in + off, chunk));
            launch_add(dev + off, chunk, delta, NULL); /* legacy stream: ordered with sync copies */
            CK(cuMemcpyDtoH(out + off, dev + off, chunk));
        }
        CK(cuCtxSynchronize());
        double t1 = now_ns();
        verify_added(out, total, seed, delta, "pageable-sync");
        if (run >= 0) {
            ms[run] = (t1 - t0) / 1e6;
        }
    }
    print_overlap("pageable-sync", chunk, chunks, 1, "wall", runs, ms);
    free(ms);
    free(out);
    free(in);
}

static void usage(void)
{
    fprintf(stderr, "usage: overlap <pinmem.ptx> [--runs N] [--chunks C] [--chunk-size S] [--streams 1,4]"
                    " [--no-spin] [--no-baseline]\n");
    exit(2);
}

int main(int argc, char** argv)
{
    const char* ptx_path = NULL;
    int runs = 5, chunks = 16, spin = 1, baseline = 1;
    size_t chunk = 32 * MIB;
    int streams[16] = {1, 4};
    int nstreams = 2;

    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--runs") == 0 && i + 1 < argc) {
            runs = parse_int(a, argv[++i]);
        } else if (strcmp(a, "--chunks") == 0 && i + 1 < argc) {
            chunks = parse_int(a, argv[++i]);
        } else if (strcmp(a, "--chunk-size") == 0 && i + 1 < argc) {
            chunk = (size_t)parse_size(argv[++i]);
        } else if (strcmp(a, "--streams") == 0 && i + 1 < argc) {
            char* list = strdup(argv[++i]);
            if (list == NULL) {
                die("strdup failed");
            }
            nstreams = 0;
            for (char* save = NULL, *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
                if (nstreams == 16) {
                    die("too many --streams values");
                }
                streams[nstreams] = parse_int("--streams", t);
                if (streams[nstreams] > MAX_STREAMS) {
                    die("at most 64 streams");
                }
                nstreams++;
            }
            free(list);
        } else if (strcmp(a, "--no-spin") == 0) {
            spin = 0;
        } else if (strcmp(a, "--no-baseline") == 0) {
            baseline = 0;
        } else if (a[0] == '-' || ptx_path != NULL) {
            usage();
        } else {
            ptx_path = a;
        }
    }
    if (ptx_path == NULL) {
        usage();
    }

    CUcontext ctx;
    CUdevice dev = open_device("overlap", &ctx);
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUmodule mod = load_ptx(ptx_path);
    CK(cuModuleGetFunction(&fn_add, mod, "add_u8"));
    CK(cuModuleGetFunction(&fn_spin, mod, "spin_wait"));

    size_t total = (size_t)chunks * chunk;
    const uint32_t seed = 2024;
    CUdeviceptr d;
    void* in = NULL;
    void* out = NULL;
    void* flags = NULL;
    CUdeviceptr dflags;
    CK(cuMemAlloc(&d, total));
    CK(cuMemHostAlloc(&in, total, 0));
    CK(cuMemHostAlloc(&out, total, 0));
    CK(cuMemHostAlloc(&flags, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    CK(cuMemHostGetDevicePointer(&dflags, flags, 0));
    memset(flags, 0, 64);
    fill_pattern(in, total, seed);

    for (int i = 0; i < nstreams; i++) {
        run_pinned(streams[i], chunks, chunk, runs, spin, d, in, out, seed, (volatile uint32_t*)flags, dflags,
                   dflags + sizeof(uint32_t));
    }
    if (baseline) {
        run_pageable(chunks, chunk, runs, d, seed);
    }

    CK(cuMemFreeHost(flags));
    CK(cuMemFreeHost(out));
    CK(cuMemFreeHost(in));
    CK(cuMemFree(d));
    CK(cuModuleUnload(mod));
    close_device(dev);
    return 0;
}
