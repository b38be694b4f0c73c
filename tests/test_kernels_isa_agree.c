/* Proves the run-time ISA dispatch is sound (src/kernels/isa.h):
 *  - the portable and the AVX-512 builds of every dispatched kernel agree on
 *    the same inputs: bit for bit where the arithmetic is element-wise or
 *    summed in row order (encoder, bias, GELU, residual, AdamW, scale, the
 *    column sums of the layernorm backward), and within a stated relative
 *    tolerance where a reduction's order follows the vector width
 *    (layernorm outputs 1e-5 of max(|v|, 1), cross-entropy 1e-6, sums of
 *    squares 1e-12);
 *  - in each build, the fused kernels give exactly what the unfused
 *    sequence gives (bias+GELU, residual+layernorm), and the bf16-output
 *    kernels give the fp32 kernel's result rounded by mf_f32_to_bf16;
 *  - the Llama family's kernels (RMSNorm, RoPE, SwiGLU and their 16-bit
 *    forms) the same way (see llama());
 *  - the AVX-512 FlashAttention against flash_attention.c's tile loops, with
 *    grouped-query heads, windows and packed documents (see flash());
 *  - the table in use is the one MEMFIT_ISA asks for (auto/unset: avx512
 *    where the CPU has it); ctest runs this test a second time with
 *    MEMFIT_ISA=portable.
 * On a CPU without AVX-512 the cross-build comparison is skipped (said on
 * stderr); the fused-vs-unfused checks still run on the portable build.
 * Sizes are odd so vector remainders and partial column blocks are hit. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "kernels/half.h"
#include "kernels/isa.h" /* internal: both tables are tested directly */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static mf_rng rng;

static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) abort();
    return p;
}
static float *fnormal(size_t n, float s) {
    float *x = falloc(n);
    for (size_t i = 0; i < n; i++) x[i] = s * mf_rng_normal(&rng);
    return x;
}
static float *fcopy(const float *x, size_t n) {
    float *y = falloc(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
/* largest |a-b| / max(|a|,|b|, floor) over n floats */
static double maxrel(const float *a, const float *b, size_t n, double floor) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double s = fmax(fmax(fabs((double)a[i]), fabs((double)b[i])), floor);
        if (!(d / s <= m)) m = d / s; /* NaN counts as a failure */
    }
    return m;
}
static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

enum { N = 37, C = 70, OC = 4 * C, V = 300, VP = 320, B = 1, NE = 100003 };

