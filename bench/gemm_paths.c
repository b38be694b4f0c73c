/* Times every fp32 GEMM shape of a gpt2-124m B4 T256 training step on the
 * two sgemm libraries Debian ships here: OpenBLAS (cblas_sgemm, the OpenMP
 * build memfit links) and oneDNN (dnnl_sgemm), row-major, in the transpose
 * forms memfit calls (no transposed copies), alternating A B per rep. Prints
 * each shape's median GFLOP/s for both and their ratio. Not a test.
 *   build/bench_gemm_paths [reps=5] [threads=all]
 * (BLIS is not packaged in this image; see docs/performance.md.) */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchutil.h"


typedef struct { const char *what; int M, N, K, ta, tb; float beta; } shape;

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5, th = argc > 2 ? atoi(argv[2]) : omp_get_num_procs();
    if (reps < 1 || reps > 100 || th < 1) {
        fprintf(stderr, "bench_gemm_paths: usage: bench_gemm_paths [reps 1..100] [threads>=1]\n");
        return 2;
    }
    omp_set_num_threads(th);
    openblas_set_num_threads(th);
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
    size_t big = (size_t)Vp * C;
    float *A = malloc(big * 4), *B = malloc(big * 4), *Cm = malloc(big * 4);
    double *t0 = malloc((size_t)reps * sizeof(double)), *t1 = malloc((size_t)reps * sizeof(double));
    double *c0 = malloc((size_t)reps * sizeof(double)), *c1 = malloc((size_t)reps * sizeof(double));
    if (!A || !B || !Cm || !t0 || !t1 || !c0 || !c1) { fprintf(stderr, "bench_gemm_paths: out of memory\n"); return 1; }
    for (size_t i = 0; i < big; i++) A[i] = (float)(i % 97) * 1e-3f, B[i] = (float)(i % 89) * 1e-3f, Cm[i] = 0;
    double tot0 = 0, tot1 = 0, ctot0 = 0, ctot1 = 0, flops = 0;
    printf("%-16s %6s %6s %6s  %29s  %29s\n", "", "", "", "", "GFLOP per wall second", "GFLOP per CPU second");
    printf("%-16s %6s %6s %6s  %10s %10s %7s  %10s %10s %7s\n", "gemm", "M", "N", "K", "openblas", "onednn", "dnnl/ob",
           "openblas", "onednn", "dnnl/ob");
    for (int s = 0; s < ns; s++) {
        const shape *q = &sh[s];
        int lda = q->ta ? q->M : q->K, ldb = q->tb ? q->K : q->N, ldc = q->N;
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up of both */
            double ca = bench_cpu(), a = bench_now();
            cblas_sgemm(CblasRowMajor, q->ta ? CblasTrans : CblasNoTrans, q->tb ? CblasTrans : CblasNoTrans, q->M, q->N,
                        q->K, 1.0f, A, lda, B, ldb, q->beta, Cm, ldc);
            double b = bench_now(), cb = bench_cpu();
            dnnl_sgemm(q->ta ? 'T' : 'N', q->tb ? 'T' : 'N', q->M, q->N, q->K, 1.0f, A, lda, B, ldb, q->beta, Cm, ldc);
            double c = bench_now(), cc = bench_cpu();
            if (r >= 0) t0[r] = b - a, t1[r] = c - b, c0[r] = cb - ca, c1[r] = cc - cb;
        }
        qsort(t0, (size_t)reps, sizeof(double), bench_cmpd);
        qsort(t1, (size_t)reps, sizeof(double), bench_cmpd);
        qsort(c0, (size_t)reps, sizeof(double), bench_cmpd);
        qsort(c1, (size_t)reps, sizeof(double), bench_cmpd);
        double f = 2.0 * q->M * (double)q->N * q->K, m0 = t0[reps / 2], m1 = t1[reps / 2];
        /* per step: 12 layers of each block GEMM, 4 chunks of each head GEMM */
        int per = s < 12 ? 12 : s < 15 ? 4 : 0;
        tot0 += per * m0, tot1 += per * m1, flops += per * f;
        double k0 = c0[reps / 2], k1 = c1[reps / 2];
        ctot0 += per * k0, ctot1 += per * k1;
        printf("%-16s %6d %6d %6d  %10.1f %10.1f %7.2f  %10.1f %10.1f %7.2f\n", q->what, q->M, q->N, q->K,
               f / m0 * 1e-9, f / m1 * 1e-9, m0 / m1, f / k0 * 1e-9, f / k1 * 1e-9, k0 / k1);
    }
    printf("%-16s %20s  %10.1f %10.1f %7.2f  %10.1f %10.1f %7.2f   (one step's GEMMs, %.0f GFLOP)\n", "step total", "",
           flops / tot0 * 1e-9, flops / tot1 * 1e-9, tot0 / tot1, flops / ctot0 * 1e-9, flops / ctot1 * 1e-9,
           ctot0 / ctot1, flops * 1e-9);
    free(A), free(B), free(Cm), free(t0), free(t1), free(c0), free(c1);
    return 0;
}
