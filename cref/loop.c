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

/* htod_loop issues count copies, each followed by `fences` sequentially
 * consistent atomic read-modify-writes (none for the plain loop: inlined with
 * a constant 0, the inner loop is gone). */
static inline long long htod_loop(htod_async_fn f, unsigned long long dst, const void* src, size_t n, void* stream,
                                  long long count, long long fences)
{
    static long long word;
    long long t0 = now_ns();
    for (long long i = 0; i < count; i++) {
        int r = f(dst, src, n, stream);
        if (r != 0) {
            return -(long long)r;
        }
        for (long long j = 0; j < fences; j++) {
            __atomic_fetch_add(&word, 1, __ATOMIC_SEQ_CST);
        }
    }
    return now_ns() - t0;
}

long long pinmem_loop_htod_async(void* fn, unsigned long long dst, const void* src, size_t n, void* stream,
                                 long long count)
{
    return htod_loop((htod_async_fn)fn, dst, src, n, stream, count, 0);
}

/* pinmem_loop_htod_async_gap is pinmem_loop_htod_async with a busy wait of
 * gap_ns after each call: it shows whether time spent between calls (as a
 * Go caller spends in crossing into C) adds to the total one for one, or is
 * partly absorbed by the driver. */
long long pinmem_loop_htod_async_gap(void* fn, unsigned long long dst, const void* src, size_t n, void* stream,
                                     long long count, long long gap_ns)
{
    htod_async_fn f = (htod_async_fn)fn;
    long long t0 = now_ns();
    for (long long i = 0; i < count; i++) {
        int r = f(dst, src, n, stream);
        if (r != 0) {
            return -(long long)r;
        }
        long long until = now_ns() + gap_ns;
        while (now_ns() < until) {
        }
    }
    return now_ns() - t0;
}

/* pinmem_loop_htod_async_fence is pinmem_loop_htod_async with `fences`
 * sequentially consistent atomic read-modify-writes (LOCK-prefixed on
 * x86) after each call, as a Go caller's crossing into C executes in the
 * scheduler (entersyscall/exitsyscall): it shows whether such barriers,
 * which drain write-combining buffers, slow the driver's next call. */
long long pinmem_loop_htod_async_fence(void* fn, unsigned long long dst, const void* src, size_t n, void* stream,
                                       long long count, long long fences)
{
    return htod_loop((htod_async_fn)fn, dst, src, n, stream, count, fences);
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
