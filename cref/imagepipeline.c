/*
 * imagepipeline.c: the C baseline of examples/imagepipeline, through the CUDA
 * driver API, on the same kernel.ptx (blur3x3_rgba). For each resolution it
 * allocates a ring of R input and R output RGBA frames once, fills the inputs
 * with two distinct random frames (slot j holds frame j % 2), and runs F
 * frames (frame f uses ring slot f % R) three ways, as the Go example does:
 *
 *   kind "naive": malloc'd frames; per frame cuMemcpyHtoD (synchronous), the
 *     kernel on a CU_STREAM_DEFAULT stream, cuStreamSynchronize, cuMemcpyDtoH
 *     (synchronous), one frame at a time;
 *   kind "pinned", streams K (K = 1 and --streams): cuMemHostAlloc'd frames;
 *     frame f's cuMemcpyHtoDAsync, kernel and cuMemcpyDtoHAsync queued on
 *     CU_STREAM_NON_BLOCKING stream f % K (each stream has its own device
 *     frames), then every stream synchronized;
 *   kind "bidir": the copy bound: 2R frame-sized pinned copies in on one
 *     stream and 2R out on another at the same time, in GB/s of both
 *     directions' bytes.
 *
 * Timing is the host clock around the whole run (CLOCK_MONOTONIC), one
 * warm-up run of R frames, then the median of N runs. After every run each
 * output frame of the ring is compared with the blur computed on the CPU;
 * a wrong byte exits 1.
 *
 * usage: imagepipeline <examples/imagepipeline/kernel.ptx> [--res 1920x1080,3840x2160]
 *                      [--frames F] [--ring R] [--streams K] [--reps N]
 *
 * One JSON line per resolution and kind, e.g.
 *   {"bench":"imagepipeline","kind":"naive","size":8294400,"dir":"h2d+blur+d2h","unit":"fps",
 *    "samples":3,"median":160.2,"min":158.9,"max":161.0,"width":1920,"height":1080,"streams":1,
 *    "frames":240,"verified":true}
 * ("size" is the frame's bytes).
 */
#include "ptx.h"

#define BLOCK 256
#define MAX_STREAMS 64
#define MAX_RES 8
#define SOURCES 2

static CUfunction fn_blur;
static int sms;

typedef struct {
    unsigned int w, h;
    size_t bytes;
    int frames, ring, reps;
    uint8_t* ref[SOURCES];
} job_t;

/* blur_ref is the kernel on the CPU: (sum of the clamped 3x3 neighbourhood + 4) / 9. */
static void blur_ref(uint8_t* dst, const uint8_t* src, unsigned int w, unsigned int h)
{
    size_t row = (size_t)w * 4;
    for (unsigned int y = 0; y < h; y++) {
        size_t rows[3] = {(size_t)(y > 0 ? y - 1 : 0) * row, (size_t)y * row, (size_t)(y + 1 < h ? y + 1 : y) * row};
        for (unsigned int x = 0; x < w; x++) {
            size_t cols[3] = {(size_t)(x > 0 ? x - 1 : 0) * 4, (size_t)x * 4, (size_t)(x + 1 < w ? x + 1 : x) * 4};
            for (int c = 0; c < 4; c++) {
                unsigned int sum = 0;
                for (int r = 0; r < 3; r++) {
                    for (int k = 0; k < 3; k++) {
                        sum += src[rows[r] + cols[k] + (size_t)c];
                    }
                }
                dst[(size_t)y * row + (size_t)x * 4 + (size_t)c] = (uint8_t)((sum + 4) / 9);
            }
        }
    }
}

static uint8_t* frame(uint8_t* ring, const job_t* j, int f)
{
    return ring + (size_t)(f % j->ring) * j->bytes;
}

static void check(const job_t* j, uint8_t* out, const char* what)
{
    for (int s = 0; s < j->ring; s++) {
        const uint8_t* got = frame(out, j, s);
        const uint8_t* want = j->ref[s % SOURCES];
        if (memcmp(got, want, j->bytes) != 0) {
            size_t i = 0;
            while (got[i] == want[i]) {
                i++;
            }
            fprintf(stderr, "error: %s: output frame %d byte %zu is %u, want %u\n", what, s, i, got[i], want[i]);
            fflush(stdout);
            exit(1);
        }
    }
}

