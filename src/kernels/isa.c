/* Picks the kernel table once (see isa.h). */
#include "isa.h"
#include "memfit/core.h"
#include "memfit/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const mf_kernel_isa *g_isa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_err[160];

int mf_kernels_isa_avx512_ok(void) {
#ifdef MF_HAVE_AVX512_TABLE
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static void pick(void) {
    const char *e = getenv("MEMFIT_ISA");
    int ok = mf_kernels_isa_avx512_ok();
    (void)ok; /* unused where the build has no avx512 table */
    g_isa = &mf_kernels_portable;
    if (!e || !*e || strcmp(e, "auto") == 0) {
#ifdef MF_HAVE_AVX512_TABLE
        if (ok) g_isa = &mf_kernels_avx512;
#endif
    } else if (strcmp(e, "portable") == 0) {
        g_isa = &mf_kernels_portable;
    } else if (strcmp(e, "avx512") == 0) {
#ifdef MF_HAVE_AVX512_TABLE
        if (ok) g_isa = &mf_kernels_avx512;
        else
#endif
            snprintf(g_err, sizeof g_err, "MEMFIT_ISA=avx512 but this CPU or build has no AVX-512F/BW/VL/DQ");
    } else {
        snprintf(g_err, sizeof g_err, "MEMFIT_ISA='%.40s' is not auto, portable or avx512", e);
    }
}

const mf_kernel_isa *mf_kernels_isa_get(void) {
    pthread_once(&g_once, pick);
    if (g_err[0]) mf_panic("%s", g_err);
    return g_isa;
}

int mf_kernels_isa_init(void) {
    pthread_once(&g_once, pick);
    if (g_err[0]) return mf_fail("%s", g_err);
    return mf_sgemm_init(); /* the GEMM backend's variable too */
}

int mf_kernels_isa_bf16dot_ok(void) {
#ifdef MF_HAVE_AVX512_TABLE
    return mf_kernels_isa_get() == &mf_kernels_avx512 && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

const char *mf_kernels_isa_name(void) { return mf_kernels_isa_get()->name; }
