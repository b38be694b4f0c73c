/* The model's plan: every tensor (with its role, its gradient, its
 * optimizer state, its ZeRO shard and 16-bit copies), every activation row
 * with its slot and lifetime under the recompute policy, and the work rows
 * of a step, declared to the planner (mf_plan_add) from the dims alone.
 * The estimate, the arena layout, the ledger and the report all read these
 * rows; the step code (blocks.c, driver.c) only looks them up.
 *
 * Phases of a micro-step (lifetimes in the plan are ranges of these):
 *   0            embedding forward
 *   1 .. L       layer l forward at 1+l
 *   L+1          head forward (final norm; logits, loss and the
 *                classifier's backward, a chunk of rows at a time)
 *   L+2          head backward
 *   L+3 .. 2L+2  layer l backward at 2L+2-l (top layer first)
 *   2L+3         embedding backward
 *   2L+4         optimizer
 * Forward-only plans (sampling, evaluation) have phases 0 .. L+1 and keep a
 * layer's activations only while that layer runs. */
#include "internal.h"
#include "memfit/distill.h"
#include "dist/dist.h"
#include "kernels/half.h"
#include "memfit/kernels.h"
#include "quant/quant.h"

#include <math.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

int mf_recompute_parse(const char *s, mf_recompute *out) {
    out->every = 0;
    if (strcmp(s, "none") == 0) out->policy = MF_RECOMPUTE_NONE;
    else if (strcmp(s, "selective") == 0) out->policy = MF_RECOMPUTE_SELECTIVE;
    else if (strcmp(s, "full") == 0) out->policy = MF_RECOMPUTE_EVERY, out->every = 1;
    else if (strcmp(s, "sqrt") == 0) out->policy = MF_RECOMPUTE_SQRT;
    else if (strcmp(s, "auto") == 0) out->policy = MF_RECOMPUTE_AUTO;
    else if (strncmp(s, "every:", 6) == 0) {
        char *end;
        long n = strtol(s + 6, &end, 10);
        if (s[6] == 0 || *end || n < 1 || n > 1 << 20)
            return mf_fail("recompute '%s': every:N needs a whole number N >= 1", s);
        out->policy = MF_RECOMPUTE_EVERY;
        out->every = (int)n;
    } else return mf_fail("recompute '%s' is not one of none, selective, full, every:N, sqrt, auto", s);
    return 0;
}

int mf_phase_emb_fwd(const mf_model *m) { (void)m; return 0; }
int mf_phase_layer_fwd(const mf_model *m, int l) { (void)m; return 1 + l; }
int mf_phase_head_fwd(const mf_model *m) { return m->d.L + 1; }
int mf_phase_head_bwd(const mf_model *m) { return m->d.L + 2; }
int mf_phase_layer_bwd(const mf_model *m, int l) { return 2 * m->d.L + 2 - l; }
int mf_phase_emb_bwd(const mf_model *m) { return 2 * m->d.L + 3; }
int mf_phase_optim(const mf_model *m) { return 2 * m->d.L + 4; }

int mf_model_n_phases(const mf_dims *d, mf_mode mode) {
    return mode == MF_MODE_TRAIN ? 2 * d->L + 5 : d->L + 2;
}

const char *mf_phase_name(const mf_model *m, int ph, char *buf, size_t n) {
    int L = m->d.L;
    if (ph == 0) snprintf(buf, n, "embed fwd");
    else if (ph <= L) snprintf(buf, n, "layer %d fwd", ph - 1);
    else if (ph == L + 1) snprintf(buf, n, "head fwd");
    else if (ph == L + 2) snprintf(buf, n, "head bwd");
    else if (ph <= 2 * L + 2) snprintf(buf, n, "layer %d bwd", 2 * L + 2 - ph);
    else if (ph == 2 * L + 3) snprintf(buf, n, "embed bwd");
    else snprintf(buf, n, "optimizer");
    return buf;
}

/* ---- plan ------------------------------------------------------------ */

typedef struct {
    mf_plan *plan;
    int err;
} adder;

static int add(adder *ad, const char *name, mf_cat cat, mf_dtype dt, int ndim,
               int64_t d0, int64_t d1, int64_t d2, int64_t d3, int first, int last, int layer) {
    if (ad->err) return -1;
    int64_t shape[4] = {d0, d1, d2, d3};
    int id = mf_plan_add(ad->plan, name, cat, dt, ndim, shape, first, last, layer);
    if (id < 0) ad->err = 1;
    return id;
}

/* Gradients that live only in the phases that build them: consumed by the
 * update as they complete (update_in_backward), or reduce-scattered into
 * this rank's shard (ZeRO 2). */
int mf_model_grads_transient(const mf_model *m) {
    return m->opt.in_backward || (m->opt.zero >= 2 && m->opt.world > 1);
}

/* The tied embedding's update split by rows (model.h, emb_split): exact
 * for optimizers whose update of a row reads only that row (AdamW, 8-bit
 * AdamW when its blocks are whole rows, SGD), not for Adafactor's row and
 * column statistics; one process, no ZeRO shard, no LoRA. */
int mf_model_emb_split(const mf_model *m) {
    if (m->mode != MF_MODE_TRAIN || !m->opt.in_backward || !m->d.tied || m->lora.r > 0) return 0;
    if (m->opt.kind == MF_OPTIM_ADAFACTOR || (m->opt.zero >= 1 && m->opt.world > 1)) return 0;
    mf_optim_shape s = {2, m->d.Vp, m->d.C, 1, m->cdt != MF_DTYPE_F32};
    return m->d.C % mf_optim_block(&m->opt, &s) == 0;
}

/* update_in_backward on a mixture of experts: each expert's gradient in a
 * row of one expert (model.h, mf_tensor.gx), its update applied as the
 * expert's backward ends. Exact for optimizers whose update of an element
 * reads only that element's state (AdamW, SGD; 8-bit AdamW when its
 * quantisation blocks tile one expert's F x C elements), not Adafactor
 * (its row and column statistics span the stack); one process, no LoRA,
 * fp32 gradient rows (grad_dtype bf16 is refused with 16-bit experts). */
int mf_model_expert_grads(const mf_model *m) {
    const mf_dims *d = &m->d;
    if (m->mode != MF_MODE_TRAIN || !m->opt.in_backward || d->n_experts < 2 || d->ep > 1 || m->lora.r > 0) return 0;
    if (m->opt.kind == MF_OPTIM_ADAFACTOR || m->opt.grad16 || (m->opt.zero >= 1 && m->opt.world > 1)) return 0;
    mf_optim_shape s = {2, (int64_t)d->n_experts * d->ffn, d->C, 0, m->cdt != MF_DTYPE_F32};
    return ((int64_t)d->ffn * d->C) % mf_optim_block(&m->opt, &s) == 0;
}

