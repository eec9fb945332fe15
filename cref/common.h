/*
 * common.h: helpers shared by pinmem's C reference programs (bw, callcost,
 * overlap). They call the CUDA driver API directly (cuda.h, -lcuda), so their
 * numbers are the bar the Go library is measured against.
 *
 * Every CUresult is checked with CK(): on failure the program prints the call,
 * the error name (cuGetErrorName) and the source line to stderr and exits 1.
 * Results go to stdout, one JSON object per line.
 */
#ifndef PINMEM_CREF_COMMON_H
#define PINMEM_CREF_COMMON_H

#define _GNU_SOURCE 1
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GIB (1024ULL * 1024ULL * 1024ULL)
#define MIB (1024ULL * 1024ULL)

static inline void ck_fail(CUresult r, const char* expr, const char* file, int line)
{
    const char* name = NULL;
    const char* desc = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) {
        name = "unknown CUresult";
    }
    if (cuGetErrorString(r, &desc) != CUDA_SUCCESS || desc == NULL) {
        desc = "";
    }
    fprintf(stderr, "%s:%d: %s failed: %s (%d): %s\n", file, line, expr, name, (int)r, desc);
    fflush(stdout);
    exit(1);
}

/* CK checks a CUresult and exits with the error's name on failure. */
#define CK(call)                                           \
    do {                                                   \
        CUresult ck_r_ = (call);                           \
        if (ck_r_ != CUDA_SUCCESS) {                       \
            ck_fail(ck_r_, #call, __FILE__, __LINE__);     \
        }                                                  \
    } while (0)

/* die prints a message and exits 1. */
static inline void die(const char* msg)
{
    fprintf(stderr, "error: %s\n", msg);
    fflush(stdout);
    exit(1);
}

static inline void* xmalloc(size_t n)
{
    void* p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "error: malloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

/* now_ns returns CLOCK_MONOTONIC in nanoseconds. */
static inline double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* pattern is the twin of kernels.Pattern (Go) and pattern() in pinmem.cu. */
static inline uint32_t pattern(uint32_t seed, uint64_t i)
{
    uint64_t x = ((uint64_t)seed * 0x9E3779B97F4A7C15ULL) ^ i ^ 0x632BE59BD9B4E019ULL;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return (uint32_t)(x ^ (x >> 32));
}

/* pattern_byte is byte b (little-endian) of the word that holds byte i. */
static inline uint8_t pattern_byte(uint32_t seed, uint64_t i)
{
    return (uint8_t)(pattern(seed, i >> 2) >> (8 * (i & 3)));
}

/* fill_pattern writes the pattern of seed into n bytes: byte i is
 * pattern_byte(seed, i), so whole words read as pattern(seed, word index). */
static inline void fill_pattern(void* buf, size_t n, uint32_t seed)
{
    uint8_t* p = (uint8_t*)buf;
    size_t words = n / 4;
    for (size_t w = 0; w < words; w++) {
        uint32_t v = pattern(seed, w);
        memcpy(p + 4 * w, &v, 4);
    }
    for (size_t i = words * 4; i < n; i++) {
        p[i] = pattern_byte(seed, i);
    }
}

/* verify_pattern returns the index of the first byte that differs from the
 * pattern of seed, or -1 when all n bytes match. */
static inline long long verify_pattern(const void* buf, size_t n, uint32_t seed)
{
    const uint8_t* p = (const uint8_t*)buf;
    size_t words = n / 4;
    for (size_t w = 0; w < words; w++) {
        uint32_t v;
        memcpy(&v, p + 4 * w, 4);
        if (v != pattern(seed, w)) {
            for (size_t i = 4 * w; i < 4 * w + 4; i++) {
                if (p[i] != pattern_byte(seed, i)) {
                    return (long long)i;
                }
            }
        }
    }
    for (size_t i = words * 4; i < n; i++) {
        if (p[i] != pattern_byte(seed, i)) {
            return (long long)i;
        }
    }
    return -1;
}

static inline int cmp_double(const void* a, const void* b)
{
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* stats sorts v[0:n) and returns its median, min and max. */
typedef struct {
    double median, min, max;
} stats_t;

static inline stats_t stats(double* v, int n)
{
    stats_t s = {0, 0, 0};
    if (n <= 0) {
        return s;
    }
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.median = (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return s;
}

/* print_result prints one JSON result line. unit is "gbps", "ns" or "ms";
 * extra is either "" or more fields starting with a comma. */
static inline void print_result(const char* bench, const char* kind, unsigned long long size,
                                const char* dir, const char* unit, int samples, stats_t s,
                                const char* extra)
{
    printf("{\"bench\":\"%s\",\"kind\":\"%s\",\"size\":%llu,\"dir\":\"%s\",\"unit\":\"%s\","
           "\"samples\":%d,\"median\":%.6g,\"min\":%.6g,\"max\":%.6g%s}\n",
           bench, kind, size, dir, unit, samples, s.median, s.min, s.max, extra ? extra : "");
    fflush(stdout);
}

/* parse_size parses a byte count with an optional K, M or G (binary) suffix. */
static inline unsigned long long parse_size(const char* s)
{
    char* end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s) {
        fprintf(stderr, "error: bad size \"%s\"\n", s);
        exit(2);
    }
    switch (*end) {
    case 'k': case 'K': v *= 1024ULL; end++; break;
    case 'm': case 'M': v *= MIB; end++; break;
    case 'g': case 'G': v *= GIB; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') {
        end++;
    }
    if (*end == 'B') {
        end++;
    }
    if (*end != '\0' || v == 0) {
        fprintf(stderr, "error: bad size \"%s\"\n", s);
        exit(2);
    }
    return v;
}

/* parse_int parses a positive int or exits. */
static inline int parse_int(const char* flag, const char* s)
{
    char* end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v <= 0 || v > 1000000000L) {
        fprintf(stderr, "error: %s wants a positive integer, got \"%s\"\n", flag, s);
        exit(2);
    }
    return (int)v;
}

/* open_device initialises the driver, makes device 0's primary context (or
 * $PINMEM_DEVICE's) current on this thread and prints an info line. */
static inline CUdevice open_device(const char* bench, CUcontext* ctx)
{
    CUdevice dev;
    int ordinal = 0;
    const char* env = getenv("PINMEM_DEVICE");
    if (env != NULL && *env != '\0') {
        ordinal = atoi(env);
    }
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, ordinal));
    CK(cuDevicePrimaryCtxRetain(ctx, dev));
    CK(cuCtxSetCurrent(*ctx));
    char name[256];
    int drv = 0, sms = 0, major = 0, minor = 0, engines = 0;
    CK(cuDeviceGetName(name, (int)sizeof name, dev));
    CK(cuDriverGetVersion(&drv));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CK(cuDeviceGetAttribute(&engines, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, dev));
    for (char* c = name; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *c = ' ';
        }
    }
    printf("{\"bench\":\"%s\",\"kind\":\"info\",\"device\":\"%s\",\"ordinal\":%d,\"driver\":%d,"
           "\"cc\":\"%d.%d\",\"sms\":%d,\"copy_engines\":%d}\n",
           bench, name, ordinal, drv, major, minor, sms, engines);
    fflush(stdout);
    return dev;
}

static inline void close_device(CUdevice dev)
{
    CK(cuCtxSynchronize());
    CK(cuDevicePrimaryCtxRelease(dev));
}

#endif
