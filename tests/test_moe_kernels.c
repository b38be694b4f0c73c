/* The MoE kernels (src/kernels/moe.c) against
 *  - a naive dense reference in double written here: every token through
 *    its top-k experts one at a time, the router's softmax / renormalisation
 *    Jacobians as full matrices; forward, aux and z losses, every gradient;
 *  - central finite differences of that reference's loss (tiny case);
 *  - PyTorch (tests/ref/moe_torch.py, HF MixtralSparseMoeBlock semantics),
 *    top-1 and top-2, with and without the aux loss, with a capacity drop;
 * plus capacity-overflow counting, the tie-break rule, the buffer-size
 * formulas, and the errors for bad sizes. Buffers are malloc'd at exactly
 * mf_moe_buffer_sizes' bytes, so the ASan build catches any overrun. */
#include "io/io.h"
#include "memfit/kernels.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    mf_moe_dims d;
    const float *x, *dy, *wg, *w1, *w3, *w2;
    float ac, zc; /* aux and z-loss coefficients */
} moe_case;

typedef struct {
    void *buf[MF_MOE_BUF_COUNT];
    mf_moe_route r;
    mf_moe_acts a;
    mf_moe_work w;
    float *y, *dx, *dwg, *dw1, *dw3, *dw2;
    double aux, z;
    int dropped;
} moe_out;

static float *zalloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static void moe_out_free(moe_out *o) {
    for (int b = 0; b < MF_MOE_BUF_COUNT; b++) free(o->buf[b]);
    free(o->y), free(o->dx), free(o->dwg), free(o->dw1), free(o->dw3), free(o->dw2);
    memset(o, 0, sizeof *o);
}

/* forward + backward of loss = sum(y * dy) + ac * aux + zc * z */
static int moe_run(moe_out *o, const moe_case *c, double cf) {
    const mf_moe_dims *d = &c->d;
    const int N = d->N, C = d->C, F = d->F, E = d->E;
    size_t bytes[MF_MOE_BUF_COUNT];
    memset(o, 0, sizeof *o);
    if (mf_moe_buffer_sizes(bytes, NULL, NULL, N, d->k, E, C, F, cf)) return -1;
    for (int b = 0; b < MF_MOE_BUF_COUNT; b++) o->buf[b] = malloc(bytes[b]);
    void **B = o->buf;
    o->r = (mf_moe_route){B[MF_MOE_BUF_PROBS], B[MF_MOE_BUF_LSE], B[MF_MOE_BUF_TOPK_IDX], B[MF_MOE_BUF_TOPK_W],
                          B[MF_MOE_BUF_FRAC]};
    o->a = (mf_moe_acts){B[MF_MOE_BUF_OFFSETS], B[MF_MOE_BUF_SLOT_ROW], B[MF_MOE_BUF_XP], B[MF_MOE_BUF_H1],
                         B[MF_MOE_BUF_H3], B[MF_MOE_BUF_HA], B[MF_MOE_BUF_YP]};
    o->w = (mf_moe_work){B[MF_MOE_BUF_DLOGITS], B[MF_MOE_BUF_DTOPK_W], B[MF_MOE_BUF_DYP], B[MF_MOE_BUF_DH1],
                         B[MF_MOE_BUF_DH3]};
    o->y = zalloc((size_t)N * C), o->dx = zalloc((size_t)N * C), o->dwg = zalloc((size_t)E * C);
    o->dw1 = zalloc((size_t)E * F * C), o->dw3 = zalloc((size_t)E * F * C), o->dw2 = zalloc((size_t)E * C * F);
    if (mf_moe_router_forward(&o->r, &o->aux, &o->z, c->x, c->wg, d)) return -1;
    if (mf_moe_dispatch(&o->a, &o->dropped, &o->r, d)) return -1;
    if (mf_moe_experts_forward(o->y, &o->a, c->x, &o->r, c->w1, c->w3, c->w2, d)) return -1;
    if (mf_moe_experts_backward(o->dx, o->dw1, o->dw3, o->dw2, &o->w, c->dy, &o->a, &o->r, c->w1, c->w3, c->w2, d))
        return -1;
    return mf_moe_router_backward(o->dx, o->dwg, &o->w, &o->r, c->x, c->wg, c->ac, c->zc, d);
}