static void add_tensor_role(mf_model *m, adder *ad, const char *name, mf_role role, int layer, int ndim,
                            int64_t d0, int64_t d1, int64_t file_rows, int decay_2d) {
    mf_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 1;
    t->rows_file = file_rows;
    t->numel = d0 * (ndim > 1 ? d1 : 1);
    t->decay = decay_2d;
    /* LoRA: the adapters are trainable (category adapter), the base is
     * frozen; under 16-bit compute the adapters stay fp32 (their own master) */
    t->lora = strstr(name, ".lora_") != NULL;
    t->os = (mf_optim_shape){ndim, d0, ndim > 1 ? d1 : 1, role == MF_ROLE_EMB,
                             m->cdt != MF_DTYPE_F32 && ndim == 2 && role != MF_ROLE_POS && !t->lora &&
                                 !mf_tensor_keep32(name)};
    t->lo = 0;
    t->hi = t->numel;
    t->frozen = (m->lora.r > 0 || mf_model_quant_infer(m)) && !t->lora;
    /* --base_dtype: the frozen Conv1D weights (2-D, inside a block) are
     * stored quantised; embeddings, LayerNorms and biases stay fp32 */
    t->qkind = t->frozen && ndim == 2 && layer >= 0 ? m->lora.base : 0;
    /* the mixture of experts' router stays fp32 under a quantised base (it
     * is small); the experts are stored quantised and dequantised a layer
     * at a time into work.moe.dequant (moe_block.c) */
    if (strstr(name, ".block_sparse_moe.gate.") || strstr(name, ".mlp.gate.")) t->qkind = 0;
    /* Qwen2-MoE's shared-expert gate is one row (1,C): fp32 too */
    if (strstr(name, ".mlp.shared_expert_gate.")) t->qkind = 0;
    /* a Llama's frozen embedding and head under a quantised base: bf16
     * (a gather reads rows, so no block format; the "bf16
     * embeddings" for QLoRA). GPT-2 keeps them fp32. */
    if (t->frozen && mf_model_block_desc(&m->d)->bf16_frozen_embed && m->lora.base &&
        (role == MF_ROLE_EMB || role == MF_ROLE_HEAD))
        t->qkind = MF_QUANT_BF16;
    mf_cat pcat = t->lora ? MF_CAT_ADAPTER : MF_CAT_PARAMS, gcat = t->lora ? MF_CAT_ADAPTER : MF_CAT_GRADS;
    int shard = m->opt.zero >= 1 && m->opt.world > 1;
    if (shard) {
        /* ZeRO: the optimizer sees only this rank's slice of the elements */
        mf_dist_shard(t->numel, mf_zero_shards(&m->opt), m->opt.rank % mf_zero_shards(&m->opt), &t->lo, &t->hi);
        t->os = (mf_optim_shape){1, t->hi - t->lo, 1, 0, 0};
    }
    int last = m->n_phases - 1;
    char nm[96];
    t->g = t->gs = t->ps = t->pb = t->mw = -1;
    t->gx = 0, t->gnumel = 0;
    /* 16-bit precision: the GEMM weights (every matrix but wpe, which only
     * the embedding adds) get a 16-bit compute row, plus an fp32 master
     * row the optimizer updates; vectors stay fp32 (they are their own
     * master). LoRA: a frozen base matrix has its 16-bit row only (no
     * update, so no master); the adapters are fp32 (mf_tensor_is16), and so
     * is a mixture's router (mf_tensor_keep32) */
    int h16 = m->cdt != MF_DTYPE_F32 && ndim == 2 && role != MF_ROLE_POS && !t->lora && !mf_tensor_keep32(name);
    if (shard && m->opt.zero >= 3) {
        /* ZeRO 3: a rank keeps its shard; the whole tensor is gathered
         * into a row that lives only in the phases that read it. A block's
         * rows live one phase earlier when prefetching: the phase before
         * (the block below in forward, above in backward) starts the gather */
        int p0 = 0, p1 = 0, b0 = -1, b1 = -1;
        if (layer >= 0) {
            p1 = mf_phase_layer_fwd(m, layer), b1 = mf_phase_layer_bwd(m, layer);
            p0 = p1 - (m->prefetch ? 1 : 0), b0 = b1 - (m->prefetch ? 1 : 0);
        }
        else if (role == MF_ROLE_EMB) p1 = m->d.tied ? mf_phase_head_fwd(m) : 0;  /* embedding (and tied classifier) */
        else if (role == MF_ROLE_HEAD) p0 = p1 = mf_phase_head_fwd(m);  /* its backward runs with the loss */
        else if (role == MF_ROLE_NORMF)
            p0 = p1 = mf_phase_head_fwd(m), b0 = b1 = mf_phase_head_bwd(m);
        snprintf(nm, sizeof nm, "param_shard.%s", name);
        t->ps = add(ad, nm, MF_CAT_PARAMS, MF_DTYPE_F32, 1, t->hi - t->lo, 0, 0, 0, 0, last, layer);
        t->p = add(ad, name, MF_CAT_PARAMS, MF_DTYPE_F32, ndim, d0, d1, 0, 0, p0, p1, layer);
        if (b0 >= 0) {
            snprintf(nm, sizeof nm, "bwd.%s", name);
            t->pb = add(ad, nm, MF_CAT_PARAMS, MF_DTYPE_F32, ndim, d0, d1, 0, 0, b0, b1, layer);
        }
    } else if (t->qkind)
        t->p = add(ad, name, MF_CAT_PARAMS, MF_DTYPE_U8, 1, (int64_t)mf_quant_bytes(t->qkind, t->numel), 0, 0, 0, 0, last, layer);
    else {
        t->p = add(ad, name, pcat, h16 ? m->cdt : MF_DTYPE_F32, ndim, d0, d1, 0, 0, 0, last, layer);
        if (h16 && m->opt.master && !t->frozen) {
            snprintf(nm, sizeof nm, "master.%s", name);
            t->mw = add(ad, nm, MF_CAT_MASTER, MF_DTYPE_F32, ndim, d0, d1, 0, 0, 0, last, layer);
        }
    }
    for (int i = 0; i < MF_OPTIM_STATES; i++) t->st[i] = -1;
    if (m->mode == MF_MODE_TRAIN && !t->frozen) {
        /* with update_in_backward a gradient lives only from the phase
         * that starts it to the phase that completes it (then the update
         * consumes it): one layer's worth plus the tied embedding's */
        int g0 = 0, g1 = last;
        if (mf_model_grads_transient(m)) {
            if (layer >= 0) g0 = g1 = mf_phase_layer_bwd(m, layer);
            else if (role == MF_ROLE_EMB && mf_model_emb_split(m)) g0 = g1 = mf_phase_head_fwd(m);
            else if (role == MF_ROLE_EMB) g0 = m->d.tied ? mf_phase_head_fwd(m) : mf_phase_emb_bwd(m), g1 = mf_phase_emb_bwd(m);
            else if (role == MF_ROLE_POS) g0 = g1 = mf_phase_emb_bwd(m);
            else if (role == MF_ROLE_HEAD) g0 = g1 = mf_phase_head_fwd(m);  /* the untied head: with the loss */
            else g0 = g1 = mf_phase_head_bwd(m);  /* ln_f */
            /* ZeRO 2-3's overlap reads it in the next phase (the embedding's
             * is reduced at once: the optimizer or the next micro-batch follows) */
            if (m->overlap && role != MF_ROLE_EMB && role != MF_ROLE_POS) g1++;
        }
        snprintf(nm, sizeof nm, "grad.%s", name);
        /* grad_dtype bf16: the 16-bit weights' gradients (GEMM outputs
         * rounded once, docs/precision.md); vectors and wpe stay fp32 */
        t->g16 = m->opt.grad16 && h16 && !t->lora;
        /* update_in_backward on a mixture: an expert stack's gradient row
         * holds one expert (moe_block.c reuses it expert after expert) */
        t->gx = layer >= 0 && !t->lora && strstr(name, ".experts.") && mf_model_expert_grads(m);
        int64_t gd0 = t->gx ? d0 / m->d.n_experts : d0;
        t->gnumel = gd0 * (ndim > 1 ? d1 : 1);
        t->g = add(ad, nm, gcat, t->g16 ? MF_DTYPE_BF16 : MF_DTYPE_F32, ndim, gd0, d1, 0, 0, g0, g1, layer);
        if (shard && m->opt.zero >= 2) {
            snprintf(nm, sizeof nm, "grad_shard.%s", name);
            t->gs = add(ad, nm, MF_CAT_GRADS, MF_DTYPE_F32, 1, t->hi - t->lo, 0, 0, 0, 0, last, layer);
        }
        if (!ad->err && mf_optim_plan(&m->opt, ad->plan, name, &t->os, 0, last, layer, t->st))
            ad->err = 1;
        for (int i = 0; t->lora && !ad->err && i < MF_OPTIM_STATES; i++)
            if (t->st[i] >= 0) ad->plan->bufs[t->st[i]].cat = MF_CAT_ADAPTER;
    }
}

static void add_tensor(mf_model *m, adder *ad, const char *name, int layer, int ndim, int64_t d0, int64_t d1,
                       int64_t file_rows, int decay_2d) {
    add_tensor_role(m, ad, name, MF_ROLE_LAYER, layer, ndim, d0, d1, file_rows, decay_2d);
}

/* Lifetimes of rebuilt slot s: [fwd[0], fwd[1]] while forward writes it,
 * [bwd[0], bwd[1]] from the backward phase that rebuilds it to the last
 * backward that reads it. `in` = the slot holds a residual input (written
 * by the block below) rather than a block's own activation. */
static void slot_life(const mf_model *m, int s, int in, int fwd[2], int bwd[2]) {
    int L = m->d.L, seg = m->seg;
    if (seg) {
        int hi = s + (L - 1 - s) / seg * seg;            /* highest block using slot s */
        int top = hi / seg * seg + seg - 1 < L - 1 ? hi / seg * seg + seg - 1 : L - 1;
        fwd[0] = mf_phase_layer_fwd(m, in ? s - 1 : s);
        fwd[1] = mf_phase_layer_fwd(m, hi);
        bwd[0] = mf_phase_layer_bwd(m, top);             /* its segment is rebuilt here */
        bwd[1] = mf_phase_layer_bwd(m, s);
    } else {
        int hi = m->auto_k ? m->auto_k - 1 : L - 1;       /* auto, or selective */
        fwd[0] = mf_phase_layer_fwd(m, 0);
        fwd[1] = mf_phase_layer_fwd(m, hi);
        bwd[0] = mf_phase_layer_bwd(m, hi);
        bwd[1] = mf_phase_layer_bwd(m, 0);
    }
}

/* Every 16-bit GEMM shape the model makes on N rows with loss chunks of R
 * rows: the block matmuls' forward (and backward when training) and the
 * chunked head (sampling's head on 1 and on min(N, R) rows). fn gets
 * (M, N, K, tA, tB, accumulate, bias) and returns nonzero to stop. */
typedef int (*gemm_shape_fn)(void *ctx, int M, int N, int K, int tA, int tB, int acc, int bias);
int mf_model_head_dw_rows(int N, int R) {
    if (R >= N) return N;
    int64_t D = R >= MF_HEAD_DW_ROWS ? R : ((int64_t)MF_HEAD_DW_ROWS + R - 1) / R * R;
    return D < N ? (int)D : N;
}
/* D: the rows of one head weight-gradient GEMM (head_dw_rows) */
static int gemm_shapes(const mf_dims *d, int N, int R, int D, int train, gemm_shape_fn fn, void *ctx) {
    int C = d->C, Vp = d->Vp;
    const mf_block_desc *bd = mf_model_block_desc(d);
    /* the block's projections in the order it runs them (blocks.c): a
     * Conv1D (in, out) weight: y = x W, dW += x^T dy, dx = dy W^T; an
     * nn.Linear (out, in) one: y = x W^T, dW += dy^T x, dx (+)= dy W (k, v
     * and up add into the input gradient q and gate started). o and down
     * accumulate onto the residual. */
    static const int proj[7] = {MF_LT_Q, MF_LT_K, MF_LT_V, MF_LT_O, MF_LT_GATE, MF_LT_UP, MF_LT_DOWN};
    int io = bd->w_in_out;
    for (int k = 0; k < 7; k++) {
        int lt = proj[k], in, out;
        if (bd->lora[lt] < 0) continue;  /* not one of this family's projections */
        mf_model_lora_dims(d, bd->lora[lt], &in, &out);
        int qkv = lt == MF_LT_Q || lt == MF_LT_K || lt == MF_LT_V;
        int acc = lt == MF_LT_O || lt == MF_LT_DOWN, bias = bd->proj_bias || (d->qkv_bias && qkv);
        int dx_acc = !io && (lt == MF_LT_K || lt == MF_LT_V || lt == MF_LT_UP);
        if (fn(ctx, N, out, in, 0, !io, acc, bias)) return -1;
        if (train && ((io ? fn(ctx, in, out, N, 1, 0, 1, 0) : fn(ctx, out, in, N, 1, 0, 1, 0)) ||
                      fn(ctx, N, in, out, 0, io, dx_acc, 0)))
            return -1;
    }
    if (d->n_experts > 0) {
        /* the mixture of experts (kernels/moe.c): the router on N rows,
         * each expert's SwiGLU on at most G rows (its largest group) */
        int64_t G;
        int E = d->n_experts, F = d->ffn;
        if (mf_moe_buffer_sizes(NULL, NULL, &G, N, d->top_k, E, C, F, d->capacity_factor)) return -1;
        /* expert parallel: an expert's group gathers the whole expert group's tokens */
        if (d->ep > 1 && mf_moe_ep_bounds(d, N, NULL, NULL, &G, NULL)) return -1;
        if (fn(ctx, N, E, C, 0, 1, 0, 0) || (train && (fn(ctx, E, C, N, 1, 0, 1, 0) || fn(ctx, N, C, E, 0, 0, 1, 0))))
            return -1;
        /* g = the largest group (fp32), then every power of two below it:
         * the 16-bit experts run a group as power-of-two chunks */
        int sz[40], ns = 0, p2 = 1;
        while (p2 <= G / 2) p2 *= 2;
        for (sz[ns++] = (int)G; p2 >= 1; p2 /= 2) sz[ns++] = p2;
        for (int i = 0; i < ns; i++) {
            const int g = sz[i];
            if (fn(ctx, g, F, C, 0, 1, 0, 0) || fn(ctx, g, C, F, 0, 1, 0, 0)) return -1;
            if (train && (fn(ctx, g, F, C, 0, 0, 0, 0) || fn(ctx, C, F, g, 1, 0, 1, 0) || fn(ctx, F, C, g, 1, 0, 1, 0) ||
                          fn(ctx, g, C, F, 0, 0, 0, 0) || fn(ctx, g, C, F, 0, 0, 1, 0)))
                return -1;
        }
    }
    int rows[3] = {R, 1, N < R ? N : R};
    for (int k = 0; k < 3; k++)
        if (fn(ctx, rows[k], Vp, C, 0, 1, 0, 0)) return -1;
    if (!train) return 0;
    int rl[2] = {R, N % R}, dl[2] = {D, N % D};  /* the last chunk and dW group may be shorter */
    for (int k = 0; k < 2; k++) {
        if (rl[k] && (fn(ctx, rl[k], Vp, C, 0, 1, 0, 0) || fn(ctx, rl[k], C, Vp, 0, 0, 0, 0))) return -1;
        if (dl[k] && fn(ctx, Vp, C, dl[k], 1, 0, 1, 0)) return -1;
    }
    return 0;
}

