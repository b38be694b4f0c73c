/* A block's twelve fp32 GEMMs (GPT-2's four projections C -> 3C, C -> C,
 * C -> 4C, 4C -> C, each as forward x W, weight gradient x^T dY
 * accumulated, input gradient dY W^T), in sequence, two ways alternating
 * round by round: hot, the same three buffers for every product (the
 * planner's calibration until 2026-11-28), and from a pool, each product's
 * operands the next stretch of a pool of POOL MiB (the calibration now,
 * POOL 64: src/planner/rates.c). Prints the median round of each and the
 * ratio pool/hot: what operands that come from memory, as a step's do,
 * cost at these shapes. Not a test.
 *   build/bench_gemm_cold [rows=1024] [C=128] [rounds=60] [pool MiB=64] [threads=all] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "memfit/train.h"

int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 1024, C = argc > 2 ? atoi(argv[2]) : 128;
    int R = argc > 3 ? atoi(argv[3]) : 60, mib = argc > 4 ? atoi(argv[4]) : 64;
    int th = argc > 5 ? atoi(argv[5]) : omp_get_num_procs();
    if (M < 1 || C < 1 || R < 3 || R > 1000 || mib < 1 || th < 1) {
        fprintf(stderr, "bench_gemm_cold: usage: bench_gemm_cold [rows] [C] [rounds 3..1000] [pool MiB] [threads]\n");
        return 2;
    }
    mf_threads_setup(th);
    const size_t big = (size_t)M * 4 * C > (size_t)16 * C * C ? (size_t)M * 4 * C : (size_t)16 * C * C;
    size_t pool = ((size_t)mib << 20) / sizeof(float);
    if (pool < 3 * big + 48) pool = 3 * big + 48;
    float *P = malloc(pool * sizeof(float));
    double *hot = malloc(R * sizeof(double)), *cold = malloc(R * sizeof(double));
    if (!P || !hot || !cold) { fprintf(stderr, "bench_gemm_cold: out of memory\n"); return 1; }
    for (size_t i = 0; i < pool; i++) P[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    const int io[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    int form[12][6]; /* tA, tB, accumulate, m, n, k */
    for (int p = 0; p < 4; p++) {
        int in = io[p][0], out = io[p][1];
        const int f3[3][6] = {{0, 0, 0, M, out, in}, {1, 0, 1, in, out, M}, {0, 1, 0, M, in, out}};
        memcpy(form[3 * p], f3, sizeof f3);
    }
    double flops = 0;
    for (int f = 0; f < 12; f++) flops += 2.0 * form[f][3] * form[f][4] * form[f][5];
    size_t off = 0;
    for (int r = 0; r < R; r++)
        for (int from_pool = 0; from_pool < 2; from_pool++) {
            double t0 = bench_now();
            for (int f = 0; f < 12; f++) {
                int m = form[f][3], n = form[f][4], k = form[f][5], tA = form[f][0], tB = form[f][1];
                float *a = P, *b = P + big, *c = P + 2 * big;
                if (from_pool) {
                    size_t need = ((size_t)m * k + 15) / 16 * 16 + ((size_t)k * n + 15) / 16 * 16 + (size_t)m * n;
                    if (off + need > pool) off = 0;
                    a = P + off; off += ((size_t)m * k + 15) / 16 * 16;
                    b = P + off; off += ((size_t)k * n + 15) / 16 * 16;
                    c = P + off; off += ((size_t)m * n + 15) / 16 * 16;
                }
                mf_sgemm(tA, tB, m, n, k, 1.0f, a, tA ? m : k, b, tB ? k : n, form[f][2] ? 1.0f : 0.0f, c, n);
            }
            (from_pool ? cold : hot)[r] = bench_now() - t0;
        }
    /* the first round of each warms up */
    double h = bench_median(hot + 1, R - 1), c = bench_median(cold + 1, R - 1);
    printf("rows %d C %d, %d threads: hot %.3f ms a round (%.0f GFLOP/s), pool %d MiB %.3f ms (%.0f GFLOP/s), pool/hot %.3f\n",
           M, C, th, 1e3 * h, flops / h / 1e9, mib, 1e3 * c, flops / c / 1e9, c / h);
    free(P); free(hot); free(cold);
    return 0;
}
