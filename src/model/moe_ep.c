/* Expert parallelism for the mixture-of-experts block (--expert_parallel
 * N; docs/moe.md, "Expert parallel"). The world is cut into expert groups
 * of N consecutive ranks; group rank g holds experts [g*E/N, (g+1)*E/N) of
 * every layer (plan.c declares only those slices of the stacks), the rest
 * of the model is replicated as plain data parallel.
 *
 * Forward of one layer on this rank's N tokens:
 *   1. route its own tokens (mf_moe_router_forward, the whole router);
 *   2. all-gather every group rank's slot count per expert (ep x E ints):
 *      from it each rank knows how many rows it sends to and receives from
 *      every other, and, with a capacity, which of its slots drop: the
 *      single process keeps each expert's first `cap` slots in token order,
 *      and the group's tokens are in rank order, so a slot is kept while the
 *      earlier ranks' slots to its expert plus its place among this rank's
 *      are below cap (cap = the capacity of the group's tokens);
 *   3. sum the router's statistics over the world (slot counts and
 *      probability sums per expert, sum of lse^2, tokens, drops), so the
 *      load-balancing and z losses, and f_e in their gradient, are the
 *      single process's over the whole batch;
 *   4. gather the kept slots' rows sorted by expert (the rows bound for
 *      group rank p are contiguous, its experts being contiguous) and
 *      MPI_Alltoallv them; the owner runs its experts on them with the
 *      kernels' mf_moe_experts_forward over E/N experts, as N' tokens of
 *      top-1 with weight 1 (its gather groups the received rows by expert,
 *      its scatter returns them to arrival order, both exact copies);
 *   5. MPI_Alltoallv the outputs back; y[n] = sum of topk_w * rows.
 * Backward reverses 5 and 4 (the owner's mf_moe_experts_backward gives the
 * experts' weight gradients and the rows' input gradients) and runs the
 * router's backward on the token's rank. With LoRA on the experts the
 * owner runs its experts' adapters (the rank's slices of the adapter
 * stacks, moe_lora.c's hooks); their gradients are then complete on the
 * owner, summed over the expert's replicas only (zero.c). Every buffer is
 * a plan row (plan.c: moe[] and moe_ep[] per layer, m->moe_ep_work). */
#include "internal.h"

#include "dist/dist.h"
#include "memfit/kernels.h"

#include <string.h>

#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define IBUF(id) ((int32_t *)mf_arena_get(a, (id)))
#define LT_I(l, k) (m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt + m->lt[k])

int mf_moe_ep_bounds(const mf_dims *d, int N, int64_t *send, int64_t *recv, int64_t *group, int *cap) {
    int P = d->ep > 1 ? d->ep : 1, E = d->n_experts, k = d->top_k, El = E / P, c = 0;
    if ((int64_t)N * P > (1 << 30)) return mf_fail("expert_parallel %d x %d tokens per rank is too many", P, N);
    if (mf_moe_capacity(N * P, k, E, d->capacity_factor, &c)) return -1;
    int64_t S = (int64_t)N * k, Rr = (int64_t)P * N * (k < El ? k : El), G = (int64_t)P * N;
    if (c > 0) {
        if ((int64_t)E * c < S) S = (int64_t)E * c;
        if ((int64_t)El * c < Rr) Rr = (int64_t)El * c;
        if (c < G) G = c;
    }
    if (send) *send = S;
    if (recv) *recv = Rr;
    if (group) *group = G;
    if (cap) *cap = c;
    return 0;
}

/* Slots rank p of the group keeps for expert e: all of them dropless, else
 * those below the capacity after the earlier ranks' */
static int64_t kept(const int32_t *cnt, int E, int p, int e, int cap) {
    if (cap <= 0) return cnt[(size_t)p * E + e];
    int64_t before = 0;
    for (int q = 0; q < p; q++) before += cnt[(size_t)q * E + e];
    int64_t k = cap - before;
    return k < 0 ? 0 : k > cnt[(size_t)p * E + e] ? cnt[(size_t)p * E + e] : k;
}

/* The exchange's layout from the group's counts (cnt, P x E) and this
 * rank's dispatch (soff, E+1): floats to send to / receive from each group
 * rank, the owner's group offsets (ooff, El+1) and, when orow is given,
 * each received row's place in the grouped rows. Returns the rows
 * received. */