/* every kernel of table k0 against table k1 */
static void cross(const mf_kernel_isa *k0, const mf_kernel_isa *k1) {
    const char *a = k0->name, *b = k1->name;
    /* encoder */
    int32_t inp[N];
    for (int i = 0; i < N; i++) inp[i] = (int32_t)(mf_rng_u32(&rng) % 11); /* repeats: dwte sums rows */
    float *wte = fnormal((size_t)11 * C, 1), *wpe = fnormal((size_t)N * C, 1), *dout = fnormal((size_t)N * C, 1);
    float *o0 = falloc((size_t)N * C), *o1 = falloc((size_t)N * C);
    k0->encoder_forward(o0, inp, wte, wpe, B, N, C);
    k1->encoder_forward(o1, inp, wte, wpe, B, N, C);
    CHECK(same_bits(o0, o1, (size_t)N * C), "encoder_forward %s vs %s", a, b);
    float *g0 = fnormal((size_t)11 * C, 1), *g1 = fcopy(g0, (size_t)11 * C);
    float *p0 = fnormal((size_t)N * C, 1), *p1 = fcopy(p0, (size_t)N * C);
    k0->encoder_backward(g0, p0, dout, inp, B, N, C);
    k1->encoder_backward(g1, p1, dout, inp, B, N, C);
    CHECK(same_bits(g0, g1, (size_t)11 * C) && same_bits(p0, p1, (size_t)N * C), "encoder_backward %s vs %s", a, b);

    /* layernorm, on rows with a large mean (the two-pass variance matters) */
    float *x = fnormal((size_t)N * C, 1), *w = fnormal(C, 1), *bb = fnormal(C, 1);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] += 20.0f;
    float m0[N], r0[N], m1[N], r1[N];
    k0->layernorm_forward(o0, m0, r0, x, w, bb, N, C);
    k1->layernorm_forward(o1, m1, r1, x, w, bb, N, C);
    /* outputs are O(1) and some near 0: errors relative to max(|v|, 1).
     * The mean of 70 floats near 20 carries a few ulps of their sum
     * (~1e-6 absolute) whichever order it is summed in; times rstd and w. */
    double e = maxrel(o0, o1, (size_t)N * C, 1.0);
    CHECK(e <= 1e-5 && maxrel(m0, m1, N, 1.0) <= 1e-6 && maxrel(r0, r1, N, 1.0) <= 1e-6,
          "layernorm_forward %s vs %s: max rel %.3g", a, b, e);
    float *dx0 = fnormal((size_t)N * C, 1), *dx1 = fcopy(dx0, (size_t)N * C);
    float *dw0 = fnormal(C, 1), *dw1 = fcopy(dw0, C), *db0 = fnormal(C, 1), *db1 = fcopy(db0, C);
    k0->layernorm_backward(dx0, dw0, db0, dout, x, w, m0, r0, N, C);
    k1->layernorm_backward(dx1, dw1, db1, dout, x, w, m0, r0, N, C);
    e = maxrel(dx0, dx1, (size_t)N * C, 1e-2);
    CHECK(e <= 1e-5, "layernorm_backward dinp %s vs %s: max rel %.3g", a, b, e);
    CHECK(same_bits(dw0, dw1, C) && same_bits(db0, db1, C), "layernorm_backward dw/db %s vs %s", a, b);

    /* bias, GELU, residual */
    float *big = fnormal((size_t)N * OC, 2), *bias = fnormal(OC, 1), *q0 = falloc((size_t)N * OC), *q1 = falloc((size_t)N * OC);
    float *b0 = fcopy(big, (size_t)N * OC), *b1 = fcopy(big, (size_t)N * OC);
    k0->bias_fill(b0, bias, N, OC, 1);
    k1->bias_fill(b1, bias, N, OC, 1);
    CHECK(same_bits(b0, b1, (size_t)N * OC), "bias_fill %s vs %s", a, b);
    float *s0 = fnormal(OC, 1), *s1 = fcopy(s0, OC);
    k0->bias_backward(s0, big, N, OC);
    k1->bias_backward(s1, big, N, OC);
    CHECK(same_bits(s0, s1, OC), "bias_backward %s vs %s", a, b);
    {   /* the fused rounding + column sums: bias_backward's bits and to_bf16's */
        float *f0 = calloc((size_t)OC, sizeof(float)), *f1 = calloc((size_t)OC, sizeof(float));
        uint16_t *h0 = malloc((size_t)N * OC * 2), *h1 = malloc((size_t)N * OC * 2), *hr = malloc((size_t)N * OC * 2);
        k0->to_bf16_colsum(h0, f0, big, N, OC);
        k1->to_bf16_colsum(h1, f1, big, N, OC);
        float *z = calloc((size_t)OC, sizeof(float));
        k0->bias_backward(z, big, N, OC);
        k0->to_bf16(hr, big, (size_t)N * OC);
        CHECK(same_bits(f0, z, OC) && same_bits(f1, z, OC), "to_bf16_colsum's sums %s vs %s vs bias_backward", a, b);
        CHECK(!memcmp(h0, hr, (size_t)N * OC * 2) && !memcmp(h1, hr, (size_t)N * OC * 2),
              "to_bf16_colsum's values %s vs %s vs to_bf16", a, b);
        free(f0); free(f1); free(z); free(h0); free(h1); free(hr);
    }
    k0->gelu_forward(q0, big, (size_t)N * OC);
    k1->gelu_forward(q1, big, (size_t)N * OC);
    CHECK(same_bits(q0, q1, (size_t)N * OC), "gelu_forward %s vs %s: max rel %.3g", a, b,
          maxrel(q0, q1, (size_t)N * OC, 1e-6));
    float *dg = fnormal((size_t)N * OC, 1);
    k0->gelu_backward(q0, big, dg, (size_t)N * OC);
    k1->gelu_backward(q1, big, dg, (size_t)N * OC);
    CHECK(same_bits(q0, q1, (size_t)N * OC), "gelu_backward %s vs %s: max rel %.3g", a, b,
          maxrel(q0, q1, (size_t)N * OC, 1e-6));
    {   /* GELU's backward fused with the rounding and the column sums: the
         * values and sums of gelu_backward then to_bf16_colsum, bit for bit */
        uint16_t *g0 = malloc((size_t)N * OC * 2), *g1 = malloc((size_t)N * OC * 2), *gr = malloc((size_t)N * OC * 2);
        float *c0 = calloc((size_t)OC, sizeof(float)), *c1 = calloc((size_t)OC, sizeof(float)),
              *cr = calloc((size_t)OC, sizeof(float));
        k0->gelu_backward_bf16_colsum(g0, c0, big, dg, N, OC);
        k1->gelu_backward_bf16_colsum(g1, c1, big, dg, N, OC);
        k0->to_bf16_colsum(gr, cr, q0, N, OC);
        CHECK(!memcmp(g0, gr, (size_t)N * OC * 2) && !memcmp(g1, gr, (size_t)N * OC * 2),
              "gelu_backward_bf16_colsum's values %s vs %s vs gelu_backward + to_bf16", a, b);
        CHECK(same_bits(c0, cr, OC) && same_bits(c1, cr, OC), "gelu_backward_bf16_colsum's sums %s vs %s", a, b);
        k0->gelu_backward_bf16_colsum(g0, NULL, big, dg, N, OC);  /* no bias: values only */
        CHECK(!memcmp(g0, gr, (size_t)N * OC * 2), "gelu_backward_bf16_colsum without a bias %s", a);
        free(g0); free(g1); free(gr); free(c0); free(c1); free(cr);
    }
    memcpy(b0, big, (size_t)N * OC * sizeof(float));
    memcpy(b1, big, (size_t)N * OC * sizeof(float));
    k0->bias_gelu_forward(q0, b0, bias, N, OC);
    k1->bias_gelu_forward(q1, b1, bias, N, OC);
    CHECK(same_bits(q0, q1, (size_t)N * OC) && same_bits(b0, b1, (size_t)N * OC), "bias_gelu_forward %s vs %s", a, b);
    float *res = fnormal((size_t)N * C, 1);
    float *y0 = fcopy(dout, (size_t)N * C), *y1 = fcopy(dout, (size_t)N * C);
    k0->residual_forward(y0, res, bb, N, C);
    k1->residual_forward(y1, res, bb, N, C);
    CHECK(same_bits(y0, y1, (size_t)N * C), "residual_forward %s vs %s", a, b);
    memcpy(y0, dout, (size_t)N * C * sizeof(float));
    memcpy(y1, dout, (size_t)N * C * sizeof(float));
    k0->residual_layernorm_forward(y0, o0, m0, r0, x, bb, w, bb, N, C);
    k1->residual_layernorm_forward(y1, o1, m1, r1, x, bb, w, bb, N, C);
    e = maxrel(o0, o1, (size_t)N * C, 1.0);
    CHECK(same_bits(y0, y1, (size_t)N * C) && e <= 1e-5, "residual_layernorm_forward %s vs %s: max rel %.3g", a, b, e);

    /* cross-entropy: loss and gradient, logits spread like a trained head */
    float *lg = fnormal((size_t)N * VP, 4), *l0 = fcopy(lg, (size_t)N * VP), *l1 = fcopy(lg, (size_t)N * VP);
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(mf_rng_u32(&rng) % V);
    float ls0[N], ls1[N];
    double t0 = k0->crossentropy_forward(l0, NULL, ls0, tg, N, V, VP, 0.5f);
    double t1 = k1->crossentropy_forward(l1, NULL, ls1, tg, N, V, VP, 0.5f);
    e = maxrel(l0, l1, (size_t)N * VP, 1e-6);
    CHECK(fabs(t0 - t1) <= 1e-6 * fabs(t0) && maxrel(ls0, ls1, N, 1e-6) <= 1e-6 && e <= 1e-6,
          "crossentropy %s vs %s: loss %.9g vs %.9g, grad max rel %.3g", a, b, t0, t1, e);

    /* sums of squares, scale, AdamW on NE (odd) elements */
    float *v = fnormal(NE, 1);
    double q = k0->sumsq(v, NE), r = k1->sumsq(v, NE);
    CHECK(fabs(q - r) <= 1e-12 * q, "sumsq %s vs %s: %.17g vs %.17g", a, b, q, r);
    float *v0 = fcopy(v, NE), *v1 = fcopy(v, NE);
    k0->scale(v0, 0.37f, NE);
    k1->scale(v1, 0.37f, NE);
    CHECK(same_bits(v0, v1, NE), "scale %s vs %s", a, b);
    float *P0 = fnormal(NE, 1), *G = fnormal(NE, 1), *M0 = fnormal(NE, 0.1f), *V0 = falloc(NE);
    for (int i = 0; i < NE; i++) V0[i] = 0.01f * fabsf(mf_rng_normal(&rng));
    float *P1 = fcopy(P0, NE), *M1 = fcopy(M0, NE), *V1 = fcopy(V0, NE);
    for (int t = 0; t < 3; t++) { /* a few steps so the state feeds back */
        k0->adamw(P0, NULL, G, M0, V0, NE, 0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 0.3f, 1e-8f, 0.9999f, 0.7f);
        k1->adamw(P1, NULL, G, M1, V1, NE, 0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 0.3f, 1e-8f, 0.9999f, 0.7f);
    }
    CHECK(same_bits(P0, P1, NE) && same_bits(M0, M1, NE) && same_bits(V0, V1, NE), "adamw %s vs %s: p max rel %.3g",
          a, b, maxrel(P0, P1, NE, 1e-6));

    free(wte), free(wpe), free(dout), free(o0), free(o1), free(g0), free(g1), free(p0), free(p1);
    free(x), free(w), free(bb), free(dx0), free(dx1), free(dw0), free(dw1), free(db0), free(db1);
    free(big), free(bias), free(q0), free(q1), free(b0), free(b1), free(s0), free(s1), free(dg), free(res), free(y0), free(y1);
    free(lg), free(l0), free(l1), free(v), free(v0), free(v1), free(P0), free(P1), free(G), free(M0), free(M1), free(V0), free(V1);
}

