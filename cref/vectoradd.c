/*
 * vectoradd.c: the C baseline of examples/vectoradd, through the CUDA driver
 * API. For each size S (bytes per array) and each host memory kind it runs the
 * example's loop: copy a and b to the device (cuMemcpyHtoD, synchronous),
 * launch vector_add on a CU_STREAM_DEFAULT stream and wait for it
 * (cuStreamSynchronize), copy c back (cuMemcpyDtoH, synchronous); then it
 * checks every element (c[i] == a[i] + b[i]). The arrays are allocated once
 * per size and kind: malloc'd ("pageable") or cuMemHostAlloc'd ("pinned").
 *
 * usage: vectoradd <examples/vectoradd/kernel.ptx> [--sizes 16M,256M] [--reps N]
 *
 * One JSON line per size and kind, medians of N timed runs after a warm-up
 * run, host clock (CLOCK_MONOTONIC), in milliseconds:
 *   {"bench":"vectoradd","kind":"pageable","size":16777216,"dir":"h2d+kernel+d2h","unit":"ms",
 *    "samples":10,"median":4.1,"min":4.0,"max":4.3,"copy_in_ms":2.6,"kernel_ms":0.03,
 *    "copy_out_ms":1.4,"transfer_ms":4.0,"verified":true}
 * "median" is the whole iteration; "transfer_ms" the median of copy in + copy out.
 */
#include "ptx.h"

#define BLOCK 256
#define MAX_SIZES 16

static CUfunction fn_add;
static int sms;

static void fill_inputs(float* a, float* b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i % 4096);
        b[i] = (float)((i * 7) % 4096) * 0.5f;
    }
}

static void check(const float* a, const float* b, const float* c, size_t n, const char* kind)
{
    for (size_t i = 0; i < n; i++) {
        if (c[i] != a[i] + b[i]) {
            fprintf(stderr, "error: %s: c[%zu] = %g, want %g\n", kind, i, (double)c[i], (double)(a[i] + b[i]));
            fflush(stdout);
            exit(1);
        }
    }
}

static void run(const char* kind, size_t size, int reps, CUstream st)
{
    size_t n = size / 4;
    float *a, *b, *c;
    int pinned = strcmp(kind, "pinned") == 0;
    if (pinned) {
        CK(cuMemHostAlloc((void**)&a, size, 0));
        CK(cuMemHostAlloc((void**)&b, size, 0));
        CK(cuMemHostAlloc((void**)&c, size, 0));
    } else {
        a = xmalloc(size);
        b = xmalloc(size);
        c = xmalloc(size);
    }
    fill_inputs(a, b, n);
    CUdeviceptr da, db, dc;
    CK(cuMemAlloc(&da, size));
    CK(cuMemAlloc(&db, size));
    CK(cuMemAlloc(&dc, size));
    unsigned long long nn = n;
    void* args[4] = {&da, &db, &dc, &nn};
    unsigned int grid = 4u * (unsigned int)(sms > 0 ? sms : 1);

    double* in = xmalloc(sizeof(double) * (size_t)reps);
    double* kern = xmalloc(sizeof(double) * (size_t)reps);
    double* out = xmalloc(sizeof(double) * (size_t)reps);
    double* xfer = xmalloc(sizeof(double) * (size_t)reps);
    double* total = xmalloc(sizeof(double) * (size_t)reps);
    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up */
        memset(c, 0xFF, size);               /* NaNs: a stale result cannot pass */
        double t0 = now_ns();
        CK(cuMemcpyHtoD(da, a, size));
        CK(cuMemcpyHtoD(db, b, size));
        double t1 = now_ns();
        CK(cuLaunchKernel(fn_add, grid, 1, 1, BLOCK, 1, 1, 0, st, args, NULL));
        CK(cuStreamSynchronize(st));
        double t2 = now_ns();
        CK(cuMemcpyDtoH(c, dc, size));
        double t3 = now_ns();
        check(a, b, c, n, kind);
        if (rep >= 0) {
            in[rep] = (t1 - t0) / 1e6;
            kern[rep] = (t2 - t1) / 1e6;
            out[rep] = (t3 - t2) / 1e6;
            xfer[rep] = in[rep] + out[rep];
            total[rep] = (t3 - t0) / 1e6;
        }
    }
    stats_t si = stats(in, reps), sk = stats(kern, reps), so = stats(out, reps), sx = stats(xfer, reps);
    char extra[256];
    snprintf(extra, sizeof extra,
             ",\"copy_in_ms\":%.6g,\"kernel_ms\":%.6g,\"copy_out_ms\":%.6g,\"transfer_ms\":%.6g,\"verified\":true",
             si.median, sk.median, so.median, sx.median);
    print_result("vectoradd", kind, size, "h2d+kernel+d2h", "ms", reps, stats(total, reps), extra);
    free(total);
    free(xfer);
    free(out);
    free(kern);
    free(in);
    CK(cuMemFree(dc));
    CK(cuMemFree(db));
    CK(cuMemFree(da));
    if (pinned) {
        CK(cuMemFreeHost(c));
        CK(cuMemFreeHost(b));
        CK(cuMemFreeHost(a));
    } else {
        free(c);
        free(b);
        free(a);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: vectoradd <kernel.ptx> [--sizes 16M,256M] [--reps N]\n");
    exit(2);
}

int main(int argc, char** argv)
{
    const char* ptx_path = NULL;
    unsigned long long sizes[MAX_SIZES] = {16 * MIB, 256 * MIB};
    int nsizes = 2, reps = 10;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--sizes") == 0 && i + 1 < argc) {
            nsizes = parse_size_list(argv[++i], sizes, MAX_SIZES);
        } else if (strcmp(a, "--reps") == 0 && i + 1 < argc) {
            reps = parse_int(a, argv[++i]);
        } else if (a[0] == '-' || ptx_path != NULL) {
            usage();
        } else {
            ptx_path = a;
        }
    }
    if (ptx_path == NULL) {
        usage();
    }
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] % 4 != 0) {
            die("sizes must be multiples of 4 bytes");
        }
    }
    CUcontext ctx;
    CUdevice dev = open_device("vectoradd", &ctx);
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUmodule mod = load_ptx(ptx_path);
    CK(cuModuleGetFunction(&fn_add, mod, "vector_add"));
    CUstream st;
    CK(cuStreamCreate(&st, CU_STREAM_DEFAULT));
    for (int i = 0; i < nsizes; i++) {
        run("pageable", (size_t)sizes[i], reps, st);
        run("pinned", (size_t)sizes[i], reps, st);
    }
    CK(cuStreamDestroy(st));
    CK(cuModuleUnload(mod));
    close_device(dev);
    return 0;
}