static int64_t layout(const mf_model *m, const int32_t *cnt, int cap, const int32_t *soff, int64_t *scnt, int64_t *sdisp,
                      int64_t *rcnt, int64_t *rdisp, int32_t *ooff, int32_t *orow) {
    const int P = m->d.ep, E = m->d.n_experts, El = E / P, C = m->d.C, g = mf_dist_ep_rank();
    for (int p = 0; p < P; p++) {
        scnt[p] = (int64_t)(soff[(p + 1) * El] - soff[p * El]) * C;
        sdisp[p] = (int64_t)soff[p * El] * C;
    }
    int64_t rows = 0;
    ooff[0] = 0;
    for (int e = 0; e < El; e++) {
        int64_t n = 0;
        for (int p = 0; p < P; p++) n += kept(cnt, E, p, g * El + e, cap);
        ooff[e + 1] = (int32_t)(ooff[e] + n);
    }
    for (int p = 0; p < P; p++) {
        int64_t r0 = rows;
        for (int e = 0; e < El; e++) {
            int64_t n = kept(cnt, E, p, g * El + e, cap);
            if (orow) {
                int64_t at = ooff[e];
                for (int q = 0; q < p; q++) at += kept(cnt, E, q, g * El + e, cap);
                for (int64_t j = 0; j < n; j++) orow[rows + j] = (int32_t)(at + j);
            }
            rows += n;
        }
        rcnt[p] = (rows - r0) * C;
        rdisp[p] = r0 * C;
    }
    return rows;
}

static mf_moe_route route_of(mf_arena *a, const mf_layer_acts *A) {
    mf_moe_route r = {BUF(A->moe[MF_MOE_BUF_PROBS]), BUF(A->moe[MF_MOE_BUF_LSE]), IBUF(A->moe[MF_MOE_BUF_TOPK_IDX]),
                      BUF(A->moe[MF_MOE_BUF_TOPK_W]), BUF(A->moe[MF_MOE_BUF_FRAC])};
    return r;
}

/* The owner's side as the kernels see it: its received rows are N' tokens
 * of top-1 with weight 1 over its E/N experts */
static void owner_of(mf_model *m, mf_arena *a, const mf_layer_acts *A, int64_t rows, mf_moe_dims *od, mf_moe_acts *oa,
                     mf_moe_route *orr, float *yp) {
    const int El = m->d.n_experts / m->d.ep;
    *od = (mf_moe_dims){.N = (int)rows, .C = m->d.C, .F = m->d.ffn, .E = El, .k = 1, .norm_topk_prob = 0, .capacity = 0};
    *oa = (mf_moe_acts){IBUF(A->moe_ep[2]), IBUF(A->moe_ep[1]), BUF(A->moe_ep[3]), BUF(A->moe[MF_MOE_BUF_H1]),
                        BUF(A->moe[MF_MOE_BUF_H3]), BUF(A->moe[MF_MOE_BUF_HA]), yp};
    float *ones = BUF(m->moe_ep_work[3]);
    for (int64_t i = 0; i < rows; i++) ones[i] = 1.0f;
    *orr = (mf_moe_route){NULL, NULL, NULL, ones, NULL};
}

/* The owner's E/N experts for the kernels: their stacks, and with LoRA on
 * the experts the adapters' hooks (moe_lora.c) over the rank's slices of
 * the adapter stacks; the model's index of its first expert carried for
 * LoRA dropout's per-expert masks, so they are the single process's */
static const mf_moe_expert_ops *expert_ops(mf_model *m, mf_arena *a, int l, mf_moe_expert_ctx *c,
                                           mf_moe_expert_ops *ops, const float **w1, const float **w3,
                                           const float **w2) {
    const mf_moe_expert_ops *o = mf_moe_expert_setup(m, a, l, c, ops, w1, w3, w2);
    c->e0 = mf_dist_ep_rank() * (m->d.n_experts / m->d.ep);
    return o;
}

