/* The experts' per-expert hooks (mf_moe_expert_ops, kernels.h) for the
 * mixture-of-experts block (moe_block.c):
 *  - a quantised frozen base (QLoRA): expert e's w1, w3, w2 are dequantised
 *    into the phase's work.moe.dequant row (3 x F x C floats, one expert),
 *    so the kernels never see a whole layer's stacks in fp32;
 *  - LoRA on the experts (targets w1, w2, w3, PEFT's names): expert e's
 *    adapter is rows e*r.. of the stacked lora_A (E*r, in) and rows
 *    e*out.. of lora_B (E*out, r); y += (alpha/r) x A_e^T B_e^T on the
 *    expert's group of permuted rows, u = x A_e^T in work.moe.lora_u's rows
 *    of that group (rebuilt in backward, as lora.h's kernels do). Under
 *    expert parallelism the stacks are the rank's E/N experts' and e counts
 *    from its first expert (the model's index: c->e0 + e).
 * LoRA dropout (--lora dropout=P) as PEFT's lora.Linear applies it to each
 * expert's input rows: a mask per (step, layer, projection, expert), drawn
 * by mf_lora_dropout_seed's counter hash over the expert's group of
 * permuted rows, so a rebuild under recompute draws the same mask; the
 * dropped input goes to the phase's work.lora_drop row, each expert's group
 * its own slice (rows r0.. of width win). And the per-layer count
 * of token-slots each expert was sent (moe_tokens: the report's and
 * memfit profile's imbalance table). */
#include "internal.h"

#include "memfit/lora.h"
#include "quant/quant.h"

#define LT_I(l, k) (m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt + m->lt[k])

static const int moe_targets[3] = {MF_LORA_W1, MF_LORA_W3, MF_LORA_W2};  /* projection p: 0 w1, 1 w3, 2 w2 */

static void expert_weights(void *ctx, int e, const float **w1, const float **w3, const float **w2) {
    mf_moe_expert_ctx *c = ctx;
    const int64_t n = (int64_t)c->m->d.ffn * c->m->d.C;  /* F*C, the same for all three */
    for (int k = 0; k < 3; k++) {
        const mf_tensor *t = &c->m->tensors[c->ids[k]];
        mf_quant_unpack((mf_quant_kind)t->qkind, c->tile + k * n, mf_model_tensor_p(c->m, c->a, c->ids[k]),
                        (int64_t)e * n, n);
    }
    *w1 = c->tile, *w3 = c->tile + n, *w2 = c->tile + 2 * n;
}

/* expert e's A (r,in), B (out,r) of projection p and their gradients */
static void adapter_of(mf_moe_expert_ctx *c, int e, int p, int *in, int *out, float **A, float **B, float **dA,
                       float **dB) {
    mf_model *m = c->m;
    int i = c->lora[p], r = m->lora.r;
    mf_model_lora_dims(&m->d, moe_targets[p], in, out);
    /* the hooks run on several threads at once (one expert each), and
     * mf_arena_get's first touch of a row adds it to the ledger: one
     * thread at a time, or two threads count the same row twice (seen:
     * ledger 3072 bytes over the plan, now and then, under recompute
     * selective) */
#pragma omp critical(mf_moe_lora_arena)
    {
        *A = (float *)mf_arena_get(c->a, m->tensors[i].p) + (size_t)e * r * *in;
        *B = (float *)mf_arena_get(c->a, m->tensors[i + 1].p) + (size_t)e * *out * r;
        if (dA) *dA = (float *)mf_arena_get(c->a, m->tensors[i].g) + (size_t)e * r * *in;
        if (dB) *dB = (float *)mf_arena_get(c->a, m->tensors[i + 1].g) + (size_t)e * *out * r;
    }
}

/* the dropout rows' width: the widest input of the run's targets (plan.c) */
static int64_t drop_width(const mf_model *m) {
    int64_t win = 0;
    for (int k = 0; k < MF_LORA_TARGETS; k++) {
        int in, out;
        mf_model_lora_dims(&m->d, k, &in, &out);
        if (m->lora.targets >> k & 1 && in > win) win = in;
    }
    return win;
}

/* row id of the arena, for a hook (see adapter_of) */
static float *hook_row(mf_moe_expert_ctx *c, int id) {
    float *x;
#pragma omp critical(mf_moe_lora_arena)
    x = mf_arena_get(c->a, id);
    return x;
}