/* ---- the dense reference, in double ------------------------------------- */

typedef struct {
    double *y, *dx, *dwg, *dw1, *dw3, *dw2; /* shapes as the kernels' */
    int *sel;                               /* (N,k) */
    double aux, z, loss;
    int dropped;
} ref_out;

static void ref_free(ref_out *o) {
    free(o->y), free(o->dx), free(o->dwg), free(o->dw1), free(o->dw3), free(o->dw2), free(o->sel);
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* grads != 0: also the gradients of loss */
static void moe_ref(ref_out *o, const moe_case *c, int grads) {
    const int N = c->d.N, C = c->d.C, F = c->d.F, E = c->d.E, k = c->d.k, cap = c->d.capacity;
    o->y = calloc((size_t)N * C, sizeof(double)), o->dx = calloc((size_t)N * C, sizeof(double));
    o->dwg = calloc((size_t)E * C, sizeof(double));
    o->dw1 = calloc((size_t)E * F * C, sizeof(double)), o->dw3 = calloc((size_t)E * F * C, sizeof(double));
    o->dw2 = calloc((size_t)E * C * F, sizeof(double));
    o->sel = calloc((size_t)N * k, sizeof(int));
    double *p = calloc((size_t)N * E, sizeof(double)), *lse = calloc(N, sizeof(double));
    double *wt = calloc((size_t)N * k, sizeof(double)), *cnt = calloc(E, sizeof(double));
    int *used = calloc(E, sizeof(int)), *keep = calloc((size_t)N * k, sizeof(int));
    double *h1 = malloc(F * sizeof(double)), *h3 = malloc(F * sizeof(double)), *da = malloc(F * sizeof(double));
    double *dp = malloc(E * sizeof(double));
    o->dropped = 0, o->z = 0;
    for (int n = 0; n < N; n++) {
        const float *xn = c->x + (size_t)n * C;
        double *pn = p + (size_t)n * E, m = -INFINITY, s = 0;
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int i = 0; i < C; i++) l += (double)xn[i] * c->wg[(size_t)e * C + i];
            pn[e] = l, m = l > m ? l : m;
        }
        for (int e = 0; e < E; e++) s += exp(pn[e] - m);
        lse[n] = m + log(s);
        for (int e = 0; e < E; e++) pn[e] = exp(pn[e] - lse[n]);
        o->z += lse[n] * lse[n] / N;
        /* top-k: sort experts by (prob desc, index asc), selection-style */
        double S = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int t = 0;
                for (int i = 0; i < j; i++) t |= o->sel[n * k + i] == e;
                if (!t && (best < 0 || pn[e] > pn[best] || (pn[e] == pn[best] && e < best))) best = e;
            }
            o->sel[n * k + j] = best, S += pn[best];
            cnt[best] += 1;
        }
        for (int j = 0; j < k; j++) wt[n * k + j] = pn[o->sel[n * k + j]] / (c->d.norm_topk_prob ? S : 1.0);
        for (int j = 0; j < k; j++) {
            const int e = o->sel[n * k + j];
            keep[n * k + j] = !(cap > 0 && used[e] >= cap);
            if (keep[n * k + j]) used[e]++;
            else o->dropped++;
        }
    }
    o->aux = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int n = 0; n < N; n++) P += p[(size_t)n * E + e];
        o->aux += E * (cnt[e] / N) * (P / N);
    }
    o->loss = c->ac * o->aux + c->zc * o->z;
    for (int n = 0; n < N; n++) {
        const float *xn = c->x + (size_t)n * C, *gn = c->dy + (size_t)n * C;
        double dw[64] = {0}; /* d loss / d wt[n, j] (k <= 64 in these tests) */
        for (int j = 0; j < k; j++) {
            if (!keep[n * k + j]) continue;
            const int e = o->sel[n * k + j];
            const float *W1 = c->w1 + (size_t)e * F * C, *W3 = c->w3 + (size_t)e * F * C, *W2 = c->w2 + (size_t)e * C * F;
            for (int f = 0; f < F; f++) {
                h1[f] = h3[f] = 0;
                for (int i = 0; i < C; i++) h1[f] += (double)W1[f * C + i] * xn[i], h3[f] += (double)W3[f * C + i] * xn[i];
            }
            for (int i = 0; i < C; i++) {
                double out = 0;
                for (int f = 0; f < F; f++) out += (double)W2[i * F + f] * silu(h1[f]) * h3[f];
                o->y[(size_t)n * C + i] += wt[n * k + j] * out;
                dw[j] += gn[i] * out;
            }
            if (!grads) continue;
            for (int f = 0; f < F; f++) da[f] = 0;
            for (int i = 0; i < C; i++)
                for (int f = 0; f < F; f++) {
                    const double dout = wt[n * k + j] * gn[i];
                    o->dw2[(size_t)e * C * F + i * F + f] += dout * silu(h1[f]) * h3[f];
                    da[f] += dout * W2[i * F + f];
                }
            for (int f = 0; f < F; f++) {
                const double sg = 1.0 / (1.0 + exp(-h1[f]));
                const double dh1 = da[f] * h3[f] * (sg + h1[f] * sg * (1 - sg)), dh3 = da[f] * silu(h1[f]);
                for (int i = 0; i < C; i++) {
                    o->dw1[(size_t)e * F * C + f * C + i] += dh1 * xn[i];
                    o->dw3[(size_t)e * F * C + f * C + i] += dh3 * xn[i];
                    o->dx[(size_t)n * C + i] += dh1 * W1[f * C + i] + dh3 * W3[f * C + i];
                }
            }
        }
        for (int i = 0; i < C; i++) o->loss += (double)gn[i] * o->y[(size_t)n * C + i];
        if (!grads) continue;
        /* router: d/dp through w_j = p_sel_j / S (full Jacobian), the aux
         * term E/N^2 cnt_e sum_n p[n,e], then the softmax Jacobian
         * dl_i = sum_e dp_e p_e (delta_ei - p_i), and the z term */
        const double *pn = p + (size_t)n * E;
        double S = 0;
        for (int j = 0; j < k; j++) S += pn[o->sel[n * k + j]];
        for (int e = 0; e < E; e++) dp[e] = c->ac * E * cnt[e] / ((double)N * N);
        for (int j = 0; j < k; j++)
            for (int i = 0; i < k; i++) {
                const double jac = c->d.norm_topk_prob ? ((i == j) * S - pn[o->sel[n * k + j]]) / (S * S) : (i == j);
                dp[o->sel[n * k + i]] += dw[j] * jac;
            }
        for (int i = 0; i < E; i++) {
            double dl = c->zc * 2 * lse[n] / N * pn[i];
            for (int e = 0; e < E; e++) dl += dp[e] * pn[e] * ((e == i) - pn[i]);
            for (int q = 0; q < C; q++) {
                o->dwg[(size_t)i * C + q] += dl * xn[q];
                o->dx[(size_t)n * C + q] += dl * c->wg[(size_t)i * C + q];
            }
        }
    }
    free(p), free(lse), free(wt), free(cnt), free(used), free(keep), free(h1), free(h3), free(da), free(dp);
}

