/* fp32 GEMM entry point (see mf_sgemm in memfit/kernels.h).
 *
 * Two libraries are linked: OpenBLAS (OpenMP build) and oneDNN. Three
 * backends, chosen by MEMFIT_GEMM:
 *  - onednn (default): oneDNN's dnnl_sgemm, whose packing buffers are
 *    malloc'd inside the library on each call; the warm-up before the
 *    baseline (train.c) makes them runtime bytes the plan is checked with.
 *    With more than one thread, memfit splits each product itself: the
 *    longer of M and N is cut into one near-equal, 16-aligned slice per
 *    thread, and each thread runs a single-threaded dnnl_sgemm on its slice
 *    (strided views, no copies). One fork and one join per GEMM instead of
 *    oneDNN's own partition and barriers; every element of C is computed by
 *    one thread over the whole K, in the same order whatever the load, so
 *    results are the same run to run. MEMFIT_GEMM_SPLIT=0 lets oneDNN
 *    thread each call itself, as before (benches; docs/performance.md has
 *    the measurements).
 *  - matmul: oneDNN's matmul primitive (dnnl_mm.h) with a user-managed
 *    scratchpad. During a step the model hands it a plan row
 *    (mf_sgemm_scratch), so the library keeps no buffers of its own: every
 *    byte is planned. Outside a step (tools, tests, calibration) a call's
 *    scratch is allocated for the call and freed. Measured on a gpt2-124m
 *    step: 7 MiB less peak RSS, 0.91x the tokens/s (bench/gemm_backend.sh).
 *  - openblas: OpenBLAS's cblas_sgemm (its own preallocated buffers).
 * docs/performance.md has the per-shape rates (bench/gemm_paths.c). All are
 * row-major with transposes expressed as flags: no transposed copies. All
 * run on libgomp's thread pool (no second pool to oversubscribe the cores);
 * called inside an OpenMP parallel region, each runs single-threaded. The
 * attention tiles keep calling OpenBLAS directly (small tiles inside a
 * parallel region, see flash_attention.c). */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "dnnl_mm.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BK_MATMUL, BK_SGEMM, BK_OPENBLAS };
static const char *const g_names[] = {"matmul", "onednn", "openblas"};
static int g_backend = BK_SGEMM;
static int g_split = 1; /* MEMFIT_GEMM_SPLIT: 0 = oneDNN threads each sgemm itself */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_err[160];
static void *g_scratch;
static size_t g_scratch_bytes;

static int parse(const char *e) {
    if (!e || !*e || strcmp(e, "auto") == 0) return BK_SGEMM;
    for (int i = 0; i < 3; i++)
        if (strcmp(e, g_names[i]) == 0) return i;
    return -1;
}

static void pick(void) {
    const char *sp = getenv("MEMFIT_GEMM_SPLIT");
    if (sp && *sp) {
        if (strcmp(sp, "0") == 0) g_split = 0;
        else if (strcmp(sp, "1") == 0) g_split = 1;
        else snprintf(g_err, sizeof g_err, "MEMFIT_GEMM_SPLIT='%.40s' is not 0 or 1", sp);
    }
    const char *e = getenv("MEMFIT_GEMM");
    int b = parse(e);
    if (b < 0) snprintf(g_err, sizeof g_err, "MEMFIT_GEMM='%.40s' is not auto, onednn, matmul or openblas", e);
    else if (!g_err[0]) g_backend = b;
}

int mf_sgemm_init(void) {
    pthread_once(&g_once, pick);
    if (g_err[0]) return mf_fail("%s", g_err);
    return 0;
}

int mf_sgemm_use(const char *name) {
    int b = parse(name);
    if (b < 0) return mf_fail("fp32 GEMM backend '%s' is not auto, onednn, matmul or openblas", name);
    pthread_once(&g_once, pick);
    g_err[0] = 0;
    g_backend = b;
    return 0;
}

