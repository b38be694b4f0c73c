/* Proves the Llama-family kernels compute what their double-precision
 * definitions say:
 *  - grouped-query FlashAttention (NH = NKV, 8/2, 4/1) with and without a
 *    sliding window (window < T, = a tile, >= T), T not a multiple of the 64
 *    tile, hs 16 and 64: out, lse and dqkv against a materialised-scores
 *    reference; 1 and 2 threads give bitwise the same results; key tiles
 *    wholly outside the window are skipped (NaN keys/values there do not
 *    reach rows that cannot see them);
 *  - GPT-2's mf_flash_attention_forward/_backward are bitwise the GQA kernel
 *    with NKV = NH, window 0;
 *  - RMSNorm forward (out, rstd) and backward (dinp and dw accumulate; dw
 *    NULL) against double formulas, the backward formula itself checked by
 *    central differences;
 *  - the RoPE table (plain and llama3-scaled, all three frequency bands hit)
 *    against the double formula; apply against a direct computation, apply
 *    then inverse restores the input, value heads untouched, pos[] = n % T
 *    equals pos NULL bitwise, and an arbitrary pos[] picks the right rows;
 *  - SwiGLU forward/backward against double, also with dgate = gate and
 *    dup = up.
 * Outputs are NaN-filled first so anything left unwritten shows up; scratch
 * is allocated at exactly the advertised size so ASan catches overruns. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *nanbuf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* got against want: each entry within rtol of the larger of |want| and
 * floor_frac * max|want| (entries that are sums of terms of both signs
 * carry the rounding of the terms, as in attention_ref.h). */
static void close_d(const char *what, const char *shape, const float *got, const double *want, size_t n,
                    double rtol, double floor_frac) {
    double amax = 0.0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(want[i]));
    size_t bad = 0, worst = 0;
    double worst_err = -1.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / (rtol * fmax(fabs(want[i]), floor_frac * amax) + 1e-30);
        if (isnan(err)) err = INFINITY;
        if (err > 1.0) bad++;
        if (err > worst_err) { worst_err = err; worst = i; }
    }
    CHECK(bad == 0, "%s %s: %zu of %zu differ; worst [%zu] got %.9g want %.9g (err %.3g of tolerance)", what,
          shape, bad, n, worst, (double)got[worst], want[worst], worst_err);
    if (getenv("MEMFIT_TEST_VERBOSE")) /* the margins, for tuning tolerances */
        printf("%-22s %-44s worst %.3g of tolerance\n", what, shape, worst_err);
}

/* ---- GQA attention ------------------------------------------------------ */

/* Causal GQA attention with a window, in double, scores materialised per
 * row: query head h uses kv head h / (NH/NKV); row i sees j in
 * (i - window, i] (window 0: all j <= i). out (B,T,NH*hs), lse (B,NH,T),
 * dqkv (B,T,QKV). */
