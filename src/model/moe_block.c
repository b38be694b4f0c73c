/* The mixture-of-experts MLP of the block library (Mixtral's
 * block_sparse_moe): a linear router picks k of E SwiGLU experts per token
 * and the token's output is the routing-weighted sum of theirs, on the
 * kernels of src/kernels/moe.c (docs/moe.md). Every buffer is a plan row
 * (plan.c: acts moe[] per layer or recompute slot, m->moe_work for
 * backward), sized by mf_moe_buffer_sizes for the worst case the plan
 * allows; the step computes the capacity from the tokens it runs (fewer
 * than planned fit smaller rows).
 *
 * Losses: each layer's load-balancing aux loss (HF's formula on that
 * layer's router) and z-loss; the model's are the means over the layers,
 * added to the training loss times router_aux_loss_coef and
 * router_z_loss_coef (driver.c). HF Mixtral instead computes one aux over
 * every layer's router logits concatenated; the two agree for a uniform
 * router, not in general (docs/moe.md). */
#include "internal.h"

#include "memfit/kernels.h"

#include <string.h>

#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define LT_I(l, k) (m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt + m->lt[k])  /* shared: l's set */

static mf_moe_dims moe_dims(const mf_model *m, int N) {
    mf_moe_dims d = {.N = N, .C = m->d.C, .F = m->d.ffn, .E = m->d.n_experts, .k = m->d.top_k,
                     .norm_topk_prob = m->d.norm_topk_prob, .capacity = 0};
    /* the capacity of this forward's tokens (<= the planned one) */
    if (mf_moe_capacity(N, d.k, d.E, m->d.capacity_factor, &d.capacity)) mf_panic("moe: %s", mf_error());
    return d;
}

static mf_moe_route route_of(mf_arena *a, const mf_layer_acts *A) {
    mf_moe_route r = {BUF(A->moe[MF_MOE_BUF_PROBS]), BUF(A->moe[MF_MOE_BUF_LSE]),
                      (int32_t *)mf_arena_get(a, A->moe[MF_MOE_BUF_TOPK_IDX]), BUF(A->moe[MF_MOE_BUF_TOPK_W]),
                      BUF(A->moe[MF_MOE_BUF_FRAC])};
    return r;
}

static mf_moe_acts acts_of(mf_arena *a, const mf_layer_acts *A) {
    mf_moe_acts x = {(int32_t *)mf_arena_get(a, A->moe[MF_MOE_BUF_OFFSETS]),
                     (int32_t *)mf_arena_get(a, A->moe[MF_MOE_BUF_SLOT_ROW]), BUF(A->moe[MF_MOE_BUF_XP]),
                     BUF(A->moe[MF_MOE_BUF_H1]), BUF(A->moe[MF_MOE_BUF_H3]), BUF(A->moe[MF_MOE_BUF_HA]),
                     BUF(A->moe[MF_MOE_BUF_YP])};
    return x;
}

/* precision bf16/fp16: ln2 is 16-bit (the block's norm wrote it as a dense
 * block's GEMM input); the router runs fp32 on it widened into work.moe.x32
 * (exactly the rounded values the experts read), the experts on the
 * 16-bit compute copies of their stacks (mf_moe_experts_forward16). */
static const float *router_input(mf_model *m, mf_arena *a, const void *ln2, int N) {
    if (m->cdt == MF_DTYPE_F32) return ln2;
    float *x = BUF(m->moe_x32);
    mf_f32_from_half(m->cdt, x, ln2, (size_t)N * m->d.C);
    return x;
}

static void gemm_scratch(mf_model *m, mf_arena *a, void **s, size_t *bytes) {
    *s = mf_arena_get(a, m->gemm_scratch), *bytes = m->gemm_scratch_bytes;
}

void mf_moe_block_forward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2,
                          const float *xmid, float *out, int N, int recompute) {
    if (m->d.ep > 1) { mf_moe_ep_forward(m, a, l, A, ln2, xmid, out, N, recompute); return; }  /* moe_ep.c */
    const int h16 = m->cdt != MF_DTYPE_F32;
    mf_moe_dims d = moe_dims(m, N);
    mf_moe_route r = route_of(a, A);
    mf_moe_acts x = acts_of(a, A);
    const float *wg = mf_model_tensor_p(m, a, LT_I(l, MF_LT_ROUTER)), *w1, *w3, *w2;
    mf_moe_expert_ctx ec;
    mf_moe_expert_ops eo;
    const mf_moe_expert_ops *ops = mf_moe_expert_setup(m, a, l, &ec, &eo, &w1, &w3, &w2);
    int dropped = 0;
    if (!recompute) {
        /* route once; a rebuild reads the kept decision (topk_idx, topk_w) */
        double aux = 0, z = 0;
        if (mf_moe_router_forward(&r, &aux, &z, router_input(m, a, ln2, N), wg, &d)) mf_panic("moe: %s", mf_error());
        m->moe_aux += aux / m->d.L, m->moe_z += z / m->d.L;
        if (m->moe_count) mf_moe_count_tokens(m, l, &r, N);
    }
    if (mf_moe_dispatch(&x, &dropped, &r, &d)) mf_panic("moe: %s", mf_error());
    if (!recompute) m->moe_dropped += dropped;
    /* a rebuild whose output row is not alive writes y into work.dln (free
     * until this layer's backward starts) */
    float *y = out ? out : BUF(m->dln);
    int rc;
    if (h16) {
        void *gs;
        size_t gb;
        gemm_scratch(m, a, &gs, &gb);
        rc = mf_moe_experts_forward16(m->cdt, y, &x, ln2, &r, w1, w3, w2, &d, gs, gb);
    } else rc = mf_moe_experts_forward_ops(y, &x, ln2, &r, w1, w3, w2, &d, ops);
    if (rc) mf_panic("moe: %s", mf_error());
    if (!out) return;
    size_t n = (size_t)N * m->d.C;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] += xmid[i];
}

