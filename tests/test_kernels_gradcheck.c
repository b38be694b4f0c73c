/* Proves every fp32 CPU kernel computes what its contract says:
 *  - each forward matches a naive double-precision reference (1e-5);
 *  - each backward matches central finite differences of that double
 *    reference for the scalar L = sum(out * R), R random and fixed, so the
 *    backward is the true gradient of the forward (differencing in double
 *    keeps the check free of fp32 rounding noise);
 *  - "accumulates" outputs add (a second call doubles the increment) and
 *    "overwritten" outputs are written in full (they start as NaN);
 *  - attention is causal, cross-entropy never reads padding columns, NaNs
 *    propagate, and the reductions are bit-identical for 1 and for several
 *    threads;
 *  - the vectorised exp/tanh behind GELU, softmax and cross-entropy are
 *    accurate to ~1 ulp / 2e-7 over their whole range.
 * Sizes are chosen so column-blocked loops see a partial last block (C=70)
 * and attention sees T not a power of two. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "kernels/vmath.h" /* internal: tested directly below */
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
static double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) abort();
    return p;
}
static void fill_normal(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * mf_rng_normal(&rng);
}
static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static double *to_double(const float *x, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Compares n kernel values against reference values; one CHECK per array so
 * a broken kernel reports the worst element instead of flooding stderr. */
static void expect_close(const char *what, const float *got, const double *want,
                         size_t n, double rtol, double atol) {
    size_t bad = 0, worst = 0;
    double worst_err = -1.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        const double m = fmax(fabs((double)got[i]), fabs(want[i]));
        double err = d / (atol + rtol * m); /* > 1 means not close */
        if (isnan(err)) err = INFINITY;       /* NaN/inf results are the worst */
        if (err > 1.0) bad++;
        if (err > worst_err) { worst_err = err; worst = i; }
    }
    CHECK(bad == 0, "%s: %zu of %zu differ; worst [%zu] got %.9g want %.9g",
          what, bad, n, worst, (double)got[worst], want[worst]);
}

/* got - base (the increment an accumulating kernel added) vs k * want. */
static void expect_increment(const char *what, const float *got, const float *base,
                             const double *want, double k, size_t n,
                             double rtol, double atol) {
    float *inc = falloc(n);
    double *w = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        inc[i] = got[i] - base[i];
        w[i] = k * want[i];
    }
    expect_close(what, inc, w, n, rtol, atol);
    free(inc);
    free(w);
}

/* Central differences of f over the n entries of x (x restored after). */
typedef double (*objective)(const void *ctx);
static void fd_grad(double *x, size_t n, double *g, objective f, const void *ctx) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = f(ctx);
        x[i] = x0 - h;
        const double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * h);
    }
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Tolerances: fp32 forward vs double reference; fp32 gradients vs FD. */
#define FWD_RTOL 1e-5
#define FWD_ATOL 1e-6
#define GRAD_RTOL 1e-4
#define GRAD_ATOL 1e-5

/* ---- encoder --------------------------------------------------------- */

typedef struct { double *wte, *wpe, *R, *out; const int32_t *inp; int B, T, C; } enc_ctx;