static int cmp_d(const char *what, const float *got, const double *want, size_t n, double rtol, double atol) {
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) w[i] = (float)want[i];
    const int ok = mf_test_compare(what, got, w, n, rtol, atol);
    free(w);
    return ok;
}

static float *randn(size_t n, float s, unsigned *seed) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double u1 = (rand_r(seed) + 1.0) / (RAND_MAX + 2.0), u2 = (rand_r(seed) + 1.0) / (RAND_MAX + 2.0);
        v[i] = (float)(s * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    return v;
}

static void case_rand(moe_case *c, unsigned seed) {
    const mf_moe_dims *d = &c->d;
    c->x = randn((size_t)d->N * d->C, 1, &seed), c->dy = randn((size_t)d->N * d->C, 1, &seed);
    c->wg = randn((size_t)d->E * d->C, 0.5f, &seed);
    c->w1 = randn((size_t)d->E * d->F * d->C, 1 / sqrtf(d->C), &seed);
    c->w3 = randn((size_t)d->E * d->F * d->C, 1 / sqrtf(d->C), &seed);
    c->w2 = randn((size_t)d->E * d->C * d->F, 1 / sqrtf(d->F), &seed);
}
static void case_free(moe_case *c) {
    free((void *)c->x), free((void *)c->dy), free((void *)c->wg);
    free((void *)c->w1), free((void *)c->w3), free((void *)c->w2);
}