static void gqa_ref(const double *qkv, const double *dout, double *out, double *lse, double *dqkv, int B, int T,
                    int NH, int NKV, int hs, int window) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, G = NH / NKV;
    const double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)B * T * QKV * sizeof(double));
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kh = h / G;
            for (int i = 0; i < T; i++) {
                const int jlo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                const double *q = qkv + ((size_t)b * T + i) * QKV + (size_t)h * hs;
                double mx = -INFINITY, s = 0.0;
                for (int j = jlo; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * QKV + (size_t)(NH + kh) * hs;
                    double d = 0.0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = jlo; j <= i; j++) s += (p[j] = exp(p[j] - mx));
                lse[((size_t)b * NH + h) * T + i] = mx + log(s);
                for (int j = jlo; j <= i; j++) p[j] /= s;
                for (int e = 0; e < hs; e++) {
                    double o = 0.0;
                    for (int j = jlo; j <= i; j++)
                        o += p[j] * qkv[((size_t)b * T + j) * QKV + (size_t)(NH + NKV + kh) * hs + e];
                    out[((size_t)b * T + i) * C + (size_t)h * hs + e] = o;
                }
                const double *dO = dout + ((size_t)b * T + i) * C + (size_t)h * hs;
                double dot = 0.0;
                for (int j = jlo; j <= i; j++) {
                    const size_t r = ((size_t)b * T + j) * QKV + (size_t)(NH + NKV + kh) * hs;
                    dp[j] = 0.0;
                    for (int e = 0; e < hs; e++) {
                        dp[j] += dO[e] * qkv[r + e];
                        dqkv[r + e] += p[j] * dO[e];
                    }
                    dot += p[j] * dp[j];
                }
                double *dq = dqkv + ((size_t)b * T + i) * QKV + (size_t)h * hs;
                for (int j = jlo; j <= i; j++) {
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    const size_t r = ((size_t)b * T + j) * QKV + (size_t)(NH + kh) * hs;
                    for (int e = 0; e < hs; e++) {
                        dq[e] += ds * qkv[r + e];
                        dqkv[r + e] += ds * q[e];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

typedef struct {
    float *out, *lse, *dqkv;
} gqa_res;

static gqa_res gqa_run(const float *qkv, const float *dout, int B, int T, int NH, int NKV, int hs, int window,
                       int nt) {
    omp_set_num_threads(nt);
    const size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    gqa_res r = {nanbuf(nout), nanbuf((size_t)B * NH * T), nanbuf(nqkv)};
    float *scratch = nanbuf(mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()));
    mf_flash_attention_gqa_forward(r.out, r.lse, qkv, B, T, NH, NKV, hs, window);
    mf_flash_attention_gqa_backward(r.dqkv, scratch, dout, r.out, qkv, r.lse, B, T, NH, NKV, hs, window);
    free(scratch);
    return r;
}

static void gqa_free(gqa_res *r) {
    free(r->out);
    free(r->lse);
    free(r->dqkv);
}

static void test_gqa(mf_rng *rng, int B, int T, int NH, int NKV, int hs, int window) {
    char shape[128];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d hs=%d window=%d", B, T, NH, NKV, hs, window);
    const int QKV = (NH + 2 * NKV) * hs;
    const size_t nqkv = (size_t)B * T * QKV, nout = (size_t)B * T * NH * hs, nlse = (size_t)B * NH * T;
    float *qkv = malloc(nqkv * sizeof(float)), *dout = malloc(nout * sizeof(float));
    double *dq = malloc(nqkv * sizeof(double)), *dd = malloc(nout * sizeof(double));
    double *rout = malloc(nout * sizeof(double)), *rlse = malloc(nlse * sizeof(double));
    double *rdqkv = malloc(nqkv * sizeof(double));
    for (size_t i = 0; i < nqkv; i++) dq[i] = qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dd[i] = dout[i] = mf_rng_normal(rng);
    gqa_ref(dq, dd, rout, rlse, rdqkv, B, T, NH, NKV, hs, window);

    gqa_res r1 = gqa_run(qkv, dout, B, T, NH, NKV, hs, window, 1);
    gqa_res r2 = gqa_run(qkv, dout, B, T, NH, NKV, hs, window, 2);
    close_d("gqa out", shape, r2.out, rout, nout, 1e-5, 0.25);
    close_d("gqa lse", shape, r2.lse, rlse, nlse, 1e-5, 0.25);
    close_d("gqa dqkv", shape, r2.dqkv, rdqkv, nqkv, 1e-5, 0.25);
    CHECK(!memcmp(r1.out, r2.out, nout * sizeof(float)) && !memcmp(r1.lse, r2.lse, nlse * sizeof(float)) &&
              !memcmp(r1.dqkv, r2.dqkv, nqkv * sizeof(float)),
          "gqa %s: 1 and 2 threads differ", shape);

    /* tiles wholly outside the window are skipped: NaN keys and values in
     * the first key tile (tokens 0..63) leave every query tile that starts
     * at or after 64 + window - 1 bitwise unchanged (forward: out, lse;
     * backward: dq of those rows); a masked-but-visited tile would turn them
     * NaN through the 0 * NaN of its P V product */
    const int iq = (64 + window - 1 + 63) / 64 * 64; /* first such query tile */
    if (window > 0 && window < T && iq < T) {
        float *poisoned = malloc(nqkv * sizeof(float));
        memcpy(poisoned, qkv, nqkv * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < 64; t++)
                for (int c = NH * hs; c < QKV; c++) poisoned[((size_t)b * T + t) * QKV + c] = NAN;
        gqa_res rp = gqa_run(poisoned, dout, B, T, NH, NKV, hs, window, 2);
        int ok = 1;
        for (int b = 0; b < B; b++)
            for (int t = iq; t < T; t++) {
                const size_t o = ((size_t)b * T + t) * NH * hs, q = ((size_t)b * T + t) * QKV;
                ok &= !memcmp(rp.out + o, r2.out + o, (size_t)NH * hs * sizeof(float));
                ok &= !memcmp(rp.dqkv + q, r2.dqkv + q, (size_t)NH * hs * sizeof(float));
                for (int h = 0; h < NH; h++)
                    ok &= !memcmp(rp.lse + ((size_t)b * NH + h) * T + t, r2.lse + ((size_t)b * NH + h) * T + t,
                                  sizeof(float));
            }
        CHECK(ok, "gqa %s: rows >= %d touched the skipped key tile 0", shape, iq);
        gqa_free(&rp);
        free(poisoned);
    }
    gqa_free(&r1);
    gqa_free(&r2);
    free(qkv); free(dout); free(dq); free(dd); free(rout); free(rlse); free(rdqkv);
}

/* GPT-2's entry points are the GQA kernel with NKV = NH, window 0, bitwise. */
static void test_gpt2_wrapper(mf_rng *rng, int B, int T, int C, int NH) {
    omp_set_num_threads(2);
    const int hs = C / NH;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    float *qkv = malloc(nqkv * sizeof(float)), *dout = malloc(nout * sizeof(float));
    for (size_t i = 0; i < nqkv; i++) qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dout[i] = mf_rng_normal(rng);
    float *out = nanbuf(nout), *lse = nanbuf(nlse), *dqkv = nanbuf(nqkv);
    float *scratch = nanbuf(mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()));
    mf_flash_attention_forward(out, lse, qkv, B, T, C, NH);
    mf_flash_attention_backward(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH);
    gqa_res g = gqa_run(qkv, dout, B, T, NH, NH, hs, 0, 2);
    gqa_res g1 = gqa_run(qkv, dout, B, T, NH, NH, hs, 0, 1);
    CHECK(!memcmp(out, g.out, nout * sizeof(float)) && !memcmp(lse, g.lse, nlse * sizeof(float)) &&
              !memcmp(dqkv, g.dqkv, nqkv * sizeof(float)) && !memcmp(out, g1.out, nout * sizeof(float)) &&
              !memcmp(dqkv, g1.dqkv, nqkv * sizeof(float)),
          "GPT-2 flash attention is not bitwise the GQA kernel (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    gqa_free(&g);
    gqa_free(&g1);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(scratch);
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* y = x r w, r = (mean(x^2) + eps)^(-1/2); L = sum(dout * y) for the
 * finite-difference check. */
static double rms_loss(const double *x, const double *w, const double *d, int C, double eps) {
    double ss = 0.0, L = 0.0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const double r = 1.0 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) L += d[c] * x[c] * r * w[c];
    return L;
}

static void test_rmsnorm(mf_rng *rng, int N, int C, float eps) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d eps=%g", N, C, (double)eps);
    const size_t n = (size_t)N * C;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float)), *w = malloc(C * sizeof(float));
    float *out = nanbuf(n), *rstd = nanbuf(N), *dx = malloc(n * sizeof(float)), *dw = malloc(C * sizeof(float));
    double *rout = malloc(n * sizeof(double)), *rr = malloc(N * sizeof(double));
    double *rdx = malloc(n * sizeof(double)), *rdw = calloc(C, sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * mf_rng_normal(rng) + 0.5f;
    for (size_t i = 0; i < n; i++) d[i] = mf_rng_normal(rng);
    for (int c = 0; c < C; c++) w[c] = 1.0f + 0.3f * mf_rng_normal(rng);
    /* accumulation: dx and dw start non-zero */
    for (size_t i = 0; i < n; i++) dx[i] = 0.5f * mf_rng_normal(rng);
    for (int c = 0; c < C; c++) dw[c] = 0.5f * mf_rng_normal(rng);
    for (size_t i = 0; i < n; i++) rdx[i] = dx[i];
    for (int c = 0; c < C; c++) rdw[c] = dw[c];

    double fd_worst = 0.0;
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C, *dr = d + (size_t)r * C;
        double ss = 0.0, gx = 0.0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(ss / C + (double)eps);
        rr[r] = rs;
        for (int c = 0; c < C; c++) rout[(size_t)r * C + c] = xr[c] * rs * w[c];
        for (int c = 0; c < C; c++) gx += (double)dr[c] * w[c] * xr[c];
        double gdx[4096];
        for (int c = 0; c < C; c++) {
            gdx[c] = rs * ((double)dr[c] * w[c] - xr[c] * rs * rs * gx / C);
            rdx[(size_t)r * C + c] += gdx[c];
            rdw[c] += (double)dr[c] * xr[c] * rs;
        }
        /* the analytic formula against central differences (double), on
         * a few entries of the first rows */
        if (r < 3) {
            double xd[4096], wd[4096], dd[4096];
            for (int c = 0; c < C; c++) xd[c] = xr[c], wd[c] = w[c], dd[c] = dr[c];
            for (int c = 0; c < C; c += C / 5 + 1) {
                const double hh = 1e-5, x0 = xd[c];
                xd[c] = x0 + hh;
                const double lp = rms_loss(xd, wd, dd, C, eps);
                xd[c] = x0 - hh;
                const double lm = rms_loss(xd, wd, dd, C, eps);
                xd[c] = x0;
                const double fd = (lp - lm) / (2 * hh);
                fd_worst = fmax(fd_worst, fabs(fd - gdx[c]) / fmax(fabs(gdx[c]), 1e-3));
            }
        }
    }
    CHECK(fd_worst < 1e-6, "rmsnorm %s: analytic dx vs central differences: worst relative %.3g", shape, fd_worst);

    float *dx2 = malloc(n * sizeof(float)), *dw2 = malloc(C * sizeof(float)), *dx3 = malloc(n * sizeof(float));
    memcpy(dx2, dx, n * sizeof(float));
    memcpy(dx3, dx, n * sizeof(float));
    memcpy(dw2, dw, C * sizeof(float));
    omp_set_num_threads(2);
    mf_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    close_d("rmsnorm out", shape, out, rout, n, 1e-6, 0.0);
    close_d("rmsnorm rstd", shape, rstd, rr, N, 1e-6, 0.0);
    mf_rmsnorm_backward(dx, dw, d, x, w, rstd, N, C);
    close_d("rmsnorm dinp", shape, dx, rdx, n, 1e-5, 1e-2);
    close_d("rmsnorm dw", shape, dw, rdw, C, 1e-5, 0.05); /* float sums of N terms of both signs */
    /* one thread: bitwise the same; dw NULL: dinp unchanged */
    omp_set_num_threads(1);
    mf_rmsnorm_backward(dx2, dw2, d, x, w, rstd, N, C);
    CHECK(!memcmp(dx, dx2, n * sizeof(float)) && !memcmp(dw, dw2, C * sizeof(float)),
          "rmsnorm %s: 1 and 2 threads differ", shape);
    omp_set_num_threads(2);
    mf_rmsnorm_backward(dx3, NULL, d, x, w, rstd, N, C);
    CHECK(!memcmp(dx, dx3, n * sizeof(float)), "rmsnorm %s: dw NULL changed dinp", shape);
    /* in place (out = inp) gives the same out */
    float *xi = malloc(n * sizeof(float)), *rs2 = nanbuf(N);
    memcpy(xi, x, n * sizeof(float));
    mf_rmsnorm_forward(xi, rs2, xi, w, N, C, eps);
    CHECK(!memcmp(xi, out, n * sizeof(float)), "rmsnorm %s: in-place forward differs", shape);
    free(xi); free(rs2);
    free(x); free(d); free(w); free(out); free(rstd); free(dx); free(dw); free(dx2); free(dw2); free(dx3);
    free(rout); free(rr); free(rdx); free(rdw);
}

