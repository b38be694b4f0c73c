/* Times the MoE kernels (src/kernels/moe.c; docs/moe.md) against a dense
 * SwiGLU MLP doing the same GEMM work: N tokens through k of E experts of
 * width F, against N tokens through one MLP of width k*F (every expert's
 * rows, summed, are the dense MLP's). The difference is the MoE overhead:
 * router, permutation, gather/scatter and E smaller GEMMs instead of one.
 * Forward + backward, the two alternating in one run; medians of wall and
 * process-CPU time and their ratio. Not a test. Built with the project
 * (cmake --build build --target bench_moe):
 *
 *   OMP_NUM_THREADS=2 build/bench_moe [reps]
 */
#include "memfit/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"

static float *fill(size_t n, unsigned s) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)(((i + s) * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return v;
}

/* dense SwiGLU MLP, width H: forward and backward (llm.c style, mf_sgemm) */
static void dense(float *y, float *dx, float *h1, float *h3, float *ha, float *d1, float *d3, float *dw1,
                  float *dw3, float *dw2, const float *x, const float *dy, const float *w1, const float *w3,
                  const float *w2, int N, int C, int H) {
    mf_sgemm(0, 1, N, H, C, 1, x, C, w1, C, 0, h1, H);
    mf_sgemm(0, 1, N, H, C, 1, x, C, w3, C, 0, h3, H);
    mf_swiglu_forward(ha, h1, h3, (size_t)N * H);
    mf_sgemm(0, 1, N, C, H, 1, ha, H, w2, H, 0, y, C);
    mf_sgemm(0, 0, N, H, C, 1, dy, C, w2, H, 0, d1, H);
    mf_sgemm(1, 0, C, H, N, 1, dy, C, ha, H, 1, dw2, H);
    mf_swiglu_backward(ha, d3, d1, h1, h3, (size_t)N * H); /* dh1 into ha (no longer needed) */
    mf_sgemm(1, 0, H, C, N, 1, ha, H, x, C, 1, dw1, C);
    mf_sgemm(1, 0, H, C, N, 1, d3, H, x, C, 1, dw3, C);
    mf_sgemm(0, 0, N, C, H, 1, ha, H, w1, C, 0, dx, C);
    mf_sgemm(0, 0, N, C, H, 1, d3, H, w3, C, 1, dx, C);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1 || reps > 64) reps = 9;
    const int N = 1024, C = 256, F = 512, E = 8, k = 2, H = k * F;
    mf_moe_dims d = {.N = N, .C = C, .F = F, .E = E, .k = k, .norm_topk_prob = 1};
    size_t b[MF_MOE_BUF_COUNT];
    if (mf_moe_buffer_sizes(b, NULL, NULL, N, k, E, C, F, 0)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    void *B[MF_MOE_BUF_COUNT];
    for (int i = 0; i < MF_MOE_BUF_COUNT; i++) B[i] = calloc(1, b[i]);
    mf_moe_route r = {B[MF_MOE_BUF_PROBS], B[MF_MOE_BUF_LSE], B[MF_MOE_BUF_TOPK_IDX], B[MF_MOE_BUF_TOPK_W],
                      B[MF_MOE_BUF_FRAC]};
    mf_moe_acts a = {B[MF_MOE_BUF_OFFSETS], B[MF_MOE_BUF_SLOT_ROW], B[MF_MOE_BUF_XP], B[MF_MOE_BUF_H1],
                     B[MF_MOE_BUF_H3], B[MF_MOE_BUF_HA], B[MF_MOE_BUF_YP]};
    mf_moe_work w = {B[MF_MOE_BUF_DLOGITS], B[MF_MOE_BUF_DTOPK_W], B[MF_MOE_BUF_DYP], B[MF_MOE_BUF_DH1],
                     B[MF_MOE_BUF_DH3]};
    const size_t NC = (size_t)N * C, EFC = (size_t)E * F * C, NH = (size_t)N * H;
    float *x = fill(NC, 1), *dy = fill(NC, 2), *wg = fill((size_t)E * C, 3), *w1 = fill(EFC, 4), *w3 = fill(EFC, 5),
          *w2 = fill(EFC, 6), *y = calloc(NC, 4), *dx = calloc(NC, 4), *dwg = calloc((size_t)E * C, 4),
          *dw1 = calloc(EFC, 4), *dw3 = calloc(EFC, 4), *dw2 = calloc(EFC, 4);
    float *h1 = calloc(NH, 4), *h3 = calloc(NH, 4), *ha = calloc(NH, 4), *d1 = calloc(NH, 4), *d3 = calloc(NH, 4);
    double t[2][64], c[2][64], aux, z;
    int dropped;
    for (int rep = -1; rep < reps; rep++)
        for (int m = 0; m < 2; m++) {
            double w0 = bench_now(), c0 = bench_cpu();
            if (m == 0) { /* dense: the same flops, the first k*F rows of the stacks as its weights */
                dense(y, dx, h1, h3, ha, d1, d3, dw1, dw3, dw2, x, dy, w1, w3, w2, N, C, H);
            } else {
                memset(dx, 0, NC * 4);
                mf_moe_router_forward(&r, &aux, &z, x, wg, &d);
                mf_moe_dispatch(&a, &dropped, &r, &d);
                mf_moe_experts_forward(y, &a, x, &r, w1, w3, w2, &d);
                mf_moe_experts_backward(dx, dw1, dw3, dw2, &w, dy, &a, &r, w1, w3, w2, &d);
                mf_moe_router_backward(dx, dwg, &w, &r, x, wg, 0.01f, 0.001f, &d);
            }
            if (rep >= 0) t[m][rep] = bench_now() - w0, c[m][rep] = bench_cpu() - c0;
        }
    const double td = bench_median(t[0], reps), tm = bench_median(t[1], reps);
    const double cd = bench_median(c[0], reps), cm = bench_median(c[1], reps);
    printf("bench_moe: N %d C %d F %d E %d k %d, forward+backward, %d reps alternating, gemm %s, isa %s\n", N, C, F,
           E, k, reps, mf_sgemm_name(), mf_kernels_isa_name());
    printf("dense SwiGLU width %d: wall %.2f ms  cpu %.2f ms\n", H, td * 1e3, cd * 1e3);
    printf("moe  %d experts top-%d: wall %.2f ms  cpu %.2f ms\n", E, k, tm * 1e3, cm * 1e3);
    printf("moe / dense: wall %.2fx  cpu %.2fx\n", tm / td, cm / cd);
    return 0;
}