/* kernels against the dense reference: outputs, losses, routing, grads */
static void check_against_ref(const char *name, mf_moe_dims d, double cf, float ac, float zc, unsigned seed) {
    moe_case c = {.d = d, .ac = ac, .zc = zc};
    if (cf > 0 && mf_moe_capacity(d.N, d.k, d.E, cf, &c.d.capacity)) { CHECK(0, "%s", mf_error()); return; }
    case_rand(&c, seed);
    moe_out o;
    ref_out r;
    const int rc = moe_run(&o, &c, cf);
    CHECK(rc == 0, "%s: %s", name, mf_error());
    moe_ref(&r, &c, 1);
    if (rc == 0) {
        const size_t NC = (size_t)d.N * d.C, EFC = (size_t)d.E * d.F * d.C;
        int same = 1;
        for (int s = 0; s < d.N * d.k; s++) same &= o.r.topk_idx[s] == r.sel[s];
        CHECK(same, "%s: top-k selection differs from the reference", name);
        CHECK(o.dropped == r.dropped, "%s: dropped %d, reference %d", name, o.dropped, r.dropped);
        CHECK(mf_close(o.aux, r.aux, 1e-5, 0), "%s: aux %.9g ref %.9g", name, o.aux, r.aux);
        CHECK(mf_close(o.z, r.z, 1e-5, 0), "%s: z %.9g ref %.9g", name, o.z, r.z);
        cmp_d("y", o.y, r.y, NC, 1e-4, 1e-5);
        cmp_d("dx", o.dx, r.dx, NC, 1e-4, 1e-5);
        cmp_d("dwg", o.dwg, r.dwg, (size_t)d.E * d.C, 1e-4, 1e-5);
        cmp_d("dw1", o.dw1, r.dw1, EFC, 1e-4, 1e-5);
        cmp_d("dw3", o.dw3, r.dw3, EFC, 1e-4, 1e-5);
        cmp_d("dw2", o.dw2, r.dw2, EFC, 1e-4, 1e-5);
        printf("%s: N%d C%d F%d E%d k%d norm%d cap%d: aux %.6f z %.6f dropped %d, matches the dense reference\n",
               name, d.N, d.C, d.F, d.E, d.k, d.norm_topk_prob, c.d.capacity, o.aux, o.z, o.dropped);
    }
    ref_free(&r);
    moe_out_free(&o);
    case_free(&c);
}