void mf_moe_ep_forward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, const float *xmid,
                       float *out, int N, int recompute) {
    if (recompute) mf_panic("expert parallel: a rebuilt block would exchange again (the plan refuses this recompute)");
    const int P = m->d.ep, E = m->d.n_experts, k = m->d.top_k, C = m->d.C, g = mf_dist_ep_rank();
    if (mf_dist_ep_size() != P) mf_panic("expert parallel: the group has %d ranks, the plan %d", mf_dist_ep_size(), P);
    mf_moe_dims d = {.N = N, .C = C, .F = m->d.ffn, .E = E, .k = k, .norm_topk_prob = m->d.norm_topk_prob};
    mf_moe_route r = route_of(a, A);
    const float *wg = mf_model_tensor_p(m, a, LT_I(l, MF_LT_ROUTER));
    double aux = 0, z = 0;
    if (mf_moe_router_forward(&r, &aux, &z, ln2, wg, &d)) mf_panic("moe: %s", mf_error());
    if (m->moe_count) mf_moe_count_tokens(m, l, &r, N);  /* this rank's tokens (report, profile) */
    /* 2. every group rank's slots per expert; the capacity of the group's tokens */
    int32_t mine[E], *cnt = IBUF(A->moe_ep[0]);
    memset(mine, 0, sizeof mine);
    for (size_t s = 0; s < (size_t)N * k; s++) mine[r.topk_idx[s]]++;
    if (mf_dist_ep_allgather_ints(mine, cnt, E)) mf_panic("%s", mf_error());
    int64_t slots = 0;
    for (int i = 0; i < P * E; i++) slots += cnt[i];
    if (mf_moe_capacity((int)(slots / k), k, E, m->d.capacity_factor, &d.capacity)) mf_panic("moe: %s", mf_error());
    int32_t before[E];
    for (int e = 0; e < E; e++) {
        before[e] = 0;
        for (int q = 0; q < g; q++) before[e] += cnt[(size_t)q * E + e];
    }
    mf_moe_acts x = {IBUF(A->moe[MF_MOE_BUF_OFFSETS]), IBUF(A->moe[MF_MOE_BUF_SLOT_ROW]), BUF(A->moe[MF_MOE_BUF_XP]),
                     NULL, NULL, NULL, BUF(A->moe[MF_MOE_BUF_YP])};
    int dropped = 0;
    if (mf_moe_dispatch_after(&x, &dropped, &r, &d, before)) mf_panic("moe: %s", mf_error());
    /* 3. the router's statistics over the world: the single process's f_e,
     * P_e, z and drops over the whole batch */
    double st[2 * E + 3];
    for (int e = 0; e < E; e++) {
        double pe = 0.0;
        for (int n = 0; n < N; n++) pe += r.probs[(size_t)n * E + e];
        st[e] = mine[e], st[E + e] = pe;
    }
    st[2 * E] = z * N, st[2 * E + 1] = N, st[2 * E + 2] = dropped;
    if (mf_dist_sum_doubles(st, 2 * E + 3)) mf_panic("%s", mf_error());
    const double Nt = st[2 * E + 1];
    double auxs = 0.0;
    for (int e = 0; e < E; e++) {
        r.frac[e] = (float)(st[e] / Nt);  /* the gradient's f_e (mf_moe_router_backward) */
        auxs += (double)r.frac[e] * (st[E + e] / Nt);
    }
    m->moe_aux += auxs * E / m->d.L, m->moe_z += st[2 * E] / Nt / m->d.L;
    m->moe_dropped += (int64_t)st[2 * E + 2];
    /* 4. the kept slots' rows, sorted by expert, to their owners */
    int64_t scnt[P], sdisp[P], rcnt[P], rdisp[P];
    const int32_t *soff = x.offsets;
    int32_t *ooff = IBUF(A->moe_ep[2]), *orow = IBUF(A->moe_ep[1]);
    int64_t rows = layout(m, cnt, d.capacity, soff, scnt, sdisp, rcnt, rdisp, ooff, orow);
    if (soff[E] > m->moe_ep_send || rows > m->moe_ep_recv)
        mf_panic("expert parallel: %d rows sent, %lld received, beyond the plan's %lld and %lld", soff[E], (long long)rows,
                 (long long)m->moe_ep_send, (long long)m->moe_ep_recv);
    mf_moe_gather(x.xp, ln2, x.slot_row, N, k, C);
    float *recv = BUF(m->moe_ep_work[0]);
    if (mf_dist_ep_alltoallv(x.xp, scnt, sdisp, recv, rcnt, rdisp)) mf_panic("%s", mf_error());
    if (rows > 0) {
        /* the owner's experts; results overwrite the received rows in
         * arrival order (the kernel's gather reads them all first) */
        mf_moe_dims od;
        mf_moe_acts oa;
        mf_moe_route orr;
        owner_of(m, a, A, rows, &od, &oa, &orr, BUF(m->moe_ep_work[1]));
        const float *w1, *w3, *w2;
        mf_moe_expert_ctx ec;
        mf_moe_expert_ops eo;
        const mf_moe_expert_ops *ops = expert_ops(m, a, l, &ec, &eo, &w1, &w3, &w2);
        if (mf_moe_experts_forward_ops(recv, &oa, recv, &orr, w1, w3, w2, &od, ops)) mf_panic("moe: %s", mf_error());
    }
    /* 5. back to the tokens' ranks, into yp (kept for backward) */
    if (mf_dist_ep_alltoallv(recv, rcnt, rdisp, x.yp, scnt, sdisp)) mf_panic("%s", mf_error());
    float *y = out ? out : BUF(m->dln);
    mf_moe_combine(y, x.yp, x.slot_row, r.topk_w, N, k, C);
    if (!out) return;
    size_t n = (size_t)N * C;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] += xmid[i];
}

