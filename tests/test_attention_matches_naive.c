/* Proves the BLAS-based attention kernels agree with the textbook triple
 * loop (computed in double) for edge and ordinary shapes: T = 1 (a single
 * token attends only to itself), T = 5 (not a power of two), T = 64; one
 * head and four heads; 1, 2 and 3 OpenMP threads (3 exceeds the cores of a
 * small machine and the number of (b, h) tasks of some shapes). Outputs
 * are pre-filled with NaN so anything left unwritten shows up, and scratch
 * is allocated at exactly the advertised size so ASan catches overruns. */
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Forward and backward of causal attention in double, loop by loop as in
 * llm.c's CPU reference: p (B,NH,T,T), out (B,T,C), dqkv (B,T,3C). */
static void naive(const double *qkv, const double *dout, double *p, double *out,
                  double *dqkv, int B, int T, int C, int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(double));
    double *dp = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * C3 + h * hs;
                double *pr = p + (((size_t)b * NH + h) * T + i) * T;
                double mx = -INFINITY, s = 0.0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double d = 0.0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    pr[j] = d * scale;
                    if (pr[j] > mx) mx = pr[j];
                }
                for (int j = 0; j <= i; j++) s += (pr[j] = exp(pr[j] - mx));
                for (int j = 0; j < T; j++) pr[j] = j <= i ? pr[j] / s : 0.0;
                for (int e = 0; e < hs; e++) {
                    double o = 0.0;
                    for (int j = 0; j <= i; j++)
                        o += pr[j] * qkv[((size_t)b * T + j) * C3 + 2 * C + h * hs + e];
                    out[((size_t)b * T + i) * C + h * hs + e] = o;
                }
                /* backward of row i */
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
    free(dp);
}

/* Relative agreement at 1e-5. Entries that are sums of terms of both signs
 * can be far smaller than the terms, and fp32 rounding then leaves them an
 * error of a few ulps of the terms, not of the entry: so "relative" is taken
 * against the larger of the entry and a quarter of the array's largest
 * magnitude (observed worst: 5e-7 of the largest, for dqkv at T = 64). */
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

static void run(mf_rng *rng, int B, int T, int C, int NH, int nt) {
    omp_set_num_threads(nt);
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T;
    const size_t nscr = mf_attention_scratch_floats(T, omp_get_max_threads());
    float *qkv = malloc(nqkv * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *out = malloc(nout * sizeof(float)), *att = malloc(natt * sizeof(float));
    float *dqkv = malloc(nqkv * sizeof(float)), *scratch = malloc(nscr * sizeof(float));
    double *dq = malloc(nqkv * sizeof(double)), *dd = malloc(nout * sizeof(double));
    double *rp = malloc(natt * sizeof(double)), *rout = malloc(nout * sizeof(double));
    double *rdqkv = malloc(nqkv * sizeof(double));
    for (size_t i = 0; i < nqkv; i++) dq[i] = qkv[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) dd[i] = dout[i] = mf_rng_normal(rng);
    for (size_t i = 0; i < nout; i++) out[i] = NAN;
    for (size_t i = 0; i < natt; i++) att[i] = NAN;
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = NAN;
    for (size_t i = 0; i < nscr; i++) scratch[i] = NAN;

    naive(dq, dd, rp, rout, rdqkv, B, T, C, NH);
    mf_attention_forward(out, att, qkv, B, T, C, NH);
    mf_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    expect_close("out", out, rout, nout, B, T, C, NH, nt);
    expect_close("att", att, rp, natt, B, T, C, NH, nt);
    expect_close("dqkv", dqkv, rdqkv, nqkv, B, T, C, NH, nt);
    free(qkv); free(dout); free(out); free(att); free(dqkv); free(scratch);
    free(dq); free(dd); free(rp); free(rout); free(rdqkv);
}

int main(void) {
    mf_rng rng;
    mf_rng_seed(&rng, 42);
    const int nt0 = omp_get_max_threads();
    static const int shapes[][4] = { /* B, T, C, NH */
        {1, 1, 8, 1},  {2, 1, 16, 4}, {2, 5, 16, 1}, {2, 5, 32, 4},
        {1, 64, 16, 1}, {2, 64, 64, 4}, {3, 64, 48, 4}, {4, 32, 64, 8},
    };
    for (int nt = 1; nt <= 3; nt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            run(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], nt);
    omp_set_num_threads(nt0);
    return mf_test_done("test_attention_matches_naive");
}