/* expert e's dropout for projection p: probability, seed and its slice of
 * the phase's dropout row (NULL, 0 without dropout) */
static float expert_drop(mf_moe_expert_ctx *c, int e, int p, int r0, float **xd, uint64_t *seed) {
    mf_model *m = c->m;
    *xd = NULL, *seed = 0;
    if (!m->lora_drop) return 0.0f;
    int bwd = m->mode == MF_MODE_TRAIN && c->a->phase >= mf_phase_head_bwd(m);
    *xd = hook_row(c, bwd ? m->lora_xb : m->lora_xf) + (size_t)r0 * drop_width(m);
    /* the dense target's seed, mixed again with the expert: PEFT's experts
     * are separate modules with separate dropout draws */
    *seed = mf_lora_dropout_seed(mf_lora_dropout_seed(m->lora_seed, m->lora_micro, c->l, moe_targets[p]),
                                 (uint64_t)(c->e0 + e), 0, 0);  /* (expert parallel: the model's expert index) */
    return m->lora.dropout;
}

static void expert_lora_fwd(void *ctx, int e, int p, const float *x, float *y, int n, int r0) {
    mf_moe_expert_ctx *c = ctx;
    if (c->lora[p] < 0) return;
    int in, out, r = c->m->lora.r;
    float *A, *B, *xd;
    uint64_t ds;
    adapter_of(c, e, p, &in, &out, &A, &B, NULL, NULL);
    float *u = hook_row(c, c->m->moe_lora_u) + (size_t)r0 * r;
    float pd = expert_drop(c, e, p, r0, &xd, &ds);
    mf_lora_forward(y, u, xd, x, A, B, n, in, out, r, mf_lora_scale(&c->m->lora), pd, ds);
}

static void expert_lora_bwd(void *ctx, int e, int p, const float *dy, const float *x, float *dx, int n, int r0) {
    mf_moe_expert_ctx *c = ctx;
    if (c->lora[p] < 0) return;
    int in, out, r = c->m->lora.r;
    float *A, *B, *dA, *dB, *xd;
    uint64_t ds;
    adapter_of(c, e, p, &in, &out, &A, &B, &dA, &dB);
    float *u = hook_row(c, c->m->moe_lora_u) + (size_t)r0 * r;
    float *du = hook_row(c, c->m->moe_lora_du) + (size_t)r0 * r;
    float pd = expert_drop(c, e, p, r0, &xd, &ds);
    mf_lora_backward_params(du, dA, dB, u, xd, dy, x, A, B, n, in, out, r, mf_lora_scale(&c->m->lora), pd, ds);
    mf_lora_backward_input(dx, xd, du, A, n, in, r, pd, ds);
}

const mf_moe_expert_ops *mf_moe_expert_setup(mf_model *m, mf_arena *a, int l, mf_moe_expert_ctx *c,
                                             mf_moe_expert_ops *ops, const float **w1, const float **w3,
                                             const float **w2) {
    *c = (mf_moe_expert_ctx){.m = m, .a = a, .l = l,
                             .ids = {LT_I(l, MF_LT_W1), LT_I(l, MF_LT_W3), LT_I(l, MF_LT_W2)}};
    *ops = (mf_moe_expert_ops){.ctx = c};
    int any = 0;
    for (int p = 0; p < 3; p++) {
        c->lora[p] = mf_lora_tensor(m, l, moe_targets[p]);
        any |= c->lora[p] >= 0;
    }
    if (any) ops->lora_fwd = expert_lora_fwd, ops->lora_bwd = expert_lora_bwd;
    if (m->tensors[c->ids[0]].qkind) {
        int bwd = m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m);
        c->tile = mf_arena_get(a, bwd ? m->moe_deq_b : m->moe_deq_f);
        ops->weights = expert_weights;
        *w1 = *w3 = *w2 = NULL;
    } else {
        *w1 = mf_model_tensor_p(m, a, c->ids[0]), *w3 = mf_model_tensor_p(m, a, c->ids[1]);
        *w2 = mf_model_tensor_p(m, a, c->ids[2]);
    }
    return ops->weights || any ? ops : NULL;
}

void mf_moe_count_tokens(mf_model *m, int l, const mf_moe_route *r, int N) {
    int64_t *c = m->moe_tokens + (size_t)l * m->d.n_experts;
    for (int e = 0; e < m->d.n_experts; e++) c[e] = 0;
    for (int64_t s = 0; s < (int64_t)N * m->d.top_k; s++) c[r->topk_idx[s]]++;
}