static void enc_ref(const enc_ctx *c) {
    for (int n = 0; n < c->B * c->T; n++)
        for (int j = 0; j < c->C; j++)
            c->out[(size_t)n * c->C + j] = c->wte[(size_t)c->inp[n] * c->C + j] +
                                           c->wpe[(size_t)(n % c->T) * c->C + j];
}
static double enc_obj(const void *p) {
    const enc_ctx *c = p;
    enc_ref(c);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void) {
    const int B = 2, T = 5, C = 70, V = 4, maxT = 7;
    const size_t N = (size_t)B * T, nout = N * C;
    int32_t inp[10];
    for (size_t i = 0; i < N; i++) inp[i] = (int32_t)(mf_rng_u32(&rng) % V); /* repeats */
    inp[0] = inp[7] = 3; /* at least one token shared across rows and batches */
    float *wte = falloc((size_t)V * C), *wpe = falloc((size_t)maxT * C);
    float *out = falloc(nout), *R = falloc(nout);
    fill_normal(wte, (size_t)V * C, 1.0f);
    fill_normal(wpe, (size_t)maxT * C, 1.0f);
    fill_normal(R, nout, 1.0f);
    fill_nan(out, nout);
    enc_ctx c = {to_double(wte, (size_t)V * C), to_double(wpe, (size_t)maxT * C),
                 to_double(R, nout), dalloc(nout), inp, B, T, C};
    enc_ref(&c);
    mf_encoder_forward(out, inp, wte, wpe, B, T, C);
    expect_close("encoder out", out, c.out, nout, FWD_RTOL, FWD_ATOL);

    double *gwte = dalloc((size_t)V * C), *gwpe = dalloc((size_t)maxT * C);
    fd_grad(c.wte, (size_t)V * C, gwte, enc_obj, &c);
    fd_grad(c.wpe, (size_t)maxT * C, gwpe, enc_obj, &c);
    float *dwte = falloc((size_t)V * C), *dwpe = falloc((size_t)maxT * C);
    float *dwte0 = falloc((size_t)V * C), *dwpe0 = falloc((size_t)maxT * C);
    fill_normal(dwte0, (size_t)V * C, 1.0f);
    fill_normal(dwpe0, (size_t)maxT * C, 1.0f);
    memcpy(dwte, dwte0, (size_t)V * C * sizeof(float));
    memcpy(dwpe, dwpe0, (size_t)maxT * C * sizeof(float));
    mf_encoder_backward(dwte, dwpe, R, inp, B, T, C);
    expect_increment("encoder dwte", dwte, dwte0, gwte, 1.0, (size_t)V * C, GRAD_RTOL, GRAD_ATOL);
    expect_increment("encoder dwpe", dwpe, dwpe0, gwpe, 1.0, (size_t)maxT * C, GRAD_RTOL, GRAD_ATOL);
    mf_encoder_backward(dwte, dwpe, R, inp, B, T, C);
    expect_increment("encoder dwte x2", dwte, dwte0, gwte, 2.0, (size_t)V * C, GRAD_RTOL, GRAD_ATOL);
    expect_increment("encoder dwpe x2", dwpe, dwpe0, gwpe, 2.0, (size_t)maxT * C, GRAD_RTOL, GRAD_ATOL);

    free(wte); free(wpe); free(out); free(R); free(c.wte); free(c.wpe); free(c.R);
    free(c.out); free(gwte); free(gwpe); free(dwte); free(dwpe); free(dwte0); free(dwpe0);
}

/* ---- layernorm ------------------------------------------------------- */

typedef struct { double *inp, *w, *b, *R, *out, *mean, *rstd; int N, C; } ln_ctx;

static void ln_ref(const ln_ctx *c) {
    for (int n = 0; n < c->N; n++) {
        const double *x = c->inp + (size_t)n * c->C;
        double m = 0.0, v = 0.0;
        for (int j = 0; j < c->C; j++) m += x[j];
        m /= c->C;
        for (int j = 0; j < c->C; j++) v += (x[j] - m) * (x[j] - m);
        const double r = 1.0 / sqrt(v / c->C + 1e-5);
        for (int j = 0; j < c->C; j++)
            c->out[(size_t)n * c->C + j] = (x[j] - m) * r * c->w[j] + c->b[j];
        c->mean[n] = m;
        c->rstd[n] = r;
    }
}
static double ln_obj(const void *p) {
    const ln_ctx *c = p;
    ln_ref(c);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
    const int N = 4, C = 70;
    const size_t n = (size_t)N * C;
    float *inp = falloc(n), *w = falloc(C), *b = falloc(C), *R = falloc(n);
    float *out = falloc(n), *mean = falloc(N), *rstd = falloc(N);
    fill_normal(inp, n, 2.0f);
    for (size_t i = 0; i < (size_t)C; i++) inp[i] += 5.0f; /* a row with a large mean */
    fill_normal(w, C, 1.0f);
    fill_normal(b, C, 1.0f);
    fill_normal(R, n, 1.0f);
    fill_nan(out, n);
    ln_ctx c = {to_double(inp, n), to_double(w, C), to_double(b, C), to_double(R, n),
                dalloc(n), dalloc(N), dalloc(N), N, C};
    ln_ref(&c);
    mf_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    expect_close("layernorm out", out, c.out, n, FWD_RTOL, FWD_ATOL);
    expect_close("layernorm mean", mean, c.mean, N, FWD_RTOL, FWD_ATOL);
    expect_close("layernorm rstd", rstd, c.rstd, N, FWD_RTOL, FWD_ATOL);

    double *ginp = dalloc(n), *gw = dalloc(C), *gb = dalloc(C);
    fd_grad(c.inp, n, ginp, ln_obj, &c);
    fd_grad(c.w, C, gw, ln_obj, &c);
    fd_grad(c.b, C, gb, ln_obj, &c);
    float *dinp = falloc(n), *dw = falloc(C), *db = falloc(C);
    float *dinp0 = falloc(n), *dw0 = falloc(C), *db0 = falloc(C);
    fill_normal(dinp0, n, 1.0f);
    fill_normal(dw0, C, 1.0f);
    fill_normal(db0, C, 1.0f);
    memcpy(dinp, dinp0, n * sizeof(float));
    memcpy(dw, dw0, C * sizeof(float));
    memcpy(db, db0, C * sizeof(float));
    mf_layernorm_backward(dinp, dw, db, R, inp, w, mean, rstd, N, C);
    expect_increment("layernorm dinp", dinp, dinp0, ginp, 1.0, n, GRAD_RTOL, GRAD_ATOL);
    expect_increment("layernorm dw", dw, dw0, gw, 1.0, C, GRAD_RTOL, GRAD_ATOL);
    expect_increment("layernorm db", db, db0, gb, 1.0, C, GRAD_RTOL, GRAD_ATOL);
    mf_layernorm_backward(dinp, dw, db, R, inp, w, mean, rstd, N, C);
    expect_increment("layernorm dinp x2", dinp, dinp0, ginp, 2.0, n, GRAD_RTOL, GRAD_ATOL);
    expect_increment("layernorm dw x2", dw, dw0, gw, 2.0, C, GRAD_RTOL, GRAD_ATOL);
    expect_increment("layernorm db x2", db, db0, gb, 2.0, C, GRAD_RTOL, GRAD_ATOL);

    free(inp); free(w); free(b); free(R); free(out); free(mean); free(rstd);
    free(c.inp); free(c.w); free(c.b); free(c.R); free(c.out); free(c.mean); free(c.rstd);
    free(ginp); free(gw); free(gb); free(dinp); free(dw); free(db);
    free(dinp0); free(dw0); free(db0);
}