/* kernel gradients against central differences of the reference loss */
static void check_fd(void) {
    moe_case c = {.d = {.N = 6, .C = 5, .F = 4, .E = 4, .k = 2, .norm_topk_prob = 1}, .ac = 0.3f, .zc = 0.1f};
    case_rand(&c, 7);
    moe_out o;
    if (moe_run(&o, &c, 0)) { CHECK(0, "fd: %s", mf_error()); return; }
    struct { const char *name; float *p; const float *g; size_t n; } ps[] = {
        {"x", (float *)c.x, o.dx, 30}, {"wg", (float *)c.wg, o.dwg, 20}, {"w1", (float *)c.w1, o.dw1, 80},
        {"w3", (float *)c.w3, o.dw3, 80}, {"w2", (float *)c.w2, o.dw2, 80}};
    ref_out r0;
    moe_ref(&r0, &c, 0);
    int checked = 0, skipped = 0;
    double worst = 0;
    for (int t = 0; t < 5; t++)
        for (size_t i = 0; i < ps[t].n; i++) {
            const float v = ps[t].p[i], vp = v + 1e-3f, vm = v - 1e-3f;
            ref_out a, b;
            ps[t].p[i] = vp, moe_ref(&a, &c, 0);
            ps[t].p[i] = vm, moe_ref(&b, &c, 0);
            ps[t].p[i] = v;
            int same = 1; /* a step that changes the routing has no derivative */
            for (int s = 0; s < 12; s++) same &= a.sel[s] == r0.sel[s] && b.sel[s] == r0.sel[s];
            if (same) {
                const double fd = (a.loss - b.loss) / ((double)vp - vm), g = ps[t].g[i];
                const double err = fabs(fd - g) / (fabs(fd) + 1e-2);
                worst = err > worst ? err : worst;
                CHECK(err < 1e-3, "fd: d loss/d %s[%zu] kernel %.7g, finite difference %.7g", ps[t].name, i, g, fd);
                checked++;
            } else {
                skipped++;
            }
            ref_free(&a), ref_free(&b);
        }
    CHECK(checked > 250, "fd: only %d entries checked (%d changed the routing)", checked, skipped);
    printf("finite differences: %d gradient entries agree (worst relative error %.2e, %d skipped)\n", checked, worst,
           skipped);
    ref_free(&r0);
    moe_out_free(&o);
    case_free(&c);
}

/* Every token's best expert is 0 (x > 0, wg row 0 = 2, the rest 0) and its
 * second one 1 (experts 1..3 tie: the lower index wins). So each of experts
 * 0 and 1 gets all N tokens and a capacity cap keeps tokens 0..cap-1. */
