/*
 * ptx.h: loading a PTX file with cuModuleLoadDataEx, for the C baselines of
 * the examples (vectoradd, imagepipeline). They load the same kernel.ptx the
 * Go example embeds, so both run the same kernel.
 */
#ifndef PINMEM_CREF_PTX_H
#define PINMEM_CREF_PTX_H

#include "common.h"

/* read_text reads a whole file and NUL-terminates it (cuModuleLoadData wants
 * a NUL-terminated PTX string). */
static inline char* read_text(const char* path)
{
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "error: open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        die("fseek failed");
    }
    long n = ftell(f);
    if (n < 0) {
        die("ftell failed");
    }
    rewind(f);
    char* buf = xmalloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "error: read %s failed\n", path);
        exit(1);
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* load_ptx loads the PTX file at path into the current context; it exits
 * with the JIT log when the driver refuses it, and with a hint when the file
 * is a placeholder holding no kernel. */
static inline CUmodule load_ptx(const char* path)
{
    char* ptx = read_text(path);
    if (strstr(ptx, ".entry") == NULL) {
        fprintf(stderr, "error: %s holds no kernels (the placeholder?); generate it with scripts/compile-kernels\n",
                path);
        exit(1);
    }
    static char log[16384];
    CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[2] = {log, (void*)(uintptr_t)sizeof log};
    CUmodule mod;
    CUresult r = cuModuleLoadDataEx(&mod, ptx, 2, opts, vals);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "JIT log: %s\n", log);
        ck_fail(r, "cuModuleLoadDataEx", __FILE__, __LINE__);
    }
    free(ptx);
    return mod;
}

/* parse_size_list parses "16M,256M" into v (at most max entries) and returns
 * the count. */
static inline int parse_size_list(const char* s, unsigned long long* v, int max)
{
    char* list = strdup(s);
    if (list == NULL) {
        die("strdup failed");
    }
    int n = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            die("too many sizes");
        }
        v[n++] = parse_size(t);
    }
    free(list);
    if (n == 0) {
        die("empty size list");
    }
    return n;
}

#endif
