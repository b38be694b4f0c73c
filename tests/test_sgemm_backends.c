/* Proves every fp32 GEMM backend of mf_sgemm (onednn, the default; matmul;
 * openblas) computes C = alpha op(A) op(B) + beta C:
 *  - all four transpose forms, beta 0 (C never read: it starts as NaN), 1
 *    and 0.5, alpha 1 and 0.25, leading dimensions wider than the matrices,
 *    on odd shapes and on shapes the matmul backend splits into column and
 *    K blocks (N and K above 1024, not multiples of any block), and on
 *    shapes the onednn backend slices by rows and by columns across the
 *    threads (MEMFIT_GEMM_SPLIT; test_sgemm_backends_unsplit runs it with
 *    oneDNN threading each call), against a
 *    double-precision product: within K * 2^-22 of sum |a||b| + |beta c|;
 *  - with a planned scratch (mf_sgemm_scratch) of exactly
 *    mf_sgemm_scratch_bytes, nothing is written outside it;
 *  - a bad MEMFIT_GEMM name is refused with a message. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "memfit/train.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float urand(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (float)((rng >> 11) * 0x1p-53) * 2 - 1; }

static void run(const char *backend, int M, int N, int K, int ta, int tb, float alpha, float beta, int pad) {
    /* op(A) is (M,K): A is stored (M,K), or (K,M) when ta; likewise B */
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = malloc((size_t)ar * lda * 4), *B = malloc((size_t)br * ldb * 4), *C = malloc((size_t)M * ldc * 4);
    float *C0 = malloc((size_t)M * ldc * 4);
    for (size_t i = 0; i < (size_t)ar * lda; i++) A[i] = urand();
    for (size_t i = 0; i < (size_t)br * ldb; i++) B[i] = urand();
    for (size_t i = 0; i < (size_t)M * ldc; i++) C0[i] = C[i] = beta != 0.0f ? urand() : NAN;
    size_t need = mf_sgemm_scratch_bytes(ta, tb, M, N, K, beta);
    CHECK(need != SIZE_MAX, "%s: scratch query failed: %s", backend, mf_error());
    if (need == SIZE_MAX) need = 0;
    unsigned char *scr = malloc(need + 128);
    memset(scr, 0xA5, need + 128);
    mf_sgemm_scratch(need ? scr + 64 : NULL, need);
    mf_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    mf_sgemm_scratch(NULL, 0);
    int guard = 1;
    for (size_t i = 0; i < 64; i++) guard &= scr[i] == 0xA5 && scr[64 + need + i] == 0xA5;
    CHECK(guard, "%s %dx%dx%d: the GEMM wrote outside its %zu bytes of scratch", backend, M, N, K, need);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b, mag += fabs(a * b);
            }
            double c0 = beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0;
            double want = alpha * s + beta * c0, tol = (K + 2) * 0x1p-22 * (fabs(alpha) * mag + fabs(beta * c0));
            double err = fabs(C[(size_t)i * ldc + j] - want);
            if (!(err <= tol)) bad++;
            if (err / (tol > 0 ? tol : 1) > worst) worst = err / (tol > 0 ? tol : 1);
        }
    /* the padding columns of C are never written */
    for (int i = 0; i < M && pad; i++)
        for (int j = N; j < ldc; j++) {
            float g = C[(size_t)i * ldc + j], w = C0[(size_t)i * ldc + j];
            if (!(g == w || (isnan(g) && isnan(w)))) bad++;
        }
    CHECK(bad == 0, "%s %dx%dx%d t%d%d alpha %g beta %g pad %d: %d values wrong (worst %.2f of the bound)", backend, M,
          N, K, ta, tb, alpha, beta, pad, bad, worst);
    free(A), free(B), free(C), free(C0), free(scr);
}

int main(void) {
    /* three threads: uneven slices, one of them a remainder (below) */
    mf_threads_setup(3);
    const char *backends[] = {"matmul", "onednn", "openblas"};
    /* the onednn backend slices the longer of M and N into 16-aligned
     * parts per thread: {70, 9, 33} is cut by rows (32, 32, 6), the wider
     * ones by columns ({33, 65, 17}: 32, 32, 1) */
    const int shapes[][3] = {{1, 1, 1},      {7, 13, 5},      {33, 65, 17},    {19, 2500, 37},
                             {23, 41, 2100}, {9, 1100, 1300}, {70, 9, 33}};
    for (int b = 0; b < 3; b++) {
        CHECK(mf_sgemm_use(backends[b]) == 0, "%s", mf_error());
        CHECK(strcmp(mf_sgemm_name(), backends[b]) == 0, "backend %s reads as %s", backends[b], mf_sgemm_name());
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++) {
                const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.25f, 0.5f}};
                for (int k = 0; k < 3; k++)
                    run(backends[b], shapes[s][0], shapes[s][1], shapes[s][2], t >> 1, t & 1, ab[k][0], ab[k][1],
                        k == 2 ? 3 : 0);
            }
    }
    CHECK(mf_sgemm_use("mkl") == -1 && strstr(mf_error(), "mkl"), "a bad backend name is refused with its name");
    return mf_test_done("test_sgemm_backends");
}
