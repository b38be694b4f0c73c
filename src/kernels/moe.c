/* Mixture-of-experts kernels (docs/moe.md): the router (softmax, top-k,
 * load-balancing and z losses), the dropless permutation of token-slots
 * into per-expert groups (with an optional capacity), the per-expert SwiGLU
 * MLPs over those groups, and the weighted scatter back; each with its
 * backward.
 *
 * The formulas follow Hugging Face transformers' MixtralSparseMoeBlock and
 * load_balancing_loss_func (modeling_mixtral.py) and the ST-MoE router
 * z-loss (Zoph et al. 2022, eq. 5). Every product is mf_sgemm; experts run
 * one after another, each GEMM parallel inside. Gathers and scatters are
 * token-parallel, each token's slots summed in slot order, so results do not
 * depend on the thread count. No allocation.
 */
#include "memfit/kernels.h"

#include <limits.h>
#include <omp.h>
#include <math.h>
#include <string.h>

#define MF_MOE_PAR_MIN 4096

static int moe_check(const mf_moe_dims *d) {
    if (d->E < 1) return mf_fail("moe: %d experts (need at least 1)", d->E);
    if (d->k < 1 || d->k > d->E) return mf_fail("moe: top-k %d with %d experts (need 1 <= k <= E)", d->k, d->E);
    if (d->N < 1 || d->C < 1 || d->F < 1)
        return mf_fail("moe: bad sizes N %d C %d F %d (each must be >= 1)", d->N, d->C, d->F);
    if (d->capacity < 0) return mf_fail("moe: capacity %d (0 = dropless, else > 0)", d->capacity);
    if ((int64_t)d->N * d->k > INT_MAX) return mf_fail("moe: %d tokens x top-%d slots overflow", d->N, d->k);
    return 0;
}

const char *mf_moe_buf_name(mf_moe_buf b) {
    static const char *names[MF_MOE_BUF_COUNT] = {
        "moe.probs", "moe.lse", "moe.topk_idx", "moe.topk_w", "moe.frac", "moe.offsets", "moe.slot_row",
        "moe.xp", "moe.h1", "moe.h3", "moe.ha", "moe.yp", "moe.dlogits", "moe.dtopk_w", "moe.dyp",
        "moe.dh1", "moe.dh3"};
    return (unsigned)b < MF_MOE_BUF_COUNT ? names[b] : "?";
}

int mf_moe_capacity(int N, int k, int E, double cf, int *capacity) {
    mf_moe_dims d = {.N = N, .C = 1, .F = 1, .E = E, .k = k};
    if (moe_check(&d)) return -1;
    if (!(cf <= 0.0) && !(cf < 1e30)) return mf_fail("moe: capacity factor %g", cf); /* NaN, inf */
    if (cf <= 0.0) { *capacity = 0; return 0; }
    const double c = ceil(cf * ((double)N * k) / E);
    if (c > INT_MAX) return mf_fail("moe: capacity factor %g gives %.0f slots per expert", cf, c);
    *capacity = (int)c;
    return 0;
}

int mf_moe_buffer_sizes(size_t *bytes, int64_t *rows, int64_t *group_rows, int N, int k, int E, int C, int F,
                        double cf) {
    int cap;
    mf_moe_dims d = {.N = N, .C = C, .F = F, .E = E, .k = k};
    if (moe_check(&d) || mf_moe_capacity(N, k, E, cf, &cap)) return -1;
    const int64_t slots = (int64_t)N * k;
    int64_t R = slots, G = N;
    if (cap > 0) {
        if ((int64_t)E * cap < R) R = (int64_t)E * cap;
        if (cap < G) G = cap;
    }
    if (rows) *rows = R;
    if (group_rows) *group_rows = G;
    if (!bytes) return 0;
    const size_t f = sizeof(float), i = sizeof(int32_t);
    const size_t RC = (size_t)R * C * f, RF = (size_t)R * F * f;
    bytes[MF_MOE_BUF_PROBS] = (size_t)N * E * f;
    bytes[MF_MOE_BUF_LSE] = (size_t)N * f;
    bytes[MF_MOE_BUF_TOPK_IDX] = (size_t)slots * i;
    bytes[MF_MOE_BUF_TOPK_W] = (size_t)slots * f;
    bytes[MF_MOE_BUF_FRAC] = (size_t)E * f;
    bytes[MF_MOE_BUF_OFFSETS] = (size_t)(E + 1) * i;
    bytes[MF_MOE_BUF_SLOT_ROW] = (size_t)slots * i;
    bytes[MF_MOE_BUF_XP] = RC;
    bytes[MF_MOE_BUF_H1] = RF;
    bytes[MF_MOE_BUF_H3] = RF;
    bytes[MF_MOE_BUF_HA] = RF;
    bytes[MF_MOE_BUF_YP] = RC;
    bytes[MF_MOE_BUF_DLOGITS] = (size_t)N * E * f;
    bytes[MF_MOE_BUF_DTOPK_W] = (size_t)slots * f;
    bytes[MF_MOE_BUF_DYP] = RC;
    bytes[MF_MOE_BUF_DH1] = RF;
    bytes[MF_MOE_BUF_DH3] = RF;
    return 0;
}