static void check_capacity_and_ties(void) {
    enum { N = 10, C = 6, F = 5, E = 4, k = 2 };
    unsigned seed = 3;
    moe_case c = {.d = {.N = N, .C = C, .F = F, .E = E, .k = k, .norm_topk_prob = 1}};
    case_rand(&c, 11);
    float *x = (float *)c.x, *wg = (float *)c.wg;
    for (int i = 0; i < N * C; i++) x[i] = 0.1f + (float)rand_r(&seed) / RAND_MAX;
    for (int i = 0; i < E * C; i++) wg[i] = i < C ? 2.0f : 0.0f;
    const double cf = 1.0; /* capacity = ceil(1.0 * 10 * 2 / 4) = 5 */
    CHECK(mf_moe_capacity(N, k, E, cf, &c.d.capacity) == 0 && c.d.capacity == 5, "capacity %d, want 5",
          c.d.capacity);
    moe_out o;
    if (moe_run(&o, &c, cf)) { CHECK(0, "capacity: %s", mf_error()); return; }
    CHECK(o.dropped == 2 * (N - 5), "dropped %d, want %d (tokens 5..9 of experts 0 and 1)", o.dropped, 2 * (N - 5));
    int ties = 1, rows = 1;
    for (int n = 0; n < N; n++) {
        ties &= o.r.topk_idx[n * k] == 0 && o.r.topk_idx[n * k + 1] == 1;
        rows &= (o.a.slot_row[n * k] >= 0) == (n < 5) && (o.a.slot_row[n * k + 1] >= 0) == (n < 5);
    }
    CHECK(ties, "tie between experts 1..3 not broken to the lower index");
    CHECK(rows, "the kept slots are not each expert's first 5 tokens");
    const int32_t want_off[E + 1] = {0, 5, 10, 10, 10};
    CHECK(!memcmp(o.a.offsets, want_off, sizeof want_off), "offsets %d %d %d %d %d", o.a.offsets[0],
          o.a.offsets[1], o.a.offsets[2], o.a.offsets[3], o.a.offsets[4]);
    int zero = 1;
    for (int i = 5 * C; i < N * C; i++) zero &= o.y[i] == 0.0f;
    CHECK(zero, "tokens whose slots all dropped must output 0");
    /* the same run again, and with one thread per kernel: bit-identical */
    moe_out o2;
    CHECK(moe_run(&o2, &c, cf) == 0, "rerun");
    CHECK(!memcmp(o.y, o2.y, N * C * sizeof(float)) && !memcmp(o.dx, o2.dx, N * C * sizeof(float)) &&
              !memcmp(o.dwg, o2.dwg, E * C * sizeof(float)) && !memcmp(o.dw1, o2.dw1, E * F * C * sizeof(float)),
          "a second run differs");
    moe_out_free(&o2);
    /* all-equal logits (wg = 0): every token takes experts 0..k-1 */
    memset(wg, 0, E * C * sizeof(float));
    c.d.capacity = 0;
    CHECK(moe_run(&o2, &c, 0) == 0, "equal logits");
    ties = 1;
    for (int n = 0; n < N; n++) ties &= o2.r.topk_idx[n * k] == 0 && o2.r.topk_idx[n * k + 1] == 1;
    CHECK(ties && o2.dropped == 0, "equal probabilities must pick experts 0, 1");
    printf("capacity 5 of 10 tokens x 2: %d slots dropped (tokens 5..9); ties go to the lower index\n", o.dropped);
    moe_out_free(&o2);
    moe_out_free(&o);
    case_free(&c);
}

static void check_sizes_and_errors(void) {
    int64_t R, G;
    size_t b[MF_MOE_BUF_COUNT];
    /* N 10, k 2, E 4: dropless R = 20 slots, one expert at most 10 tokens;
     * cf 0.5: cap ceil(0.5*20/4) = 3, R = 4*3 = 12, G = 3; cf 2: cap 10 */
    CHECK(mf_moe_buffer_sizes(b, &R, &G, 10, 2, 4, 8, 16, 0) == 0 && R == 20 && G == 10, "dropless R %ld G %ld",
          (long)R, (long)G);
    CHECK(b[MF_MOE_BUF_H1] == 20 * 16 * 4 && b[MF_MOE_BUF_XP] == 20 * 8 * 4 && b[MF_MOE_BUF_PROBS] == 10 * 4 * 4 &&
              b[MF_MOE_BUF_OFFSETS] == 5 * 4,
          "dropless bytes");
    CHECK(mf_moe_buffer_sizes(b, &R, &G, 10, 2, 4, 8, 16, 0.5) == 0 && R == 12 && G == 3, "cf 0.5: R %ld G %ld",
          (long)R, (long)G);
    CHECK(b[MF_MOE_BUF_DH3] == 12 * 16 * 4 && b[MF_MOE_BUF_SLOT_ROW] == 20 * 4, "cf 0.5 bytes");
    CHECK(mf_moe_buffer_sizes(NULL, &R, &G, 10, 2, 4, 8, 16, 2.0) == 0 && R == 20 && G == 10, "cf 2: R %ld G %ld",
          (long)R, (long)G);
    /* bad sizes: -1 and a message naming the problem */
    moe_out o;
    float one = 1;
    moe_case c = {.d = {.N = 2, .C = 1, .F = 1, .E = 2, .k = 3}, .x = &one};
    mf_moe_route r = {0};
    CHECK(mf_moe_router_forward(&r, NULL, NULL, &one, &one, &c.d) == -1 && strstr(mf_error(), "top-k"),
          "k > E accepted (%s)", mf_error());
    c.d.E = 0, c.d.k = 1;
    CHECK(mf_moe_router_forward(&r, NULL, NULL, &one, &one, &c.d) == -1 && strstr(mf_error(), "experts"),
          "E < 1 accepted (%s)", mf_error());
    CHECK(mf_moe_buffer_sizes(b, &R, &G, 4, 0, 4, 8, 8, 0) == -1, "k 0 accepted");
    CHECK(mf_moe_buffer_sizes(b, &R, &G, 4, 1, 4, 8, 8, NAN) == -1, "capacity factor NaN accepted");
    c.d = (mf_moe_dims){.N = 2, .C = 1, .F = 1, .E = 2, .k = 1, .capacity = -1};
    CHECK(mf_moe_dispatch(&o.a, NULL, &r, &c.d) == -1 && strstr(mf_error(), "capacity"), "capacity -1 accepted");
    printf("sizes: dropless R 20 / G 10, cf 0.5 R 12 / G 3; bad sizes refused (%s)\n", mf_error());
}