const char *mf_sgemm_name(void) {
    if (mf_sgemm_init()) mf_panic("%s", g_err);
    return g_names[g_backend];
}

static mf_mm call_of(int ta, int tb, int M, int N, int K, float alpha, int lda, int ldb, float beta, int ldc) {
    return (mf_mm){M, N, K, ta, tb, lda, ldb, ldc, dnnl_f32, dnnl_f32, alpha, beta, 0};
}

size_t mf_sgemm_scratch_bytes(int ta, int tb, int M, int N, int K, float beta) {
    if (mf_sgemm_init()) return SIZE_MAX;
    if (g_backend != BK_MATMUL || M <= 0 || N <= 0 || K <= 0) return 0;
    mf_mm s = call_of(ta, tb, M, N, K, 1.0f, ta ? M : K, tb ? K : N, beta, N);
    return mf_mm_scratch(&s);
}

void mf_sgemm_scratch(void *p, size_t bytes) {
    g_scratch = p;
    g_scratch_bytes = p ? bytes : 0;
}

static void dnnl_one(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success)
        mf_panic("oneDNN sgemm %dx%dx%d (%c%c) failed: status %d", M, N, K, ta ? 'T' : 'N', tb ? 'T' : 'N', (int)st);
}

/* Thread t of n computes rows (M >= N) or columns [lo, hi) of C, slices of
 * ceil(len / n) rounded up to 16 (whole cache lines of C and of B's rows),
 * with a single-threaded dnnl_sgemm (oneDNN runs sequentially inside an
 * OpenMP region). A slice is op(A)'s rows lo.. (A + lo, or A + lo*lda when
 * A is not transposed), or op(B)'s columns lo.. (B + lo, or B + lo*ldb
 * when B is transposed). */
static void dnnl_split(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    const int rows = M >= N, len = rows ? M : N;
#pragma omp parallel
    {
        const int n = omp_get_num_threads(), per = ((len + n - 1) / n + 15) / 16 * 16;
        const int lo = omp_get_thread_num() * per, hi = lo + per < len ? lo + per : len;
        if (lo < hi && rows)
            dnnl_one(ta, tb, hi - lo, N, K, alpha, A + (ta ? (size_t)lo : (size_t)lo * lda), lda, B, ldb, beta,
                     C + (size_t)lo * ldc, ldc);
        else if (lo < hi)
            dnnl_one(ta, tb, M, hi - lo, K, alpha, A, lda, B + (tb ? (size_t)lo * ldb : (size_t)lo), ldb, beta,
                     C + lo, ldc);
    }
}

void mf_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (mf_sgemm_init()) mf_panic("%s", g_err);
    if (g_backend == BK_MATMUL && K > 0) {
        /* the planned scratch belongs to the thread running the step; a
         * call from elsewhere (or none planned) brings its own */
        mf_mm s = call_of(ta, tb, M, N, K, alpha, lda, ldb, beta, ldc);
        void *scr = omp_in_parallel() ? NULL : g_scratch, *own = NULL;
        size_t n = scr ? g_scratch_bytes : 0;
        if (!scr) {
            n = mf_mm_scratch(&s);
            if (n == SIZE_MAX) mf_panic("fp32 GEMM %dx%dx%d: %s", M, N, K, mf_error());
            if (n && !(scr = own = malloc(n))) mf_panic("out of memory for %zu bytes of GEMM scratch", n);
        }
        if (mf_mm_run(&s, A, B, NULL, C, scr, n))
            mf_panic("fp32 GEMM %dx%dx%d (%c%c) failed (a memfit bug if the plan sized its scratch): %s", M, N, K,
                     ta ? 'T' : 'N', tb ? 'T' : 'N', mf_error());
        free(own);
        return;
    }
    if (g_backend != BK_OPENBLAS) {
        if (g_split && omp_get_max_threads() > 1 && !omp_in_parallel())
            dnnl_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        else
            dnnl_one(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
}