/* ---- router ------------------------------------------------------------- */

int mf_moe_router_forward(mf_moe_route *r, double *aux, double *z, const float *x, const float *wg,
                          const mf_moe_dims *d) {
    if (moe_check(d)) return -1;
    const int N = d->N, C = d->C, E = d->E, k = d->k;
    float *P = r->probs;
    mf_sgemm(0, 1, N, E, C, 1.0f, x, C, wg, C, 0.0f, P, E); /* logits (N,E) */
    double zsum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : zsum) if ((size_t)N * E >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *p = P + (size_t)n * E;
        float mx = p[0];
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        double s = 0.0;
        for (int e = 0; e < E; e++) s += exp((double)p[e] - mx);
        const double lse = mx + log(s);
        for (int e = 0; e < E; e++) p[e] = (float)exp((double)p[e] - lse);
        r->lse[n] = (float)lse;
        zsum += lse * lse;
        /* top-k by k passes: the largest not yet taken, the lower index on
         * a tie (strict >), so equal probabilities pick deterministically */
        int32_t *idx = r->topk_idx + (size_t)n * k;
        float *tw = r->topk_w + (size_t)n * k;
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            tw[j] = p[best];
            sum += p[best];
        }
        if (d->norm_topk_prob) /* HF: routing_weights /= routing_weights.sum(-1) in fp32 */
            for (int j = 0; j < k; j++) tw[j] /= sum;
    }
    /* f_e and P_e; serial over tokens in order (deterministic, cheap). The
     * counts are summed in frac itself as floats: exact up to 2^24 slots */
    double auxs = 0.0;
    for (int e = 0; e < E; e++) r->frac[e] = 0.0f;
    for (size_t s = 0; s < (size_t)N * k; s++) r->frac[r->topk_idx[s]] += 1.0f;
    for (int e = 0; e < E; e++) {
        double pe = 0.0;
        for (int n = 0; n < N; n++) pe += P[(size_t)n * E + e];
        r->frac[e] = (float)(r->frac[e] / (double)N);
        auxs += (double)r->frac[e] * (pe / N);
    }
    if (aux) *aux = auxs * E;
    if (z) *z = zsum / N;
    return 0;
}

/* d(probs) collects: the routing-weight gradient on the chosen columns
 * (through the renormalisation w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i)
 * / S), and aux_scale * E * f_e / N on every column (f_e is a count: no
 * gradient). Softmax backward: dl = p * (dp - sum_e p_e dp_e); the z-loss
 * adds z_scale * 2 lse / N * p (d lse / d logits = p). */
