/* FlashAttention forward + backward: flash_attention.c's tile loops (OpenBLAS
 * tiles, what MEMFIT_ISA=portable runs) against fa_avx512.c (the avx512
 * table's kernel), alternating in one run; prints the medians per layer and
 * the ratio. Default shape: smollm2-135m's, B4 T256, 9 query / 3 KV heads of
 * 64. Not a test. Build and run from the repository root after building
 * libmemfit (cmake --build build):
 *
 *   gcc -O3 -fopenmp -DMEMFIT_AVX512_TU=1 -Iinclude -Isrc bench/flash_isa_bench.c build/libmemfit.a \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -lm -o /tmp/flash_isa_bench
 *   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 /tmp/flash_isa_bench [reps [B T NH NKV hs]]
 */
#include "memfit/kernels.h"
#include "kernels/isa.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
#ifndef MEMFIT_AVX512_TU
    (void)argc, (void)argv;
    fprintf(stderr, "flash_isa_bench: this build has no AVX-512 table\n");
    return 1;
#else
    if (!mf_kernels_isa_avx512_ok()) {
        fprintf(stderr, "flash_isa_bench: this CPU has no AVX-512\n");
        return 1;
    }
    int reps = argc > 1 ? atoi(argv[1]) : 40, B = 4, T = 256, NH = 9, NKV = 3, hs = 64;
    if (argc > 6) B = atoi(argv[2]), T = atoi(argv[3]), NH = atoi(argv[4]), NKV = atoi(argv[5]), hs = atoi(argv[6]);
    if (reps < 1 || reps > 1000 || B < 1 || T < 1 || NKV < 1 || NH % NKV || hs < 1 || hs > MF_FA512_MAX_HS) {
        fprintf(stderr, "flash_isa_bench: bad arguments\n");
        return 1;
    }
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs;
    const size_t nq = (size_t)B * T * QKV, no = (size_t)B * T * C;
    float *qkv = malloc(nq * 4), *dq = malloc(nq * 4), *out = malloc(no * 4), *dout = malloc(no * 4);
    float *lse = malloc((size_t)B * NH * T * 4);
    float *scr = malloc(mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()) * 4);
    if (!qkv || !dq || !out || !dout || !lse || !scr) return 1;
    unsigned s = 1;
    for (size_t i = 0; i < nq; i++) s = s * 1664525u + 1013904223u, qkv[i] = (s >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < no; i++) s = s * 1664525u + 1013904223u, dout[i] = ((s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        mf_flash_forward_tiles(out, lse, qkv, B, T, NH, NKV, hs, 0, NULL);
        double t1 = now();
        mf_flash_backward_tiles(dq, scr, dout, out, qkv, lse, B, T, NH, NKV, hs, 0, NULL);
        double t2 = now();
        mf_flash_forward_avx512(out, lse, qkv, B, T, NH, NKV, hs, 0, NULL);
        double t3 = now();
        mf_flash_backward_avx512(dq, scr, dout, out, qkv, lse, B, T, NH, NKV, hs, 0, NULL);
        double t4 = now();
        t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2, t[3][r] = t4 - t3;
    }
    for (int k = 0; k < 4; k++) qsort(t[k], reps, sizeof(double), cmp);
    const double pf = t[0][reps / 2] * 1e3, pb = t[1][reps / 2] * 1e3, af = t[2][reps / 2] * 1e3, ab = t[3][reps / 2] * 1e3;
    printf("B%d T%d NH%d NKV%d hs%d, %d threads, median of %d\n", B, T, NH, NKV, hs, omp_get_max_threads(), reps);
    printf("tiles (portable): fwd %.3f ms  bwd %.3f ms\n", pf, pb);
    printf("avx512:           fwd %.3f ms  bwd %.3f ms\n", af, ab);
    printf("speed-up fwd %.2fx  bwd %.2fx  fwd+bwd %.2fx\n", pf / af, pb / ab, (pf + pb) / (af + ab));
    return 0;
#endif
}