/* ---- matmul ---------------------------------------------------------- */

typedef struct { double *inp, *w, *bias, *R, *out; int N, C, OC; } mm_ctx;

static void mm_ref(const mm_ctx *c) {
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = c->bias ? c->bias[o] : 0.0;
            for (int i = 0; i < c->C; i++)
                s += c->inp[(size_t)n * c->C + i] * c->w[(size_t)i * c->OC + o];
            c->out[(size_t)n * c->OC + o] = s;
        }
}
static double mm_obj(const void *p) {
    const mm_ctx *c = p;
    mm_ref(c);
    return dot(c->out, c->R, (size_t)c->N * c->OC);
}

static void test_matmul(void) {
    const int N = 5, C = 7, OC = 70; /* N, C, OC all different: catches ld mix-ups */
    const size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    float *inp = falloc(ni), *w = falloc(nw), *bias = falloc(OC), *R = falloc(no);
    float *out = falloc(no), *out0 = falloc(no);
    fill_normal(inp, ni, 1.0f);
    fill_normal(w, nw, 1.0f);
    fill_normal(bias, OC, 1.0f);
    fill_normal(R, no, 1.0f);
    mm_ctx c = {to_double(inp, ni), to_double(w, nw), to_double(bias, OC),
                to_double(R, no), dalloc(no), N, C, OC};
    mm_ref(&c);

    fill_nan(out, no);
    mf_matmul_forward(out, inp, w, bias, N, C, OC, 0);
    expect_close("matmul out", out, c.out, no, FWD_RTOL, FWD_ATOL);
    fill_normal(out0, no, 1.0f);
    memcpy(out, out0, no * sizeof(float));
    mf_matmul_forward(out, inp, w, bias, N, C, OC, 1);
    expect_increment("matmul out accumulate", out, out0, c.out, 1.0, no, FWD_RTOL, FWD_ATOL);

    double *ginp = dalloc(ni), *gw = dalloc(nw), *gb = dalloc(OC);
    fd_grad(c.inp, ni, ginp, mm_obj, &c);
    fd_grad(c.w, nw, gw, mm_obj, &c);
    fd_grad(c.bias, OC, gb, mm_obj, &c);
    float *dinp = falloc(ni), *dinp1 = falloc(ni), *dw = falloc(nw), *db = falloc(OC);
    float *dw0 = falloc(nw), *db0 = falloc(OC);
    fill_nan(dinp, ni);
    fill_normal(dw0, nw, 1.0f);
    fill_normal(db0, OC, 1.0f);
    memcpy(dw, dw0, nw * sizeof(float));
    memcpy(db, db0, OC * sizeof(float));
    mf_matmul_backward(dinp, dw, db, R, inp, w, N, C, OC);
    expect_close("matmul dinp", dinp, ginp, ni, GRAD_RTOL, GRAD_ATOL);
    expect_increment("matmul dw", dw, dw0, gw, 1.0, nw, GRAD_RTOL, GRAD_ATOL);
    expect_increment("matmul dbias", db, db0, gb, 1.0, OC, GRAD_RTOL, GRAD_ATOL);
    memcpy(dinp1, dinp, ni * sizeof(float));
    mf_matmul_backward(dinp, dw, db, R, inp, w, N, C, OC);
    CHECK(memcmp(dinp, dinp1, ni * sizeof(float)) == 0, "matmul dinp must be overwritten, not accumulated");
    expect_increment("matmul dw x2", dw, dw0, gw, 2.0, nw, GRAD_RTOL, GRAD_ATOL);
    expect_increment("matmul dbias x2", db, db0, gb, 2.0, OC, GRAD_RTOL, GRAD_ATOL);

    /* no bias, no dinp, no dbias */
    free(c.bias);
    c.bias = NULL;
    mm_ref(&c);
    fill_nan(out, no);
    mf_matmul_forward(out, inp, w, NULL, N, C, OC, 0);
    expect_close("matmul out (no bias)", out, c.out, no, FWD_RTOL, FWD_ATOL);
    memcpy(out, out0, no * sizeof(float));
    mf_matmul_forward(out, inp, w, NULL, N, C, OC, 1);
    expect_increment("matmul out accumulate (no bias)", out, out0, c.out, 1.0, no, FWD_RTOL, FWD_ATOL);
    memcpy(dw, dw0, nw * sizeof(float));
    mf_matmul_backward(NULL, dw, NULL, R, inp, w, N, C, OC);
    expect_increment("matmul dw (no dinp, no dbias)", dw, dw0, gw, 1.0, nw, GRAD_RTOL, GRAD_ATOL);

    free(inp); free(w); free(bias); free(R); free(out); free(out0);
    free(c.inp); free(c.w); free(c.R); free(c.out); free(ginp); free(gw); free(gb);
    free(dinp); free(dinp1); free(dw); free(db); free(dw0); free(db0);
}