int mf_moe_router_backward(float *dx, float *dwg, mf_moe_work *w, const mf_moe_route *r, const float *x,
                           const float *wg, float aux_scale, float z_scale, const mf_moe_dims *d) {
    if (moe_check(d)) return -1;
    const int N = d->N, C = d->C, E = d->E, k = d->k;
    float *DL = w->dlogits;
#pragma omp parallel for schedule(static) if ((size_t)N * E >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *p = r->probs + (size_t)n * E;
        float *dl = DL + (size_t)n * E;
        const int32_t *idx = r->topk_idx + (size_t)n * k;
        const float *tw = r->topk_w + (size_t)n * k, *dtw = w->dtopk_w + (size_t)n * k;
        for (int e = 0; e < E; e++) dl[e] = (float)((double)aux_scale * E * r->frac[e] / N);
        if (d->norm_topk_prob) {
            double S = 0.0, dot = 0.0;
            for (int j = 0; j < k; j++) S += p[idx[j]], dot += (double)dtw[j] * tw[j];
            for (int j = 0; j < k; j++) dl[idx[j]] += (float)((dtw[j] - dot) / S);
        } else {
            for (int j = 0; j < k; j++) dl[idx[j]] += dtw[j];
        }
        double pd = 0.0;
        for (int e = 0; e < E; e++) pd += (double)p[e] * dl[e];
        const double zg = (double)z_scale * 2.0 * r->lse[n] / N;
        for (int e = 0; e < E; e++) dl[e] = (float)(p[e] * ((dl[e] - pd) + zg));
    }
    if (dwg) mf_sgemm(1, 0, E, C, N, 1.0f, DL, E, x, C, 1.0f, dwg, C); /* dwg (E,C) += dl^T x */
    mf_sgemm(0, 0, N, C, E, 1.0f, DL, E, wg, C, 1.0f, dx, C);           /* dx += dl @ wg */
    return 0;
}

/* ---- permutation -------------------------------------------------------- */

int mf_moe_dispatch(mf_moe_acts *a, int *dropped, const mf_moe_route *r, const mf_moe_dims *d) {
    return mf_moe_dispatch_after(a, dropped, r, d, NULL);
}

int mf_moe_dispatch_after(mf_moe_acts *a, int *dropped, const mf_moe_route *r, const mf_moe_dims *d,
                          const int32_t *before) {
    if (moe_check(d)) return -1;
    const int E = d->E, cap = d->capacity;
    const int S = d->N * d->k;
    int32_t *off = a->offsets;
    /* count each expert's kept slots into off[e+1] (slot_row -1 marks a
     * drop: the expert already had `cap` earlier slots), prefix-sum into
     * group starts, place kept slots in slot order using off[e] as expert
     * e's cursor (stable: token order within a group), then shift the
     * cursors, now group ends, back into starts */
    for (int e = 0; e <= E; e++) off[e] = 0;
    int drop = 0;
    for (int s = 0; s < S; s++) {
        const int e = r->topk_idx[s];
        if (e < 0 || e >= E) return mf_fail("moe: slot %d routed to expert %d of %d", s, e, E);
        if (cap > 0 && off[e + 1] + (before ? before[e] : 0) >= cap) {
            a->slot_row[s] = -1;
            drop++;
        } else {
            a->slot_row[s] = 0;
            off[e + 1]++;
        }
    }
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    for (int s = 0; s < S; s++)
        if (a->slot_row[s] == 0) a->slot_row[s] = off[r->topk_idx[s]]++;
    for (int e = E; e > 0; e--) off[e] = off[e - 1];
    off[0] = 0;
    if (dropped) *dropped = drop;
    return 0;
}

/* ---- experts ------------------------------------------------------------ */

/* Experts in parallel (each GEMM then single-threaded inside, as mf_sgemm
 * runs in a parallel region) when there are at least as many experts as
 * threads: many small multi-threaded GEMMs spend their time in the
 * threads' barriers (bench/moe_bench.c: 2.4x a dense MLP of the same flops
 * on 2 threads, against 1.04x on 1). Not with the matmul backend, whose
 * calls inside a parallel region allocate their own scratch instead of
 * the planned one. Which way runs changes no result beyond the GEMM
 * backend's own thread-count dependence. */
static int experts_parallel(int E) {
    return E >= omp_get_max_threads() && !omp_in_parallel() && strcmp(mf_sgemm_name(), "matmul") != 0;
}

/* HF MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x), per expert on its
 * group of permuted rows; then y[n] = sum_j topk_w[n,j] * yp[row of slot]. */
int mf_moe_experts_forward(float *y, mf_moe_acts *a, const float *x, const mf_moe_route *r, const float *w1,
                           const float *w3, const float *w2, const mf_moe_dims *d) {
    return mf_moe_experts_forward_ops(y, a, x, r, w1, w3, w2, d, NULL);
}

/* expert e's three matrices: the stacks' slices, or the hook's */
static void expert_mats(const mf_moe_expert_ops *ops, int e, const mf_moe_dims *d, const float *w1,
                        const float *w3, const float *w2, const float **e1, const float **e3, const float **e2) {
    if (ops && ops->weights) { ops->weights(ops->ctx, e, e1, e3, e2); return; }
    const size_t wo = (size_t)e * d->F * d->C;
    *e1 = w1 + wo, *e3 = w3 + wo, *e2 = w2 + wo;
}

