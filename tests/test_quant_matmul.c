/* Proves the frozen-base GEMMs of quant/quant.h compute what they say, for
 * fp32, bf16, int8 and nf4 weights, at gpt2-124m's shapes (K=768, N=2304;
 * K=3072, N=768) and odd ones (K, N not multiples of the tile, the block or
 * 2; M = 1, 2, 3, 5, 7, 11, 13), bias on and off:
 *  - out = inp @ W (+ bias) and dinp += dout @ W^T, where W is the whole
 *    matrix dequantised by mf_quant_unpack, summed here in double: every
 *    element within 1e-5 of the sum of |terms| (fp32 accumulation error);
 *  - forward overwrites out (it starts as NaN), backward accumulates into
 *    dinp (it starts random);
 *  - the functions touch no scratch beyond mf_quant_matmul_scratch_bytes:
 *    the scratch is malloc'ed exactly that size (ASan in the sanitizer build)
 *    and a guard pattern past it stays intact in a second call;
 *  - scratch is a tile of rows, never the whole matrix, once K exceeds the
 *    tile; fp32 needs none;
 *  - all of the above with 1, 2, 3 and 5 OpenMP threads (the scratch is
 *    split between them). */
#include "memfit/core.h"
#include "quant/quant.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static mf_rng rng;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

static float *randn(size_t n, float s) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = s * mf_rng_normal(&rng);
    return x;
}

static void check_shape(mf_quant_kind k, int M, int K, int N, int with_bias) {
    const char *kn = mf_quant_name(k);
    float *w = randn((size_t)K * N, 0.02f), *inp = randn((size_t)M * K, 1.0f), *dout = randn((size_t)M * N, 1.0f);
    float *bias = with_bias ? randn((size_t)N, 0.1f) : NULL;
    void *wq = xmalloc(mf_quant_bytes(k, (int64_t)K * N));
    mf_quant_pack(k, wq, w, (int64_t)K * N);
    float *wd = xmalloc((size_t)K * N * sizeof(float)); /* the reference's whole dequantised matrix */
    mf_quant_unpack(k, wd, wq, 0, (int64_t)K * N);

    size_t sb = mf_quant_matmul_scratch_bytes(k, M, K, N);
    if (k == MF_QUANT_F32) CHECK(sb == 0, "fp32 needs no scratch, got %zu", sb);
    else CHECK(sb == (size_t)(K < MF_QUANT_TILE_ROWS ? K : MF_QUANT_TILE_ROWS) * N * 4,
               "%s M=%d K=%d N=%d: scratch %zu bytes is not one tile of rows", kn, M, K, N, sb);
    if (K > MF_QUANT_TILE_ROWS) CHECK(sb < (size_t)K * N * 4, "%s: scratch holds the whole matrix", kn);
    void *scratch = sb ? xmalloc(sb) : NULL; /* exactly sb bytes: ASan catches any overrun */

    float *out = xmalloc((size_t)M * N * sizeof(float)), *dinp = randn((size_t)M * K, 1.0f);
    float *dinp0 = xmalloc((size_t)M * K * sizeof(float));
    memcpy(dinp0, dinp, (size_t)M * K * sizeof(float));
    for (size_t i = 0; i < (size_t)M * N; i++) out[i] = NAN;
    mf_quant_matmul_forward(out, inp, wq, bias, M, K, N, k, scratch);
    mf_quant_matmul_backward_input(dinp, dout, wq, M, K, N, k, scratch);

    double worst_f = 0, worst_b = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0, a = bias ? fabs(bias[n]) : 0;
            for (int kk = 0; kk < K; kk++) {
                double t = (double)inp[(size_t)m * K + kk] * wd[(size_t)kk * N + n];
                s += t;
                a += fabs(t);
            }
            double e = fabs(out[(size_t)m * N + n] - s) / (a > 0 ? a : 1);
            worst_f = isnan(out[(size_t)m * N + n]) ? INFINITY : fmax(worst_f, e);
        }
    for (int m = 0; m < M; m++)
        for (int kk = 0; kk < K; kk++) {
            double s = dinp0[(size_t)m * K + kk], a = fabs(s);
            for (int n = 0; n < N; n++) {
                double t = (double)dout[(size_t)m * N + n] * wd[(size_t)kk * N + n];
                s += t;
                a += fabs(t);
            }
            worst_b = fmax(worst_b, fabs(dinp[(size_t)m * K + kk] - s) / (a > 0 ? a : 1));
        }
    CHECK(worst_f <= 1e-5, "%s M=%d K=%d N=%d bias=%d: forward off by %g (relative to sum |terms|)", kn, M, K, N,
          with_bias, worst_f);
    CHECK(worst_b <= 1e-5, "%s M=%d K=%d N=%d: backward_input off by %g", kn, M, K, N, worst_b);

    /* the same calls again with a guard pattern past the scratch */
    uint8_t *g = xmalloc(sb + 256);
    memset(g + sb, 0xa5, 256);
    mf_quant_matmul_forward(out, inp, wq, bias, M, K, N, k, g);
    mf_quant_matmul_backward_input(dinp, dout, wq, M, K, N, k, g);
    int touched = 0;
    for (int i = 0; i < 256; i++) touched += g[sb + i] != 0xa5;
    CHECK(touched == 0, "%s M=%d K=%d N=%d: %d bytes past the scratch were written", kn, M, K, N, touched);
    printf("%-4s M=%-3d K=%-4d N=%-4d bias=%d scratch %7zu B: forward %.2e, backward_input %.2e\n", kn, M, K, N,
           with_bias, sb, worst_f, worst_b);

    free(g);
    free(w);
    free(inp);
    free(dout);
    free(bias);
    free(wq);
    free(wd);
    free(scratch);
    free(out);
    free(dinp);
    free(dinp0);
}

int main(void) {
    mf_rng_seed(&rng, 11);
    const mf_quant_kind ks[] = {MF_QUANT_F32, MF_QUANT_BF16, MF_QUANT_INT8, MF_QUANT_NF4};
    const int shapes[][3] = {
        {11, 768, 2304}, /* gpt2-124m attn.c_attn */
        {7, 3072, 768},  /* gpt2-124m mlp.c_proj */
        {13, 257, 67},   /* K one past a tile, N odd and not a block multiple */
        {1, 1, 1},
        {5, 600, 5},     /* 3 tiles, the last short; K*N not a multiple of 64 */
        {3, 65, 1},
        {2, 7, 9},       /* K under one tile */
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int k = 0; k < 4; k++)
            for (int b = 0; b < 2; b++) check_shape(ks[k], shapes[s][0], shapes[s][1], shapes[s][2], b);
    /* the scratch is split between the threads: other thread counts */
    int saved = omp_get_max_threads();
    const int threads[] = {1, 3, 5};
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(threads[t]);
        printf("OpenMP threads %d:\n", threads[t]);
        for (size_t s = 2; s < sizeof shapes / sizeof *shapes; s++)
            for (int k = 1; k < 4; k++) check_shape(ks[k], shapes[s][0], shapes[s][1], shapes[s][2], (int)(s % 2));
        check_shape(MF_QUANT_NF4, 3, 768, 2304, 1);
    }
    omp_set_num_threads(saved);
    return mf_test_done("test_quant_matmul");
}
