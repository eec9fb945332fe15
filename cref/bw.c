/*
 * bw.c: host <-> device copy bandwidth through the CUDA driver API, for every
 * kind of host memory, and (with --pin-cost) the cost of pinning.
 *
 * usage:
 *   bw [--samples N] [--kinds k1,k2,...] [--dirs h2d,d2h] [--min-ms MS]
 *      [--pageable memalign|thp|nothp] [size ...]
 *   bw --pin-cost [--fast-only] [--threads T] [--samples N] [size ...]
 *
 * Kinds: pageable (page-aligned posix_memalign by default; --pageable thp or
 * nothp: a 2 MiB-aligned anonymous mapping advised MADV_HUGEPAGE or
 * MADV_NOHUGEPAGE, to compare with Go heap memory, which lives in 64
 * MiB-aligned anonymous mappings and gets huge pages when the system's THP
 * setting gives them), pinned (cuMemHostAlloc 0), portable
 * (CU_MEMHOSTALLOC_PORTABLE), mapped (CU_MEMHOSTALLOC_DEVICEMAP),
 * write-combined (CU_MEMHOSTALLOC_WRITECOMBINED), registered (page-aligned
 * malloc + cuMemHostRegister). Sizes take K/M/G suffixes (binary); default
 * 65536 1048576 16777216 268435456.
 *
 * Bandwidth: cuMemcpyHtoDAsync / cuMemcpyDtoHAsync on one non-blocking
 * stream, timed with events around a batch of repetitions long enough to take
 * at least --min-ms (20) ms; N samples (default 5); GB/s = 1e9 bytes/s. After
 * the samples every byte that moved is checked against a pattern (write-combined
 * host memory is read back through the GPU into pinned memory, since CPU reads
 * of it are uncached). One line per (kind, size, dir):
 *   {"bench":"bw","kind":"pinned","size":16777216,"dir":"h2d","unit":"gbps",
 *    "samples":5,"median":54.9,"min":54.8,"max":55.0,"reps":66,"verified":true}
 *
 * --pin-cost: ms per call of cuMemHostAlloc, cuMemFreeHost, malloc+memset
 * ("malloc+touch"), cuMemHostRegister and cuMemHostUnregister, for sizes
 * 1M 64M 1G 4G by default, N samples (default 3); "dir" is "none",
 * "unit" is "ms". Then the fast pinning method pinmem uses, done in C:
 * a 2 MiB-aligned anonymous mapping with madvise(MADV_HUGEPAGE), its pages
 * touched by --threads threads (default one per online CPU, as pinmem; each
 * takes an equal share of at least 16 MiB), then one cuMemHostRegister: "fast-pin" (all of it),
 * "fast-pin-touch" (map + touch), "fast-pin-register", and "fast-unpin"
 * (cuMemHostUnregister + munmap). --fast-only measures only the fast method.
 */
#include "common.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

enum { K_PAGEABLE, K_PINNED, K_PORTABLE, K_MAPPED, K_WC, K_REGISTERED, K_COUNT };

static const char* const kind_names[K_COUNT] = {
    "pageable", "pinned", "portable", "mapped", "write-combined", "registered",
};

typedef struct {
    void* p;
    size_t n;
    int kind;
    void* map; /* the mapping of --pageable thp|nothp memory, else NULL */
    size_t maplen;
} hostbuf_t;

/* pageable_mode is --pageable: 0 memalign, 1 thp, 2 nothp. */
static int pageable_mode = 0;