int mf_moe_experts_forward_ops(float *y, mf_moe_acts *a, const float *x, const mf_moe_route *r, const float *w1,
                               const float *w3, const float *w2, const mf_moe_dims *d, const mf_moe_expert_ops *ops) {
    if (moe_check(d)) return -1;
    const int N = d->N, C = d->C, F = d->F, E = d->E, k = d->k;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            const int row = a->slot_row[(size_t)n * k + j];
            if (row >= 0) memcpy(a->xp + (size_t)row * C, x + (size_t)n * C, (size_t)C * sizeof(float));
        }
    const int par = experts_parallel(E) && !(ops && ops->weights);
    const int lora = ops && ops->lora_fwd;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int e = 0; e < E; e++) {
        const int r0 = a->offsets[e], m = a->offsets[e + 1] - r0;
        if (m == 0) continue;
        const float *xe = a->xp + (size_t)r0 * C, *e1, *e3, *e2;
        expert_mats(ops, e, d, w1, w3, w2, &e1, &e3, &e2);
        float *h1 = a->h1 + (size_t)r0 * F, *h3 = a->h3 + (size_t)r0 * F, *ha = a->ha + (size_t)r0 * F;
        float *ye = a->yp + (size_t)r0 * C;
        mf_sgemm(0, 1, m, F, C, 1.0f, xe, C, e1, C, 0.0f, h1, F);
        if (lora) ops->lora_fwd(ops->ctx, e, 0, xe, h1, m, r0);
        mf_sgemm(0, 1, m, F, C, 1.0f, xe, C, e3, C, 0.0f, h3, F);
        if (lora) ops->lora_fwd(ops->ctx, e, 1, xe, h3, m, r0);
        mf_swiglu_forward(ha, h1, h3, (size_t)m * F);
        mf_sgemm(0, 1, m, C, F, 1.0f, ha, F, e2, F, 0.0f, ye, C);
        if (lora) ops->lora_fwd(ops->ctx, e, 2, ha, ye, m, r0);
    }
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *yn = y + (size_t)n * C;
        memset(yn, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int row = a->slot_row[(size_t)n * k + j];
            if (row < 0) continue; /* dropped: contributes nothing */
            const float wgt = r->topk_w[(size_t)n * k + j], *yr = a->yp + (size_t)row * C;
#pragma omp simd
            for (int c = 0; c < C; c++) yn[c] += wgt * yr[c];
        }
    }
    return 0;
}

/* Scatter backward: dyp[row] = topk_w * dy[n], dtopk_w = dy[n] . yp[row];
 * then per expert: dha = dyp @ w2, dw2 += dyp^T ha; SwiGLU backward into
 * dh1, dh3; dw1 += dh1^T xp, dw3 += dh3^T xp; dxp = dh1 @ w1 + dh3 @ w3
 * (into dyp, no longer needed); finally dx[n] += sum over kept slots dxp. */
int mf_moe_experts_backward(float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, const float *dy,
                            const mf_moe_acts *a, const mf_moe_route *r, const float *w1, const float *w3,
                            const float *w2, const mf_moe_dims *d) {
    return mf_moe_experts_backward_ops(dx, dw1, dw3, dw2, w, dy, a, r, w1, w3, w2, d, NULL);
}