/* the bf16-output kernels of one table: the conversion is mf_f32_to_bf16
 * element by element (ties, NaN, infinities, subnormals included), and
 * layernorm/GELU with a bf16 output are the fp32 kernels then that rounding */
static void bf16_outputs(const mf_kernel_isa *k) {
    const size_t n = (size_t)N * OC;
    float *x = fnormal(n, 3);
    const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u,
                                0x80400000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00000000u};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) memcpy(&x[i * 7], &special[i], 4);
    uint16_t *h0 = malloc(n * 2), *h1 = malloc(n * 2);
    k->to_bf16(h0, x, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= h0[i] == mf_f32_to_bf16(x[i]);
    CHECK(ok, "%s: to_bf16 != mf_f32_to_bf16", k->name);

    float *g = falloc(n), *y = fnormal((size_t)N * C, 2), *w = fnormal(C, 1), *b = fnormal(C, 1), *o = falloc((size_t)N * C);
    k->gelu_forward(g, y, (size_t)N * C);
    k->to_bf16(h0, g, (size_t)N * C);
    k->gelu_forward_bf16(h1, y, (size_t)N * C);
    CHECK(memcmp(h0, h1, (size_t)N * C * 2) == 0, "%s: gelu_forward_bf16 != bf16(gelu_forward)", k->name);
    float m0[N], r0[N], m1[N], r1[N];
    k->layernorm_forward(o, m0, r0, y, w, b, N, C);
    k->to_bf16(h0, o, (size_t)N * C);
    k->layernorm_forward_bf16(h1, m1, r1, y, w, b, N, C);
    CHECK(memcmp(h0, h1, (size_t)N * C * 2) == 0 && same_bits(m0, m1, N) && same_bits(r0, r1, N),
          "%s: layernorm_forward_bf16 != bf16(layernorm_forward)", k->name);
    /* AdamW writing the bf16 copy: the same fp32 update, and p16 is exactly
     * to_bf16 of the new weights */
    float *P0 = fnormal(n, 1), *G = fnormal(n, 1), *M0 = fnormal(n, 0.1f), *V0 = falloc(n);
    for (size_t i = 0; i < n; i++) V0[i] = 0.01f * fabsf(mf_rng_normal(&rng));
    float *P1 = fcopy(P0, n), *M1 = fcopy(M0, n), *V1 = fcopy(V0, n);
    k->adamw(P0, NULL, G, M0, V0, n, 0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 0.3f, 1e-8f, 0.9999f, 0.7f);
    k->adamw(P1, h1, G, M1, V1, n, 0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 0.3f, 1e-8f, 0.9999f, 0.7f);
    k->to_bf16(h0, P0, n);
    CHECK(same_bits(P0, P1, n) && same_bits(M0, M1, n) && same_bits(V0, V1, n) && memcmp(h0, h1, n * 2) == 0,
          "%s: adamw with a bf16 copy != adamw then to_bf16", k->name);
    free(P0), free(P1), free(G), free(M0), free(M1), free(V0), free(V1);
    /* cross-entropy writing a bf16 gradient: the same losses, and the
     * gradient is to_bf16 of the fp32 one (padding columns 0) */
    float *lg = fnormal((size_t)N * VP, 4), *lf = fcopy(lg, (size_t)N * VP), ls0[N], ls1[N];
    uint16_t *d16 = malloc((size_t)N * VP * 2), *r16 = malloc((size_t)N * VP * 2);
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(mf_rng_u32(&rng) % V);
    double t0 = k->crossentropy_forward(lf, NULL, ls0, tg, N, V, VP, 0.25f);
    double t1 = k->crossentropy_forward(lg, d16, ls1, tg, N, V, VP, 0.25f);
    k->to_bf16(r16, lf, (size_t)N * VP);
    CHECK(t0 == t1 && same_bits(ls0, ls1, N) && memcmp(d16, r16, (size_t)N * VP * 2) == 0,
          "%s: crossentropy with a bf16 gradient != crossentropy then to_bf16", k->name);
    free(lg), free(lf), free(d16), free(r16);
    free(x), free(h0), free(h1), free(g), free(y), free(w), free(b), free(o);
}