static void launch(CUdeviceptr in, CUdeviceptr out, const job_t* j, CUstream st)
{
    unsigned int w = j->w, h = j->h;
    void* args[4] = {&in, &out, &w, &h};
    CK(cuLaunchKernel(fn_blur, 8u * (unsigned int)(sms > 0 ? sms : 1), 1, 1, BLOCK, 1, 1, 0, st, args, NULL));
}

static void print_fps(const char* kind, const job_t* j, int streams, double* fps)
{
    char extra[192];
    snprintf(extra, sizeof extra, ",\"width\":%u,\"height\":%u,\"streams\":%d,\"frames\":%d,\"verified\":true", j->w,
             j->h, streams, j->frames);
    print_result("imagepipeline", kind, j->bytes, "h2d+blur+d2h", "fps", j->reps, stats(fps, j->reps), extra);
}

static void run_naive(const job_t* j, uint8_t* in, uint8_t* out, CUdeviceptr din, CUdeviceptr dout, CUstream st)
{
    double* fps = xmalloc(sizeof(double) * (size_t)j->reps);
    for (int rep = -1; rep < j->reps; rep++) {
        int frames = rep < 0 ? j->ring : j->frames;
        memset(out, 0, j->bytes * (size_t)j->ring);
        double t0 = now_ns();
        for (int f = 0; f < frames; f++) {
            CK(cuMemcpyHtoD(din, frame(in, j, f), j->bytes));
            launch(din, dout, j, st);
            CK(cuStreamSynchronize(st));
            CK(cuMemcpyDtoH(frame(out, j, f), dout, j->bytes));
        }
        double t1 = now_ns();
        check(j, out, "naive");
        if (rep >= 0) {
            fps[rep] = (double)frames / ((t1 - t0) / 1e9);
        }
    }
    print_fps("naive", j, 1, fps);
    free(fps);
}

static void run_pinned(const job_t* j, int nstreams, uint8_t* in, uint8_t* out, CUdeviceptr* din, CUdeviceptr* dout,
                       CUstream* st)
{
    double* fps = xmalloc(sizeof(double) * (size_t)j->reps);
    for (int rep = -1; rep < j->reps; rep++) {
        int frames = rep < 0 ? j->ring : j->frames;
        memset(out, 0, j->bytes * (size_t)j->ring);
        double t0 = now_ns();
        for (int f = 0; f < frames; f++) {
            int k = f % nstreams;
            CK(cuMemcpyHtoDAsync(din[k], frame(in, j, f), j->bytes, st[k]));
            launch(din[k], dout[k], j, st[k]);
            CK(cuMemcpyDtoHAsync(frame(out, j, f), dout[k], j->bytes, st[k]));
        }
        for (int k = 0; k < nstreams; k++) {
            CK(cuStreamSynchronize(st[k]));
        }
        double t1 = now_ns();
        check(j, out, "pinned");
        if (rep >= 0) {
            fps[rep] = (double)frames / ((t1 - t0) / 1e9);
        }
    }
    print_fps("pinned", j, nstreams, fps);
    free(fps);
}

static void run_bidir(const job_t* j, uint8_t* in, uint8_t* out, CUdeviceptr din, CUdeviceptr dout, CUstream up,
                      CUstream down)
{
    int count = 2 * j->ring;
    double* gbps = xmalloc(sizeof(double) * (size_t)j->reps);
    for (int rep = -1; rep < j->reps; rep++) {
        double t0 = now_ns();
        for (int i = 0; i < count; i++) {
            CK(cuMemcpyHtoDAsync(din, frame(in, j, i), j->bytes, up));
            CK(cuMemcpyDtoHAsync(frame(out, j, i), dout, j->bytes, down));
        }
        CK(cuStreamSynchronize(up));
        CK(cuStreamSynchronize(down));
        double t1 = now_ns();
        if (rep >= 0) {
            gbps[rep] = 2.0 * (double)count * (double)j->bytes / (t1 - t0);
        }
    }
    char extra[128];
    snprintf(extra, sizeof extra, ",\"width\":%u,\"height\":%u,\"streams\":2", j->w, j->h);
    print_result("imagepipeline", "bidir", j->bytes, "h2d+d2h", "gbps", j->reps, stats(gbps, j->reps), extra);
    free(gbps);
}

static void fill_random(uint8_t* p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 32);
    }
}

