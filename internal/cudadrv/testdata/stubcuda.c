/*
 * stubcuda.c: a stand-in libcuda for CPU tests of pinmem's purego binding
 * (internal/cudadrv/stub_test.go builds it with the system C compiler).
 * It implements a handful of driver entry points with fixed, checkable
 * behaviour and deliberately lacks others, so the tests can exercise symbol
 * binding, argument passing (including cuLaunchKernel's stack arguments),
 * out-parameters, error names and the missing-symbol path. It is not CUDA.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

CUresult cuInit(unsigned int flags)
{
    const char* fail = getenv("PINMEM_STUB_INIT");
    if (flags != 0) return 1;
    if (fail && strcmp(fail, "nodevice") == 0) return 100;
    if (fail && strcmp(fail, "fail") == 0) return 999;
    return 0;
}

/* PINMEM_STUB_VERSION overrides the version (the batch-copy tests load
 * the stub as a 12.8 and as a 13.0 driver). */
CUresult cuDriverGetVersion(int* v)
{
    const char* s = getenv("PINMEM_STUB_VERSION");
    *v = s ? atoi(s) : 12080;
    return 0;
}

CUresult cuGetErrorName(CUresult r, const char** s)
{
    switch (r) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    }
    return 1;
}

CUresult cuGetErrorString(CUresult r, const char** s)
{
    switch (r) {
    case 1: *s = "invalid argument"; return 0;
    case 2: *s = "out of memory"; return 0;
    case 100: *s = "no CUDA-capable device is detected"; return 0;
    }
    return 1;
}

CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(int* d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetName(char* buf, int len, int dev) { (void)dev; strncpy(buf, "Stub GPU", (size_t)len); return 0; }
/* Every attribute reads as its own number plus the device ordinal. */
CUresult cuDeviceGetAttribute(int* v, int attr, int dev) { *v = attr + dev; return 0; }
CUresult cuDeviceTotalMem_v2(size_t* b, int dev) { (void)dev; *b = (size_t)1 << 34; return 0; }

CUresult cuMemAlloc_v2(unsigned long long* p, size_t n)
{
    if (n > ((size_t)1 << 40)) return 2;
    *p = 0x7f0000001000ULL;
    return 0;
}

/* Only the old entry point: the binding must fall back to it. */
CUresult cuEventElapsedTime(float* ms, void* start, void* end)
{
    if (start != (void*)0x10 || end != (void*)0x20) return 1;
    *ms = 1.5f;
    return 0;
}

/* Succeeds only when all eleven arguments arrive as the test sends them
 * (the last five travel on the stack on x86-64). */
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                        void* stream, void** params, void** extra)
{
    if (f != (void*)0xf00d || gx != 2 || gy != 3 || gz != 4 || bx != 5 || by != 6 || bz != 7 ||
        shmem != 8 || stream != (void*)0x9 || extra != NULL) return 1;
    if (params == NULL || *(unsigned long long*)params[0] != 0x1122334455667788ULL ||
        *(unsigned char*)params[1] != 0xab) return 1;
    return 0;
}

/* Batch support: an async H2D copy "copies" by adding the bytes' sum to a
 * log, an event record appends the event; a copy of 13 bytes fails with
 * CUDA_ERROR_INVALID_VALUE (1), so a batch must stop there. */
static unsigned long long stub_log[64];
static int stub_log_n;

CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* stream)
{
    if (n == 13) return 1;
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum += ((const unsigned char*)src)[i];
    if (stub_log_n < 64) stub_log[stub_log_n++] = dst + sum + (unsigned long long)stream;
    return 0;
}

CUresult cuEventRecord(void* event, void* stream)
{
    if (stub_log_n < 64) stub_log[stub_log_n++] = (unsigned long long)event * 1000 + (unsigned long long)stream;
    return 0;
}

/* stub_take_log copies the log out (as cuDeviceGetAttribute's pointer
 * style: out-parameter first) and clears it; it returns the count. */
int stub_take_log(unsigned long long* out)
{
    int n = stub_log_n;
    memcpy(out, stub_log, sizeof(unsigned long long) * (size_t)n);
    stub_log_n = 0;
    return n;
}

/* Batch copy, both forms. Each copy logs dst + src + size; each attribute
 * logs srcAccessOrder*1000000 + flags*100000 + srcLocHint.type*10000 +
 * srcLocHint.id*1000 + dstLocHint.type*100 + dstLocHint.id*10 + form (1 or
 * 2) and its index, so the test checks the struct layout field by field.
 * A copy of 13 bytes fails the batch (CUDA_ERROR_INVALID_VALUE) before
 * anything is logged; the 12.8 form reports its index in failIdx. */
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int srcAccessOrder;
    CUmemLocation srcLocHint;
    CUmemLocation dstLocHint;
    unsigned int flags;
} CUmemcpyAttributes;

static CUresult stub_batch(int form, unsigned long long* dsts, unsigned long long* srcs, size_t* sizes, size_t count,
                           CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, size_t* failIdx, void* stream)
{
    if (sizeof(CUmemcpyAttributes) != 24 || stream == NULL || count == 0 || numAttrs == 0 || attrsIdxs[0] != 0) return 1;
    for (size_t i = 0; i < count; i++) {
        if (sizes[i] == 13) {
            if (failIdx) *failIdx = i;
            return 1;
        }
    }
    for (size_t k = 0; k < numAttrs; k++) {
        const CUmemcpyAttributes* a = &attrs[k];
        unsigned long long v = (unsigned long long)a->srcAccessOrder * 1000000 + (unsigned long long)a->flags * 100000 +
                               (unsigned long long)a->srcLocHint.type * 10000 + (unsigned long long)a->srcLocHint.id * 1000 +
                               (unsigned long long)a->dstLocHint.type * 100 + (unsigned long long)a->dstLocHint.id * 10 + (unsigned long long)form;
        if (stub_log_n < 63) {
            stub_log[stub_log_n++] = v;
            stub_log[stub_log_n++] = attrsIdxs[k];
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (stub_log_n < 64) stub_log[stub_log_n++] = dsts[i] + srcs[i] + sizes[i];
    }
    return 0;
}

CUresult cuMemcpyBatchAsync(unsigned long long* dsts, unsigned long long* srcs, size_t* sizes, size_t count,
                            CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, size_t* failIdx, void* stream)
{
    if (failIdx == NULL) return 1;
    *failIdx = (size_t)-1;
    return stub_batch(1, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream);
}

CUresult cuMemcpyBatchAsync_v2(unsigned long long* dsts, unsigned long long* srcs, size_t* sizes, size_t count,
                               CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, void* stream)
{
    return stub_batch(2, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, stream);
}