/* ---- RoPE --------------------------------------------------------------- */

/* transformers' _compute_default_rope_parameters + _compute_llama3_parameters,
 * in double, written out as there */
static double ref_inv_freq(int i, int hs, double theta, const mf_rope_scaling *sc, int *band) {
    double f = 1.0 / pow(theta, (double)(2 * i) / hs);
    *band = 0;
    if (!sc || sc->type != MF_ROPE_LLAMA3) return f;
    const double old = sc->original_max_position_embeddings;
    const double lw = old / sc->low_freq_factor, hw = old / sc->high_freq_factor;
    const double wl = 2 * acos(-1.0) / f;
    const double scaled = wl > lw ? f / sc->factor : f;
    const double sm = (old / wl - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
    const double smoothed = (1 - sm) * scaled / sc->factor + sm * scaled;
    const int medium = !(wl < hw) && !(wl > lw);
    *band = wl > lw ? 1 : medium ? 2 : 3;
    return medium ? smoothed : scaled;
}

static void test_rope_table(int T, int hs, double theta, const mf_rope_scaling *sc) {
    char shape[96];
    snprintf(shape, sizeof shape, "T=%d hs=%d theta=%g %s", T, hs, theta,
             sc && sc->type == MF_ROPE_LLAMA3 ? "llama3" : "plain");
    const int half = hs / 2;
    float *tab = nanbuf((size_t)2 * T * half);
    double *want = malloc((size_t)2 * T * half * sizeof(double));
    int bands[4] = {0};
    for (int i = 0; i < half; i++) {
        int band;
        const double f = ref_inv_freq(i, hs, theta, sc, &band);
        bands[band]++;
        for (int t = 0; t < T; t++) {
            want[(size_t)t * half + i] = (float)cos(t * f);
            want[(size_t)T * half + (size_t)t * half + i] = (float)sin(t * f);
        }
    }
    if (sc && sc->type == MF_ROPE_LLAMA3)
        CHECK(bands[1] && bands[2] && bands[3], "rope %s: test misses a band (low %d, medium %d, high %d)", shape,
              bands[1], bands[2], bands[3]);
    mf_rope_table(tab, T, hs, theta, sc);
    /* both are the double value rounded once: equal but for a double ulp
     * that flips a rounding */
    size_t bad = 0;
    for (size_t k = 0; k < (size_t)2 * T * half; k++)
        if (!(fabs(tab[k] - want[k]) <= 6e-8)) bad++;
    CHECK(bad == 0, "rope table %s: %zu entries differ", shape, bad);
    free(tab);
    free(want);
}

static void test_rope_apply(mf_rng *rng, int B, int T, int NH, int NKV, int hs, const mf_rope_scaling *sc) {
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d hs=%d", B, T, NH, NKV, hs);
    const int half = hs / 2, QKV = (NH + 2 * NKV) * hs, N = B * T;
    const size_t n = (size_t)N * QKV;
    float *tab = malloc((size_t)2 * T * half * sizeof(float));
    mf_rope_table(tab, T, hs, 500000.0, sc);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *z = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = mf_rng_normal(rng);
    int32_t *pos = malloc((size_t)N * sizeof(int32_t));

    /* direct double computation from the same table, for positions pos */
    for (int mode = 0; mode < 3; mode++) { /* pos NULL, pos = n % T, scattered pos */
        for (int r = 0; r < N; r++) pos[r] = mode == 2 ? (int32_t)((r * 37 + 11) % T) : r % T;
        for (int r = 0; r < N; r++) {
            const int p = pos[r];
            for (int c = 0; c < QKV; c++) want[(size_t)r * QKV + c] = x[(size_t)r * QKV + c];
            for (int h = 0; h < NH + NKV; h++)
                for (int i = 0; i < half; i++) {
                    const size_t a = (size_t)r * QKV + (size_t)h * hs + i, b2 = a + half;
                    const double c = tab[(size_t)p * half + i], s = tab[(size_t)T * half + (size_t)p * half + i];
                    want[a] = x[a] * c - x[b2] * s;
                    want[b2] = x[b2] * c + x[a] * s;
                }
        }
        memcpy(y, x, n * sizeof(float));
        mf_rope_apply(y, tab, mode == 0 ? NULL : pos, B, T, NH, NKV, hs, 0);
        close_d(mode == 0 ? "rope apply (pos NULL)" : mode == 1 ? "rope apply (pos n%T)" : "rope apply (pos[])",
                shape, y, want, n, 1e-6, 0.25);
        if (mode == 0) memcpy(z, y, n * sizeof(float));
        if (mode == 1)
            CHECK(!memcmp(y, z, n * sizeof(float)), "rope %s: pos = n %% T differs from pos NULL", shape);
        /* value heads untouched */
        int vok = 1;
        for (int r = 0; r < N; r++)
            vok &= !memcmp(y + (size_t)r * QKV + (size_t)(NH + NKV) * hs, x + (size_t)r * QKV + (size_t)(NH + NKV) * hs,
                           (size_t)NKV * hs * sizeof(float));
        CHECK(vok, "rope %s: value heads changed", shape);
        /* inverse restores the input */
        mf_rope_apply(y, tab, mode == 0 ? NULL : pos, B, T, NH, NKV, hs, 1);
        double *xd = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) xd[i] = x[i];
        close_d("rope apply+inverse", shape, y, xd, n, 1e-6, 0.25);
        free(xd);
    }
    free(tab); free(x); free(y); free(z); free(want); free(pos);
}