/* ---- attention ------------------------------------------------------- */

typedef struct { double *qkv, *R, *out; int B, T, C, NH; } att_ctx;

/* Naive causal attention in double, straight from the definition. */
static void att_ref(const att_ctx *c) {
    const int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double p[64];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = c->qkv + ((size_t)b * T + i) * 3 * C + h * hs;
                double mx = -INFINITY, s = 0.0;
                for (int j = 0; j <= i; j++) {
                    const double *k = c->qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) s += (p[j] = exp(p[j] - mx));
                for (int e = 0; e < hs; e++) {
                    double o = 0.0;
                    for (int j = 0; j <= i; j++)
                        o += p[j] / s * c->qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + e];
                    c->out[((size_t)b * T + i) * C + h * hs + e] = o;
                }
            }
}
static double att_obj(const void *p) {
    const att_ctx *c = p;
    att_ref(c);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_attention(void) {
    const int B = 2, T = 7, C = 12, NH = 3;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T;
    float *qkv = falloc(nqkv), *R = falloc(nout), *out = falloc(nout), *att = falloc(natt);
    float *dqkv = falloc(nqkv), *dqkv1 = falloc(nqkv);
    const size_t nscr = mf_attention_scratch_floats(T, omp_get_max_threads());
    float *scratch = falloc(nscr);
    fill_normal(qkv, nqkv, 1.0f);
    fill_normal(R, nout, 1.0f);
    fill_nan(out, nout);
    fill_nan(att, natt);
    att_ctx c = {to_double(qkv, nqkv), to_double(R, nout), dalloc(nout), B, T, C, NH};
    att_ref(&c);
    mf_attention_forward(out, att, qkv, B, T, C, NH);
    expect_close("attention out", out, c.out, nout, FWD_RTOL, FWD_ATOL);
    int upper_nonzero = 0;
    double rowsum_err = 0.0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int i = 0; i < T; i++) {
            double s = 0.0;
            for (int j = 0; j < T; j++) {
                const float a = att[((size_t)bh * T + i) * T + j];
                if (j > i && a != 0.0f) upper_nonzero++;
                s += a;
            }
            rowsum_err = fmax(rowsum_err, fabs(s - 1.0));
        }
    CHECK(upper_nonzero == 0, "attention: %d entries above the diagonal are not 0", upper_nonzero);
    CHECK(rowsum_err < 1e-5, "attention rows must sum to 1 (max error %g)", rowsum_err);

    double *g = dalloc(nqkv);
    fd_grad(c.qkv, nqkv, g, att_obj, &c);
    fill_nan(dqkv, nqkv);
    fill_nan(scratch, nscr);
    mf_attention_backward(dqkv, scratch, R, qkv, att, B, T, C, NH);
    expect_close("attention dqkv", dqkv, g, nqkv, GRAD_RTOL, GRAD_ATOL);
    memcpy(dqkv1, dqkv, nqkv * sizeof(float));
    mf_attention_backward(dqkv, scratch, R, qkv, att, B, T, C, NH);
    CHECK(memcmp(dqkv, dqkv1, nqkv * sizeof(float)) == 0, "attention dqkv must be overwritten");

    /* Causality, forward: changing token t0's q, k and v leaves every
     * output row before t0 bit-identical, and does change row t0. */
    const int t0 = 4;
    float *out2 = falloc(nout), *att2 = falloc(natt), *qkv2 = falloc(nqkv);
    memcpy(qkv2, qkv, nqkv * sizeof(float));
    for (int j = 0; j < 3 * C; j++) qkv2[(size_t)t0 * 3 * C + j] += 3.0f + mf_rng_normal(&rng);
    mf_attention_forward(out2, att2, qkv2, B, T, C, NH);
    CHECK(memcmp(out2, out, (size_t)t0 * C * sizeof(float)) == 0,
          "attention: rows before t0 changed when token t0 changed");
    CHECK(memcmp(out2 + (size_t)T * C, out + (size_t)T * C, (size_t)T * C * sizeof(float)) == 0,
          "attention: batch 1 changed when a token of batch 0 changed");
    CHECK(memcmp(out2 + (size_t)t0 * C, out + (size_t)t0 * C, (size_t)C * sizeof(float)) != 0,
          "attention: row t0 did not change when token t0 changed");

    /* Causality, backward: a loss on rows before t0 gives no gradient to
     * the q, k, v of token t0 or later. */
    float *R2 = falloc(nout);
    memcpy(R2, R, nout * sizeof(float));
    for (int b = 0; b < B; b++)
        memset(R2 + ((size_t)b * T + t0) * C, 0, (size_t)(T - t0) * C * sizeof(float));
    mf_attention_backward(dqkv, scratch, R2, qkv, att, B, T, C, NH);
    int leaked = 0;
    for (int b = 0; b < B; b++)
        for (size_t j = ((size_t)b * T + t0) * 3 * C; j < (size_t)(b + 1) * T * 3 * C; j++)
            leaked += dqkv[j] != 0.0f;
    CHECK(leaked == 0, "attention backward: %d gradients reached tokens >= t0 from earlier rows", leaked);

    free(qkv); free(R); free(out); free(att); free(dqkv); free(dqkv1); free(scratch);
    free(c.qkv); free(c.R); free(c.out); free(g); free(out2); free(att2); free(qkv2); free(R2);
}

