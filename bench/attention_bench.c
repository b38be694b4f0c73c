/* Times naive attention (mf_attention_*, stores B*NH*T*T probabilities)
 * against FlashAttention (mf_flash_attention_*, stores B*NH*T lse) forward
 * and backward, and prints the medians, their ratio, and the bytes of the
 * naive att buffer (+ its backward scratch) vs flash's lse + scratch.
 * Not a test. Build and run from the repository root:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O3 -march=x86-64-v2 -fopenmp -Wall -Wextra \
 *       -Iinclude -Isrc -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *       src/core/util.c src/kernels/[a-z]*.c bench/attention_bench.c \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm \
 *       -o /tmp/attention_bench && /tmp/attention_bench [reps]
 *
 * (add -DMF_FLASH_NO_BLAS to time flash's plain-loop tile products)
 */
#include "memfit/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"


static void bench(int B, int T, int C, int NH, int reps) {
    const int hs = C / NH, nt = omp_get_max_threads();
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T, nlse = (size_t)B * NH * T;
    const size_t nscr = mf_attention_scratch_floats(T, nt);
    const size_t fscr = mf_flash_attention_scratch_floats(T, hs, nt);
    float *qkv = malloc(nqkv * 4), *dout = malloc(nout * 4), *out = malloc(nout * 4);
    float *dqkv = malloc(nqkv * 4), *att = malloc(natt * 4), *scr = malloc(nscr * 4);
    float *lse = malloc(nlse * 4), *fs = malloc(fscr * 4);
    if (!qkv || !dout || !out || !dqkv || !att || !scr || !lse || !fs) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    unsigned s = 12345;
    for (size_t i = 0; i < nqkv; i++) { s = s * 1664525u + 1013904223u; qkv[i] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    for (size_t i = 0; i < nout; i++) { s = s * 1664525u + 1013904223u; dout[i] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    memset(att, 0, natt * 4);
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = malloc((size_t)reps * sizeof(double));
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double a = omp_get_wtime();
        mf_attention_forward(out, att, qkv, B, T, C, NH);
        double b = omp_get_wtime();
        mf_attention_backward(dqkv, scr, dout, qkv, att, B, T, C, NH);
        double c = omp_get_wtime();
        mf_flash_attention_forward(out, lse, qkv, B, T, C, NH);
        double d = omp_get_wtime();
        mf_flash_attention_backward(dqkv, fs, dout, out, qkv, lse, B, T, C, NH);
        double e = omp_get_wtime();
        if (r >= 0) {
            t[0][r] = (b - a) * 1e3; t[1][r] = (c - b) * 1e3;
            t[2][r] = (d - c) * 1e3; t[3][r] = (e - d) * 1e3;
        }
    }
    double tot_n[64], tot_f[64];
    for (int r = 0; r < reps && r < 64; r++) { tot_n[r] = t[0][r] + t[1][r]; tot_f[r] = t[2][r] + t[3][r]; }
    const int nr = reps < 64 ? reps : 64;
    const double mn = bench_median(tot_n, nr), mf = bench_median(tot_f, nr);
    const double nf = bench_median(t[0], reps), nb = bench_median(t[1], reps);
    const double ff = bench_median(t[2], reps), fb = bench_median(t[3], reps);
    printf("B=%d T=%d C=%d NH=%d threads=%d reps=%d (medians)\n", B, T, C, NH, nt, reps);
    printf("  naive: fwd %8.2f ms  bwd %8.2f ms  total %8.2f ms\n", nf, nb, mn);
    printf("  flash: fwd %8.2f ms  bwd %8.2f ms  total %8.2f ms\n", ff, fb, mf);
    printf("  flash/naive: fwd %.2fx  bwd %.2fx  total %.2fx\n", ff / nf, fb / nb, mf / mn);
    printf("  memory: naive att %zu B + bwd scratch %zu B; flash lse %zu B + bwd scratch %zu B\n",
           natt * 4, nscr * 4, nlse * 4, fscr * 4);
    for (int k = 0; k < 4; k++) free(t[k]);
    free(qkv); free(dout); free(out); free(dqkv); free(att); free(scr); free(lse); free(fs);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 64) { fprintf(stderr, "reps in 1..64\n"); return 1; }
    bench(4, 256, 768, 12, reps);
    bench(1, 2048, 768, 12, reps);
    return 0;
}
