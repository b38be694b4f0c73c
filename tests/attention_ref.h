/* Shared by the attention tests: a double-precision reference of causal
 * attention and the tolerance both kernels are held to. */
#ifndef MEMFIT_ATTENTION_REF_H
#define MEMFIT_ATTENTION_REF_H
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "testutil.h"

/* Causal attention forward and backward in double, loop by loop (as in
 * llm.c's CPU reference): out (B,T,C), dqkv (B,T,3C); if non-NULL, p
 * (B,NH,T,T) gets the probabilities (0 above the diagonal) and lse (B,NH,T)
 * each row's log-sum-exp of the scaled scores. */
static void attn_ref(const double *qkv, const double *dout, double *out, double *p, double *lse,
                     double *dqkv, int B, int T, int C, int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(double));
    double *pr = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * C3 + h * hs;
                double mx = -INFINITY, s = 0.0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double d = 0.0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    pr[j] = d * scale;
                    if (pr[j] > mx) mx = pr[j];
                }
                for (int j = 0; j <= i; j++) s += (pr[j] = exp(pr[j] - mx));
                if (lse) lse[((size_t)b * NH + h) * T + i] = mx + log(s);
                for (int j = 0; j <= i; j++) pr[j] /= s;
                if (p)
                    for (int j = 0; j < T; j++) p[(((size_t)b * NH + h) * T + i) * T + j] = j <= i ? pr[j] : 0.0;
                for (int e = 0; e < hs; e++) {
                    double o = 0.0;
                    for (int j = 0; j <= i; j++)
                        o += pr[j] * qkv[((size_t)b * T + j) * C3 + 2 * C + h * hs + e];
                    out[((size_t)b * T + i) * C + h * hs + e] = o;
                }
                const double *dO = dout + ((size_t)b * T + i) * C + h * hs;
                double dot = 0.0;
                for (int j = 0; j <= i; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    double *dv = dqkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    dp[j] = 0.0;
                    for (int e = 0; e < hs; e++) {
                        dp[j] += dO[e] * v[e];
                        dv[e] += pr[j] * dO[e];
                    }
                    dot += pr[j] * dp[j];
                }
                double *dq = dqkv + ((size_t)b * T + i) * C3 + h * hs;
                for (int j = 0; j <= i; j++) {
                    const double ds = pr[j] * (dp[j] - dot) * scale;
                    const double *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double *dk = dqkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    for (int e = 0; e < hs; e++) {
                        dq[e] += ds * k[e];
                        dk[e] += ds * q[e];
                    }
                }
            }
    free(pr);
    free(dp);
}

/* Relative agreement at 1e-5, relative to the larger of the entry and a
 * quarter of the array's largest magnitude (entries that are sums of terms of both signs carry rounding error of the
 * terms, not of the entry; observed worst: 5e-7 of the largest, for dqkv at T = 64). */
static void expect_close(const char *what, const float *got, const double *want,
                         size_t n, int B, int T, int C, int NH, int nt) {
    double amax = 0.0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(want[i]));
    size_t bad = 0, worst = 0;
    double worst_err = -1.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / (1e-5 * fmax(fabs(want[i]), 0.25 * amax) + 1e-30);
        if (isnan(err)) err = INFINITY;
        if (err > 1.0) bad++;
        if (err > worst_err) { worst_err = err; worst = i; }
    }
    CHECK(bad == 0, "%s B=%d T=%d C=%d NH=%d threads=%d: %zu of %zu differ; worst [%zu] got %.9g want %.9g",
          what, B, T, C, NH, nt, bad, n, worst, (double)got[worst], want[worst]);
}

#endif