/* the fused kernels of one table against the unfused sequence */
static void fused(const mf_kernel_isa *k) {
    float *pre = fnormal((size_t)N * OC, 2), *bias = fnormal(OC, 1);
    float *a = fcopy(pre, (size_t)N * OC), *ga = falloc((size_t)N * OC), *gb = falloc((size_t)N * OC);
    k->bias_fill(pre, bias, N, OC, 1);
    k->gelu_forward(gb, pre, (size_t)N * OC);
    k->bias_gelu_forward(ga, a, bias, N, OC);
    CHECK(same_bits(a, pre, (size_t)N * OC) && same_bits(ga, gb, (size_t)N * OC), "%s: bias_gelu != bias + gelu", k->name);
    k->bias_gelu_forward(a, a, bias, N, OC); /* in place: out == pre */
    k->bias_fill(pre, bias, N, OC, 1);
    k->gelu_forward(pre, pre, (size_t)N * OC);
    CHECK(same_bits(a, pre, (size_t)N * OC), "%s: bias_gelu in place differs", k->name);

    float *x = fnormal((size_t)N * C, 1), *res = fnormal((size_t)N * C, 3), *b = fnormal(C, 1), *w = fnormal(C, 1);
    float *x2 = fcopy(x, (size_t)N * C), *o1 = falloc((size_t)N * C), *o2 = falloc((size_t)N * C);
    float m1[N], r1[N], m2[N], r2[N];
    k->residual_layernorm_forward(x, o1, m1, r1, res, b, w, b, N, C);
    k->residual_forward(x2, res, b, N, C);
    k->layernorm_forward(o2, m2, r2, x2, w, b, N, C);
    CHECK(same_bits(x, x2, (size_t)N * C) && same_bits(o1, o2, (size_t)N * C) && same_bits(m1, m2, N) &&
          same_bits(r1, r2, N), "%s: residual_layernorm != residual + layernorm", k->name);
    /* the residual sum is res + (x + bias): check against that formula */
    float *x3 = fnormal((size_t)N * C, 1), *x4 = fcopy(x3, (size_t)N * C);
    k->residual_forward(x3, res, b, N, C);
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            float want = res[(size_t)n * C + c] + (x4[(size_t)n * C + c] + b[c]);
            ok &= x3[(size_t)n * C + c] == want;
        }
    CHECK(ok, "%s: residual_forward != res + (x + bias)", k->name);
    float *x5 = fcopy(x4, (size_t)N * C);
    k->residual_forward(x4, res, NULL, N, C);
    ok = 1;
    for (size_t i = 0; i < (size_t)N * C; i++) ok &= x4[i] == res[i] + x5[i];
    CHECK(ok, "%s: residual_forward without bias != res + x", k->name);
    free(x5);
    free(pre), free(bias), free(a), free(ga), free(gb), free(x), free(res), free(b), free(w), free(x2), free(o1), free(o2);
    free(x3), free(x4);
}

