/* Times every fp32 GEMM shape of a gpt2-124m B4 T256 training step on the
 * three fp32 backends mf_sgemm has (MEMFIT_GEMM): OpenBLAS (cblas_sgemm,
 * the OpenMP build memfit links), oneDNN's dnnl_sgemm (the default), and oneDNN's matmul
 * primitive with a caller-owned scratchpad, row-major, in the
 * transpose forms memfit calls (no transposed copies), alternating A B C per
 * rep. Prints each shape's median GFLOP/s per wall second for the three,
 * and the matmul/sgemm ratio. Not a test.
 *   build/bench_gemm_paths [reps=5] [threads=all]
 * (BLIS is not packaged in this image; see docs/performance.md.) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchutil.h"
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "memfit/train.h"

typedef struct { const char *what; int M, N, K, ta, tb; float beta; } shape;

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5, th = argc > 2 ? atoi(argv[2]) : omp_get_num_procs();
    if (reps < 1 || reps > 100 || th < 1) {
        fprintf(stderr, "bench_gemm_paths: usage: bench_gemm_paths [reps 1..100] [threads>=1]\n");
        return 2;
    }
    mf_threads_setup(th);
    const int N = 1024, C = 768, R = 256, Vp = 50304;
    const shape sh[] = {
        {"qkv fwd     x W", N, 3 * C, C, 0, 0, 0}, {"qkv dW   x^T dY", C, 3 * C, N, 1, 0, 1},
        {"qkv dX   dY W^T", N, C, 3 * C, 0, 1, 0}, {"proj fwd    x W", N, C, C, 0, 0, 0},
        {"proj dW  x^T dY", C, C, N, 1, 0, 1},     {"proj dX  dY W^T", N, C, C, 0, 1, 0},
        {"fc fwd      x W", N, 4 * C, C, 0, 0, 0}, {"fc dW    x^T dY", C, 4 * C, N, 1, 0, 1},
        {"fc dX    dY W^T", N, C, 4 * C, 0, 1, 0}, {"fcp fwd     x W", N, C, 4 * C, 0, 0, 0},
        {"fcp dW   x^T dY", 4 * C, C, N, 1, 0, 1}, {"fcp dX   dY W^T", N, 4 * C, C, 0, 1, 0},
        {"head fwd  x E^T", R, Vp, C, 0, 1, 0},    {"head dX    dZ E", R, C, Vp, 0, 0, 0},
        {"head dE  dZ^T x", Vp, C, R, 1, 0, 1},
        {"square 2048", 2048, 2048, 2048, 0, 0, 0}, /* the reference rate, not in the step */
    };
    const int ns = (int)(sizeof sh / sizeof sh[0]);
    const char *bk[3] = {"openblas", "onednn", "matmul"};
    size_t big = (size_t)Vp * C, scr = 0;
    for (int s = 0; s < ns; s++) {
        if (mf_sgemm_use("matmul")) { fprintf(stderr, "bench_gemm_paths: %s\n", mf_error()); return 1; }
        size_t n = mf_sgemm_scratch_bytes(sh[s].ta, sh[s].tb, sh[s].M, sh[s].N, sh[s].K, sh[s].beta);
        if (n == SIZE_MAX) { fprintf(stderr, "bench_gemm_paths: %s\n", mf_error()); return 1; }
        if (n > scr) scr = n;
    }
    float *A = malloc(big * 4), *B = malloc(big * 4), *Cm = malloc(big * 4);
    void *S = malloc(scr ? scr : 1);
    double *t[3], tot[3] = {0, 0, 0}, flops = 0;
    for (int b = 0; b < 3; b++) t[b] = malloc((size_t)reps * sizeof(double));
    if (!A || !B || !Cm || !S || !t[0] || !t[1] || !t[2]) { fprintf(stderr, "bench_gemm_paths: out of memory\n"); return 1; }
    for (size_t i = 0; i < big; i++) A[i] = (float)(i % 97) * 1e-3f, B[i] = (float)(i % 89) * 1e-3f, Cm[i] = 0;
    mf_sgemm_scratch(S, scr);
    printf("fp32 GEMM, GFLOP per wall second (median of %d), %d threads; matmul scratch %zu KiB at most\n", reps, th,
           scr >> 10);
    printf("%-16s %6s %6s %6s  %9s %9s %9s  %14s\n", "gemm", "M", "N", "K", bk[0], bk[1], bk[2], "matmul/onednn");
    for (int s = 0; s < ns; s++) {
        const shape *q = &sh[s];
        int lda = q->ta ? q->M : q->K, ldb = q->tb ? q->K : q->N, ldc = q->N;
        for (int r = -1; r < reps; r++) /* r = -1: warm-up of all three */
            for (int b = 0; b < 3; b++) {
                mf_sgemm_use(bk[b]);
                double t0 = bench_now();
                mf_sgemm(q->ta, q->tb, q->M, q->N, q->K, 1.0f, A, lda, B, ldb, q->beta, Cm, ldc);
                if (r >= 0) t[b][r] = bench_now() - t0;
            }
        double f = 2.0 * q->M * (double)q->N * q->K, m[3];
        /* per step: 12 layers of each block GEMM, 4 chunks of each head GEMM */
        int per = s < 12 ? 12 : s < 15 ? 4 : 0;
        for (int b = 0; b < 3; b++) {
            qsort(t[b], (size_t)reps, sizeof(double), bench_cmpd);
            m[b] = t[b][reps / 2];
            tot[b] += per * m[b];
        }
        flops += per * f;
        printf("%-16s %6d %6d %6d  %9.1f %9.1f %9.1f  %14.2f\n", q->what, q->M, q->N, q->K, f / m[0] * 1e-9,
               f / m[1] * 1e-9, f / m[2] * 1e-9, m[1] / m[2]);
    }
    printf("%-16s %20s  %9.1f %9.1f %9.1f  %14.2f   (one step's GEMMs, %.0f GFLOP)\n", "step total", "",
           flops / tot[0] * 1e-9, flops / tot[1] * 1e-9, flops / tot[2] * 1e-9, tot[1] / tot[2], flops * 1e-9);
    mf_sgemm_scratch(NULL, 0);
    free(A), free(B), free(Cm), free(S);
    for (int b = 0; b < 3; b++) free(t[b]);
    return 0;
}