static void run_res(job_t* j, int nstreams)
{
    size_t ringbytes = j->bytes * (size_t)j->ring;
    uint8_t* src[SOURCES];
    for (int s = 0; s < SOURCES; s++) {
        src[s] = xmalloc(j->bytes);
        fill_random(src[s], j->bytes, (uint64_t)s + 1);
        j->ref[s] = xmalloc(j->bytes);
        blur_ref(j->ref[s], src[s], j->w, j->h);
    }
    uint8_t* gin = xmalloc(ringbytes);
    uint8_t* gout = xmalloc(ringbytes);
    uint8_t *pin, *pout;
    CK(cuMemHostAlloc((void**)&pin, ringbytes, 0));
    CK(cuMemHostAlloc((void**)&pout, ringbytes, 0));
    for (int s = 0; s < j->ring; s++) {
        memcpy(frame(gin, j, s), src[s % SOURCES], j->bytes);
        memcpy(frame(pin, j, s), src[s % SOURCES], j->bytes);
    }
    int ns = nstreams < 2 ? 2 : nstreams;
    CUstream st[MAX_STREAMS], blocking;
    CUdeviceptr din[MAX_STREAMS], dout[MAX_STREAMS];
    CK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    for (int k = 0; k < ns; k++) {
        CK(cuStreamCreate(&st[k], CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&din[k], j->bytes));
        CK(cuMemAlloc(&dout[k], j->bytes));
    }
    run_bidir(j, pin, pout, din[0], dout[0], st[0], st[1]);
    run_naive(j, gin, gout, din[0], dout[0], blocking);
    run_pinned(j, 1, pin, pout, din, dout, st);
    if (nstreams > 1) {
        run_pinned(j, nstreams, pin, pout, din, dout, st);
    }
    for (int k = 0; k < ns; k++) {
        CK(cuMemFree(dout[k]));
        CK(cuMemFree(din[k]));
        CK(cuStreamDestroy(st[k]));
    }
    CK(cuStreamDestroy(blocking));
    CK(cuMemFreeHost(pout));
    CK(cuMemFreeHost(pin));
    free(gout);
    free(gin);
    for (int s = 0; s < SOURCES; s++) {
        free(j->ref[s]);
        free(src[s]);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: imagepipeline <kernel.ptx> [--res 1920x1080,3840x2160] [--frames F] [--ring R]"
                    " [--streams K] [--reps N]\n");
    exit(2);
}

int main(int argc, char** argv)
{
    const char* ptx_path = NULL;
    const char* res = "1920x1080,3840x2160";
    int frames = 240, ring = 8, nstreams = 4, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--res") == 0 && i + 1 < argc) {
            res = argv[++i];
        } else if (strcmp(a, "--frames") == 0 && i + 1 < argc) {
            frames = parse_int(a, argv[++i]);
        } else if (strcmp(a, "--ring") == 0 && i + 1 < argc) {
            ring = parse_int(a, argv[++i]);
        } else if (strcmp(a, "--streams") == 0 && i + 1 < argc) {
            nstreams = parse_int(a, argv[++i]);
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
    if (nstreams > MAX_STREAMS || ring % nstreams != 0 || frames < ring) {
        die("want --streams <= 64, --ring a multiple of --streams, --frames at least --ring");
    }
    unsigned int ws[MAX_RES], hs[MAX_RES];
    int nres = 0;
    char* list = strdup(res);
    if (list == NULL) {
        die("strdup failed");
    }
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (nres == MAX_RES || sscanf(t, "%ux%u", &ws[nres], &hs[nres]) != 2 || ws[nres] == 0 || hs[nres] == 0) {
            die("bad --res (want WIDTHxHEIGHT,...)");
        }
        nres++;
    }
    free(list);

    CUcontext ctx;
    CUdevice dev = open_device("imagepipeline", &ctx);
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUmodule mod = load_ptx(ptx_path);
    CK(cuModuleGetFunction(&fn_blur, mod, "blur3x3_rgba"));
    for (int r = 0; r < nres; r++) {
        job_t j = {ws[r], hs[r], (size_t)ws[r] * hs[r] * 4, frames, ring, reps, {NULL, NULL}};
        run_res(&j, nstreams);
    }
    CK(cuModuleUnload(mod));
    close_device(dev);
    return 0;
}