/* the Llama family's kernels (RMSNorm, RoPE, SwiGLU): table k1 against k0
 * (NULL k1: only k0's 16-bit forms against its fp32 ones). Element-wise
 * kernels (RoPE, SwiGLU, RMSNorm's column-summed dw) agree bit for bit; the
 * row reductions in double (RMSNorm's rstd and dinp) within 1e-6 of
 * max(|v|, 1). The 16-bit outputs are the fp32 results rounded, with the
 * same rstd bit for bit. */
static void llama(const mf_kernel_isa *k0, const mf_kernel_isa *k1) {
    const size_t nc = (size_t)N * C, nf = (size_t)N * OC;
    float *x = fnormal(nc, 2), *w = fnormal(C, 1), *d = fnormal(nc, 1);
    float *o0 = falloc(nc), *o1 = falloc(nc), r0[N], r1[N];
    float *dx0 = fnormal(nc, 1), *dx1 = fcopy(dx0, nc), *dw0 = fnormal(C, 1), *dw1 = fcopy(dw0, C);
    float *g = fnormal(nf, 3), *u = fnormal(nf, 1), *dd = fnormal(nf, 1);
    float *s0 = falloc(nf), *s1 = falloc(nf), *dg0 = falloc(nf), *du0 = falloc(nf), *dg1 = falloc(nf), *du1 = falloc(nf);
    uint16_t *h0 = malloc(nf * 2), *h1 = malloc(nf * 2);
    /* RoPE on B2 x T5 rows of 3 query + 1 key/value heads of size 8, with positions */
    enum { RB = 2, RT = 5, NH = 3, NKV = 1, HS = 8, QKV = (NH + 2 * NKV) * HS };
    float tab[RT * HS], *q0 = fnormal(RB * RT * QKV, 1), *q1 = fcopy(q0, RB * RT * QKV);
    const int32_t pos[RB * RT] = {0, 1, 2, 3, 4, 3, 0, 1, 4, 2};
    mf_rope_table(tab, RT, HS, 10000.0, NULL);
    if (k1) {
        const char *a = k0->name, *b = k1->name;
        k0->rmsnorm_forward(o0, r0, x, w, N, C, 1e-5f);
        k1->rmsnorm_forward(o1, r1, x, w, N, C, 1e-5f);
        CHECK(maxrel(o0, o1, nc, 1) <= 1e-6 && maxrel(r0, r1, N, 1) <= 1e-6, "rmsnorm_forward %s vs %s: %.3g", a, b,
              maxrel(o0, o1, nc, 1));
        k0->rmsnorm_backward(dx0, dw0, d, x, w, r0, N, C);
        k1->rmsnorm_backward(dx1, dw1, d, x, w, r0, N, C);
        CHECK(maxrel(dx0, dx1, nc, 1) <= 1e-6 && same_bits(dw0, dw1, C), "rmsnorm_backward %s vs %s: dx %.3g", a, b,
              maxrel(dx0, dx1, nc, 1));
        for (int inv = 0; inv < 2; inv++) {
            k0->rope_apply(q0, tab, inv ? pos : NULL, RB, RT, NH, NKV, HS, inv);
            k1->rope_apply(q1, tab, inv ? pos : NULL, RB, RT, NH, NKV, HS, inv);
            CHECK(same_bits(q0, q1, RB * RT * QKV), "rope_apply (inverse %d) %s vs %s", inv, a, b);
        }
        k0->swiglu_forward(s0, g, u, nf);
        k1->swiglu_forward(s1, g, u, nf);
        CHECK(same_bits(s0, s1, nf), "swiglu_forward %s vs %s: %.3g", a, b, maxrel(s0, s1, nf, 1e-6));
        k0->swiglu_backward(dg0, du0, dd, g, u, nf);
        k1->swiglu_backward(dg1, du1, dd, g, u, nf);
        CHECK(same_bits(dg0, dg1, nf) && same_bits(du0, du1, nf), "swiglu_backward %s vs %s", a, b);
    }
    for (int dt = 0; dt < 2; dt++) { /* the 16-bit outputs of k0 */
        const mf_dtype t = dt ? MF_DTYPE_F16 : MF_DTYPE_BF16;
        k0->rmsnorm_forward(o0, r0, x, w, N, C, 1e-5f);
        k0->rmsnorm_forward16(h1, t, r1, x, w, N, C, 1e-5f);
        int ok = same_bits(r0, r1, N);
        for (size_t i = 0; i < nc; i++) ok &= h1[i] == (dt ? mf_f32_to_fp16(o0[i]) : mf_f32_to_bf16(o0[i]));
        CHECK(ok, "%s: rmsnorm_forward16 (%s) != rounded rmsnorm_forward", k0->name, mf_dtype_name(t));
        k0->swiglu_forward(s0, g, u, nf);
        k0->swiglu_forward16(h0, t, g, u, nf);
        ok = 1;
        for (size_t i = 0; i < nf; i++) ok &= h0[i] == (dt ? mf_f32_to_fp16(s0[i]) : mf_f32_to_bf16(s0[i]));
        CHECK(ok, "%s: swiglu_forward16 (%s) != rounded swiglu_forward", k0->name, mf_dtype_name(t));
    }
    free(x), free(w), free(d), free(o0), free(o1), free(dx0), free(dx1), free(dw0), free(dw1), free(g), free(u), free(dd);
    free(s0), free(s1), free(dg0), free(du0), free(dg1), free(du1), free(h0), free(h1), free(q0), free(q1);
}