/* ---- GELU ------------------------------------------------------------ */

typedef struct { double *inp, *R, *out; size_t n; } gelu_ctx;

static void gelu_ref(const gelu_ctx *c) {
    for (size_t i = 0; i < c->n; i++) {
        const double x = c->inp[i];
        c->out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}
static double gelu_obj(const void *p) {
    const gelu_ctx *c = p;
    gelu_ref(c);
    return dot(c->out, c->R, c->n);
}

static void test_gelu(void) {
    const size_t n = 300;
    float *inp = falloc(n), *R = falloc(n), *out = falloc(n), *dinp = falloc(n), *d2 = falloc(n);
    fill_normal(inp, n, 2.5f);
    /* 0, tiny (tanh argument near 0), saturated both ways, huge */
    const float special[] = {0.0f, 1e-4f, -1e-4f, 12.0f, -12.0f, 40.0f, -40.0f, 1e6f, -1e6f};
    memcpy(inp, special, sizeof special);
    fill_normal(R, n, 1.0f);
    fill_nan(out, n);
    gelu_ctx c = {to_double(inp, n), to_double(R, n), dalloc(n), n};
    gelu_ref(&c);
    mf_gelu_forward(out, inp, n);
    expect_close("gelu out", out, c.out, n, FWD_RTOL, FWD_ATOL);
    double *g = dalloc(n);
    fd_grad(c.inp, n, g, gelu_obj, &c);
    fill_nan(dinp, n);
    mf_gelu_backward(dinp, inp, R, n);
    expect_close("gelu dinp", dinp, g, n, GRAD_RTOL, GRAD_ATOL);
    /* in place: dinp aliases dout */
    memcpy(d2, R, n * sizeof(float));
    mf_gelu_backward(d2, inp, d2, n);
    CHECK(memcmp(d2, dinp, n * sizeof(float)) == 0, "gelu backward in place differs");
    /* a NaN activation must stay NaN (divergence stays visible) */
    float xn = NAN, yn = 0.0f, dn = 1.0f;
    mf_gelu_forward(&yn, &xn, 1);
    mf_gelu_backward(&dn, &xn, &dn, 1);
    CHECK(isnan(yn) && isnan(dn), "gelu of NaN gave %g, grad %g", (double)yn, (double)dn);
    free(inp); free(R); free(out); free(dinp); free(d2);
    free(c.inp); free(c.R); free(c.out); free(g);
}

/* ---- cross-entropy --------------------------------------------------- */

typedef struct { double *logits, *losses; const int32_t *tg; int N, V, Vp; } ce_ctx;

/* Reads only the first V columns of each Vp-wide row. */
static double ce_obj(const void *p) {
    const ce_ctx *c = p;
    double total = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double *z = c->logits + (size_t)n * c->Vp;
        double mx = -INFINITY, s = 0.0;
        for (int j = 0; j < c->V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < c->V; j++) s += exp(z[j] - mx);
        c->losses[n] = mx + log(s) - z[c->tg[n]];
        total += c->losses[n];
    }
    return total;
}

