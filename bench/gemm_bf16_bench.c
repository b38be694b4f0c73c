/* Times fp32 sgemm (OpenBLAS) against the bf16 matmul memfit uses
 * (mf_gemm_bf16: oneDNN, fp32 accumulation) on GPT-2 124M's GEMM shapes at
 * batch 4 x seq 256 and on a 2048^3 square, alternating A B A B, and prints
 * each one's median GFLOP/s and the ratio. Not a test. From the repository
 * root, after `make` (or any cmake build of build/):
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -Iinclude -Isrc \
 *       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/gemm_bf16_bench.c \
 *       build/libmemfit.a -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -lm \
 *       -o /tmp/gemm_bf16_bench && /tmp/gemm_bf16_bench [reps]
 */
#include "memfit/core.h"
#include "kernels/half.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchutil.h"


int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 1000) reps = 7;
    struct { const char *what; int M, N, K; } shapes[] = {
        {"c_attn fwd", 1024, 2304, 768}, {"attn.c_proj fwd", 1024, 768, 768}, {"c_fc fwd", 1024, 3072, 768},
        {"mlp.c_proj fwd", 1024, 768, 3072}, {"square 2048", 2048, 2048, 2048},
    };
    printf("threads %d; oneDNN bf16 kernel: %s; %d reps, medians\n", omp_get_max_threads(), mf_gemm_bf16_impl(), reps);
    printf("%-16s %6s %6s %6s %12s %12s %7s\n", "shape", "M", "N", "K", "sgemm GF/s", "bf16 GF/s", "ratio");
    double gsum_s = 0, gsum_b = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)K * N * 4), *C = malloc((size_t)M * N * 4);
        mf_bf16 *Ah = malloc((size_t)M * K * 2), *Bh = malloc((size_t)K * N * 2);
        for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)rand() / RAND_MAX - 0.5f;
        mf_bf16_from_f32(Ah, A, (size_t)M * K);
        mf_bf16_from_f32(Bh, B, (size_t)K * N);
        size_t ns = mf_gemm_bf16_scratch_bytes(M, N, K, 0, 0, 0, 0, 0);
        void *scr = ns ? malloc(ns) : NULL;
        double ts[1000], tb[1000], fl = 2.0 * M * N * K;
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up, untimed */
            double t0 = bench_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, A, K, B, N, 0, C, N);
            double t1 = bench_now();
            if (mf_gemm_bf16(C, Ah, Bh, NULL, M, N, K, 0, 0, 0, 0, scr)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
            double t2 = bench_now();
            if (r >= 0) { ts[r] = t1 - t0; tb[r] = t2 - t1; }
        }
        qsort(ts, reps, sizeof *ts, bench_cmpd);
        qsort(tb, reps, sizeof *tb, bench_cmpd);
        double gs = fl / ts[reps / 2] / 1e9, gb = fl / tb[reps / 2] / 1e9;
        if (s < 4) { gsum_s += fl / gs; gsum_b += fl / gb; }
        printf("%-16s %6d %6d %6d %12.1f %12.1f %6.2fx\n", shapes[s].what, M, N, K, gs, gb, gb / gs);
        free(A); free(B); free(C); free(Ah); free(Bh); free(scr);
    }
    printf("GPT-2 forward shapes together: bf16 %.2fx the sgemm time\n", gsum_b / gsum_s);
    return 0;
}