void mf_moe_ep_backward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, int N) {
    const int P = m->d.ep, E = m->d.n_experts, k = m->d.top_k, C = m->d.C;
    mf_moe_dims d = {.N = N, .C = C, .F = m->d.ffn, .E = E, .k = k, .norm_topk_prob = m->d.norm_topk_prob};
    mf_moe_route r = route_of(a, A);
    const int32_t *cnt = IBUF(A->moe_ep[0]), *soff = IBUF(A->moe[MF_MOE_BUF_OFFSETS]);
    const int32_t *slot_row = IBUF(A->moe[MF_MOE_BUF_SLOT_ROW]);
    int64_t slots = 0;
    for (int i = 0; i < P * E; i++) slots += cnt[i];
    if (mf_moe_capacity((int)(slots / k), k, E, m->d.capacity_factor, &d.capacity)) mf_panic("moe: %s", mf_error());
    int64_t scnt[P], sdisp[P], rcnt[P], rdisp[P];
    int32_t ooff[E / P + 1];
    int64_t rows = layout(m, cnt, d.capacity, soff, scnt, sdisp, rcnt, rdisp, ooff, NULL);
    mf_moe_work w = {BUF(m->moe_work[MF_MOE_BUF_DLOGITS]), BUF(m->moe_work[MF_MOE_BUF_DTOPK_W]),
                     BUF(m->moe_work[MF_MOE_BUF_DYP]), BUF(m->moe_work[MF_MOE_BUF_DH1]), BUF(m->moe_work[MF_MOE_BUF_DH3])};
    float *dres = BUF(m->dres), *dln = BUF(m->dln);
    /* the scatter's backward on the tokens' rank, then the rows to their owners */
    mf_moe_combine_backward(w.dyp, w.dtopk_w, dres, BUF(A->moe[MF_MOE_BUF_YP]), slot_row, r.topk_w, N, k, C);
    float *recv = BUF(m->moe_ep_work[0]), *back = BUF(m->moe_ep_work[1]);
    if (mf_dist_ep_alltoallv(w.dyp, scnt, sdisp, recv, rcnt, rdisp)) mf_panic("%s", mf_error());
    if (rows > 0) {
        /* the owner: its experts' backward over the received rows (as
         * top-1 with weight 1: the routing weight was applied on the
         * token's rank); their input gradients into `back` in arrival order */
        mf_moe_dims od;
        mf_moe_acts oa;
        mf_moe_route orr;
        owner_of(m, a, A, rows, &od, &oa, &orr, recv);  /* (yp is read only for the discarded weight gradient) */
        mf_moe_work ow = {NULL, BUF(m->moe_ep_work[4]), BUF(m->moe_ep_work[2]), w.dh1, w.dh3};
        const float *w1, *w3, *w2;
        mf_moe_expert_ctx ec;
        mf_moe_expert_ops eo;
        const mf_moe_expert_ops *ops = expert_ops(m, a, l, &ec, &eo, &w1, &w3, &w2);
        /* (NULL under LoRA: the expert base is frozen, the adapters' hooks
         * add their own gradients) */
        float *dw1 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W1)), *dw3 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W3));
        float *dw2 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W2));
        memset(back, 0, (size_t)rows * C * sizeof(float));
        if (mf_moe_experts_backward_ops(back, dw1, dw3, dw2, &ow, recv, &oa, &orr, w1, w3, w2, &od, ops))
            mf_panic("moe: %s", mf_error());
    }
    /* the rows' input gradients back to the tokens' ranks (into dyp, read) */
    if (mf_dist_ep_alltoallv(back, rcnt, rdisp, w.dyp, scnt, sdisp)) mf_panic("%s", mf_error());
    memset(dln, 0, (size_t)N * C * sizeof(float));
    mf_moe_gather_backward(dln, w.dyp, slot_row, N, k, C);
    const float *wg = mf_model_tensor_p(m, a, LT_I(l, MF_LT_ROUTER));
    float *dwg = mf_model_tensor_g(m, a, LT_I(l, MF_LT_ROUTER));
    if (mf_moe_router_backward(dln, dwg, &w, &r, ln2, wg, m->d.aux_coef * m->moe_gscale / m->d.L,
                               m->d.z_coef * m->moe_gscale / m->d.L, &d))
        mf_panic("moe: %s", mf_error());
}