int mf_moe_experts_backward_ops(float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, const float *dy,
                                const mf_moe_acts *a, const mf_moe_route *r, const float *w1, const float *w3,
                                const float *w2, const mf_moe_dims *d, const mf_moe_expert_ops *ops) {
    if (moe_check(d)) return -1;
    const int N = d->N, C = d->C, F = d->F, E = d->E, k = d->k;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = dy + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const size_t s = (size_t)n * k + j;
            const int row = a->slot_row[s];
            if (row < 0) { w->dtopk_w[s] = 0.0f; continue; }
            const float wgt = r->topk_w[s], *yr = a->yp + (size_t)row * C;
            float *dr = w->dyp + (size_t)row * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dot += (double)g[c] * yr[c];
                dr[c] = wgt * g[c];
            }
            w->dtopk_w[s] = (float)dot;
        }
    }
    const int gh = ops && ops->grads;
    const int par = experts_parallel(E) && !(ops && (ops->weights || gh));
    const int lora = ops && ops->lora_bwd;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int e = 0; e < E; e++) {
        const int r0 = a->offsets[e], m = a->offsets[e + 1] - r0;
        const size_t wo = (size_t)e * F * C;
        /* expert e's weight gradients: the stacks' slices, or the hook's rows */
        float *g1 = dw1 ? dw1 + wo : NULL, *g3 = dw1 ? dw3 + wo : NULL, *g2 = dw2 ? dw2 + wo : NULL;
        if (gh) ops->grads(ops->ctx, e, &g1, &g3, &g2);
        if (m == 0) {
            if (gh) ops->grads_done(ops->ctx, e);
            continue;
        }
        const float *xe = a->xp + (size_t)r0 * C, *h1 = a->h1 + (size_t)r0 * F, *h3 = a->h3 + (size_t)r0 * F;
        const float *e1, *e3, *e2;
        expert_mats(ops, e, d, w1, w3, w2, &e1, &e3, &e2);
        float *dyp = w->dyp + (size_t)r0 * C, *dh1 = w->dh1 + (size_t)r0 * F, *dh3 = w->dh3 + (size_t)r0 * F;
        mf_sgemm(0, 0, m, F, C, 1.0f, dyp, C, e2, F, 0.0f, dh1, F); /* dha, in dh1 */
        if (lora) ops->lora_bwd(ops->ctx, e, 2, dyp, a->ha + (size_t)r0 * F, dh1, m, r0);
        if (g2) mf_sgemm(1, 0, C, F, m, 1.0f, dyp, C, a->ha + (size_t)r0 * F, F, 1.0f, g2, F);
        /* SwiGLU backward in place over dha (mf_swiglu_backward's
         * formula; its contract does not let dgate alias dout) */
        const size_t mf = (size_t)m * F;
#pragma omp parallel for simd schedule(static) if (mf >= MF_MOE_PAR_MIN)
        for (size_t i = 0; i < mf; i++) {
            const float gt = h1[i], u = h3[i], dd = dh1[i];
            const float sg = 1.0f / (1.0f + expf(-gt));
            dh1[i] = dd * u * (sg * (1.0f + gt * (1.0f - sg)));
            dh3[i] = dd * (gt * sg);
        }
        if (g1) {
            mf_sgemm(1, 0, F, C, m, 1.0f, dh1, F, xe, C, 1.0f, g1, C);
            mf_sgemm(1, 0, F, C, m, 1.0f, dh3, F, xe, C, 1.0f, g3, C);
        }
        mf_sgemm(0, 0, m, C, F, 1.0f, dh1, F, e1, C, 0.0f, dyp, C);
        mf_sgemm(0, 0, m, C, F, 1.0f, dh3, F, e3, C, 1.0f, dyp, C);
        if (lora) {
            ops->lora_bwd(ops->ctx, e, 0, dh1, xe, dyp, m, r0);
            ops->lora_bwd(ops->ctx, e, 1, dh3, xe, dyp, m, r0);
        }
        if (gh) ops->grads_done(ops->ctx, e);  /* the expert's gradients done, its weights read */
    }
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *g = dx + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int row = a->slot_row[(size_t)n * k + j];
            if (row < 0) continue;
            const float *dr = w->dyp + (size_t)row * C;
#pragma omp simd
            for (int c = 0; c < C; c++) g[c] += dr[c];
        }
    }
    return 0;
}

/* ---- expert parallel: the gather and the scatter on their own ----------- */

/* The same loops as inside mf_moe_experts_forward/backward (token-parallel,
 * a token's slots in slot order), for expert parallelism, where the
 * experts run on other ranks between the gather and the scatter. */
void mf_moe_gather(float *xp, const float *x, const int32_t *slot_row, int N, int k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            const int row = slot_row[(size_t)n * k + j];
            if (row >= 0) memcpy(xp + (size_t)row * C, x + (size_t)n * C, (size_t)C * sizeof(float));
        }
}

void mf_moe_combine(float *y, const float *yp, const int32_t *slot_row, const float *topk_w, int N, int k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *yn = y + (size_t)n * C;
        memset(yn, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int row = slot_row[(size_t)n * k + j];
            if (row < 0) continue;
            const float wgt = topk_w[(size_t)n * k + j], *yr = yp + (size_t)row * C;
#pragma omp simd
            for (int c = 0; c < C; c++) yn[c] += wgt * yr[c];
        }
    }
}

