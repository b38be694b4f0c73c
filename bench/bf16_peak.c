/* The machine's bf16 multiply-add peak: twelve independent vdpbf16ps
 * chains per thread (registers only: no loads, no dependencies a core must
 * wait on), 1 thread and all threads, each repeated and the best kept.
 * One vdpbf16ps on zmm registers does 32 bf16 pair products added into 16
 * fp32 lanes: 64 FLOPs. What a bf16 GEMM, and so a bf16 training step,
 * can at most reach here (docs/performance.md). Not a test.
 *
 *   gcc -O2 -mavx512f -mavx512bf16 -fopenmp bench/bf16_peak.c -o /tmp/bf16_peak && /tmp/bf16_peak
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s of `threads` threads, each running `iters` rounds of 12 vdpbf16ps */
static double run(int threads, long iters) {
    float sink = 0;
    double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        /* twelve named accumulators: an array would live in memory */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
               a9 = a0, a10 = a0, a11 = a0;
        const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3c00);
        for (long n = 0; n < iters; n++) {
            a0 = _mm512_dpbf16_ps(a0, x, y), a1 = _mm512_dpbf16_ps(a1, x, y), a2 = _mm512_dpbf16_ps(a2, x, y);
            a3 = _mm512_dpbf16_ps(a3, x, y), a4 = _mm512_dpbf16_ps(a4, x, y), a5 = _mm512_dpbf16_ps(a5, x, y);
            a6 = _mm512_dpbf16_ps(a6, x, y), a7 = _mm512_dpbf16_ps(a7, x, y), a8 = _mm512_dpbf16_ps(a8, x, y);
            a9 = _mm512_dpbf16_ps(a9, x, y), a10 = _mm512_dpbf16_ps(a10, x, y), a11 = _mm512_dpbf16_ps(a11, x, y);
            /* the loop may not be folded away */
            __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                             "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
        }
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
        sink += _mm512_reduce_add_ps(s);
    }
    double t = now() - t0;
    if (sink < 0) printf("impossible\n"); /* keeps the sums */
    return (double)iters * 12 * 64 * threads / t / 1e9;
}

int main(void) {
    if (!__builtin_cpu_supports("avx512bf16")) {
        fprintf(stderr, "bf16_peak: this CPU has no AVX512_BF16\n");
        return 1;
    }
    int all = omp_get_max_threads();
    for (int th = 1; th <= all; th = th == all ? all + 1 : all) {
        double best = 0;
        for (int r = 0; r < 5; r++) {
            double g = run(th, 20000000);
            if (g > best) best = g;
        }
        printf("%d thread%s: %.1f GFLOP/s bf16 (best of 5)\n", th, th > 1 ? "s" : "", best);
    }
    return 0;
}
