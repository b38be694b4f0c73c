/* Proves mf_adafactor_update is transformers' Adafactor.step:
 *  - five steps on small random tensors match a double-precision transcription
 *    of Adafactor.step (below) to 1e-5 relative, for a factored 2-D tensor and
 *    an unfactored 1-D one, with and without momentum, relative_step on and
 *    off, weight decay, gradient scaling and active update clipping;
 *  - the result does not depend on the thread count (bit for bit);
 *  - it descends a quadratic with transformers' default settings;
 *  - factored state is 4 (rows + cols) bytes.
 * Sizes are odd so the column tiles (64) and the sum partition see remainders. */
#include "memfit/core.h"
#include "memfit/optim.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static mf_rng rng;

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) abort();
    return p;
}

/* ---- reference: Adafactor.step (transformers/optimization.py) in double -- */

typedef struct {
    int64_t rows, cols;
    int factored;
    double *p, *vr, *vc, *v, *m;
} ref_state;

static double rms(const double *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += x[i] * x[i];
    return sqrt(s / (double)n);
}

static void ref_step(ref_state *s, const float *gf, const mf_adafactor_hp *hp, int t,
                     float gscale) {
    size_t R = (size_t)s->rows, C = (size_t)s->cols, n = R * C;
    double *g = xcalloc(n, sizeof(double)), *u = xcalloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) g[i] = (double)gf[i] * gscale;
    /* _get_lr */
    double lr = hp->lr;
    if (hp->relative_step) {
        double min_step = hp->warmup_init ? 1e-6 * t : 1e-2;
        lr = fmin(min_step, 1.0 / sqrt((double)t));
    }
    if (hp->scale_parameter) lr *= fmax(hp->eps2, rms(s->p, n));
    double beta2t = 1.0 - pow((double)t, hp->decay_rate);
    if (s->factored) {
        for (size_t r = 0; r < R; r++) {
            double mean = 0.0;
            for (size_t c = 0; c < C; c++) mean += g[r * C + c] * g[r * C + c] + hp->eps1;
            s->vr[r] = beta2t * s->vr[r] + (1.0 - beta2t) * (mean / (double)C);
        }
        for (size_t c = 0; c < C; c++) {
            double mean = 0.0;
            for (size_t r = 0; r < R; r++) mean += g[r * C + c] * g[r * C + c] + hp->eps1;
            s->vc[c] = beta2t * s->vc[c] + (1.0 - beta2t) * (mean / (double)R);
        }
        double vr_mean = 0.0;
        for (size_t r = 0; r < R; r++) vr_mean += s->vr[r] / (double)R;
        /* _approx_sq_grad: rsqrt(vr / mean(vr)) x rsqrt(vc), times grad */
        for (size_t r = 0; r < R; r++)
            for (size_t c = 0; c < C; c++)
                u[r * C + c] = g[r * C + c] / sqrt(s->vr[r] / vr_mean) / sqrt(s->vc[c]);
    } else {
        for (size_t i = 0; i < n; i++) {
            s->v[i] = beta2t * s->v[i] + (1.0 - beta2t) * (g[i] * g[i] + hp->eps1);
            u[i] = g[i] / sqrt(s->v[i]);
        }
    }
    double div = fmax(rms(u, n) / hp->clip_threshold, 1.0);
    for (size_t i = 0; i < n; i++) u[i] = u[i] / div * lr;
    if (hp->beta1 > 0) {
        for (size_t i = 0; i < n; i++) {
            s->m[i] = hp->beta1 * s->m[i] + (1.0 - hp->beta1) * u[i];
            u[i] = s->m[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (hp->wd != 0) s->p[i] += -hp->wd * lr * s->p[i];
        s->p[i] -= u[i];
    }
    free(g);
    free(u);
}

/* ---- comparison ---------------------------------------------------------- */

/* worst |got - want| / (rtol |want| + atol[i]); > 1 fails */
static double worst_err(const double *got, const double *want, size_t n, double rtol,
                        const double *atol) {
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (rtol * fabs(want[i]) + atol[i]);
        if (isnan(e)) e = INFINITY;
        w = fmax(w, e);
    }
    return w;
}

static void fill_grad(float *g, int64_t rows, int64_t cols) {
    /* rows and columns of different scales, so the factoring matters */
    for (int64_t r = 0; r < rows; r++) {
        float rs = expf(mf_rng_normal(&rng));
        for (int64_t c = 0; c < cols; c++)
            g[r * cols + c] = rs * (1.0f + (float)(c % 7)) * 1e-2f * mf_rng_normal(&rng);
    }
}

/* fp32 spacing at |x| (the larger of the two neighbours' binades) */
static double ulp(double x) {
    return x > 0 ? ldexp(1.0, ilogb(x) - 23) : ldexp(1.0, -149);
}

static void to_double(double *d, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = f[i];
}

