/* fp32 GEMM entry point (see mf_sgemm in memfit/kernels.h).
 *
 * Two libraries are linked: OpenBLAS (OpenMP build) and oneDNN. On this
 * project's reference machine (2-core Zen 5, AVX-512) oneDNN's sgemm does
 * about 1.9x the flops per CPU-second of OpenBLAS 0.3.21's Cooperlake
 * kernels on every GEMM shape of a GPT-2 step (bench/gemm_paths.c,
 * docs/performance.md), so it is the default; MEMFIT_GEMM=openblas selects
 * OpenBLAS (for comparison, or where it is the faster one). Both are
 * row-major with transposes expressed as flags: no transposed copies. Both
 * run on libgomp's thread pool (no second pool to oversubscribe the cores);
 * called inside an OpenMP parallel region, each runs single-threaded.
 * The attention tiles keep calling OpenBLAS directly (small tiles inside a
 * parallel region, see flash_attention.c). */
#include "memfit/core.h"
#include "memfit/kernels.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_onednn = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_err[160];

static void pick(void) {
    const char *e = getenv("MEMFIT_GEMM");
    if (!e || !*e || strcmp(e, "auto") == 0 || strcmp(e, "onednn") == 0) g_onednn = 1;
    else if (strcmp(e, "openblas") == 0) g_onednn = 0;
    else snprintf(g_err, sizeof g_err, "MEMFIT_GEMM='%.40s' is not auto, onednn or openblas", e);
}

int mf_sgemm_init(void) {
    pthread_once(&g_once, pick);
    if (g_err[0]) return mf_fail("%s", g_err);
    return 0;
}

const char *mf_sgemm_name(void) {
    if (mf_sgemm_init()) mf_panic("%s", g_err);
    return g_onednn ? "onednn" : "openblas";
}

void mf_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (mf_sgemm_init()) mf_panic("%s", g_err);
    if (g_onednn) {
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        if (st != dnnl_success) mf_panic("oneDNN sgemm %dx%dx%d (%c%c) failed: status %d", M, N, K, ta ? 'T' : 'N',
                                         tb ? 'T' : 'N', (int)st);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
}