static void test_crossentropy(void) {
    const int N = 5, V = 11, Vp = 16;
    const size_t nl = (size_t)N * Vp;
    int32_t tg[5] = {0, 10, 3, 7, 5};
    float *logits = falloc(nl), *lg = falloc(nl), *losses = falloc(N);
    fill_normal(logits, nl, 3.0f);
    for (int j = 0; j < V; j++) logits[(size_t)3 * Vp + j] += 200.0f; /* expf(200) overflows */
    /* padding is never read: NaN would poison any sum it entered, and a huge
     * value catches a max taken over Vp (a NaN loses every comparison) */
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = n % 2 ? 1e4f : NAN;
    ce_ctx c = {to_double(logits, nl), dalloc(N), tg, N, V, Vp};
    const double want = ce_obj(&c);

    memcpy(lg, logits, nl * sizeof(float));
    const double got0 = mf_crossentropy_forward(lg, losses, tg, N, V, Vp, 0.0f);
    CHECK(mf_close(got0, want, FWD_RTOL, FWD_ATOL), "crossentropy sum %.9g want %.9g", got0, want);
    expect_close("crossentropy losses", losses, c.losses, N, FWD_RTOL, FWD_ATOL);
    int changed = 0;
    for (size_t i = 0; i < nl; i++)
        changed += !(lg[i] == logits[i] || (isnan(lg[i]) && isnan(logits[i])));
    CHECK(changed == 0, "crossentropy with dscale 0 modified %d logits", changed);

    double *g = dalloc(nl);
    /* the reference never reads padding, so its FD gradient there is 0 */
    fd_grad(c.logits, nl, g, ce_obj, &c);
    float *zero = falloc(nl);
    memset(zero, 0, nl * sizeof(float));
    const float dscale = 0.25f;
    const double got = mf_crossentropy_forward(lg, losses, tg, N, V, Vp, dscale);
    CHECK(mf_close(got, want, FWD_RTOL, FWD_ATOL), "crossentropy sum (with grad) %.9g want %.9g", got, want);
    expect_close("crossentropy losses (with grad)", losses, c.losses, N, FWD_RTOL, FWD_ATOL);
    expect_increment("crossentropy dlogits", lg, zero, g, dscale, nl, GRAD_RTOL, GRAD_ATOL);
    int pad_nonzero = 0;
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) pad_nonzero += lg[(size_t)n * Vp + j] != 0.0f;
    CHECK(pad_nonzero == 0, "crossentropy: %d padding gradients are not exactly 0", pad_nonzero);
    /* a NaN logit (not the target) makes that row's loss NaN */
    memcpy(lg, logits, nl * sizeof(float));
    lg[(size_t)2 * Vp + 4] = NAN;
    const double gotn = mf_crossentropy_forward(lg, losses, tg, N, V, Vp, 0.0f);
    CHECK(isnan(gotn) && isnan(losses[2]) && !isnan(losses[1]),
          "crossentropy with a NaN logit: sum %g, row loss %g", gotn, (double)losses[2]);
    free(logits); free(lg); free(losses); free(c.logits); free(c.losses); free(g); free(zero);
}