void mf_moe_combine_backward(float *dyp, float *dtopk_w, const float *dy, const float *yp, const int32_t *slot_row,
                             const float *topk_w, int N, int k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = dy + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const size_t s = (size_t)n * k + j;
            const int row = slot_row[s];
            if (row < 0) { dtopk_w[s] = 0.0f; continue; }
            const float wgt = topk_w[s], *yr = yp + (size_t)row * C;
            float *dr = dyp + (size_t)row * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dot += (double)g[c] * yr[c];
                dr[c] = wgt * g[c];
            }
            dtopk_w[s] = (float)dot;
        }
    }
}

void mf_moe_gather_backward(float *dx, const float *dxp, const int32_t *slot_row, int N, int k, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *g = dx + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int row = slot_row[(size_t)n * k + j];
            if (row < 0) continue;
            const float *dr = dxp + (size_t)row * C;
#pragma omp simd
            for (int c = 0; c < C; c++) g[c] += dr[c];
        }
    }
}

/* ---- 16-bit experts (precision bf16 / fp16; docs/moe.md) ---------------- */

/* The dense block's 16-bit recipe (blocks.c lin_fwd/lin_bwd, docs/
 * precision.md) applied per expert: the GEMM inputs xp (gathered from the
 * 16-bit ln2 rows, a copy) and ha are 16-bit, the weights are the 16-bit
 * compute copies, every GEMM accumulates in fp32 into fp32 outputs (h1,
 * h3, yp); backward rounds each output gradient (dyp, then dh1 and dh3)
 * into d16 once before its two products. The experts run one after
 * another (they share the planned GEMM scratch and d16), each GEMM
 * parallel inside; gathers and scatters are mf_moe_gather's loops.
 * A group of m rows runs as chunks of power-of-two rows (m = 13: 8, 4, 1;
 * the weight gradients accumulate over them): oneDNN builds and caches a
 * primitive per GEMM shape, and group sizes change every step, so whole
 * groups made a new primitive per expert per step (the resident memory
 * grew ~1 MiB a step on moe-tiny until the cache filled: the trainer's
 * leak check stopped the run); chunks keep to log2(N) + 1 row counts. */
static int moe_chunk(int m) {
    int c = 1;
    while (c <= m / 2) c *= 2;
    return c;
}

int mf_moe_experts_forward16(mf_dtype dt, float *y, mf_moe_acts *a, const void *x, const mf_moe_route *r,
                             const void *w1, const void *w3, const void *w2, const mf_moe_dims *d, void *scratch,
                             size_t scratch_bytes) {
    if (moe_check(d)) return -1;
    const int N = d->N, C = d->C, F = d->F, E = d->E, k = d->k;
    uint16_t *xp = (uint16_t *)a->xp, *ha = (uint16_t *)a->ha;
    const uint16_t *x16 = x, *W1 = w1, *W3 = w3, *W2 = w2;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_MOE_PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            const int row = a->slot_row[(size_t)n * k + j];
            if (row >= 0) memcpy(xp + (size_t)row * C, x16 + (size_t)n * C, (size_t)C * sizeof(uint16_t));
        }
    for (int e = 0; e < E; e++) {
        const int r0 = a->offsets[e], m = a->offsets[e + 1] - r0;
        if (m == 0) continue;
        const size_t wo = (size_t)e * F * C;
        for (int c0 = 0, c; c0 < m; c0 += c) {
            c = moe_chunk(m - c0);
            const size_t q = (size_t)r0 + c0;
            const uint16_t *xe = xp + q * C;
            float *h1 = a->h1 + q * F, *h3 = a->h3 + q * F;
            uint16_t *hae = ha + q * F;
            mf_gemm16(dt, h1, xe, W1 + wo, NULL, c, F, C, 0, 1, 0, scratch, scratch_bytes);
            mf_gemm16(dt, h3, xe, W3 + wo, NULL, c, F, C, 0, 1, 0, scratch, scratch_bytes);
            mf_swiglu_forward16(hae, dt, h1, h3, (size_t)c * F);
            mf_gemm16(dt, a->yp + q * C, hae, W2 + wo, NULL, c, C, F, 0, 1, 0, scratch, scratch_bytes);
        }
    }
    mf_moe_combine(y, a->yp, a->slot_row, r->topk_w, N, k, C);
    return 0;
}

