/*
 * callcost.c: what a driver call costs from C, to compare with the same calls
 * made from Go through purego.
 *
 * usage: callcost [--samples N] [--batch B] [--cpu C]
 *
 * --cpu C binds the process to CPU C before anything else (sched_setaffinity),
 * so that a Go benchmark can run its own calls and this program's on the same
 * core.
 *
 * Two measurements, each N samples (default 101) of B calls (default 1000),
 * timed on the host with CLOCK_MONOTONIC and reported as ns per call:
 *   - cuCtxGetCurrent;
 *   - issuing cuMemcpyHtoDAsync of 4 KiB from pinned memory on one
 *     non-blocking stream. The stream is synchronized between batches, outside
 *     the timed region, so every batch starts on an idle stream. The copied
 *     bytes are verified at the end.
 * Output, one JSON line each:
 *   {"bench":"callcost","kind":"cuCtxGetCurrent","size":0,"dir":"none","unit":"ns",
 *    "samples":101,"median":12.1,"min":11.9,"max":30.2,"batch":1000}
 *   {"bench":"callcost","kind":"cuMemcpyHtoDAsync","size":4096,"dir":"h2d","unit":"ns",...,
 *    "batch":1000,"verified":true}
 */
#include "common.h"

#include <sched.h>

#define COPY_BYTES 4096

int main(int argc, char** argv)
{
    int samples = 101, batch = 1000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            samples = parse_int(argv[i], argv[i + 1]);
            i++;
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            batch = parse_int(argv[i], argv[i + 1]);
            i++;
        } else if (strcmp(argv[i], "--cpu") == 0 && i + 1 < argc) {
            int cpu = parse_int(argv[i], argv[i + 1]);
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu, &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0) {
                die("sched_setaffinity failed");
            }
            i++;
        } else {
            fprintf(stderr, "usage: callcost [--samples N] [--batch B] [--cpu C]\n");
            return 2;
        }
    }

    CUcontext ctx;
    CUdevice dev = open_device("callcost", &ctx);
    double* v = xmalloc(sizeof(double) * (size_t)samples);
    char extra[96];

    /* cuCtxGetCurrent */
    CUcontext cur = NULL;
    for (int s = -1; s < samples; s++) { /* s == -1 warms up */
        double t0 = now_ns();
        for (int b = 0; b < batch; b++) {
            CK(cuCtxGetCurrent(&cur));
        }
        double t1 = now_ns();
        if (s >= 0) {
            v[s] = (t1 - t0) / batch;
        }
    }
    if (cur != ctx) {
        die("cuCtxGetCurrent did not return the primary context");
    }
    snprintf(extra, sizeof extra, ",\"batch\":%d", batch);
    print_result("callcost", "cuCtxGetCurrent", 0, "none", "ns", samples, stats(v, samples), extra);

    /* cuMemcpyHtoDAsync, 4 KiB, pinned */
    CUstream stream;
    CUdeviceptr d;
    void* src = NULL;
    void* back = NULL;
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&d, COPY_BYTES));
    CK(cuMemHostAlloc(&src, COPY_BYTES, 0));
    CK(cuMemHostAlloc(&back, COPY_BYTES, 0));
    fill_pattern(src, COPY_BYTES, 99);
    CK(cuMemsetD8(d, 0, COPY_BYTES));
    for (int s = -1; s < samples; s++) {
        CK(cuStreamSynchronize(stream));
        double t0 = now_ns();
        for (int b = 0; b < batch; b++) {
            CK(cuMemcpyHtoDAsync(d, src, COPY_BYTES, stream));
        }
        double t1 = now_ns();
        if (s >= 0) {
            v[s] = (t1 - t0) / batch;
        }
    }
    CK(cuStreamSynchronize(stream));
    memset(back, 0, COPY_BYTES);
    CK(cuMemcpyDtoH(back, d, COPY_BYTES));
    long long bad = verify_pattern(back, COPY_BYTES, 99);
    if (bad >= 0) {
        fprintf(stderr, "error: copied 4 KiB differ at byte %lld\n", bad);
        return 1;
    }
    snprintf(extra, sizeof extra, ",\"batch\":%d,\"verified\":true", batch);
    print_result("callcost", "cuMemcpyHtoDAsync", COPY_BYTES, "h2d", "ns", samples, stats(v, samples), extra);

    CK(cuMemFreeHost(back));
    CK(cuMemFreeHost(src));
    CK(cuMemFree(d));
    CK(cuStreamDestroy(stream));
    free(v);
    close_device(dev);
    return 0;
}