/* Five steps; before each the reference takes the kernel's fp32 state, so
 * every step is judged on its own. Tolerance 1e-5 relative, elementwise:
 * exactly for the second-moment statistics (positive, no cancellation);
 * for m and for the step p_new - p_old, values that cancel to near zero are
 * judged against 1e-5 of the tensor's RMS, and the step may also be off by
 * the two half-ulp roundings of p in fp32 (p - wd lr p, then - update).
 * Starting from p = 0 the update is compared nearly free of that rounding,
 * since p then holds only past updates. */
static void check_case(const char *name, int64_t rows, int64_t cols, int factored,
                       mf_adafactor_hp hp, float gscale, float p_std) {
    const double tol = 1e-5;
    size_t n = (size_t)(rows * cols), R = (size_t)rows, C = (size_t)cols;
    int mom = hp.beta1 > 0;
    float *p = xcalloc(n, 4), *g = xcalloc(n, 4);
    float *vr = factored ? xcalloc(R, 4) : NULL, *vc = factored ? xcalloc(C, 4) : NULL;
    float *v = factored ? NULL : xcalloc(n, 4);
    float *m = mom ? xcalloc(n, 4) : NULL;
    ref_state s = {rows, cols, factored, xcalloc(n, 8), xcalloc(R, 8), xcalloc(C, 8),
                   xcalloc(n, 8), xcalloc(n, 8)};
    double *got = xcalloc(n, 8), *want = xcalloc(n, 8), *atol = xcalloc(n, 8);
    double *pold = xcalloc(n, 8);
    for (size_t i = 0; i < n; i++) p[i] = p_std * mf_rng_normal(&rng);
    double e_state = 0.0, e_m = 0.0, e_dp = 0.0;
    for (int t = 1; t <= 5; t++) {
        to_double(s.p, p, n), to_double(pold, p, n);
        if (factored) to_double(s.vr, vr, R), to_double(s.vc, vc, C);
        else to_double(s.v, v, n);
        if (mom) to_double(s.m, m, n);
        fill_grad(g, rows, cols);
        mf_adafactor_update(p, g, vr, vc, v, m, rows, cols, &hp, t, gscale);
        ref_step(&s, g, &hp, t, gscale);

        memset(atol, 0, n * 8);
        if (factored) {
            to_double(got, vr, R);
            e_state = fmax(e_state, worst_err(got, s.vr, R, tol, atol));
            to_double(got, vc, C);
            e_state = fmax(e_state, worst_err(got, s.vc, C, tol, atol));
        } else {
            to_double(got, v, n);
            e_state = fmax(e_state, worst_err(got, s.v, n, tol, atol));
        }
        if (mom) {
            double r = rms(s.m, n);
            for (size_t i = 0; i < n; i++) atol[i] = tol * r;
            to_double(got, m, n);
            e_m = fmax(e_m, worst_err(got, s.m, n, tol, atol));
        }
        for (size_t i = 0; i < n; i++) {
            got[i] = (double)p[i] - pold[i];
            want[i] = s.p[i] - pold[i];
        }
        double r = rms(want, n);
        for (size_t i = 0; i < n; i++)
            atol[i] = tol * r + ulp(fmax(fabs(pold[i]), fabs((double)p[i])));
        e_dp = fmax(e_dp, worst_err(got, want, n, tol, atol));
    }
    printf("%-34s worst err / tolerance: v %.3f  m %.3f  step %.3f\n", name, e_state, e_m, e_dp);
    CHECK(e_state <= 1 && e_m <= 1 && e_dp <= 1,
          "%s: differs from the reference by more than %g relative", name, tol);
    free(p), free(g), free(vr), free(vc), free(v), free(m);
    free(got), free(want), free(atol), free(pold);
    free(s.p), free(s.vr), free(s.vc), free(s.v), free(s.m);
}

static void test_matches_reference(void) {
    mf_adafactor_hp d = mf_adafactor_hp_default();
    check_case("2-D defaults (relative, scaled)", 37, 70, 1, d, 1.0f, 0.05f);
    check_case("1-D defaults", 301, 1, 0, d, 1.0f, 0.05f);
    check_case("2-D defaults, from p = 0", 37, 70, 1, d, 1.0f, 0.0f);

    mf_adafactor_hp h = d;
    h.relative_step = 0, h.scale_parameter = 0, h.lr = 1e-2f, h.beta1 = 0.9f, h.wd = 0.1f;
    check_case("2-D lr, momentum, wd, gscale", 37, 70, 1, h, 0.5f, 0.05f);
    check_case("1-D lr, momentum, wd, gscale", 301, 1, 0, h, 0.5f, 0.05f);
    check_case("2-D lr, momentum, wd, from p = 0", 37, 70, 1, h, 0.5f, 0.0f);
    check_case("1-D lr, momentum, wd, from p = 0", 301, 1, 0, h, 0.5f, 0.0f);

    h = d;
    h.clip_threshold = 0.5f, h.warmup_init = 1, h.wd = 0.01f; /* clipping always acts */
    check_case("2-D clip 0.5, warmup_init", 37, 70, 1, h, 2.0f, 0.05f);
    check_case("1-D clip 0.5, warmup_init", 301, 1, 0, h, 2.0f, 0.05f);
    h.warmup_init = 0, h.scale_parameter = 0, h.beta1 = 0.5f;
    check_case("2-D clip 0.5, momentum, unscaled", 129, 65, 1, h, 1.0f, 0.05f);
}