/* grad_dtype bf16: the weight-gradient GEMMs (the only ones with tA:
 * dW += x^T dy, dwte += dlogits^T x) write bf16 rows */
typedef struct { mf_dtype dt; size_t mx; int grad16; } scratch_ctx;
static int scratch_max(void *ctx, int M, int N, int K, int tA, int tB, int acc, int bias) {
    scratch_ctx *c = ctx;
    if (c->grad16 && tA) {
        size_t s = mf_gemm_bf16_scratch_bytes(M, N, K, tA, tB, acc, 1, bias);
        if (s == SIZE_MAX) { c->mx = SIZE_MAX; return -1; }
        if (s > c->mx) c->mx = s;
    }
    size_t s;
    if (c->dt == MF_DTYPE_F32) {
        /* fp32: forward GEMMs run with beta 0 (fused kernels) or 1 (bias
         * put in first, or a residual accumulated) */
        s = mf_sgemm_scratch_bytes(tA, tB, M, N, K, acc || bias ? 1.0f : 0.0f);
        size_t s0 = bias && !acc && s != SIZE_MAX ? mf_sgemm_scratch_bytes(tA, tB, M, N, K, 0.0f) : 0;
        if (s0 == SIZE_MAX || s0 > s) s = s0;
    } else
        s = mf_gemm16_scratch_bytes(c->dt, M, N, K, tA, tB, acc, bias);
    if (s == SIZE_MAX) { c->mx = SIZE_MAX; return -1; }
    if (s > c->mx) c->mx = s;
    return 0;
}

/* Scratch bytes of the largest GEMM the model makes (fp32: through
 * mf_sgemm's matmul backend, 0 for the others); SIZE_MAX with mf_error set
 * if the library cannot run one. */
size_t mf_model_gemm_scratch_need(const mf_model *m, int N) {
    scratch_ctx c = {m->cdt, 0, m->mode == MF_MODE_TRAIN && m->opt.grad16};
    gemm_shapes(&m->d, N, m->chunk_rows, m->head_dw_rows, m->mode == MF_MODE_TRAIN, scratch_max, &c);
    return c.mx;
}

/* The warm-up's operands and scratch (the step's are arena rows) are
 * mapped and unmapped, not malloc'd: freed heap chunks stay resident
 * (M_TRIM_THRESHOLD, train.c) and were in the baseline the plan is checked
 * against, where a step's unplanned malloc of up to their size (~65 MiB
 * for gpt2-10m) reused them without moving the peak RSS. What the GEMM
 * library mallocs itself stays in the heap for the step, as intended. */