static float *st_f32(const mf_st_file *f, const char *name, size_t n) {
    const mf_st_tensor *t = mf_st_find(f, name);
    CHECK(t && t->dtype == MF_DTYPE_F32 && t->nbytes == n * sizeof(float), "reference tensor %s", name);
    return t && t->nbytes == n * sizeof(float) ? (float *)t->data : NULL;
}

/* PyTorch's MixtralSparseMoeBlock (tests/ref/moe_torch.py) */
static void check_torch(const char *src, mf_moe_dims d, float ac, float zc) {
    char path[] = "/tmp/memfit-moe-XXXXXX", cmd[1024];
    const int fd = mkstemp(path);
    if (fd < 0) { CHECK(0, "mkstemp"); return; }
    close(fd);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/moe_torch.py --out %s --N %d --C %d --F %d --E %d --k %d --norm %d "
             "--cap %d --aux_coef %g --z_coef %g --seed 5",
             src, path, d.N, d.C, d.F, d.E, d.k, d.norm_topk_prob, d.capacity, ac, zc);
    mf_st_file f;
    if (system(cmd) != 0 || mf_st_open(&f, path)) {
        CHECK(0, "reference failed: %s (needs /usr/bin/python3 with python3-torch)", cmd);
        unlink(path);
        return;
    }
    const size_t NC = (size_t)d.N * d.C, EFC = (size_t)d.E * d.F * d.C;
    moe_case c = {.d = d, .ac = ac, .zc = zc};
    c.x = st_f32(&f, "x", NC), c.dy = st_f32(&f, "dy", NC), c.wg = st_f32(&f, "gate", (size_t)d.E * d.C);
    c.w1 = st_f32(&f, "w1", EFC), c.w3 = st_f32(&f, "w3", EFC), c.w2 = st_f32(&f, "w2", EFC);
    const float *y = st_f32(&f, "y", NC), *gx = st_f32(&f, "grad.x", NC), *gg = st_f32(&f, "grad.gate", d.E * d.C);
    const float *g1 = st_f32(&f, "grad.w1", EFC), *g3 = st_f32(&f, "grad.w3", EFC), *g2 = st_f32(&f, "grad.w2", EFC);
    const float *rw = st_f32(&f, "routing", (size_t)d.N * d.k);
    const mf_st_tensor *sel = mf_st_find(&f, "sel");
    const char *aux = mf_st_meta(&f, "aux"), *z = mf_st_meta(&f, "z"), *dr = mf_st_meta(&f, "dropped");
    moe_out o;
    if (c.x && c.dy && c.wg && c.w1 && c.w3 && c.w2 && y && gx && gg && g1 && g3 && g2 && rw && sel && aux && z &&
        dr) {
        /* the kernels use the capacity as given (cf is only for sizing):
         * size the buffers dropless, the worst case */
        if (moe_run(&o, &c, 0)) {
            CHECK(0, "torch case: %s", mf_error());
        } else {
            CHECK(!memcmp(o.r.topk_idx, sel->data, (size_t)d.N * d.k * sizeof(int32_t)), "selection differs");
            mf_test_compare("routing weights", o.r.topk_w, rw, (size_t)d.N * d.k, 1e-5, 1e-7);
            CHECK(o.dropped == atoi(dr), "dropped %d, torch %s", o.dropped, dr);
            CHECK(mf_close(o.aux, atof(aux), 1e-5, 0) && mf_close(o.z, atof(z), 1e-5, 0), "aux %.9g / %s, z %.9g / %s",
                  o.aux, aux, o.z, z);
            mf_test_compare("torch y", o.y, y, NC, 1e-4, 1e-5);
            mf_test_compare("torch dx", o.dx, gx, NC, 1e-4, 1e-5);
            mf_test_compare("torch dgate", o.dwg, gg, (size_t)d.E * d.C, 1e-4, 1e-5);
            mf_test_compare("torch dw1", o.dw1, g1, EFC, 1e-4, 1e-5);
            mf_test_compare("torch dw3", o.dw3, g3, EFC, 1e-4, 1e-5);
            mf_test_compare("torch dw2", o.dw2, g2, EFC, 1e-4, 1e-5);
            printf("torch: top-%d norm %d cap %d aux_coef %g: aux %s z %s dropped %s agree\n", d.k, d.norm_topk_prob,
                   d.capacity, ac, aux, z, dr);
        }
        moe_out_free(&o);
    }
    mf_st_close(&f);
    unlink(path);
}