/* ---- SwiGLU ------------------------------------------------------------- */

static void test_swiglu(mf_rng *rng, size_t n) {
    float *g = malloc(n * sizeof(float)), *u = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    float *out = nanbuf(n), *dg = nanbuf(n), *du = nanbuf(n);
    double *ro = calloc(n, sizeof(double)), *rdg = calloc(n, sizeof(double)), *rdu = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        g[i] = 4.0f * mf_rng_normal(rng);
        u[i] = mf_rng_normal(rng);
        d[i] = mf_rng_normal(rng);
    }
    if (n >= 4) g[0] = 0.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = -1.2784645f; /* silu' ~ 0 at the last */
    size_t bad_g = 0;
    for (size_t i = 0; i < n; i++) {
        const double s = 1.0 / (1.0 + exp(-(double)g[i]));
        ro[i] = g[i] * s * u[i];
        rdu[i] = d[i] * g[i] * s;
        rdg[i] = (double)d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
    }
    omp_set_num_threads(2);
    mf_swiglu_forward(out, g, u, n);
    close_d("swiglu out", "", out, ro, n, 2e-6, 0.0);
    mf_swiglu_backward(dg, du, d, g, u, n);
    close_d("swiglu dup", "", du, rdu, n, 2e-6, 0.0);
    /* dgate: silu' crosses 0 near g = -1.278, where 1 + g(1 - s) cancels;
     * hold it to the scale of its factors |dout * up| */
    for (size_t i = 0; i < n; i++)
        if (!(fabs(dg[i] - rdg[i]) <= 2e-6 * (fabs(rdg[i]) + fabs((double)d[i] * u[i])))) bad_g++;
    CHECK(bad_g == 0, "swiglu dgate: %zu of %zu differ", bad_g, n);
    /* dgate = gate, dup = up in place */
    float *g2 = malloc(n * sizeof(float)), *u2 = malloc(n * sizeof(float));
    memcpy(g2, g, n * sizeof(float));
    memcpy(u2, u, n * sizeof(float));
    mf_swiglu_backward(g2, u2, d, g2, u2, n);
    CHECK(!memcmp(g2, dg, n * sizeof(float)) && !memcmp(u2, du, n * sizeof(float)),
          "swiglu backward in place differs from out of place");
    free(g2); free(u2);
    free(g); free(u); free(d); free(out); free(dg); free(du); free(ro); free(rdg); free(rdu);
}