static void *warm_map(size_t n) {
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void warm_unmap(void *p, size_t n) { if (p) munmap(p, n ? n : 1); }

static int warm_one(void *ctx, int M, int N, int K, int tA, int tB, int acc, int bias) {
    const scratch_ctx *w = ctx;
    mf_dtype dt = w->dt;
    int c16 = w->grad16 && tA;  /* grad_dtype bf16: a weight gradient written in bf16 */
    size_t sb = c16 ? mf_gemm_bf16_scratch_bytes(M, N, K, tA, tB, acc, 1, bias)
                    : mf_gemm16_scratch_bytes(dt, M, N, K, tA, tB, acc, bias);
    if (sb == SIZE_MAX) return -1;
    size_t na = (size_t)M * K * 2, nb = (size_t)K * N * 2, ns = sb ? sb : 1, nc = (size_t)M * N * sizeof(float),
           nbi = (size_t)N * sizeof(float);
    void *a = warm_map(na), *b = warm_map(nb), *s = warm_map(ns);
    float *c = warm_map(nc), *bi = warm_map(nbi);
    if (a && b && s && c && bi) {
        if (c16) mf_gemm_bf16_sized(c, a, b, NULL, M, N, K, tA, tB, acc, 1, s, ns);
        else mf_gemm16(dt, c, a, b, bias ? bi : NULL, M, N, K, tA, tB, acc, s, ns);
    }
    warm_unmap(a, na); warm_unmap(b, nb); warm_unmap(s, ns); warm_unmap(c, nc); warm_unmap(bi, nbi);
    return 0;
}

int mf_model_gemm16_warmup(const mf_dims *d, mf_dtype dt, int B, int T, int loss_chunk, int train, int grad16) {
    if (dt == MF_DTYPE_F32) return 0;
    int64_t N = (int64_t)B * T, R = loss_chunk > 0 && loss_chunk < N ? loss_chunk : N;
    if (R < B) R = B;
    scratch_ctx w = {dt, 0, train && grad16};
    return gemm_shapes(d, (int)N, (int)R, mf_model_head_dw_rows((int)N, (int)R), train, warm_one, &w);
}

/* Scratch bytes of the largest quantised-base GEMM on N rows: the block's
 * projections in the description's layout, and a frozen bf16 head (a
 * chunk of rows at a time) where the description stores one. */
size_t mf_model_quant_scratch_need(const mf_model *m, int N) {
    const mf_dims *d = &m->d;
    const mf_block_desc *bd = mf_model_block_desc(d);
    size_t mx = 0, b;
    for (int lt = 0; lt < MF_LT_COUNT; lt++) {
        int in, out;
        if (bd->lora[lt] < 0) continue;
        mf_model_lora_dims(d, bd->lora[lt], &in, &out);
        b = bd->w_in_out ? mf_quant_matmul_scratch_bytes(m->lora.base, N, in, out)
                         : mf_quant_linear_scratch_bytes(m->lora.base, N, in, out);
        if (b > mx) mx = b;
    }
    if (bd->bf16_frozen_embed) {
        int R = N < m->chunk_rows ? N : m->chunk_rows;
        if ((b = mf_quant_linear_scratch_bytes(MF_QUANT_BF16, R, d->C, d->Vp)) > mx) mx = b;
    }
    return mx;
}

/* GPT-2's tensors under its HF names, Conv1D (in, out) layout: wte, wpe,
 * per block (mf_model.lt order) ln_1, c_attn (q|k|v in one matrix),
 * attn.c_proj, ln_2, c_fc, mlp.c_proj, each with its bias; ln_f. */
static void declare_gpt2_tensors(mf_model *m, adder *ad) {
    const mf_dims *d = &m->d;
    int64_t C = d->C;
    add_tensor_role(m, ad, "wte.weight", MF_ROLE_EMB, -1, 2, d->Vp, C, d->V, 1);
    m->t_pos = m->n_tensors;
    add_tensor_role(m, ad, "wpe.weight", MF_ROLE_POS, -1, 2, d->maxT, C, d->maxT, 1);
    m->t_layer0 = m->n_tensors, m->nlt = 12;
    /* the block's tensors in file order, by what they do (blocks.c) */
    static const int order[12] = {MF_LT_LN1, MF_LT_LN1B, MF_LT_Q, MF_LT_QB, MF_LT_O, MF_LT_OB,
                                                MF_LT_LN2, MF_LT_LN2B, MF_LT_GATE, MF_LT_GATEB, MF_LT_DOWN, MF_LT_DOWNB};
    for (int k = 0; k < MF_LT_COUNT; k++) m->lt[k] = -1;
    for (int k = 0; k < 12; k++) m->lt[order[k]] = k;
    for (int l = 0; l < mf_model_weight_sets(d); l++) {  /* shared: only the sets exist */
        char nm[48];
#define LT(suffix, nd, a0, a1, dec) \
        snprintf(nm, sizeof nm, "h.%d." suffix, l); add_tensor(m, ad, nm, l, nd, a0, a1, a0, dec)
        LT("ln_1.weight", 1, C, 0, 0);
        LT("ln_1.bias", 1, C, 0, 0);
        LT("attn.c_attn.weight", 2, C, 3 * C, 1);
        LT("attn.c_attn.bias", 1, 3 * C, 0, 0);
        LT("attn.c_proj.weight", 2, C, C, 1);
        LT("attn.c_proj.bias", 1, C, 0, 0);
        LT("ln_2.weight", 1, C, 0, 0);
        LT("ln_2.bias", 1, C, 0, 0);
        LT("mlp.c_fc.weight", 2, C, 4 * C, 1);
        LT("mlp.c_fc.bias", 1, 4 * C, 0, 0);
        LT("mlp.c_proj.weight", 2, 4 * C, C, 1);
        LT("mlp.c_proj.bias", 1, C, 0, 0);
#undef LT
    }
    m->t_normf = m->n_tensors, m->n_normf = 2;
    add_tensor_role(m, ad, "ln_f.weight", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
    add_tensor_role(m, ad, "ln_f.bias", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
}

/* The Llama family's tensors under Hugging Face's names, in nn.Linear
 * (out, in) layout: embed_tokens, per block (mf_model.lt order) the
 * attention norm, q/k/v (biases for Qwen2), o, the MLP norm, gate, up,
 * down; the final norm; lm_head when untied. */
static void declare_llama_tensors(mf_model *m, adder *ad) {
    const mf_dims *d = &m->d;
    int64_t C = d->C, AO = (int64_t)d->NH * d->hd, KV = (int64_t)d->NKV * d->hd, I = d->ffn;
    add_tensor_role(m, ad, "model.embed_tokens.weight", MF_ROLE_EMB, -1, 2, d->Vp, C, d->V, 1);
    m->t_layer0 = m->n_tensors;
    static const char *const nm_[MF_LT_COUNT] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
        "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
        "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    const int64_t rows[MF_LT_COUNT] = {C, AO, AO, KV, KV, KV, KV, C, C, I, I, C};
    const int64_t cols[MF_LT_COUNT] = {0, C, 0, C, 0, C, 0, AO, 0, C, C, I};
    int n = 0;
    for (int k = 0; k < MF_LT_COUNT; k++) {
        /* GPT-2's other biases (MF_LT_LN1B ..) a Llama does not have */
        int bias = k == MF_LT_QB || k == MF_LT_KB || k == MF_LT_VB;
        m->lt[k] = k > MF_LT_DOWN || (bias && !d->qkv_bias) ? -1 : n++;
    }
    int64_t E = d->n_experts;
    if (E > 0) {
        /* Mixtral: block_sparse_moe.gate (the router) and the experts'
         * w1/w3/w2 stacked expert after expert, one row each (hf.c maps
         * HF's experts.{e}.w1.weight to slices of them) */
        m->lt[MF_LT_GATE] = m->lt[MF_LT_UP] = m->lt[MF_LT_DOWN] = -1;
        n = 0;
        for (int k = 0; k <= MF_LT_LN2; k++)
            if (m->lt[k] >= 0) m->lt[k] = n++;
        for (int k = MF_LT_ROUTER; k <= MF_LT_W2; k++) m->lt[k] = n++;
        /* Qwen2-MoE: the shared expert's gate/up/down and its gate */
        if (d->shared_ffn > 0)
            for (int k = MF_LT_GATE; k <= MF_LT_DOWN; k++) m->lt[k] = n++;
        if (d->shared_ffn > 0) m->lt[MF_LT_SHGATE] = n++;
    }
    m->nlt = n;
    for (int l = 0; l < mf_model_weight_sets(d); l++) {  /* shared: only the sets exist */
        for (int k = 0; k < MF_LT_COUNT; k++) {
            if (m->lt[k] < 0 || k >= MF_LT_ROUTER) continue;
            if (E > 0 && k >= MF_LT_GATE && k <= MF_LT_DOWN) continue;  /* Qwen2-MoE's shared expert: below */
            char nm[96];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, nm_[k]);
            add_tensor(m, ad, nm, l, cols[k] ? 2 : 1, rows[k], cols[k], rows[k], cols[k] ? 1 : 0);
        }
        if (E <= 0) continue;
        char nm[96];
        /* Qwen2-MoE's names: mlp.gate, mlp.experts.{gate,up,down}_proj (stacked) */
        int q = d->shared_ffn > 0;
        const char *blk = q ? "mlp" : "block_sparse_moe", *wn[3] = {"w1", "w3", "w2"};
        if (q) wn[0] = "gate_proj", wn[1] = "up_proj", wn[2] = "down_proj";
        snprintf(nm, sizeof nm, "model.layers.%d.%s.gate.weight", l, blk);
        add_tensor(m, ad, nm, l, 2, E, C, E, 1);
        /* expert parallel: this rank's E / ep experts of each stack, the
         * elements [ep_lo, ep_lo + numel) of the whole one */
        int64_t P = d->ep > 1 ? d->ep : 1, El = E / P, g = m->opt.rank % P;
        snprintf(nm, sizeof nm, "model.layers.%d.%s.experts.%s.weight", l, blk, wn[0]);
        add_tensor(m, ad, nm, l, 2, El * I, C, El * I, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.%s.experts.%s.weight", l, blk, wn[1]);
        add_tensor(m, ad, nm, l, 2, El * I, C, El * I, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.%s.experts.%s.weight", l, blk, wn[2]);
        add_tensor(m, ad, nm, l, 2, El * C, I, El * C, 1);
        for (int k = 1; P > 1 && k <= 3; k++) {
            mf_tensor *t = &m->tensors[m->n_tensors - k];
            t->ep_full = t->numel * P, t->ep_lo = t->numel * g;
        }
        if (!q) continue;
        /* the shared expert (S = shared_expert_intermediate_size), replicated
         * like attention under expert parallelism, and its (1,C) gate */
        int64_t S = d->shared_ffn;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
        add_tensor(m, ad, nm, l, 2, S, C, S, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
        add_tensor(m, ad, nm, l, 2, S, C, S, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
        add_tensor(m, ad, nm, l, 2, C, S, C, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        add_tensor(m, ad, nm, l, 2, 1, C, 1, 1);
    }
    m->t_normf = m->n_tensors, m->n_normf = 1;
    add_tensor_role(m, ad, "model.norm.weight", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
    if (!d->tied) {
        m->t_head = m->n_tensors;
        add_tensor_role(m, ad, "lm_head.weight", MF_ROLE_HEAD, -1, 2, d->Vp, C, d->V, 1);
    }
}

/* Layer l's mixture-of-experts rows (mf_moe_buf's up to the backward
 * scratch, each its mf_moe_buffer_sizes bytes): the router's state (probs,
 * lse, topk_idx, topk_w, frac) is kept from the layer's forward (f) to its
 * backward (e) under every recompute policy, so a rebuilt block reuses the
 * routing decision; the permutation and the experts' activations are kept,
 * or, when the whole block is rebuilt, live in recompute slot s like the
 * block's other rows (fw, bw: the slot's lifetimes). */
static void moe_layer_rows(mf_model *m, adder *ad, int l, mf_layer_acts *A, mf_layer_acts *R, int whole, int s, int f,
                           int e, const int fw[2], const int bw[2], const size_t *bytes) {
    char nm[64];
    for (int b = 0; b < MF_MOE_BUF_DLOGITS; b++) {
        mf_dtype dt = b == MF_MOE_BUF_TOPK_IDX || b == MF_MOE_BUF_OFFSETS || b == MF_MOE_BUF_SLOT_ROW ? MF_DTYPE_I32
                                                                                                    : MF_DTYPE_F32;
        /* 16-bit precision: the experts' GEMM inputs (bytes already halved) */
        if (m->cdt != MF_DTYPE_F32 && (b == MF_MOE_BUF_XP || b == MF_MOE_BUF_HA)) dt = m->cdt;
        int64_t n = (int64_t)(bytes[b] / (dt == MF_DTYPE_F32 || dt == MF_DTYPE_I32 ? 4 : 2));
        const char *bn = mf_moe_buf_name((mf_moe_buf)b);
        if (whole && b > MF_MOE_BUF_FRAC) {
            if (l == s) {
                snprintf(nm, sizeof nm, "act.slot%d.fwd.%s", s, bn);
                A->moe[b] = add(ad, nm, MF_CAT_ACTS, dt, 1, n, 0, 0, 0, fw[0], fw[1], -1);
                snprintf(nm, sizeof nm, "act.slot%d.bwd.%s", s, bn);
                R->moe[b] = add(ad, nm, MF_CAT_ACTS, dt, 1, n, 0, 0, 0, bw[0], bw[1], -1);
            } else A->moe[b] = m->acts[s].moe[b], R->moe[b] = m->racts[s].moe[b];
        } else {
            snprintf(nm, sizeof nm, "act.h.%d.%s", l, bn);
            A->moe[b] = R->moe[b] = add(ad, nm, MF_CAT_ACTS, dt, 1, n, 0, 0, 0, f, e, l);
        }
    }
}

int mf_model_plan(mf_model *m, mf_plan *plan, const mf_dims *d, int B, int T,
                  mf_mode mode, int nthreads, int loss_chunk, mf_recompute recompute,
                  const mf_optim *opt) {
    return mf_model_plan_lora(m, plan, d, B, T, mode, nthreads, loss_chunk, recompute, opt, NULL);
}

int mf_model_plan_lora(mf_model *m, mf_plan *plan, const mf_dims *d, int B, int T,
                       mf_mode mode, int nthreads, int loss_chunk, mf_recompute recompute,
                       const mf_optim *opt, const mf_lora_cfg *lora) {
    memset(m, 0, sizeof *m);
    if (mode == MF_MODE_TRAIN && !opt) return mf_fail("a training plan needs an optimizer");
    if (opt) m->opt = *opt;
    /* a quantised model for inference (memfit quantize): the block
     * matrices are stored int8/nf4 as a QLoRA base is, without adapters */
    if (lora && lora->r == 0 && lora->base && mode == MF_MODE_INFER) m->lora.base = lora->base;
    if (lora && lora->r > 0) {
        m->lora = *lora;
        /* data parallel (and expert parallel) run zero 0 without the
         * backward overlap: the optimizer-phase all-reduce skips the frozen
         * base (zero.c); sharding the adapters' small state is not done */
        if (mode == MF_MODE_TRAIN && opt->world > 1 && opt->zero != 0)
            return mf_fail("lora with zero %d is not supported yet (the adapters' state is small: sharding it saves "
                           "little); use zero 0", opt->zero);
        if (mode == MF_MODE_TRAIN && opt->world > 1 && d->ep > 1 && d->n_experts > 0 && lora->base)
            return mf_fail("lora with base_dtype %s and expert_parallel %d is not supported yet (a rank's slice of a "
                           "quantised expert stack is not the whole stack's quantisation); use --base_dtype fp32",
                           mf_quant_name((mf_quant_kind)lora->base), d->ep);
        if (mode == MF_MODE_TRAIN && opt->in_backward)
            return mf_fail("lora: update_in_backward is not supported with LoRA (the adapters' state is small); drop it");
        if (mode == MF_MODE_TRAIN && opt->offload_path[0])
            return mf_fail("lora: optimizer offload is not supported with LoRA (the adapters' state is small); drop --offload");
        /* bf16 compute: the frozen base's GEMMs and the activations in
         * bf16 as full bf16 training runs them; the adapters, their
         * gradients and state fp32 (docs/lora.md, "16-bit compute") */
        if (mode == MF_MODE_TRAIN && opt->compute == MF_DTYPE_F16)
            return mf_fail("lora: --precision fp16 is not supported with LoRA yet (use --precision bf16, which needs no "
                           "loss scaling, or fp32)");
        if (mode == MF_MODE_TRAIN && opt->compute != MF_DTYPE_F32 && (!opt->master || opt->half_state || opt->grad16))
            return mf_fail("lora: --master_weights 0, --pure_bf16 and --grad_dtype bf16 do not apply to LoRA (the frozen "
                           "base has no master copy, gradient or state; the adapters keep fp32 weights, gradients and "
                           "state); drop them");
    }
    if (d->share && d->share < d->L) {
        /* cross-layer sharing: a set's gradient is complete only after its
         * last use in backward (its first block), so the paths that finish
         * a gradient per layer (update in backward, ZeRO 2/3's per-layer
         * rows) and LoRA's per-layer adapters are refused, not approximated */
        if (lora && lora->r > 0) return mf_fail("share_layers %d: LoRA on a shared model is not supported; drop one", d->share);
        if (d->n_experts > 0)
            return mf_fail("share_layers %d: a mixture-of-experts model cannot share layers yet (untested); drop one",
                           d->share);
        if (mode == MF_MODE_TRAIN && opt->in_backward)
            return mf_fail("share_layers %d: update_in_backward is not supported (a shared set's gradient is complete only "
                           "after its first block's backward); drop one", d->share);
        if (mode == MF_MODE_TRAIN && opt->zero >= 2 && opt->world > 1)
            return mf_fail("share_layers %d: zero %d is not supported (per-layer gradient and parameter rows); use zero 0 "
                           "or 1", d->share, opt->zero);
    }
    int llama = d->arch == MF_ARCH_LLAMA;
    /* the pieces the family's blocks compose (arch.c) */
    const mf_block_desc *bd = mf_model_block_desc(d);
    int ln_mean = bd->norm == MF_NORM_LAYERNORM;  /* LayerNorm keeps each row's mean; RMSNorm none */
    if (lora && lora->r > 0) {
        /* each family's own modules; without targets= PEFT's defaults
         * (GPT-2: c_attn; Llama: q_proj, v_proj) */
        int moe = bd->mlp == MF_MLP_MOE;
        unsigned own = moe ? MF_LORA_ATTN_TARGETS | MF_LORA_MOE_TARGETS
                           : llama ? MF_LORA_LLAMA_TARGETS : MF_LORA_GPT2_TARGETS;
        if (moe && d->shared_ffn > 0) {
            /* Qwen2-MoE: the shared expert's gate_proj, up_proj, down_proj
             * (the dense hooks); the routed experts take none yet (w1/w2/w3
             * are Mixtral's names, PEFT's here would be experts.{e}.gate_proj) */
            own = MF_LORA_LLAMA_TARGETS;
            if (lora->targets & MF_LORA_MOE_TARGETS)
                return mf_fail("lora: targets w1, w2, w3 (Mixtral's expert names) are not modules of a Qwen2-MoE model; "
                               "its shared expert takes gate_proj, up_proj, down_proj (routed experts: none yet)");
        }
        if (!m->lora.targets_given && llama) m->lora.targets = 1u << MF_LORA_Q_PROJ | 1u << MF_LORA_V_PROJ;
        if (m->lora.targets & ~own) {
            char tg[160];
            return mf_fail("lora: targets %s are not modules of a %s model (its targets: %s)",
                           mf_lora_targets_str(&m->lora, tg, sizeof tg),
                           moe ? "mixture-of-experts" : llama ? "Llama-family" : "GPT-2",
                           moe && d->shared_ffn > 0 ? "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
                           : moe ? "q_proj, k_proj, v_proj, o_proj, w1, w2, w3"
                               : llama ? "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
                                       : "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj");
        }
    }
    m->lora_u = m->lora_du = m->lora_xf = m->lora_xb = m->qscr_f = m->qscr_b = -1;
    m->comm = -1;
    m->rope = -1;
    m->pf_first = -1;
    const char *pf = getenv("MEMFIT_ZERO_PREFETCH");
    m->prefetch = !(pf && strcmp(pf, "0") == 0);
    const char *ov = getenv("MEMFIT_ZERO_OVERLAP");
    m->overlap = m->opt.world > 1 && !m->opt.in_backward && !(ov && strcmp(ov, "0") == 0);
    /* expert parallel: the experts' gradients are summed over their
     * replicas only, in the optimizer phase (zero.c), not in the overlap's
     * all-reduce over the world */
    if (mode == MF_MODE_TRAIN && d->ep > 1) m->overlap = 0;
    /* LoRA: the adapters' gradients, a few MiB, are all-reduced in the
     * optimizer phase (the overlap's per-block hooks walk the frozen base) */
    if (mode == MF_MODE_TRAIN && m->lora.r > 0) m->overlap = 0;
    m->cdt = mode == MF_MODE_TRAIN ? m->opt.compute : MF_DTYPE_F32;  /* forward-only plans are fp32 */
    m->in16 = m->dout16 = m->dlogits16 = m->gemm_scratch = m->upd32 = -1;
    m->emb_rows = m->emb_index = m->emb_map = -1;
    if (m->cdt != MF_DTYPE_F32 && m->opt.zero >= 1 && m->opt.world > 1)
        return mf_fail("precision %s with zero %d: ZeRO sharding of 16-bit weights is not supported yet (use zero 0 "
                       "or precision fp32)", m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16", m->opt.zero);
    /* grad_dtype bf16 over the ranks: ZeRO 0 (the refusal above covers 1-3),
     * each row summed in fp32 through comm.bucket (dist/grad16.c) */
    if (mode == MF_MODE_TRAIN && m->opt.grad16 && d->share && d->share < d->L)
        return mf_fail("grad_dtype bf16 with share_layers %d is not supported (a shared set's gradient would be "
                       "rounded once per block); use grad_dtype fp32", d->share);
    if (d->shared_ffn > 0 && m->cdt != MF_DTYPE_F32)  /* moe_shared.c's gate reads fp32 rows */
        return mf_fail("precision %s: Qwen2-MoE's shared expert is fp32 only (use --precision fp32)",
                       m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16");
    /* 16-bit experts (moe_block.c): the router stays fp32; expert parallel,
     * bf16 gradient rows and adapters run with fp32 experts only */
    if (d->n_experts > 0 && m->cdt != MF_DTYPE_F32 && d->ep > 1 && m->opt.world > 1)
        return mf_fail("precision %s with expert_parallel %d: the exchanged experts are fp32 only (use --precision "
                       "fp32)", m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16", d->ep);
    if (d->n_experts > 0 && mode == MF_MODE_TRAIN && m->opt.grad16)
        return mf_fail("grad_dtype bf16 with a mixture of experts is not supported yet (use grad_dtype fp32)");
    if (d->n_experts > 0 && m->cdt != MF_DTYPE_F32 && m->lora.r > 0)
        return mf_fail("lora with precision %s on a mixture of experts is not supported yet (use --precision fp32)",
                       m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16");
    if (B < 1 || T < 1) return mf_fail("batch and seq must be >= 1 (got %d, %d)", B, T);
    if (T > d->maxT) return mf_fail("seq %d exceeds the model's block_size %d", T, d->maxT);
    m->d = *d;
    /* expert parallel is a training run's over MPI ranks (estimate: --world_size) */
    if (mode != MF_MODE_TRAIN || m->opt.world <= 1 || m->d.ep < 1) m->d.ep = 1;
    m->B = B;
    m->T = T;
    m->mode = mode;
    m->nthreads = nthreads;
    m->recompute = recompute;
    /* checkpointed segments of `seg` blocks: only each segment's input is
     * kept; "full" is segments of one block, "sqrt" of ceil(sqrt(L)) blocks
     * (Chen et al. 2016, section 3) */
    int seg = 0;
    if (mode == MF_MODE_TRAIN && recompute.policy == MF_RECOMPUTE_EVERY) seg = recompute.every < d->L ? recompute.every : d->L;
    if (mode == MF_MODE_TRAIN && recompute.policy == MF_RECOMPUTE_SQRT) seg = (int)ceil(sqrt((double)d->L) - 1e-9);
    m->seg = seg;
    m->auto_k = mode == MF_MODE_TRAIN && recompute.policy == MF_RECOMPUTE_AUTO ? recompute.every : 0;
    if (m->auto_k > d->L) m->auto_k = d->L;
    /* rows of logits that exist at once; at least one per sequence so a
     * sampling forward can hold each sequence's last position */
    int64_t R = loss_chunk > 0 && loss_chunk < B * T ? loss_chunk : (int64_t)B * T;
    m->chunk_rows = (int)(R < B ? B : R);
    m->head_dw_rows = m->chunk_rows;  /* 16-bit training with a trainable head: more (below) */
    m->n_phases = mf_model_n_phases(d, mode);
    if (plan->n_phases != m->n_phases) return mf_fail("plan has %d phases, model needs %d", plan->n_phases, m->n_phases);
    int L = d->L;
    int64_t C = d->C, N = (int64_t)B * T, NH = d->NH;
    /* widths: q|k|v rows, attention output, MLP hidden */
    int64_t QKV = (int64_t)(d->NH + 2 * d->NKV) * d->hd, AO = (int64_t)d->NH * d->hd, I = d->ffn;
    /* the dense MLP rows' width (a mixture's: its shared expert's, Qwen2-MoE) */
    int64_t MI = bd->mlp == MF_MLP_MOE ? d->shared_ffn : I;
    int nlora = m->lora.r > 0 ? 2 * L * mf_lora_n_targets(&m->lora) : 0;
    m->tensors = calloc((size_t)(2 + L * MF_LAYER_TENSORS + 3 + nlora), sizeof *m->tensors);
    m->res = calloc(2 * ((size_t)L + 1), sizeof *m->res);
    m->rres = m->res ? m->res + L + 1 : NULL;
    m->acts = calloc(2 * (size_t)L, sizeof *m->acts);
    m->racts = m->acts ? m->acts + L : NULL;
    if (!m->tensors || !m->res || !m->acts) { mf_model_free(m); return mf_fail("out of memory for the model table"); }
    adder ad = {plan, 0};
    int train = mode == MF_MODE_TRAIN, last = m->n_phases - 1;

    /* weights (and in training their gradients and AdamW moments) */
    m->t_emb = 0;
    m->t_pos = m->t_head = -1;
    if (llama) declare_llama_tensors(m, &ad);
    else declare_gpt2_tensors(m, &ad);
    /* LoRA adapters, as PEFT stores them: lora_A (r, in), lora_B (out, r) */
    m->lora_first = m->n_tensors;
    for (int l = 0; l < L && nlora; l++)
        for (int k = 0; k < MF_LORA_TARGETS; k++) {
            if (!(m->lora.targets >> k & 1)) continue;
            int in, out, r = m->lora.r;
            char nm[96];
            const char *pre = llama ? "model.layers" : "h";
            mf_model_lora_dims(d, k, &in, &out);
            /* an expert target's adapters stack the E experts' (expert
             * after expert, as the base stacks are): A (E*r, in), B (E*out, r) */
            int64_t ne = MF_LORA_MOE_TARGETS >> k & 1 ? d->n_experts : 1;
            /* expert parallel: the rank's E/N experts' adapters (as its base
             * stacks), the elements [ep_lo, ep_lo + numel) of the whole */
            int64_t P = ne > 1 && m->d.ep > 1 ? m->d.ep : 1;
            ne /= P;
            /* Qwen2-MoE: gate/up/down_proj are the shared expert's (PEFT: mlp.shared_expert.gate_proj) */
            char path[64];
            snprintf(path, sizeof path, "%s", mf_lora_target_path(k));
            if (d->shared_ffn > 0 && MF_LORA_LLAMA_TARGETS >> k & 1 && !(MF_LORA_ATTN_TARGETS >> k & 1))
                snprintf(path, sizeof path, "mlp.shared_expert.%s", mf_lora_target_path(k) + 4);
            snprintf(nm, sizeof nm, "%s.%d.%s.lora_A.weight", pre, l, path);
            add_tensor(m, &ad, nm, l, 2, ne * r, in, ne * r, 1);
            snprintf(nm, sizeof nm, "%s.%d.%s.lora_B.weight", pre, l, path);
            add_tensor(m, &ad, nm, l, 2, ne * out, r, ne * out, 1);
            for (int j = 1; P > 1 && j <= 2; j++) {
                mf_tensor *t = &m->tensors[m->n_tensors - j];
                t->ep_full = t->numel * P, t->ep_lo = t->numel * (m->opt.rank % P);
            }
        }

    /* loader buffers */
    m->inputs = add(&ad, "data.inputs", MF_CAT_DATA, MF_DTYPE_I32, 2, B, T, 0, 0, 0, last, -1);
    m->targets = add(&ad, "data.targets", MF_CAT_DATA, MF_DTYPE_I32, 2, B, T, 0, 0, 0, last, -1);
    m->pos = -1;  /* packing's positions row: added by the plan builder (build.c) when packing is on */

    /* Activations. A row backward needs is either kept (one per layer,
     * alive from the layer's forward to its backward) or rebuilt: forward
     * writes it to a slot alive over the forward phases only, and backward
     * rebuilds it into a second slot alive over the backward phases only,
     * so neither exists while the head runs. Slots are shared by index:
     * every recomputed block under `full`/`auto`/`selective` uses slot 0,
     * block l of a checkpointed segment uses slot l % seg. res/acts are
     * what the forward pass uses, rres/racts what backward uses (the same
     * rows for kept activations). */
    char nm[64];
    int fw[2], bw[2];
    for (int j = 0; j <= L; j++) {
        if (seg && j % seg && j != L) {
            /* inside a segment: refilled by the segment's recomputation */
            int s = j % seg;
            if (j < seg) {
                slot_life(m, s, 1, fw, bw);
                snprintf(nm, sizeof nm, "act.slot%d.fwd.in", s);
                m->res[j] = add(&ad, nm, MF_CAT_ACTS, MF_DTYPE_F32, 2, N, C, 0, 0, fw[0], fw[1], -1);
                snprintf(nm, sizeof nm, "act.slot%d.bwd.in", s);
                m->rres[j] = add(&ad, nm, MF_CAT_ACTS, MF_DTYPE_F32, 2, N, C, 0, 0, bw[0], bw[1], -1);
            } else m->res[j] = m->res[s], m->rres[j] = m->rres[s];
            continue;
        }
        int first = j == 0 ? 0 : mf_phase_layer_fwd(m, j - 1);
        /* res[j] feeds layer j (its LayerNorm input) or the head when j == L */
        int lastp = train ? (j < L ? mf_phase_layer_bwd(m, j) : mf_phase_head_bwd(m))
                          : (j < L ? mf_phase_layer_fwd(m, j) : mf_phase_head_fwd(m));
        snprintf(nm, sizeof nm, j == 0 ? "act.embed" : "act.h.%d.out", j - 1);
        m->res[j] = m->rres[j] = add(&ad, nm, MF_CAT_ACTS, MF_DTYPE_F32, 2, N, C, 0, 0, first, lastp, j - 1);
    }
    /* "full"/every:N/sqrt/auto rebuild whole blocks; "selective" rebuilds
     * the cheap element-wise outputs (LayerNorm outputs, GELU output) and
     * keeps the matmul outputs. A GELU output rebuilt right before its own
     * layer's backward needs no row at all: it lives in work.dmlp, whose
     * first use in backward (c_proj's weight gradient) reads it before the
     * input gradient overwrites it. Only non-top blocks of a segment keep
     * theirs in a slot until their backward. */
    int sel = train && m->recompute.policy == MF_RECOMPUTE_SELECTIVE;
    /* mixture of experts: each buffer's worst case (mf_moe_buffer_sizes)
     * for N tokens and the run's capacity factor */
    size_t moe_bytes[MF_MOE_BUF_COUNT];
    for (int b = 0; b < MF_MOE_BUF_COUNT; b++) m->moe_work[b] = -1;
    m->moe_deq_f = m->moe_deq_b = m->moe_lora_u = m->moe_lora_du = m->moe_x32 = -1;
    m->moe_capacity = 0, m->moe_rows = 0;
    if (bd->mlp == MF_MLP_MOE && !(m->moe_tokens = calloc((size_t)L * d->n_experts, sizeof *m->moe_tokens))) {
        mf_model_free(m);
        return mf_fail("out of memory for the experts' token counts");
    }
    if (bd->mlp == MF_MLP_MOE &&
        (mf_moe_buffer_sizes(moe_bytes, &m->moe_rows, NULL, (int)N, d->top_k, d->n_experts, (int)C, (int)I,
                             d->capacity_factor) ||
         mf_moe_capacity((int)N, d->top_k, d->n_experts, d->capacity_factor, &m->moe_capacity))) {
        mf_model_free(m);
        return -1;
    }
    /* 16-bit experts: the GEMM inputs xp and ha are kept in 16 bits, as a
     * dense block's ln2 and h are (moe_block.c) */
    if (bd->mlp == MF_MLP_MOE && m->cdt != MF_DTYPE_F32)
        moe_bytes[MF_MOE_BUF_XP] /= 2, moe_bytes[MF_MOE_BUF_HA] /= 2;
    int ep = bd->mlp == MF_MLP_MOE && m->d.ep > 1;
    m->moe_ep_send = m->moe_ep_recv = 0;
    for (int b = 0; b < 5; b++) m->moe_ep_work[b] = -1;
    if (ep) {
        /* expert parallel (moe_ep.c): this rank sends at most moe_ep_send
         * permuted rows (xp, yp, dyp) and its experts receive at most
         * moe_ep_recv (their h1, h3, ha, dh1, dh3 and the exchange rows);
         * the capacity is the expert group's */
        if (mf_moe_ep_bounds(&m->d, (int)N, &m->moe_ep_send, &m->moe_ep_recv, NULL, &m->moe_capacity)) {
            mf_model_free(m);
            return -1;
        }
        m->moe_rows = m->moe_ep_recv;
        const size_t SC = (size_t)m->moe_ep_send * C * 4, RF = (size_t)m->moe_ep_recv * I * 4;
        moe_bytes[MF_MOE_BUF_XP] = moe_bytes[MF_MOE_BUF_YP] = moe_bytes[MF_MOE_BUF_DYP] = SC;
        moe_bytes[MF_MOE_BUF_H1] = moe_bytes[MF_MOE_BUF_H3] = moe_bytes[MF_MOE_BUF_HA] = RF;
        moe_bytes[MF_MOE_BUF_DH1] = moe_bytes[MF_MOE_BUF_DH3] = RF;
    }
    for (int l = 0; l < L; l++) {
        int f = mf_phase_layer_fwd(m, l), e = train ? mf_phase_layer_bwd(m, l) : f;
        int whole = l < m->auto_k || seg, s = seg ? l % seg : 0;
        int in_dmlp = !seg || s == seg - 1;
        if (whole || sel) slot_life(m, s, 0, fw, bw);
        mf_layer_acts *A = &m->acts[l], *R = &m->racts[l];
        /* forward slots are used within the layer's forward only, so a
         * row whose value is dead by then takes over its bytes: attention's
         * output and ln_2 reuse ln_1's row, GELU runs in place on fch */
        /* (an alias is taken only when the dtypes match) */
#define ACT(field, cheap, fwd_alias, dt_, nd, a0, a1, a2, a3) \
        if (whole || (sel && (cheap))) { \
            if (l == s) { \
                A->field = fwd_alias; \
                if (A->field >= 0 && plan->bufs[A->field].dtype != (dt_)) A->field = -1; \
                if (A->field < 0) { \
                    snprintf(nm, sizeof nm, "act.slot%d.fwd." #field, s); \
                    A->field = add(&ad, nm, MF_CAT_ACTS, dt_, nd, a0, a1, a2, a3, fw[0], fw[1], -1); \
                } \
                R->field = -1; \
                if (!(in_dmlp && strcmp(#field, "fch_gelu") == 0)) { \
                    snprintf(nm, sizeof nm, "act.slot%d.bwd." #field, s); \
                    R->field = add(&ad, nm, MF_CAT_ACTS, dt_, nd, a0, a1, a2, a3, bw[0], bw[1], -1); \
                } \
            } else A->field = m->acts[s].field, R->field = m->racts[s].field; \
        } else { \
            snprintf(nm, sizeof nm, "act.h.%d." #field, l); \
            A->field = R->field = add(&ad, nm, MF_CAT_ACTS, dt_, nd, a0, a1, a2, a3, f, e, l); \
        }
        /* 16-bit precision: the outputs GEMMs read (ln_1, ln_2, GELU) are
         * kept in 16 bits; the attention output stays fp32 (the attention
         * backward reads it) and is rounded into in16 for its GEMM */
        const mf_dtype F = MF_DTYPE_F32, H = m->cdt;
        /* (Llama: RMSNorm keeps no mean; fch is the gate projection,
         * up the up projection, fch_gelu silu(gate) * up, in place on the
         * gate's row when the whole block is rebuilt) */
        A->ln1_mean = R->ln1_mean = A->ln2_mean = R->ln2_mean = A->up = R->up = -1;
        ACT(ln1, 1, -1, H, 2, N, C, 0, 0);
        if (ln_mean) { ACT(ln1_mean, 0, -1, F, 1, N, 0, 0, 0); }
        ACT(ln1_rstd, 0, -1, F, 1, N, 0, 0, 0);
        ACT(qkv, 0, -1, F, 2, N, QKV, 0, 0);
        ACT(lse, 0, -1, F, 3, B, NH, T, 0);
        ACT(atty, 0, A->ln1 >= 0 && plan->bufs[A->ln1].bytes >= (size_t)(N * AO * 4) ? A->ln1 : -1, F, 2, N, AO, 0, 0);
        ACT(xmid, 0, -1, F, 2, N, C, 0, 0);
        ACT(ln2, 1, A->ln1, H, 2, N, C, 0, 0);
        if (ln_mean) { ACT(ln2_mean, 0, -1, F, 1, N, 0, 0, 0); }
        ACT(ln2_rstd, 0, -1, F, 1, N, 0, 0, 0);
        for (int b = 0; b < MF_MOE_BUF_COUNT; b++) A->moe[b] = R->moe[b] = -1;
        for (int b = 0; b < 4; b++) A->moe_ep[b] = R->moe_ep[b] = -1;
        A->sh_y = R->sh_y = A->sh_s = R->sh_s = -1;
        if (bd->mlp == MF_MLP_MOE) {
            A->fch = R->fch = A->fch_gelu = R->fch_gelu = -1;
            moe_layer_rows(m, &ad, l, A, R, whole, s, f, e, fw, bw, moe_bytes);
            for (int b = 0; b < 4; b++) A->moe_ep[b] = R->moe_ep[b] = -1;
            if (ep) {
                /* kept from the layer's forward to its backward (block
                 * rebuilds are refused with expert parallel) */
                int64_t Rr = m->moe_ep_recv > 0 ? m->moe_ep_recv : 1;
                static const char *const epn[4] = {"counts", "owner_row", "owner_offsets", "owner_xp"};
                const int64_t epl[4] = {(int64_t)m->d.ep * d->n_experts, Rr, d->n_experts / m->d.ep + 1, Rr * C};
                for (int b = 0; b < 4; b++) {
                    snprintf(nm, sizeof nm, "act.h.%d.moe.ep.%s", l, epn[b]);
                    A->moe_ep[b] = R->moe_ep[b] = add(&ad, nm, MF_CAT_ACTS, b < 3 ? MF_DTYPE_I32 : MF_DTYPE_F32, 1,
                                                      epl[b], 0, 0, 0, f, e, l);
                }
            }
            if (!d->shared_ffn) continue;
            /* Qwen2-MoE's shared expert: a SwiGLU of width shared_ffn on the
             * dense rows below, its output and its gate (moe_shared.c) */
            ACT(sh_y, 0, -1, F, 2, N, C, 0, 0);
            ACT(sh_s, 0, -1, F, 1, N, 0, 0, 0);
        }
        ACT(fch, 0, -1, F, 2, N, MI, 0, 0);
        if (bd->mlp != MF_MLP_GELU) { ACT(up, 0, -1, F, 2, N, MI, 0, 0); }
        ACT(fch_gelu, 1, whole ? A->fch : -1, H, 2, N, MI, 0, 0);
#undef ACT
    }
    int hf = mf_phase_head_fwd(m), hb = train ? mf_phase_head_bwd(m) : hf;
    m->lnf = add(&ad, "act.ln_f", MF_CAT_ACTS, m->cdt, 2, N, C, 0, 0, hf, hb, -1);
    m->lnf_mean = !ln_mean ? -1 : add(&ad, "act.ln_f_mean", MF_CAT_ACTS, MF_DTYPE_F32, 1, N, 0, 0, 0, hf, hb, -1);
    m->lnf_rstd = add(&ad, "act.ln_f_rstd", MF_CAT_ACTS, MF_DTYPE_F32, 1, N, 0, 0, 0, hf, hb, -1);
    /* the classifier and its loss run a chunk of rows at a time, backward
     * included, so at most chunk_rows x Vp logits exist, only in this phase */
    m->logits = add(&ad, "work.logits", MF_CAT_WORK, MF_DTYPE_F32, 2, m->chunk_rows, d->Vp, 0, 0, hf, hf, -1);
    m->losses = add(&ad, "work.losses", MF_CAT_WORK, MF_DTYPE_F32, 1, N, 0, 0, 0, hf, hf, -1);

    /* offloaded optimizer state streams through two windows that exist
     * only in the optimizer phase, so they reuse activation bytes */
    m->offload_win[0] = m->offload_win[1] = -1;
    if (train && m->opt.offload_path[0])
        for (int i = 0; i < 2; i++) {
            snprintf(nm, sizeof nm, "offload.window%d", i);
            m->offload_win[i] = add(&ad, nm, MF_CAT_OFFLOAD, MF_DTYPE_U8, 1, (int64_t)m->opt.offload_window, 0, 0, 0,
                                    mf_phase_optim(m), mf_phase_optim(m), -1);
        }
    m->dres = m->dln = m->dbig = m->dqkv = m->attn_scratch = -1;
    if (train) {
        /* one layer's worth of activation gradients, reused down the stack */
        int h0 = mf_phase_head_bwd(m), l0 = mf_phase_layer_bwd(m, L - 1), l1 = mf_phase_layer_bwd(m, 0);
        m->dres = add(&ad, "work.dresidual", MF_CAT_WORK, MF_DTYPE_F32, 2, N, C, 0, 0, h0, mf_phase_emb_bwd(m), -1);
        m->dln = add(&ad, "work.dln", MF_CAT_WORK, MF_DTYPE_F32, 2, N, AO > C ? AO : C, 0, 0, hf, l1, -1);
        if (bd->mlp == MF_MLP_MOE)  /* the experts' backward scratch instead of the dense MLP's */
            for (int b = MF_MOE_BUF_DLOGITS; b < MF_MOE_BUF_COUNT; b++) {
                snprintf(nm, sizeof nm, "work.%s", mf_moe_buf_name((mf_moe_buf)b));
                m->moe_work[b] = add(&ad, nm, MF_CAT_WORK, MF_DTYPE_F32, 1, (int64_t)(moe_bytes[b] / 4), 0, 0, 0, l0,
                                     l1, -1);
            }
        if (bd->mlp != MF_MLP_MOE || MI > 0)  /* a dense MLP, or Qwen2-MoE's shared expert */
            m->dbig = add(&ad, "work.dmlp", MF_CAT_WORK, MF_DTYPE_F32, 2, N, MI, 0, 0, l0, l1, -1);
        if (ep) {
            /* the exchange's rows (moe_ep.c): received rows and the owner's
             * outputs or input gradients in arrival order, the grouped
             * output gradient, the owner's unit routing weights and its
             * discarded weight gradients; every layer's forward and backward */
            int64_t Rr = m->moe_ep_recv > 0 ? m->moe_ep_recv : 1;
            static const char *const epw[5] = {"recv", "back", "dye", "ones", "dtopk_w"};
            const int64_t n[5] = {Rr * C, Rr * C, Rr * C, Rr, Rr};
            for (int b = 0; b < 5; b++) {
                snprintf(nm, sizeof nm, "work.moe.ep.%s", epw[b]);
                int b0 = b == 2 || b == 4 ? l0 : mf_phase_layer_fwd(m, 0);
                m->moe_ep_work[b] = add(&ad, nm, MF_CAT_WORK, MF_DTYPE_F32, 1, n[b], 0, 0, 0, b0, l1, -1);
            }
        }
        m->dqkv = add(&ad, "work.dqkv", MF_CAT_WORK, MF_DTYPE_F32, 2, N, QKV, 0, 0, l0, l1, -1);
        /* sized for the model's longest sequence, not T, so a batch of
         * longer sequences (fewer rows) fits the plan: the trainer's
         * run-time split (mf_model_fits); nthreads x (block_size - T) floats */
        m->attn_scratch = add(&ad, "work.attn_bwd", MF_CAT_WORK, MF_DTYPE_F32, 1,
                              (int64_t)mf_flash_attention_scratch_floats(d->maxT, d->hd, nthreads), 0, 0, 0, l0, l1, -1);
    }
    m->emb_split = !ad.err && mf_model_emb_split(m) && !m->tensors[m->t_emb].frozen;
    if (m->emb_split) {
        /* the tied embedding's touched rows, from the head to the embedding's backward */
        int eb = mf_phase_emb_bwd(m);
        m->emb_rows = add(&ad, "grad.wte.rows", MF_CAT_GRADS, MF_DTYPE_F32, 2, N, C, 0, 0, hf, eb, -1);
        m->emb_index = add(&ad, "work.emb_index", MF_CAT_WORK, MF_DTYPE_I32, 1, 2 * N, 0, 0, 0, hf, eb, -1);
        m->emb_map = add(&ad, "work.emb_map", MF_CAT_WORK, MF_DTYPE_I32, 1, d->Vp, 0, 0, 0, hf, hf, -1);
    }
    m->emb_fold = !ad.err && train && !m->emb_split && m->opt.grad16 && m->tensors[m->t_emb].g16;
    if (m->emb_fold) {
        /* grad_dtype bf16: the embedding backward sums each distinct
         * token's positions here in fp32, then adds each slot into the
         * bf16 gradient once (blocks.c) */
        int eb = mf_phase_emb_bwd(m);
        m->emb_rows = add(&ad, "work.emb_rows", MF_CAT_WORK, MF_DTYPE_F32, 2, N, C, 0, 0, eb, eb, -1);
        m->emb_index = add(&ad, "work.emb_index", MF_CAT_WORK, MF_DTYPE_I32, 1, 2 * N, 0, 0, 0, eb, eb, -1);
        m->emb_map = add(&ad, "work.emb_map", MF_CAT_WORK, MF_DTYPE_I32, 1, d->Vp, 0, 0, 0, eb, eb, -1);
    }
    if (bd->rope) {
        /* rotary cos/sin for the positions a forward can have (the run-time
         * guard allows fewer, longer sequences up to B x T tokens); kept
         * for the whole run, so it is computed again only when a forward's
         * sequence length differs from the last one's */
        int64_t tmax = N < d->maxT ? N : d->maxT;
        m->rope_T = (int)tmax;
        m->rope = add(&ad, "work.rope", MF_CAT_WORK, MF_DTYPE_F32, 2, tmax, d->hd, 0, 0, 0, last, -1);
    }
    if (nlora) {
        /* LoRA scratch: the low-rank product (rebuilt in backward, so no
         * activation rows), and dropout(x) in forward and in backward phases */
        int f0 = mf_phase_layer_fwd(m, 0), f1 = mf_phase_layer_fwd(m, L - 1);
        int b0 = train ? mf_phase_layer_bwd(m, L - 1) : f0, b1 = train ? mf_phase_layer_bwd(m, 0) : f1;
        int64_t win = 0;
        for (int k = 0; k < MF_LORA_TARGETS; k++) {
            int in, out;
            mf_model_lora_dims(d, k, &in, &out);
            if (m->lora.targets >> k & 1 && in > win) win = in;
        }
        if (m->lora.targets & ~MF_LORA_MOE_TARGETS) {  /* the block's own projections */
            m->lora_u = add(&ad, "work.lora_u", MF_CAT_WORK, MF_DTYPE_F32, 2, N, m->lora.r, 0, 0, f0, b1, -1);
            if (train) m->lora_du = add(&ad, "work.lora_du", MF_CAT_WORK, MF_DTYPE_F32, 2, N, m->lora.r, 0, 0, b0, b1, -1);
        }
        if (m->lora.targets & MF_LORA_MOE_TARGETS) {
            /* the experts' adapters: the low-rank product of every permuted
             * row (each expert's group its slice, so experts running at once
             * do not share rows); rebuilt in backward, so no activation rows */
            m->moe_lora_u = add(&ad, "work.moe.lora_u", MF_CAT_WORK, MF_DTYPE_F32, 2, m->moe_rows, m->lora.r, 0, 0, f0,
                                b1, -1);
            if (train)
                m->moe_lora_du = add(&ad, "work.moe.lora_du", MF_CAT_WORK, MF_DTYPE_F32, 2, m->moe_rows, m->lora.r, 0, 0,
                                     b0, b1, -1);
        }
        /* 16-bit compute (training plans only): a projection's 16-bit
         * input is widened (exactly) into these rows for the adapter's
         * fp32 GEMMs (dropout then applies in place) and, with a
         * quantised base, for the base's fp32 tile GEMMs too: then every
         * projection of the block reads it, targeted or not */
        int x32 = m->cdt != MF_DTYPE_F32;
        if (x32 && m->lora.base) {
            const mf_block_desc *bdl = mf_model_block_desc(d);
            for (int lt = 0; lt < MF_LT_COUNT; lt++) {
                int in, out;
                if (bdl->lora[lt] < 0) continue;
                mf_model_lora_dims(d, bdl->lora[lt], &in, &out);
                if (in > win) win = in;
            }
        }
        if (train && (m->lora.dropout > 0 || x32)) {
            /* adapters on the experts drop each permuted row's input
             * (moe_lora.c): R rows, each expert's group its slice */
            int64_t dn = m->lora.targets & MF_LORA_MOE_TARGETS && m->moe_rows > N ? m->moe_rows : N;
            m->lora_xf = add(&ad, x32 ? "work.lora_x32.fwd" : "work.lora_drop.fwd", MF_CAT_WORK, MF_DTYPE_F32, 2, dn, win,
                             0, 0, f0, f1, -1);
            m->lora_xb = add(&ad, x32 ? "work.lora_x32.bwd" : "work.lora_drop.bwd", MF_CAT_WORK, MF_DTYPE_F32, 2, dn, win,
                             0, 0, b0, b1, -1);
        }
        if (m->lora.base) {
            /* quantised base: the tile of dequantised rows the GEMMs use
             * (a Llama's bf16 head too, so it lives into the head phase) */
            int64_t qs = (int64_t)mf_model_quant_scratch_need(m, (int)N);
            m->qscr_bytes = (size_t)qs;
            m->qscr_f = add(&ad, "work.quant_gemm.fwd", MF_CAT_WORK, MF_DTYPE_U8, 1, qs, 0, 0, 0, f0,
                            bd->bf16_frozen_embed ? mf_phase_head_fwd(m) : f1, -1);
            if (train) m->qscr_b = add(&ad, "work.quant_gemm.bwd", MF_CAT_WORK, MF_DTYPE_U8, 1, qs, 0, 0, 0, b0, b1, -1);
        }
    }
    if (!nlora && mf_model_quant_infer(m)) {
        /* a quantised model's inference: the dequantised tile the GEMMs use
         * (a Llama's bf16 head too, so it lives into the head phase) */
        int64_t qs = (int64_t)mf_model_quant_scratch_need(m, (int)N);
        m->qscr_bytes = (size_t)qs;
        m->qscr_f = add(&ad, "work.quant_gemm.fwd", MF_CAT_WORK, MF_DTYPE_U8, 1, qs, 0, 0, 0, mf_phase_layer_fwd(m, 0),
                        bd->bf16_frozen_embed ? mf_phase_head_fwd(m) : mf_phase_layer_fwd(m, L - 1), -1);
    }
    if (bd->mlp == MF_MLP_MOE && m->cdt != MF_DTYPE_F32)
        /* 16-bit experts: the fp32 router reads ln2 (16-bit, as a dense
         * block's) widened into this row, in a layer's forward and again in
         * its backward */
        m->moe_x32 = add(&ad, "work.moe.x32", MF_CAT_WORK, MF_DTYPE_F32, 2, N, C, 0, 0, mf_phase_layer_fwd(m, 0),
                         train ? mf_phase_layer_bwd(m, 0) : mf_phase_layer_fwd(m, L - 1), -1);
    if (bd->mlp == MF_MLP_MOE && m->lora.base && m->lora.r > 0) {
        /* quantised experts: one expert's three matrices dequantised to
         * fp32 at a time for the kernels (mf_moe_expert_ops.weights; the
         * experts then run one after another), a row for forward phases and
         * one for backward */
        int64_t n = 3 * I * C;
        int f0 = mf_phase_layer_fwd(m, 0), f1 = mf_phase_layer_fwd(m, L - 1);
        m->moe_deq_f = add(&ad, "work.moe.dequant.fwd", MF_CAT_WORK, MF_DTYPE_F32, 1, n, 0, 0, 0, f0, f1, -1);
        if (train)
            m->moe_deq_b = add(&ad, "work.moe.dequant.bwd", MF_CAT_WORK, MF_DTYPE_F32, 1, n, 0, 0, 0,
                               mf_phase_layer_bwd(m, L - 1), mf_phase_layer_bwd(m, 0), -1);
    }
    if (m->cdt != MF_DTYPE_F32 && !ad.err) {
        /* 16-bit: rounded GEMM operands that are not kept */
        int g0 = mf_phase_layer_fwd(m, 0), g1 = train ? mf_phase_layer_bwd(m, 0) : hf;
        /* the attention output rounded for the output projection; every
         * GEMM's output gradient rounded (the widest: GPT-2's 4C, a
         * Llama's MLP width or its query heads) */
        int64_t dw16 = I > AO ? I : AO;
        if (dw16 < C) dw16 = C;
        /* the experts round dh1 and dh3 of one expert's group (<= N rows)
         * side by side (mf_moe_experts_backward16) */
        if (bd->mlp == MF_MLP_MOE && 2 * I > dw16) dw16 = 2 * I;
        m->in16 = add(&ad, "work.gemm_in16", MF_CAT_WORK, m->cdt, 2, N, AO > C ? AO : C, 0, 0, g0, g1, -1);
        if (train) {
            m->dout16 = add(&ad, "work.gemm_dout16", MF_CAT_WORK, m->cdt, 2, N, dw16, 0, 0,
                            mf_phase_layer_bwd(m, L - 1), g1, -1);
            /* a trainable head's weight gradient sums head_dw_rows rows at a time */
            int HW = m->t_head >= 0 ? m->t_head : m->t_emb;
            if (!m->tensors[HW].frozen) m->head_dw_rows = mf_model_head_dw_rows((int)N, m->chunk_rows);
            m->dlogits16 = add(&ad, "work.dlogits16", MF_CAT_WORK, m->cdt, 2, m->head_dw_rows, d->Vp, 0, 0, hf, hf, -1);
        }
        if (train && (!m->opt.master || m->opt.grad16)) {
            /* master_weights 0: each 16-bit tensor is widened here a slice
             * at a time (mf_optim_slice: 2^18 elements, adafactor whole
             * tensors), updated, and rounded back stochastically; under
             * update_in_backward the updates run from the head to the
             * embedding's backward. pure_bf16: the slice's m and v are
             * widened beside it; grad_dtype bf16: its gradient too (the
             * last slot; with master weights the only one) */
            int64_t sl = 0;
            int base = (!m->opt.master) + (m->opt.grad16 ? 1 : 0), slots = base;
            for (int i = 0; i < m->n_tensors; i++) {
                const mf_tensor *x = &m->tensors[i];
                int k = base + (mf_optim_half(&m->opt, &x->os) ? 2 : 0);
                if (mf_tensor_is16(m, x) && !x->frozen && mf_optim_slice(&m->opt, &x->os) > sl) sl = mf_optim_slice(&m->opt, &x->os);
                if (k > slots && mf_tensor_is16(m, x) && !x->frozen) slots = k;
            }
            if (sl < 1) sl = 1;
            m->upd_slice = sl;
            int po = mf_phase_optim(m), p0 = m->opt.in_backward ? hf : po;
            m->upd32 = add(&ad, "work.update_f32", MF_CAT_WORK, MF_DTYPE_F32, 1, sl * slots, 0, 0, 0, p0, po, -1);
        }
    }
    if (!ad.err) {
        /* the GEMM library's scratch for the largest call (fp32: none
         * unless the backend is oneDNN's matmul; 16-bit: docs/precision.md) */
        int g0 = mf_phase_layer_fwd(m, 0), g1 = train ? mf_phase_layer_bwd(m, 0) : hf;
        size_t gs = mf_model_gemm_scratch_need(m, (int)N);
        if (gs == SIZE_MAX) { mf_model_free(m); return -1; }
        m->gemm_scratch_bytes = gs;
        if (gs || m->cdt != MF_DTYPE_F32)
            m->gemm_scratch = add(&ad, "work.gemm_scratch", MF_CAT_WORK, MF_DTYPE_U8, 1, (int64_t)(gs ? gs : 1), 0, 0,
                                  0, g0, g1, -1);
    }
    if (ad.err) { mf_model_free(m); return -1; }
    return 0;
}

void mf_model_free(mf_model *m) {
    mf_teacher_free(m->teacher);  /* distillation's teacher (teacher.c), if any */
    free(m->tensors);
    free(m->res);   /* rres and racts share these allocations */
    free(m->acts);
    free(m->moe_tokens);
    memset(m, 0, sizeof *m);
}