/* FlashAttention: the avx512 table's kernel (fa_avx512.c, its own AVX-512
 * tile products and a transposed softmax) against flash_attention.c's tile
 * loops (cblas tiles; what the portable table runs). Different summation
 * orders, so within round-off: out and dqkv 2e-6 of the tensor's largest
 * magnitude, lse 1e-6 relative. Shapes: MHA and grouped-query heads, T below a tile and not a
 * multiple of 64, hs 16/64/80/128 (80: a partial vector block), a sliding
 * window shorter than T and packed documents. The masks are checked to be
 * exact on their own: a key a row must not see is poisoned with a huge value
 * in the forward's input and must change nothing. */
/* max |a - b| over max |a|: round-off of sums whose order differs */
static double normerr(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)a[i]));
    }
    return m > 0 ? d / m : d;
}

/* The last query row of batch 0, head 0 sees keys in [lo, T-1]: every key
 * before lo is poisoned with a huge value (qkv modified) and fwd's output
 * row there must still equal ref's, bit for bit. */
typedef void (*fa_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                           int window, const int32_t *pos);
static void masked_keys_inert(fa_forward fwd, const char *what, float *qkv, float *o, float *l, const float *ref,
                              int B, int T, int NH, int NKV, int hs, int win, const int32_t *pos) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, last = T - 1;
    int lo = win ? last - win + 1 : 0;
    if (pos) lo = lo > last - pos[last] ? lo : last - pos[last];
    if (lo <= 0) return;
    for (int j = 0; j < lo; j++)
        for (int kv = 0; kv < NKV; kv++) qkv[(size_t)j * QKV + (size_t)(NH + kv) * hs] = 1e4f;
    fwd(o, l, qkv, B, T, NH, NKV, hs, win, pos);
    CHECK(memcmp(o + (size_t)last * C, ref + (size_t)last * C, (size_t)hs * sizeof(float)) == 0,
          "%s B%d T%d window %d docs %d: a masked key changed row %d", what, B, T, win, pos != NULL, last);
}