int mf_moe_experts_backward16(mf_dtype dt, float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, void *d16,
                              const float *dy, const mf_moe_acts *a, const mf_moe_route *r, const void *w1,
                              const void *w3, const void *w2, const mf_moe_dims *d, void *scratch,
                              size_t scratch_bytes) {
    return mf_moe_experts_backward16_ops(dt, dx, dw1, dw3, dw2, w, d16, dy, a, r, w1, w3, w2, d, scratch,
                                         scratch_bytes, NULL);
}

int mf_moe_experts_backward16_ops(mf_dtype dt, float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w,
                                  void *d16, const float *dy, const mf_moe_acts *a, const mf_moe_route *r,
                                  const void *w1, const void *w3, const void *w2, const mf_moe_dims *d,
                                  void *scratch, size_t scratch_bytes, const mf_moe_expert_ops *ops) {
    if (moe_check(d)) return -1;
    const int gh = ops && ops->grads;
    const int N = d->N, C = d->C, F = d->F, E = d->E, k = d->k;
    const uint16_t *xp = (const uint16_t *)a->xp, *ha = (const uint16_t *)a->ha;
    const uint16_t *W1 = w1, *W3 = w3, *W2 = w2;
    uint16_t *g16 = d16;
    mf_moe_combine_backward(w->dyp, w->dtopk_w, dy, a->yp, a->slot_row, r->topk_w, N, k, C);
    for (int e = 0; e < E; e++) {
        const int r0 = a->offsets[e], m = a->offsets[e + 1] - r0;
        const size_t wo = (size_t)e * F * C;
        float *g1 = dw1 ? dw1 + wo : NULL, *g3 = dw1 ? dw3 + wo : NULL, *g2 = dw2 ? dw2 + wo : NULL;
        if (gh) ops->grads(ops->ctx, e, &g1, &g3, &g2);
        for (int c0 = 0, c; c0 < m; c0 += c) {
        c = moe_chunk(m - c0);
        const size_t q = (size_t)r0 + c0, mf = (size_t)c * F;
        const uint16_t *xe = xp + q * C;
        const float *h1 = a->h1 + q * F, *h3 = a->h3 + q * F;
        float *dyp = w->dyp + q * C, *dh1 = w->dh1 + q * F, *dh3 = w->dh3 + q * F;
        mf_half_from_f32(dt, g16, dyp, (size_t)c * C);
        mf_gemm16(dt, dh1, g16, W2 + wo, NULL, c, F, C, 0, 0, 0, scratch, scratch_bytes); /* dha, in dh1 */
        if (g2) mf_gemm16_dw(dt, g2, 0, g16, ha + q * F, C, F, c, 1, 0, scratch, scratch_bytes);
#pragma omp parallel for simd schedule(static) if (mf >= MF_MOE_PAR_MIN)
        for (size_t i = 0; i < mf; i++) {
            const float gt = h1[i], u = h3[i], dd = dh1[i];
            const float sg = 1.0f / (1.0f + expf(-gt));
            dh1[i] = dd * u * (sg * (1.0f + gt * (1.0f - sg)));
            dh3[i] = dd * (gt * sg);
        }
        mf_half_from_f32(dt, g16, dh1, mf);
        mf_half_from_f32(dt, g16 + mf, dh3, mf);
        if (g1) {
            mf_gemm16_dw(dt, g1, 0, g16, xe, F, C, c, 1, 0, scratch, scratch_bytes);
            mf_gemm16_dw(dt, g3, 0, g16 + mf, xe, F, C, c, 1, 0, scratch, scratch_bytes);
        }
        mf_gemm16(dt, dyp, g16, W1 + wo, NULL, c, C, F, 0, 0, 0, scratch, scratch_bytes);
        mf_gemm16(dt, dyp, g16 + mf, W3 + wo, NULL, c, C, F, 0, 0, 1, scratch, scratch_bytes);
        }
        if (gh) ops->grads_done(ops->ctx, e);  /* after its last chunk: gradients done, weights read */
    }
    mf_moe_gather_backward(dx, w->dyp, a->slot_row, N, k, C);
    return 0;
}