/* ---- classifier (tied output head) ------------------------------------ */

typedef struct { double *x, *wte, *R, *out; int N, C, Vp; } cls_ctx;

static double cls_obj(const void *p) {
    const cls_ctx *c = p;
    for (int n = 0; n < c->N; n++)
        for (int v = 0; v < c->Vp; v++) {
            double s = 0.0;
            for (int i = 0; i < c->C; i++) s += c->x[(size_t)n * c->C + i] * c->wte[(size_t)v * c->C + i];
            c->out[(size_t)n * c->Vp + v] = s;
        }
    return dot(c->out, c->R, (size_t)c->N * c->Vp);
}

static void test_classifier(void) {
    const int N = 5, C = 7, Vp = 9;
    const size_t nx = (size_t)N * C, nw = (size_t)Vp * C, no = (size_t)N * Vp;
    float *x = falloc(nx), *wte = falloc(nw), *R = falloc(no), *out = falloc(no);
    float *dx = falloc(nx), *dwte = falloc(nw), *dwte0 = falloc(nw);
    fill_normal(x, nx, 1.0f);
    fill_normal(wte, nw, 1.0f);
    fill_normal(R, no, 1.0f);
    cls_ctx c = {to_double(x, nx), to_double(wte, nw), to_double(R, no), dalloc(no), N, C, Vp};
    cls_obj(&c);
    fill_nan(out, no);
    mf_classifier_forward(out, x, wte, N, C, Vp);
    expect_close("classifier logits", out, c.out, no, FWD_RTOL, FWD_ATOL);
    double *gx = dalloc(nx), *gw = dalloc(nw);
    fd_grad(c.x, nx, gx, cls_obj, &c);
    fd_grad(c.wte, nw, gw, cls_obj, &c);
    fill_nan(dx, nx);
    fill_normal(dwte0, nw, 1.0f);
    memcpy(dwte, dwte0, nw * sizeof(float));
    mf_classifier_backward(dx, dwte, R, x, wte, N, C, Vp);
    expect_close("classifier dx", dx, gx, nx, GRAD_RTOL, GRAD_ATOL);
    expect_increment("classifier dwte", dwte, dwte0, gw, 1.0, nw, GRAD_RTOL, GRAD_ATOL);
    mf_classifier_backward(dx, dwte, R, x, wte, N, C, Vp);
    expect_close("classifier dx (again, overwritten)", dx, gx, nx, GRAD_RTOL, GRAD_ATOL);
    expect_increment("classifier dwte x2", dwte, dwte0, gw, 2.0, nw, GRAD_RTOL, GRAD_ATOL);
    free(x); free(wte); free(R); free(out); free(dx); free(dwte); free(dwte0);
    free(c.x); free(c.wte); free(c.R); free(c.out); free(gx); free(gw);
}

/* ---- vectorised exp/tanh (src/kernels/vmath.h) ----------------------- */

static void test_vmath(void) {
    double emax = 0.0, tmax = 0.0;
    for (int i = 0; i <= 400000; i++) {
        const float x = -87.0f + 175.0f * (float)i / 400000.0f;
        const double e = exp((double)x);
        emax = fmax(emax, fabs((double)mf_vexpf(x) - e) / e);
        const float u = -20.0f + 40.0f * (float)i / 400000.0f;
        tmax = fmax(tmax, fabs((double)mf_vtanhf(u) - tanh((double)u)));
    }
    CHECK(emax < 2e-7, "mf_vexpf max relative error %g", emax);
    CHECK(tmax < 3e-7, "mf_vtanhf max absolute error %g", tmax);
    CHECK(mf_vexpf(0.0f) == 1.0f, "exp(0) = %.9g", (double)mf_vexpf(0.0f));
    CHECK(isfinite(mf_vexpf(1000.0f)) && mf_vexpf(1000.0f) > 1e38f, "exp(1000) must clamp high");
    CHECK(mf_vexpf(-1000.0f) >= 0.0f && mf_vexpf(-1000.0f) < 1e-37f, "exp(-1000) must clamp low");
    CHECK(mf_vexpf(-INFINITY) < 1e-37f && isfinite(mf_vexpf(INFINITY)), "exp(+-inf) must clamp");
    CHECK(isnan(mf_vexpf(NAN)) && isnan(mf_vexpf(-NAN)), "exp(NaN) must be NaN");
    CHECK(mf_vtanhf(50.0f) == 1.0f && mf_vtanhf(-50.0f) == -1.0f && mf_vtanhf(INFINITY) == 1.0f,
          "tanh limits");
}