#ifdef MF_HAVE_AVX512_TABLE
/* The bf16 tiles (mf_flash_*_avx512bf16) against the fp32 AVX-512 kernel.
 * Given Q, K, V and dO already rounded to bf16, the score products are
 * exact products summed in fp32 on both sides, so the log-sum-exps agree to
 * float round-off (2e-6 relative; 2.4e-7 seen); what remains is the
 * rounding of P and dS to bf16 (2^-9 relative each): out within 4e-3 and
 * dqkv within 5e-3 of the tensor's largest magnitude (1.2e-3 and 1.5e-3
 * seen). On the unrounded inputs the bf16 kernel must differ from the fp32
 * one (it ran bf16 products) and stay within 1e-2 / 1.5e-2 (4.0e-3 and
 * 5.8e-3 seen). The masks: a poisoned key must not move a row that cannot see
 * it, as for the fp32 kernel. */
static void flash_bf16(int B, int T, int NH, int NKV, int hs, int win, const int32_t *pos, const float *qkv0,
                       const float *dout0) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs;
    const size_t nq = (size_t)B * T * QKV, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = falloc(nq), *dout = falloc(no);
    memcpy(qkv, qkv0, nq * sizeof *qkv);
    memcpy(dout, dout0, no * sizeof *dout);
    float *o0 = falloc(no), *o1 = falloc(no), *l0 = falloc(nl), *l1 = falloc(nl), *g0 = falloc(nq), *g1 = falloc(nq);
    const size_t ns = mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads());
    float *sc = falloc(ns);
    /* unrounded inputs: bf16 products, so different from fp32, but close */
    mf_flash_forward_avx512(o0, l0, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_forward_avx512bf16(o1, l1, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_avx512(g0, sc, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_avx512bf16(g1, sc, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    double eo = normerr(o0, o1, no), eg = normerr(g0, g1, nq);
    CHECK(eo > 0 && eg > 0 && eo <= 1e-2 && eg <= 1.5e-2,
          "flash bf16 vs fp32 B%d T%d NH%d NKV%d hs%d window %d docs %d: out %.3g dqkv %.3g (want (0, 1e-2], (0, 1.5e-2])",
          B, T, NH, NKV, hs, win, pos != NULL, eo, eg);
    for (size_t i = 0; i < nq; i++) qkv[i] = mf_bf16_to_f32(mf_f32_to_bf16(qkv[i]));
    for (size_t i = 0; i < no; i++) dout[i] = mf_bf16_to_f32(mf_f32_to_bf16(dout[i]));
    mf_flash_forward_avx512(o0, l0, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_forward_avx512bf16(o1, l1, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_avx512(g0, sc, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_avx512bf16(g1, sc, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    eo = normerr(o0, o1, no), eg = normerr(g0, g1, nq);
    const double el = maxrel(l0, l1, nl, 1.0);
    CHECK(el <= 2e-6 && eo <= 4e-3 && eg <= 5e-3,
          "flash bf16 vs fp32 on bf16 inputs B%d T%d NH%d NKV%d hs%d window %d docs %d: lse %.3g out %.3g dqkv %.3g",
          B, T, NH, NKV, hs, win, pos != NULL, el, eo, eg);
    masked_keys_inert(mf_flash_forward_avx512bf16, "flash bf16", qkv, o0, l0, o1, B, T, NH, NKV, hs, win, pos);
    free(o0); free(o1); free(l0); free(l1); free(g0); free(g1); free(sc); free(qkv); free(dout);
}
#endif

static void flash_one(int B, int T, int NH, int NKV, int hs, int window, int docs) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs;
    const size_t nq = (size_t)B * T * QKV, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = fnormal(nq, 1), *dout = fnormal(no, 1);
    float *o0 = falloc(no), *o1 = falloc(no), *l0 = falloc(nl), *l1 = falloc(nl);
    float *g0 = falloc(nq), *g1 = falloc(nq);
    const size_t ns = mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads());
    float *s0 = falloc(ns), *s1 = falloc(ns);
    int32_t *pos = NULL;
    if (docs) { /* documents of lengths 1, 5, 17, 40, ... restarting positions */
        pos = malloc((size_t)B * T * sizeof *pos);
        if (!pos) abort();
        static const int len[] = {1, 5, 17, 40, 70, 3, 90};
        for (int b = 0; b < B; b++)
            for (int t = 0, d = b % 7, p = 0; t < T; t++) {
                if (p == len[d]) { p = 0; d = (d + 1) % 7; }
                pos[(size_t)b * T + t] = p++;
            }
    }
    const int win = window > 0 && window < T ? window : 0;
    mf_flash_forward_tiles(o0, l0, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_forward_avx512(o1, l1, qkv, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_tiles(g0, s0, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    mf_flash_backward_avx512(g1, s1, dout, o0, qkv, l0, B, T, NH, NKV, hs, win, pos);
    const double eo = normerr(o0, o1, no), el = maxrel(l0, l1, nl, 1.0), eg = normerr(g0, g1, nq);
    CHECK(eo <= 2e-6 && el <= 1e-6 && eg <= 2e-6,
          "flash avx512 vs tiles B%d T%d NH%d NKV%d hs%d window %d docs %d: out %.3g lse %.3g dqkv %.3g", B, T, NH,
          NKV, hs, win, docs, eo, el, eg);
#ifdef MF_HAVE_AVX512_TABLE
    if (mf_kernels_isa_bf16dot_ok()) flash_bf16(B, T, NH, NKV, hs, win, pos, qkv, dout);
#endif
    masked_keys_inert(mf_flash_forward_avx512, "flash avx512", qkv, o0, l0, o1, B, T, NH, NKV, hs, win, pos);
    free(qkv); free(dout); free(o0); free(o1); free(l0); free(l1); free(g0); free(g1); free(s0); free(s1);
    free(pos);
}

static void flash(void) {
    flash_one(2, 7, 3, 3, 16, 0, 0);
    flash_one(2, 65, 4, 2, 64, 0, 0);
    flash_one(1, 200, 9, 3, 64, 0, 0);
    flash_one(2, 256, 9, 3, 64, 0, 0);
    flash_one(1, 257, 4, 1, 128, 0, 0);
    flash_one(1, 130, 4, 2, 80, 0, 0);
    flash_one(1, 200, 4, 2, 64, 50, 0);
    flash_one(1, 300, 4, 4, 64, 64, 0);
    flash_one(3, 190, 6, 2, 64, 0, 1);
    flash_one(2, 150, 4, 2, 32, 33, 1);
}

int main(void) {
    mf_rng_seed(&rng, 7);
    const char *env = getenv("MEMFIT_ISA");
    const mf_kernel_isa *use = mf_kernels_isa_get();
    int ok512 = mf_kernels_isa_avx512_ok();
    const char *want = env && strcmp(env, "portable") == 0 ? "portable" : ok512 ? "avx512" : "portable";
    CHECK(strcmp(use->name, want) == 0, "MEMFIT_ISA=%s: table %s in use, want %s", env ? env : "(unset)", use->name, want);
    CHECK(strcmp(mf_kernels_isa_name(), use->name) == 0, "mf_kernels_isa_name disagrees");
    fused(&mf_kernels_portable);
#ifdef MF_HAVE_AVX512_TABLE
    if (ok512) {
        fused(&mf_kernels_avx512);
        cross(&mf_kernels_portable, &mf_kernels_avx512);
    } else
#endif
        fprintf(stderr, "test_kernels_isa_agree: no AVX-512 here; portable vs avx512 not compared\n");
    /* after the cross-build comparison, so its inputs (one seeded stream) stay as they were */
    bf16_outputs(&mf_kernels_portable);
#ifdef MF_HAVE_AVX512_TABLE
    if (ok512) bf16_outputs(&mf_kernels_avx512);
#endif
    llama(&mf_kernels_portable, NULL);
#ifdef MF_HAVE_AVX512_TABLE
    if (ok512) llama(&mf_kernels_avx512, NULL), llama(&mf_kernels_portable, &mf_kernels_avx512);
    if (ok512) flash();
#endif
    return mf_test_done("test_kernels_isa_agree");
}