static void test_threads_do_not_matter(void) {
    const int64_t R = 150, C = 200;
    size_t n = (size_t)(R * C);
    mf_adafactor_hp hp = mf_adafactor_hp_default();
    hp.beta1 = 0.9f;
    float *g = xcalloc(n, 4), *p[2], *m[2], *vr[2], *vc[2], *v[2], *q[2], *mq[2];
    for (int k = 0; k < 2; k++) {
        p[k] = xcalloc(n, 4), m[k] = xcalloc(n, 4), vr[k] = xcalloc(R, 4),
        vc[k] = xcalloc(C, 4), v[k] = xcalloc(n, 4), q[k] = xcalloc(n, 4), mq[k] = xcalloc(n, 4);
    }
    for (size_t i = 0; i < n; i++) p[0][i] = p[1][i] = q[0][i] = q[1][i] = mf_rng_normal(&rng);
    int saved = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        fill_grad(g, R, C);
        for (int k = 0; k < 2; k++) {
            omp_set_num_threads(k ? 3 : 1);
            mf_adafactor_update(p[k], g, vr[k], vc[k], NULL, m[k], R, C, &hp, t, 1.0f);
            mf_adafactor_update(q[k], g, NULL, NULL, v[k], mq[k], R * C, 1, &hp, t, 1.0f);
        }
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(p[0], p[1], n * 4) == 0 && memcmp(vr[0], vr[1], R * 4) == 0 &&
          memcmp(vc[0], vc[1], C * 4) == 0 && memcmp(q[0], q[1], n * 4) == 0,
          "Adafactor differs between 1 and 3 threads");
    for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(vr[k]), free(vc[k]), free(v[k]), free(q[k]), free(mq[k]);
    free(g);
}

/* 0.5 sum h (p - p*)^2, h = a_r b_c in [0.1, 10] (separable curvature) */
static void test_descends_quadratic(void) {
    const int64_t R = 48, C = 80;
    const int steps = 200;
    size_t n = (size_t)(R * C);
    float *p = xcalloc(n, 4), *g = xcalloc(n, 4), *h = xcalloc(n, 4), *ps = xcalloc(n, 4);
    float *vr = xcalloc(R, 4), *vc = xcalloc(C, 4);
    for (int64_t r = 0; r < R; r++) {
        float a = sqrtf(0.1f) * powf(10.0f, mf_rng_uniform(&rng));
        for (int64_t c = 0; c < C; c++) h[r * C + c] = a;
    }
    for (int64_t c = 0; c < C; c++) {
        float b = sqrtf(0.1f) * powf(10.0f, mf_rng_uniform(&rng));
        for (int64_t r = 0; r < R; r++) h[r * C + c] *= b;
    }
    for (size_t i = 0; i < n; i++) ps[i] = mf_rng_normal(&rng), p[i] = ps[i] + mf_rng_normal(&rng);
    mf_adafactor_hp hp = mf_adafactor_hp_default();
    double l0 = 0.0, l = 0.0;
    for (size_t i = 0; i < n; i++) l0 += 0.5 * h[i] * (p[i] - ps[i]) * (p[i] - ps[i]);
    for (int t = 1; t <= steps; t++) {
        for (size_t i = 0; i < n; i++) g[i] = h[i] * (p[i] - ps[i]);
        mf_adafactor_update(p, g, vr, vc, NULL, NULL, R, C, &hp, t, 1.0f);
    }
    for (size_t i = 0; i < n; i++) l += 0.5 * h[i] * (p[i] - ps[i]) * (p[i] - ps[i]);
    printf("quadratic %lldx%lld, defaults, %d steps: loss %.2f -> %.4f\n", (long long)R,
           (long long)C, steps, l0, l);
    CHECK(l < 0.01 * l0, "Adafactor did not descend: %g -> %g", l0, l);
    free(p), free(g), free(h), free(ps), free(vr), free(vc);
}

static void test_bytes(void) {
    CHECK(mf_adafactor_state_bytes(768, 3072, 1, 0) == 4 * (768 + 3072), "factored bytes");
    CHECK(mf_adafactor_state_bytes(768, 3072, 0, 0) == 4 * 768 * 3072, "unfactored bytes");
    CHECK(mf_adafactor_state_bytes(768, 3072, 1, 1) == 4 * (768 + 3072 + 768 * 3072),
          "momentum bytes");
}

int main(void) {
    mf_rng_seed(&rng, 4321);
    test_matches_reference();
    test_threads_do_not_matter();
    test_descends_quadratic();
    test_bytes();
    return mf_test_done("test_optim_adafactor");
}