/* update_in_backward (mf_model_expert_grads): expert e's gradients go to
 * the layer's one-expert rows grad.*.experts.* (zeroed here), and once the
 * kernel has finished the expert the trainer updates that expert's rows
 * of the stacks (their weights, master rows and optimizer state) from
 * them, so the rows serve the next expert. The experts then run one after
 * another: the update runs in the trainer (its sums, its one update
 * scratch row), never from several threads at once, and one expert's rows
 * are all the plan holds whatever the thread count. */
static void expert_grads(void *ctx, int e, float **g1, float **g3, float **g2) {
    mf_moe_expert_ctx *c = ctx;
    float **g[3] = {g1, g3, g2};
    (void)e;
    for (int k = 0; k < 3; k++) {
        const mf_tensor *t = &c->m->tensors[c->ids[k]];
        *g[k] = mf_model_tensor_g(c->m, c->a, c->ids[k]);
        memset(*g[k], 0, (size_t)t->gnumel * sizeof(float));
    }
}

static void expert_grads_done(void *ctx, int e) {
    mf_moe_expert_ctx *c = ctx;
    mf_model *m = c->m;
    for (int k = 0; k < 3; k++) {
        const mf_tensor *t = &m->tensors[c->ids[k]];
        const int64_t nr = t->shape[0] / m->d.n_experts;
        if (m->grads_rows_ready)
            m->grads_rows_ready(m->grads_ctx, c->ids[k], (int64_t)e * nr, nr, mf_model_tensor_g(m, c->a, c->ids[k]));
    }
}

void mf_moe_block_backward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, int N) {
    if (m->d.ep > 1) { mf_moe_ep_backward(m, a, l, A, ln2, N); return; }  /* moe_ep.c */
    mf_moe_dims d = moe_dims(m, N);
    mf_moe_route r = route_of(a, A);
    mf_moe_acts x = acts_of(a, A);
    mf_moe_work w = {BUF(m->moe_work[MF_MOE_BUF_DLOGITS]), BUF(m->moe_work[MF_MOE_BUF_DTOPK_W]),
                     BUF(m->moe_work[MF_MOE_BUF_DYP]), BUF(m->moe_work[MF_MOE_BUF_DH1]),
                     BUF(m->moe_work[MF_MOE_BUF_DH3])};
    const float *wg = mf_model_tensor_p(m, a, LT_I(l, MF_LT_ROUTER)), *w1, *w3, *w2;
    mf_moe_expert_ctx ec;
    mf_moe_expert_ops eo;
    const mf_moe_expert_ops *ops = mf_moe_expert_setup(m, a, l, &ec, &eo, &w1, &w3, &w2);
    float *dwg = mf_model_tensor_g(m, a, LT_I(l, MF_LT_ROUTER));
    float *dw1 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W1)), *dw3 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W3));
    float *dw2 = mf_model_tensor_g(m, a, LT_I(l, MF_LT_W2));
    if (m->tensors[LT_I(l, MF_LT_W1)].gx) {  /* one expert's rows: the hooks above */
        eo.grads = expert_grads, eo.grads_done = expert_grads_done;
        ops = &eo;
        dw1 = dw3 = dw2 = NULL;
    }
    float *dln = BUF(m->dln), *dres = BUF(m->dres);
    memset(dln, 0, (size_t)N * m->d.C * sizeof(float));
    int rc;
    if (m->cdt != MF_DTYPE_F32) {
        void *gs;
        size_t gb;
        gemm_scratch(m, a, &gs, &gb);
        rc = mf_moe_experts_backward16_ops(m->cdt, dln, dw1, dw3, dw2, &w, mf_arena_get(a, m->dout16), dres, &x, &r,
                                           w1, w3, w2, &d, gs, gb, ops);
    } else rc = mf_moe_experts_backward_ops(dln, dw1, dw3, dw2, &w, dres, &x, &r, w1, w3, w2, &d, ops);
    if (rc || mf_moe_router_backward(dln, dwg, &w, &r, router_input(m, a, ln2, N), wg,
                                     m->d.aux_coef * m->moe_gscale / m->d.L,
                                     m->d.z_coef * m->moe_gscale / m->d.L, &d))
        mf_panic("moe: %s", mf_error());
}