static hostbuf_t host_alloc(int kind, size_t n)
{
    hostbuf_t b = {NULL, n, kind, NULL, 0};
    switch (kind) {
    case K_PAGEABLE:
        if (pageable_mode != 0) {
            const size_t huge = 2u << 20;
            b.maplen = (n + huge - 1) / huge * huge + huge;
            b.map = mmap(NULL, b.maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (b.map == MAP_FAILED) {
                die("mmap failed");
            }
            b.p = (void*)(((uintptr_t)b.map + huge - 1) / huge * huge);
            if (madvise(b.p, b.maplen - huge, pageable_mode == 1 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) {
                die("madvise failed");
            }
            memset(b.p, 0, n);
            break;
        }
        /* Page-aligned, as the Go heap's large objects are, so that the
         * driver's pageable path sees the same kind of memory from C and
         * from Go (malloc's large blocks start 16 bytes into a page). */
        if (posix_memalign(&b.p, 4096, n) != 0) {
            die("posix_memalign failed");
        }
        memset(b.p, 0, n);
        break;
    case K_PINNED:
        CK(cuMemHostAlloc(&b.p, n, 0));
        break;
    case K_PORTABLE:
        CK(cuMemHostAlloc(&b.p, n, CU_MEMHOSTALLOC_PORTABLE));
        break;
    case K_MAPPED: {
        CUdeviceptr dp = 0;
        CK(cuMemHostAlloc(&b.p, n, CU_MEMHOSTALLOC_DEVICEMAP));
        CK(cuMemHostGetDevicePointer(&dp, b.p, 0));
        if (dp == 0) {
            die("cuMemHostGetDevicePointer returned a null device pointer for mapped memory");
        }
        break;
    }
    case K_WC:
        CK(cuMemHostAlloc(&b.p, n, CU_MEMHOSTALLOC_WRITECOMBINED));
        break;
    case K_REGISTERED: {
        long page = sysconf(_SC_PAGESIZE);
        int rc = posix_memalign(&b.p, page > 0 ? (size_t)page : 4096, n);
        if (rc != 0) {
            fprintf(stderr, "error: posix_memalign(%zu): %s\n", n, strerror(rc));
            exit(1);
        }
        memset(b.p, 0, n);
        CK(cuMemHostRegister(b.p, n, 0));
        break;
    }
    default:
        die("unknown host memory kind");
    }
    return b;
}

static void host_free(hostbuf_t* b)
{
    switch (b->kind) {
    case K_PAGEABLE:
        if (b->map != NULL) {
            munmap(b->map, b->maplen);
            b->map = NULL;
        } else {
            free(b->p);
        }
        break;
    case K_REGISTERED:
        CK(cuMemHostUnregister(b->p));
        free(b->p);
        break;
    default:
        CK(cuMemFreeHost(b->p));
        break;
    }
    b->p = NULL;
}

/* Shared state for the bandwidth runs. */
static CUstream stream;
static CUevent ev_start, ev_end;
static CUdeviceptr dbuf, dscratch; /* device buffers of the largest size */
static void* check;                /* pinned buffer of the largest size */
static double min_ms = 20.0;

/* issue queues reps copies of n bytes in direction dir (0 = h2d, 1 = d2h). */
static void issue(int dir, void* host, size_t n, long reps)
{
    for (long r = 0; r < reps; r++) {
        if (dir == 0) {
            CK(cuMemcpyHtoDAsync(dbuf, host, n, stream));
        } else {
            CK(cuMemcpyDtoHAsync(host, dbuf, n, stream));
        }
    }
}

/* timed_ms times reps copies with events, in milliseconds. */
static double timed_ms(int dir, void* host, size_t n, long reps)
{
    float ms = 0;
    CK(cuEventRecord(ev_start, stream));
    issue(dir, host, n, reps);
    CK(cuEventRecord(ev_end, stream));
    CK(cuEventSynchronize(ev_end));
    CK(cuEventElapsedTime(&ms, ev_start, ev_end));
    return (double)ms;
}

/* calibrate returns the number of repetitions that takes at least min_ms. */
static long calibrate(int dir, void* host, size_t n)
{
    long k = 1;
    for (;;) {
        double ms = timed_ms(dir, host, n, k);
        if (ms >= 2.0 || k >= (1L << 20)) {
            if (ms <= 0) {
                ms = 1e-3;
            }
            double want = (double)k * min_ms / ms;
            long reps = (long)want + 1;
            return reps < 1 ? 1 : reps;
        }
        k *= 2;
    }
}

static void verify_or_die(const void* p, size_t n, uint32_t seed, const char* what, const char* kind,
                          size_t size)
{
    long long bad = verify_pattern(p, n, seed);
    if (bad >= 0) {
        fprintf(stderr, "error: %s %s size %zu: byte %lld is 0x%02x, want 0x%02x\n", kind, what, size, bad,
                ((const uint8_t*)p)[bad], pattern_byte(seed, (uint64_t)bad));
        fflush(stdout);
        exit(1);
    }
}

static void run_bw(int kind, size_t size, int dir, int samples, uint32_t seed)
{
    hostbuf_t h = host_alloc(kind, size);
    const char* dname = dir == 0 ? "h2d" : "d2h";
    if (dir == 0) {
        fill_pattern(h.p, size, seed);
    } else {
        fill_pattern(check, size, seed);
        CK(cuMemcpyHtoD(dbuf, check, size));
        memset(h.p, 0, size);
    }
    /* warm up: one copy, then calibrate */
    issue(dir, h.p, size, 1);
    CK(cuStreamSynchronize(stream));
    long reps = calibrate(dir, h.p, size);

    double* gbps = xmalloc(sizeof(double) * (size_t)samples);
    for (int s = 0; s < samples; s++) {
        double ms = timed_ms(dir, h.p, size, reps);
        gbps[s] = (double)size * (double)reps / (ms * 1e6);
    }
    CK(cuStreamSynchronize(stream));

    /* verify every byte that moved */
    if (dir == 0) {
        memset(check, 0, size);
        CK(cuMemcpyDtoH(check, dbuf, size));
        verify_or_die(check, size, seed, "h2d (device copy)", kind_names[kind], size);
    } else if (kind == K_WC) {
        /* CPU reads of write-combined memory are uncached: read it back through the GPU */
        memset(check, 0, size);
        CK(cuMemcpyHtoD(dscratch, h.p, size));
        CK(cuMemcpyDtoH(check, dscratch, size));
        verify_or_die(check, size, seed, "d2h (host copy, via GPU)", kind_names[kind], size);
    } else {
        verify_or_die(h.p, size, seed, "d2h (host copy)", kind_names[kind], size);
    }

    char extra[96];
    snprintf(extra, sizeof extra, ",\"reps\":%ld,\"verified\":true", reps);
    print_result("bw", kind_names[kind], size, dname, "gbps", samples, stats(gbps, samples), extra);
    free(gbps);
    host_free(&h);
}

#define HUGE_PAGE (2ULL << 20)

/* fast_threads is --threads: the touching threads of the fast method (0:
 * one per online CPU, pinmem's default). */
static int fast_threads = 0;

typedef struct {
    char* p;
    size_t lo, hi, step;
} touch_arg_t;

static void* touch_share(void* arg)
{
    touch_arg_t* t = arg;
    for (size_t i = t->lo; i < t->hi; i += t->step) {
        t->p[i] = 0;
    }
    return NULL;
}

/* fast_pin maps n bytes 2 MiB-aligned with huge pages advised, touches them
 * from fast_threads threads (at least 16 MiB each) and registers them; it
 * returns the mapping (base and length to munmap in *map, *maplen) and the
 * times at which the touch and the registration ended, in ns from t0. */
static char* fast_pin(size_t n, double t0, double* touched, double* registered, void** map, size_t* maplen)
{
    size_t len = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    size_t total = len + HUGE_PAGE;
    char* raw = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        die("mmap failed");
    }
    char* p = (char*)(((uintptr_t)raw + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    size_t step = HUGE_PAGE;
    if (madvise(p, len, MADV_HUGEPAGE) != 0) {
        step = (size_t)sysconf(_SC_PAGESIZE); /* no THP: touch every small page */
    }
    int threads = fast_threads;
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus < 1 ? 1 : (int)cpus;
    }
    int most = (int)(len / (16 << 20)); /* at least 16 MiB per thread, as pinmem */
    if (most < 1) {
        most = 1;
    }
    if (threads > most) {
        threads = most;
    }
    size_t per = (len / (size_t)threads + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    pthread_t* tid = xmalloc(sizeof(pthread_t) * (size_t)threads);
    touch_arg_t* args = xmalloc(sizeof(touch_arg_t) * (size_t)threads);
    int started = 0;
    for (int i = 0; i < threads; i++) {
        size_t lo = (size_t)i * per;
        if (lo >= len) {
            break;
        }
        args[i] = (touch_arg_t){p, lo, lo + per < len ? lo + per : len, step};
        if (pthread_create(&tid[i], NULL, touch_share, &args[i]) != 0) {
            die("pthread_create failed");
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
    }
    free(tid);
    free(args);
    *touched = now_ns() - t0;
    CK(cuMemHostRegister(p, len, 0));
    *registered = now_ns() - t0;
    *map = raw;
    *maplen = total;
    return p;
}

static void run_fast_pin(size_t n, int samples)
{
    enum { F_PIN, F_TOUCH, F_REGISTER, F_UNPIN, F_COUNT };
    static const char* const names[F_COUNT] = {"fast-pin", "fast-pin-touch", "fast-pin-register", "fast-unpin"};
    double* v[F_COUNT];
    for (int o = 0; o < F_COUNT; o++) {
        v[o] = xmalloc(sizeof(double) * (size_t)samples);
    }
    for (int s = 0; s < samples; s++) {
        double touched, registered;
        void* map;
        size_t maplen;
        double t0 = now_ns();
        char* p = fast_pin(n, t0, &touched, &registered, &map, &maplen);
        double t1 = now_ns();
        CK(cuMemHostUnregister(p));
        if (munmap(map, maplen) != 0) {
            die("munmap failed");
        }
        double t2 = now_ns();
        v[F_PIN][s] = (t1 - t0) / 1e6;
        v[F_TOUCH][s] = touched / 1e6;
        v[F_REGISTER][s] = (registered - touched) / 1e6;
        v[F_UNPIN][s] = (t2 - t1) / 1e6;
    }
    for (int o = 0; o < F_COUNT; o++) {
        print_result("pin-cost", names[o], n, "none", "ms", samples, stats(v[o], samples), "");
        free(v[o]);
    }
}

static void run_pin_cost(const unsigned long long* sizes, int nsizes, int samples, int fast_only)
{
    enum { OP_ALLOC, OP_FREEHOST, OP_TOUCH, OP_REGISTER, OP_UNREGISTER, OP_COUNT };
    static const char* const op_names[OP_COUNT] = {
        "cuMemHostAlloc", "cuMemFreeHost", "malloc+touch", "cuMemHostRegister", "cuMemHostUnregister",
    };
    for (int si = 0; si < nsizes; si++) {
        size_t n = (size_t)sizes[si];
        if (fast_only) {
            run_fast_pin(n, samples);
            continue;
        }
        double* v[OP_COUNT];
        for (int o = 0; o < OP_COUNT; o++) {
            v[o] = xmalloc(sizeof(double) * (size_t)samples);
        }
        for (int s = 0; s < samples; s++) {
            void* p = NULL;
            double t0 = now_ns();
            CK(cuMemHostAlloc(&p, n, 0));
            double t1 = now_ns();
            CK(cuMemFreeHost(p));
            double t2 = now_ns();
            v[OP_ALLOC][s] = (t1 - t0) / 1e6;
            v[OP_FREEHOST][s] = (t2 - t1) / 1e6;

            t0 = now_ns();
            p = malloc(n);
            if (p == NULL) {
                fprintf(stderr, "error: malloc(%zu) failed\n", n);
                exit(1);
            }
            memset(p, 1, n);
            t1 = now_ns();
            CK(cuMemHostRegister(p, n, 0));
            t2 = now_ns();
            CK(cuMemHostUnregister(p));
            double t3 = now_ns();
            free(p);
            v[OP_TOUCH][s] = (t1 - t0) / 1e6;
            v[OP_REGISTER][s] = (t2 - t1) / 1e6;
            v[OP_UNREGISTER][s] = (t3 - t2) / 1e6;
        }
        for (int o = 0; o < OP_COUNT; o++) {
            print_result("pin-cost", op_names[o], n, "none", "ms", samples, stats(v[o], samples), "");
            free(v[o]);
        }
        run_fast_pin(n, samples);
    }
}

static int parse_list(const char* arg, const char* const* names, int count, int* selected)
{
    char* copy = strdup(arg);
    if (copy == NULL) {
        die("strdup failed");
    }
    int n = 0;
    for (char* save = NULL, *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < count; i++) {
            if (strcmp(tok, names[i]) == 0) {
                found = i;
            }
        }
        if (found < 0) {
            fprintf(stderr, "error: unknown name \"%s\" in \"%s\"\n", tok, arg);
            exit(2);
        }
        selected[found] = 1;
        n++;
    }
    free(copy);
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bw [--samples N] [--kinds k1,k2] [--dirs h2d,d2h] [--min-ms MS]\n"
            "          [--pageable memalign|thp|nothp] [size ...]\n"
            "       bw --pin-cost [--fast-only] [--threads T] [--samples N] [size ...]\n"
            "kinds: pageable pinned portable mapped write-combined registered\n");
    exit(2);
}

int main(int argc, char** argv)
{
    int samples = 0, pin_cost = 0, fast_only = 0;
    int kinds[K_COUNT] = {0}, dirs[2] = {0};
    int any_kind = 0, any_dir = 0;
    static const char* const dir_names[2] = {"h2d", "d2h"};
    unsigned long long sizes[64];
    int nsizes = 0;

    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "--samples") == 0 && i + 1 < argc) {
            samples = parse_int(a, argv[++i]);
        } else if (strcmp(a, "--kinds") == 0 && i + 1 < argc) {
            any_kind = parse_list(argv[++i], kind_names, K_COUNT, kinds);
        } else if (strcmp(a, "--dirs") == 0 && i + 1 < argc) {
            any_dir = parse_list(argv[++i], dir_names, 2, dirs);
        } else if (strcmp(a, "--min-ms") == 0 && i + 1 < argc) {
            min_ms = (double)parse_int(a, argv[++i]);
        } else if (strcmp(a, "--pageable") == 0 && i + 1 < argc) {
            const char* m = argv[++i];
            if (strcmp(m, "memalign") == 0) {
                pageable_mode = 0;
            } else if (strcmp(m, "thp") == 0) {
                pageable_mode = 1;
            } else if (strcmp(m, "nothp") == 0) {
                pageable_mode = 2;
            } else {
                usage();
            }
        } else if (strcmp(a, "--pin-cost") == 0) {
            pin_cost = 1;
        } else if (strcmp(a, "--fast-only") == 0) {
            fast_only = 1;
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            fast_threads = parse_int(a, argv[++i]);
        } else if (a[0] == '-') {
            usage();
        } else {
            if (nsizes == (int)(sizeof sizes / sizeof sizes[0])) {
                die("too many sizes");
            }
            sizes[nsizes++] = parse_size(a);
        }
    }
    if (!any_kind) {
        for (int k = 0; k < K_COUNT; k++) {
            kinds[k] = 1;
        }
    }
    if (!any_dir) {
        dirs[0] = dirs[1] = 1;
    }

    CUcontext ctx;
    CUdevice dev = open_device(pin_cost ? "pin-cost" : "bw", &ctx);

    if (pin_cost) {
        if (nsizes == 0) {
            sizes[0] = MIB;
            sizes[1] = 64 * MIB;
            sizes[2] = GIB;
            sizes[3] = 4 * GIB;
            nsizes = 4;
        }
        run_pin_cost(sizes, nsizes, samples ? samples : 3, fast_only);
        close_device(dev);
        return 0;
    }

    if (nsizes == 0) {
        sizes[0] = 65536;
        sizes[1] = 1048576;
        sizes[2] = 16777216;
        sizes[3] = 268435456;
        nsizes = 4;
    }
    if (samples == 0) {
        samples = 5;
    }
    size_t max = 0;
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] > max) {
            max = (size_t)sizes[i];
        }
    }
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&ev_start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&ev_end, CU_EVENT_DEFAULT));
    CK(cuMemAlloc(&dbuf, max));
    CK(cuMemAlloc(&dscratch, max));
    CK(cuMemHostAlloc(&check, max, 0));

    uint32_t seed = 1;
    for (int k = 0; k < K_COUNT; k++) {
        if (!kinds[k]) {
            continue;
        }
        for (int i = 0; i < nsizes; i++) {
            for (int d = 0; d < 2; d++) {
                if (dirs[d]) {
                    run_bw(k, (size_t)sizes[i], d, samples, seed++);
                }
            }
        }
    }

    CK(cuMemFreeHost(check));
    CK(cuMemFree(dscratch));
    CK(cuMemFree(dbuf));
    CK(cuEventDestroy(ev_end));
    CK(cuEventDestroy(ev_start));
    CK(cuStreamDestroy(stream));
    close_device(dev);
    return 0;
}