int main(void) {
    mf_rng rng;
    mf_rng_seed(&rng, 4321);
    const int nt0 = omp_get_max_threads();
    static const int shapes[][6] = {
        /* B, T, NH, NKV, hs, window */
        {2, 100, 4, 4, 16, 0},  {1, 130, 8, 2, 16, 0},  {1, 100, 4, 1, 64, 0},   {1, 130, 8, 2, 16, 17},
        {2, 100, 4, 1, 16, 64}, {1, 130, 4, 4, 64, 17}, {1, 200, 4, 2, 16, 17},  {1, 200, 8, 2, 16, 64},
        {1, 130, 4, 1, 16, 1},  {1, 100, 8, 2, 16, 100}, {1, 130, 4, 2, 64, 500}, {1, 7, 4, 2, 16, 3},
        {1, 1, 2, 1, 16, 0},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        test_gqa(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], shapes[s][5]);
    test_gpt2_wrapper(&rng, 2, 130, 64, 4);
    test_gpt2_wrapper(&rng, 1, 65, 96, 3);

    test_rmsnorm(&rng, 37, 200, 1e-5f);
    test_rmsnorm(&rng, 64, 256, 1e-6f);
    test_rmsnorm(&rng, 3, 7, 1e-5f);

    const mf_rope_scaling l3 = {MF_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192};
    const mf_rope_scaling none = {MF_ROPE_NONE, 0, 0, 0, 0};
    test_rope_table(300, 64, 500000.0, &l3);
    test_rope_table(300, 64, 500000.0, NULL);
    test_rope_table(130, 16, 10000.0, &none);
    test_rope_table(9000, 128, 500000.0, &l3);
    test_rope_apply(&rng, 2, 50, 4, 2, 64, &l3);
    test_rope_apply(&rng, 1, 33, 8, 8, 16, NULL);

    test_swiglu(&rng, 10007);
    test_swiglu(&rng, 5);
    omp_set_num_threads(nt0);
    return mf_test_done("test_llama_kernels");
}
