/*
 * cref/loop.c: a shared object that runs the C reference's call loops inside
 * another process. internal/cudadrv's BenchmarkInProcessC loads it (path in
 * PINMEM_CREF_LOOPLIB) and calls its loops once per batch through pinmem's
 * trampoline, so the loop runs as C on a Go thread of the Go process, with
 * the Go process's context, stream and buffers. Set beside the Go calls and
 * the separate cref/callcost process, it tells whether the gap between Go
 * and C comes from each Go call or from the process the calls are made in.
 *
 * The driver's entry points are passed in as function pointers, so the
 * object needs no CUDA header or library to build. Each loop returns the
 * nanoseconds it took (CLOCK_MONOTONIC), or minus the first non-zero
 * CUresult.
 */
#include <stddef.h>
#include <time.h>

typedef int (*htod_async_fn)(unsigned long long dst, const void* src, size_t n, void* stream);
typedef int (*ctx_get_current_fn)(void** ctx);

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

long long pinmem_loop_htod_async(void* fn, unsigned long long dst, const void* src, size_t n, void* stream,
                                 long long count)
{
    htod_async_fn f = (htod_async_fn)fn;
    long long t0 = now_ns();
    for (long long i = 0; i < count; i++) {
        int r = f(dst, src, n, stream);
        if (r != 0) {
            return -(long long)r;
        }
    }
    return now_ns() - t0;
}

long long pinmem_loop_ctx_get_current(void* fn, long long count)
{
    ctx_get_current_fn f = (ctx_get_current_fn)fn;
    void* ctx = NULL;
    long long t0 = now_ns();
    for (long long i = 0; i < count; i++) {
        int r = f(&ctx);
        if (r != 0) {
            return -(long long)r;
        }
    }
    return now_ns() - t0;
}