int main(void) {
    check_against_ref("top-2 Mixtral", (mf_moe_dims){.N = 37, .C = 16, .F = 24, .E = 8, .k = 2, .norm_topk_prob = 1},
                      0, 0.02f, 0.001f, 1);
    check_against_ref("top-1 no renorm", (mf_moe_dims){.N = 33, .C = 12, .F = 20, .E = 4, .k = 1}, 0, 0.01f, 0.0f,
                      2);
    check_against_ref("top-2 cf 0.75", (mf_moe_dims){.N = 40, .C = 12, .F = 20, .E = 4, .k = 2, .norm_topk_prob = 1},
                      0.75, 0.05f, 0.01f, 3);
    check_against_ref("top-3 no renorm", (mf_moe_dims){.N = 20, .C = 8, .F = 12, .E = 6, .k = 3}, 0, 0.1f, 0.1f, 4);
    check_against_ref("k = E", (mf_moe_dims){.N = 9, .C = 8, .F = 6, .E = 3, .k = 3, .norm_topk_prob = 1}, 0, 0, 0,
                      5);
    check_fd();
    check_capacity_and_ties();
    check_sizes_and_errors();
    const char *src = getenv("MEMFIT_SRC");
    if (!src) src = ".";
    check_torch(src, (mf_moe_dims){.N = 24, .C = 16, .F = 12, .E = 4, .k = 2, .norm_topk_prob = 1}, 0.02f, 0.001f);
    check_torch(src, (mf_moe_dims){.N = 24, .C = 16, .F = 12, .E = 4, .k = 1}, 0.02f, 0.001f);
    check_torch(src, (mf_moe_dims){.N = 24, .C = 16, .F = 12, .E = 4, .k = 2, .norm_topk_prob = 1}, 0, 0);
    check_torch(src, (mf_moe_dims){.N = 24, .C = 16, .F = 12, .E = 4, .k = 2, .norm_topk_prob = 1, .capacity = 9},
                0.02f, 0.001f);
    return mf_test_done("test_moe_kernels");
}