/* ---- sumsq, scale ---------------------------------------------------- */

static void test_sumsq_scale(void) {
    const size_t sizes[] = {0, 1, 255, 257, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        float *x = falloc(n);
        fill_normal(x, n, 1.0f);
        double want = 0.0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        const double got = mf_sumsq(x, n);
        CHECK(mf_close(got, want, 1e-12, 0.0), "sumsq n=%zu: %.17g want %.17g", n, got, want);
        mf_scale(x, -0.5f, n);
        CHECK(mf_close(mf_sumsq(x, n), 0.25 * want, 1e-7, 0.0), "scale n=%zu", n);
        free(x);
    }
}

/* ---- determinism across thread counts -------------------------------- */

/* The row-crossing reductions (dwte/dwpe, layernorm dw/db, dbias, sumsq,
 * the cross-entropy total) must give identical bits with 1 thread and with
 * the default team, at a size large enough to take the parallel paths. */
static void test_thread_invariance(void) {
    const int B = 4, T = 16, C = 200, V = 9, OC = 130;
    const size_t N = (size_t)B * T, n = N * C;
    int32_t *inp = malloc(N * sizeof(int32_t));
    for (size_t i = 0; i < N; i++) inp[i] = (int32_t)(mf_rng_u32(&rng) % V);
    float *x = falloc(n), *dout = falloc(n), *w = falloc(C), *b = falloc(C);
    float *y = falloc(n), *mean = falloc(N), *rstd = falloc(N), *dbo = falloc(N * OC);
    fill_normal(x, n, 1.0f);
    fill_normal(dout, n, 1.0f);
    fill_normal(w, C, 1.0f);
    fill_normal(b, C, 1.0f);
    fill_normal(dbo, N * OC, 1.0f);
    mf_layernorm_forward(y, mean, rstd, x, w, b, (int)N, C);

    const size_t nres = (size_t)V * C + (size_t)T * C + n + 2 * (size_t)C + OC + 1;
    float *res[2], *lg[2];
    double ss[2], ce[2];
    const int V2 = 300, Vp2 = 320; /* cross-entropy over N rows */
    int32_t *tg = malloc(N * sizeof(int32_t));
    for (size_t i = 0; i < N; i++) tg[i] = (int32_t)(mf_rng_u32(&rng) % V2);
    float *logits = falloc(N * Vp2), *losses = falloc(N);
    fill_normal(logits, N * Vp2, 2.0f);
    const int nt_default = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r == 0 ? 1 : (nt_default > 1 ? nt_default : 3));
        float *o = res[r] = calloc(nres, sizeof(float));
        float *dwte = o, *dwpe = dwte + (size_t)V * C, *dinp = dwpe + (size_t)T * C;
        float *dw = dinp + n, *db = dw + C, *dbias = db + C;
        mf_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
        mf_layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, (int)N, C);
        float *W = falloc((size_t)C * OC), *dW = falloc((size_t)C * OC);
        memset(W, 0, (size_t)C * OC * sizeof(float));
        memset(dW, 0, (size_t)C * OC * sizeof(float));
        mf_matmul_backward(NULL, dW, dbias, dbo, x, W, (int)N, C, OC);
        free(W);
        free(dW);
        ss[r] = mf_sumsq(x, n);
        lg[r] = falloc(N * Vp2);
        memcpy(lg[r], logits, N * Vp2 * sizeof(float));
        ce[r] = mf_crossentropy_forward(lg[r], losses, tg, (int)N, V2, Vp2, 1.0f / (float)N);
    }
    omp_set_num_threads(nt_default);
    CHECK(memcmp(res[0], res[1], nres * sizeof(float)) == 0,
          "reductions differ between 1 thread and several");
    CHECK(ss[0] == ss[1], "sumsq differs between 1 thread and several");
    CHECK(ce[0] == ce[1] && memcmp(lg[0], lg[1], N * Vp2 * sizeof(float)) == 0,
          "crossentropy differs between 1 thread and several");
    free(lg[0]); free(lg[1]); free(tg); free(logits); free(losses);
    free(res[0]); free(res[1]); free(inp); free(x); free(dout); free(w); free(b);
    free(y); free(mean); free(rstd); free(dbo);
}

int main(void) {
    mf_rng_seed(&rng, 1234);
    test_encoder();
    test_layernorm();
    test_matmul();
    test_attention();
    test_gelu();
    test_crossentropy();
    test_classifier();
    test_vmath();
    test_sumsq_scale();
    test_thread_invariance();
    return mf_test_done("test_kernels_gradcheck");
}
