/* GPT-2: presets, the plan rows, initialisation, forward and backward.
 *
 * Phases of a micro-step (lifetimes in the plan are ranges of these):
 *   0            embedding forward
 *   1 .. L       layer l forward at 1+l
 *   L+1          head forward (ln_f; logits, loss and the classifier's
 *                backward, a chunk of rows at a time)
 *   L+2          head backward
 *   L+3 .. 2L+2  layer l backward at 2L+2-l (top layer first)
 *   2L+3         embedding backward
 *   2L+4         optimizer
 * Forward-only plans (sampling, evaluation) have phases 0 .. L+1 and keep a
 * layer's activations only while that layer runs. */
#include "internal.h"
#include "memfit/dist.h"
#include "memfit/half.h"
#include "memfit/kernels.h"
#include "memfit/quant.h"

#include <math.h>
#include <omp.h>
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
static int grads_transient(const mf_model *m) {
    return m->opt.in_backward || (m->opt.zero >= 2 && m->opt.world > 1);
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
    t->os = (mf_optim_shape){ndim, d0, ndim > 1 ? d1 : 1, role == MF_ROLE_EMB};
    t->lo = 0;
    t->hi = t->numel;
    /* LoRA: the adapters are trainable (category adapter), the base is frozen */
    t->lora = strstr(name, ".lora_") != NULL;
    t->frozen = m->lora.r > 0 && !t->lora;
    /* --base_dtype: the frozen Conv1D weights (2-D, inside a block) are
     * stored quantised; embeddings, LayerNorms and biases stay fp32 */
    t->qkind = t->frozen && ndim == 2 && layer >= 0 ? m->lora.base : 0;
    /* a Llama's frozen embedding and head under a quantised base: bf16
     * (a gather reads rows, so no block format; the "bf16
     * embeddings" for QLoRA). GPT-2 keeps them fp32. */
    if (t->frozen && m->d.arch == MF_ARCH_LLAMA && m->lora.base && (role == MF_ROLE_EMB || role == MF_ROLE_HEAD))
        t->qkind = MF_QUANT_BF16;
    mf_cat pcat = t->lora ? MF_CAT_ADAPTER : MF_CAT_PARAMS, gcat = t->lora ? MF_CAT_ADAPTER : MF_CAT_GRADS;
    int shard = m->opt.zero >= 1 && m->opt.world > 1;
    if (shard) {
        /* ZeRO: the optimizer sees only this rank's slice of the elements */
        mf_dist_shard(t->numel, m->opt.world, m->opt.rank, &t->lo, &t->hi);
        t->os = (mf_optim_shape){1, t->hi - t->lo, 1, 0};
    }
    int last = m->n_phases - 1;
    char nm[96];
    t->g = t->gs = t->ps = t->pb = t->mw = -1;
    /* 16-bit precision: the GEMM weights (every matrix but wpe, which only
     * the embedding adds) get a 16-bit compute row, plus an fp32 master
     * row the optimizer updates; vectors stay fp32 (they are their own
     * master) */
    int h16 = m->cdt != MF_DTYPE_F32 && ndim == 2 && role != MF_ROLE_POS;
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
        if (h16 && m->opt.master) {
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
        if (grads_transient(m)) {
            if (layer >= 0) g0 = g1 = mf_phase_layer_bwd(m, layer);
            else if (role == MF_ROLE_EMB) g0 = m->d.tied ? mf_phase_head_fwd(m) : mf_phase_emb_bwd(m), g1 = mf_phase_emb_bwd(m);
            else if (role == MF_ROLE_POS) g0 = g1 = mf_phase_emb_bwd(m);
            else if (role == MF_ROLE_HEAD) g0 = g1 = mf_phase_head_fwd(m);  /* the untied head: with the loss */
            else g0 = g1 = mf_phase_head_bwd(m);  /* ln_f */
            /* ZeRO 2's overlap reads it in the next phase (the embedding's
             * is reduced at once: the optimizer or the next micro-batch follows) */
            if (m->overlap && role != MF_ROLE_EMB && role != MF_ROLE_POS) g1++;
        }
        snprintf(nm, sizeof nm, "grad.%s", name);
        t->g = add(ad, nm, gcat, MF_DTYPE_F32, ndim, d0, d1, 0, 0, g0, g1, layer);
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
static int gemm_shapes(const mf_dims *d, int N, int R, int train, gemm_shape_fn fn, void *ctx) {
    int C = d->C, Vp = d->Vp;
    if (d->arch == MF_ARCH_LLAMA) {
        /* nn.Linear (out, in): y = x W^T, dx (+)= dy W, dW += dy^T x; k, v
         * and up add into the input gradient q, gate started */
        int AO = d->NH * d->hd, KV = d->NKV * d->hd;
        const int io[7][3] = {{C, AO, 0}, {C, KV, 1}, {C, KV, 1}, {AO, C, 0}, {C, d->ffn, 0}, {C, d->ffn, 1}, {d->ffn, C, 0}};
        for (int k = 0; k < 7; k++) {
            int ci = io[k][0], oc = io[k][1];
            if (fn(ctx, N, oc, ci, 0, 1, k == 3 || k == 6, d->qkv_bias && k < 3)) return -1;
            if (train && (fn(ctx, oc, ci, N, 1, 0, 1, 0) || fn(ctx, N, ci, oc, 0, 0, io[k][2], 0))) return -1;
        }
    } else {
    /* (in, out) of the four block matmuls; accumulate for the residual ones */
    const int io[4][3] = {{C, 3 * C, 0}, {C, C, 1}, {C, 4 * C, 0}, {4 * C, C, 1}};
    for (int k = 0; k < 4; k++) {
        int ci = io[k][0], oc = io[k][1];
        if (fn(ctx, N, oc, ci, 0, 0, io[k][2], 1)) return -1;
        if (train && (fn(ctx, ci, oc, N, 1, 0, 1, 0) || fn(ctx, N, ci, oc, 0, 1, 0, 0))) return -1;
    }
    }
    int rows[3] = {R, 1, N < R ? N : R};
    for (int k = 0; k < 3; k++)
        if (fn(ctx, rows[k], Vp, C, 0, 1, 0, 0)) return -1;
    if (!train) return 0;
    int rl[2] = {R, N % R};  /* the last chunk may be shorter */
    for (int k = 0; k < 2; k++) {
        if (!rl[k]) continue;
        if (fn(ctx, rl[k], Vp, C, 0, 1, 0, 0) || fn(ctx, rl[k], C, Vp, 0, 0, 0, 0) || fn(ctx, Vp, C, rl[k], 1, 0, 1, 0))
            return -1;
    }
    return 0;
}

typedef struct { mf_dtype dt; size_t mx; } scratch_ctx;
static int scratch_max(void *ctx, int M, int N, int K, int tA, int tB, int acc, int bias) {
    scratch_ctx *c = ctx;
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
static size_t gemm_scratch_need(const mf_model *m, int N) {
    scratch_ctx c = {m->cdt, 0};
    gemm_shapes(&m->d, N, m->chunk_rows, m->mode == MF_MODE_TRAIN, scratch_max, &c);
    return c.mx;
}

static int warm_one(void *ctx, int M, int N, int K, int tA, int tB, int acc, int bias) {
    mf_dtype dt = *(const mf_dtype *)ctx;
    size_t sb = mf_gemm16_scratch_bytes(dt, M, N, K, tA, tB, acc, bias);
    if (sb == SIZE_MAX) return -1;
    void *a = calloc((size_t)M * K, 2), *b = calloc((size_t)K * N, 2), *s = calloc(sb ? sb : 1, 1);
    float *c = calloc((size_t)M * N, sizeof(float)), *bi = calloc((size_t)N, sizeof(float));
    if (a && b && s && c && bi) mf_gemm16(dt, c, a, b, bias ? bi : NULL, M, N, K, tA, tB, acc, s, sb ? sb : 1);
    free(a); free(b); free(s); free(c); free(bi);
    return 0;
}

int mf_model_gemm16_warmup(const mf_dims *d, mf_dtype dt, int B, int T, int loss_chunk, int train) {
    if (dt == MF_DTYPE_F32) return 0;
    int64_t N = (int64_t)B * T, R = loss_chunk > 0 && loss_chunk < N ? loss_chunk : N;
    if (R < B) R = B;
    return gemm_shapes(d, (int)N, (int)R, train, warm_one, &dt);
}

/* Scratch bytes of the largest quantised-base GEMM on N rows: GPT-2's four
 * Conv1D matmuls; a Llama's seven projections and its bf16 head (a chunk
 * of rows at a time). */
static size_t quant_scratch_need(const mf_model *m, int N) {
    const mf_dims *d = &m->d;
    size_t mx = 0, b;
    if (d->arch == MF_ARCH_LLAMA) {
        for (int k = MF_LORA_Q_PROJ; k <= MF_LORA_DOWN_PROJ; k++) {
            int in, out;
            mf_model_lora_dims(d, k, &in, &out);
            if ((b = mf_quant_linear_scratch_bytes(m->lora.base, N, in, out)) > mx) mx = b;
        }
        int R = N < m->chunk_rows ? N : m->chunk_rows;
        if ((b = mf_quant_linear_scratch_bytes(MF_QUANT_BF16, R, d->C, d->Vp)) > mx) mx = b;
        return mx;
    }
    static const int kin[4] = {1, 1, 1, 4}, kout[4] = {3, 1, 4, 1};
    for (int k = 0; k < 4; k++)
        if ((b = mf_quant_matmul_scratch_bytes(m->lora.base, N, kin[k] * d->C, kout[k] * d->C)) > mx) mx = b;
    return mx;
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
        int bias = k == MF_LT_QB || k == MF_LT_KB || k == MF_LT_VB;
        m->lt[k] = bias && !d->qkv_bias ? -1 : n++;
    }
    m->nlt = n;
    for (int l = 0; l < d->L; l++)
        for (int k = 0; k < MF_LT_COUNT; k++) {
            if (m->lt[k] < 0) continue;
            char nm[96];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, nm_[k]);
            add_tensor(m, ad, nm, l, cols[k] ? 2 : 1, rows[k], cols[k], rows[k], cols[k] ? 1 : 0);
        }
    m->t_normf = m->n_tensors, m->n_normf = 1;
    add_tensor_role(m, ad, "model.norm.weight", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
    if (!d->tied) {
        m->t_head = m->n_tensors;
        add_tensor_role(m, ad, "lm_head.weight", MF_ROLE_HEAD, -1, 2, d->Vp, C, d->V, 1);
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
    if (lora && lora->r > 0) {
        m->lora = *lora;
        /* combinations that iterate gradients LoRA's frozen base does not have */
        if (mode == MF_MODE_TRAIN && opt->world > 1)
            return mf_fail("lora: data parallel (mpirun, zero %d) is not supported with LoRA yet; train in one process", opt->zero);
        if (mode == MF_MODE_TRAIN && opt->in_backward)
            return mf_fail("lora: update_in_backward is not supported with LoRA (the adapters' state is small); drop it");
        if (mode == MF_MODE_TRAIN && opt->offload_path[0])
            return mf_fail("lora: optimizer offload is not supported with LoRA (the adapters' state is small); drop --offload");
        if (mode == MF_MODE_TRAIN && opt->compute != MF_DTYPE_F32)
            return mf_fail("lora: --precision %s is not supported with LoRA yet (use fp32 compute; --base_dtype stores the "
                           "frozen base in bf16, int8 or nf4)", opt->compute == MF_DTYPE_BF16 ? "bf16" : "fp16");
    }
    int llama = d->arch == MF_ARCH_LLAMA;
    if (lora && lora->r > 0) {
        /* each family's own modules; without targets= PEFT's defaults
         * (GPT-2: c_attn; Llama: q_proj, v_proj) */
        unsigned own = llama ? MF_LORA_LLAMA_TARGETS : MF_LORA_GPT2_TARGETS;
        if (!m->lora.targets_given && llama) m->lora.targets = 1u << MF_LORA_Q_PROJ | 1u << MF_LORA_V_PROJ;
        if (m->lora.targets & ~own) {
            char tg[160];
            return mf_fail("lora: targets %s are not modules of a %s model (its targets: %s)",
                           mf_lora_targets_str(&m->lora, tg, sizeof tg), llama ? "Llama-family" : "GPT-2",
                           llama ? "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
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
    m->overlap = m->opt.zero == 2 && m->opt.world > 1 && !m->opt.in_backward && !(ov && strcmp(ov, "0") == 0);
    m->cdt = mode == MF_MODE_TRAIN ? m->opt.compute : MF_DTYPE_F32;  /* forward-only plans are fp32 */
    m->in16 = m->dout16 = m->dlogits16 = m->gemm_scratch = m->upd32 = -1;
    if (m->cdt != MF_DTYPE_F32 && m->opt.zero >= 1 && m->opt.world > 1)
        return mf_fail("precision %s with zero %d: ZeRO sharding of 16-bit weights is not supported yet (use zero 0 "
                       "or precision fp32)", m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16", m->opt.zero);
    if (B < 1 || T < 1) return mf_fail("batch and seq must be >= 1 (got %d, %d)", B, T);
    if (T > d->maxT) return mf_fail("seq %d exceeds the model's block_size %d", T, d->maxT);
    m->d = *d;
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
    m->n_phases = mf_model_n_phases(d, mode);
    if (plan->n_phases != m->n_phases) return mf_fail("plan has %d phases, model needs %d", plan->n_phases, m->n_phases);
    int L = d->L;
    int64_t C = d->C, N = (int64_t)B * T, NH = d->NH;
    /* widths: q|k|v rows, attention output, MLP hidden */
    int64_t QKV = (int64_t)(d->NH + 2 * d->NKV) * d->hd, AO = (int64_t)d->NH * d->hd, I = d->ffn;
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
    else {
    add_tensor_role(m, &ad, "wte.weight", MF_ROLE_EMB, -1, 2, d->Vp, C, d->V, 1);
    m->t_pos = m->n_tensors;
    add_tensor_role(m, &ad, "wpe.weight", MF_ROLE_POS, -1, 2, d->maxT, C, d->maxT, 1);
    m->t_layer0 = m->n_tensors, m->nlt = MF_LAYER_TENSORS;
    for (int l = 0; l < L; l++) {
        char nm[48];
#define LT(suffix, nd, a0, a1, dec) \
        snprintf(nm, sizeof nm, "h.%d." suffix, l); add_tensor(m, &ad, nm, l, nd, a0, a1, a0, dec)
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
    add_tensor_role(m, &ad, "ln_f.weight", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
    add_tensor_role(m, &ad, "ln_f.bias", MF_ROLE_NORMF, -1, 1, C, 0, C, 0);
    }
    /* LoRA adapters, as PEFT stores them: lora_A (r, in), lora_B (out, r) */
    m->lora_first = m->n_tensors;
    for (int l = 0; l < L && nlora; l++)
        for (int k = 0; k < MF_LORA_TARGETS; k++) {
            if (!(m->lora.targets >> k & 1)) continue;
            int in, out, r = m->lora.r;
            char nm[96];
            const char *pre = llama ? "model.layers" : "h";
            mf_model_lora_dims(d, k, &in, &out);
            snprintf(nm, sizeof nm, "%s.%d.%s.lora_A.weight", pre, l, mf_lora_target_path(k));
            add_tensor(m, &ad, nm, l, 2, r, in, r, 1);
            snprintf(nm, sizeof nm, "%s.%d.%s.lora_B.weight", pre, l, mf_lora_target_path(k));
            add_tensor(m, &ad, nm, l, 2, out, r, out, 1);
        }

    /* loader buffers */
    m->inputs = add(&ad, "data.inputs", MF_CAT_DATA, MF_DTYPE_I32, 2, B, T, 0, 0, 0, last, -1);
    m->targets = add(&ad, "data.targets", MF_CAT_DATA, MF_DTYPE_I32, 2, B, T, 0, 0, 0, last, -1);

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
        if (!llama) { ACT(ln1_mean, 0, -1, F, 1, N, 0, 0, 0); }
        ACT(ln1_rstd, 0, -1, F, 1, N, 0, 0, 0);
        ACT(qkv, 0, -1, F, 2, N, QKV, 0, 0);
        ACT(lse, 0, -1, F, 3, B, NH, T, 0);
        ACT(atty, 0, A->ln1 >= 0 && plan->bufs[A->ln1].bytes >= (size_t)(N * AO * 4) ? A->ln1 : -1, F, 2, N, AO, 0, 0);
        ACT(xmid, 0, -1, F, 2, N, C, 0, 0);
        ACT(ln2, 1, A->ln1, H, 2, N, C, 0, 0);
        if (!llama) { ACT(ln2_mean, 0, -1, F, 1, N, 0, 0, 0); }
        ACT(ln2_rstd, 0, -1, F, 1, N, 0, 0, 0);
        ACT(fch, 0, -1, F, 2, N, I, 0, 0);
        if (llama) { ACT(up, 0, -1, F, 2, N, I, 0, 0); }
        ACT(fch_gelu, 1, whole ? A->fch : -1, H, 2, N, I, 0, 0);
#undef ACT
    }
    int hf = mf_phase_head_fwd(m), hb = train ? mf_phase_head_bwd(m) : hf;
    m->lnf = add(&ad, "act.ln_f", MF_CAT_ACTS, m->cdt, 2, N, C, 0, 0, hf, hb, -1);
    m->lnf_mean = llama ? -1 : add(&ad, "act.ln_f_mean", MF_CAT_ACTS, MF_DTYPE_F32, 1, N, 0, 0, 0, hf, hb, -1);
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
        m->dbig = add(&ad, "work.dmlp", MF_CAT_WORK, MF_DTYPE_F32, 2, N, I, 0, 0, l0, l1, -1);
        m->dqkv = add(&ad, "work.dqkv", MF_CAT_WORK, MF_DTYPE_F32, 2, N, QKV, 0, 0, l0, l1, -1);
        /* sized for the model's longest sequence, not T, so a batch of
         * longer sequences (fewer rows) fits the plan: the trainer's
         * run-time split (mf_model_fits); nthreads x (block_size - T) floats */
        m->attn_scratch = add(&ad, "work.attn_bwd", MF_CAT_WORK, MF_DTYPE_F32, 1,
                              (int64_t)mf_flash_attention_scratch_floats(d->maxT, d->hd, nthreads), 0, 0, 0, l0, l1, -1);
    }
    if (llama) {
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
        m->lora_u = add(&ad, "work.lora_u", MF_CAT_WORK, MF_DTYPE_F32, 2, N, m->lora.r, 0, 0, f0, b1, -1);
        if (train) m->lora_du = add(&ad, "work.lora_du", MF_CAT_WORK, MF_DTYPE_F32, 2, N, m->lora.r, 0, 0, b0, b1, -1);
        if (train && m->lora.dropout > 0) {
            m->lora_xf = add(&ad, "work.lora_drop.fwd", MF_CAT_WORK, MF_DTYPE_F32, 2, N, win, 0, 0, f0, f1, -1);
            m->lora_xb = add(&ad, "work.lora_drop.bwd", MF_CAT_WORK, MF_DTYPE_F32, 2, N, win, 0, 0, b0, b1, -1);
        }
        if (m->lora.base) {
            /* quantised base: the tile of dequantised rows the GEMMs use
             * (a Llama's bf16 head too, so it lives into the head phase) */
            int64_t qs = (int64_t)quant_scratch_need(m, (int)N);
            m->qscr_bytes = (size_t)qs;
            m->qscr_f = add(&ad, "work.quant_gemm.fwd", MF_CAT_WORK, MF_DTYPE_U8, 1, qs, 0, 0, 0, f0,
                            llama ? mf_phase_head_fwd(m) : f1, -1);
            if (train) m->qscr_b = add(&ad, "work.quant_gemm.bwd", MF_CAT_WORK, MF_DTYPE_U8, 1, qs, 0, 0, 0, b0, b1, -1);
        }
    }
    if (m->cdt != MF_DTYPE_F32 && !ad.err) {
        /* 16-bit: rounded GEMM operands that are not kept */
        int g0 = mf_phase_layer_fwd(m, 0), g1 = train ? mf_phase_layer_bwd(m, 0) : hf;
        /* the attention output rounded for the output projection; every
         * GEMM's output gradient rounded (the widest: GPT-2's 4C, a
         * Llama's MLP width or its query heads) */
        int64_t dw16 = I > AO ? I : AO;
        if (dw16 < C) dw16 = C;
        m->in16 = add(&ad, "work.gemm_in16", MF_CAT_WORK, m->cdt, 2, N, AO > C ? AO : C, 0, 0, g0, g1, -1);
        if (train) {
            m->dout16 = add(&ad, "work.gemm_dout16", MF_CAT_WORK, m->cdt, 2, N, dw16, 0, 0,
                            mf_phase_layer_bwd(m, L - 1), g1, -1);
            m->dlogits16 = add(&ad, "work.dlogits16", MF_CAT_WORK, m->cdt, 2, m->chunk_rows, d->Vp, 0, 0, hf, hf, -1);
        }
        if (train && !m->opt.master) {
            /* master_weights 0: each 16-bit tensor is widened here, updated,
             * and rounded back stochastically; the largest is wte */
            int64_t mx = 0;
            for (int i = 0; i < m->n_tensors; i++)
                if (mf_tensor_is16(m, &m->tensors[i]) && m->tensors[i].numel > mx) mx = m->tensors[i].numel;
            int po = mf_phase_optim(m);
            m->upd32 = add(&ad, "work.update_f32", MF_CAT_WORK, MF_DTYPE_F32, 1, mx, 0, 0, 0, po, po, -1);
        }
    }
    if (!ad.err) {
        /* the GEMM library's scratch for the largest call (fp32: none
         * unless the backend is oneDNN's matmul; 16-bit: docs/precision.md) */
        int g0 = mf_phase_layer_fwd(m, 0), g1 = train ? mf_phase_layer_bwd(m, 0) : hf;
        size_t gs = gemm_scratch_need(m, (int)N);
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
    free(m->tensors);
    free(m->res);   /* rres and racts share these allocations */
    free(m->acts);
    memset(m, 0, sizeof *m);
}

/* ---- init ------------------------------------------------------------ */

void mf_model_state_ptrs(const mf_model *m, const mf_arena *a, const mf_tensor *t, void *ptr[MF_OPTIM_STATES]) {
    (void)m;
    for (int i = 0; i < MF_OPTIM_STATES; i++) ptr[i] = t->st[i] >= 0 ? mf_arena_ptr(a, t->st[i]) : NULL;
}

void mf_model_zero_state(const mf_model *m, const mf_arena *a, const mf_tensor *t) {
    void *ptr[MF_OPTIM_STATES];
    mf_model_state_ptrs(m, a, t, ptr);
    mf_optim_zero(&m->opt, ptr, t->st, &t->os);
}

int mf_tensor_weights_row(const mf_tensor *t) { return t->mw >= 0 ? t->mw : t->p; }

int mf_tensor_is16(const mf_model *m, const mf_tensor *t) {
    return m->cdt != MF_DTYPE_F32 && t->ndim == 2 && t->role != MF_ROLE_POS;
}

void mf_model_sync_params(const mf_model *m, const mf_arena *a, int first, int n) {
    for (int i = first; i < first + n; i++) {
        const mf_tensor *t = &m->tensors[i];
        if (t->mw >= 0) mf_half_from_f32(m->cdt, mf_arena_ptr(a, t->p), mf_arena_ptr(a, t->mw), (size_t)t->numel);
    }
}

/* Stores v as element k of tensor t's weights: fp32, or rounded to 16 bits
 * when the tensor has no fp32 row (master_weights 0) */
static void put_w(const mf_model *m, const mf_tensor *t, void *row, int64_t k, float v) {
    if (t->mw < 0 && mf_tensor_is16(m, t)) ((uint16_t *)row)[k] = m->cdt == MF_DTYPE_BF16 ? mf_f32_to_bf16(v) : mf_f32_to_fp16(v);
    else ((float *)row)[k] = v;
}

/* Set-up only (outside the step, when no non-persistent row is alive): an
 * arena row of at least n floats to stage a weight in before it is packed,
 * or NULL (the caller then uses the heap). */
float *mf_model_stage(const mf_model *m, const mf_arena *a, int64_t n) {
    const mf_plan *p = a->plan;
    for (int i = 0; i < p->n; i++) {
        const mf_buf *b = &p->bufs[i];
        if (!b->disk && !(b->first == 0 && b->last == m->n_phases - 1) && b->bytes >= (size_t)n * sizeof(float))
            return mf_arena_ptr(a, i);
    }
    return NULL;
}

/* A quantised frozen matrix's values, drawn a part at a time in the order
 * the full draw would take them (N(0, std), padding rows 0); the NF4
 * second pass starts the same stream again. */
typedef struct { mf_rng *rng, start; float std; int64_t pad_from; } qinit_ctx;
static void qinit_fill(void *ctx, float *buf, int64_t lo, int64_t len) {
    qinit_ctx *q = ctx;
    if (lo == 0) *q->rng = q->start;
    for (int64_t k = 0; k < len; k++) {
        float v = q->std * mf_rng_normal(q->rng);
        buf[k] = lo + k >= q->pad_from ? 0.0f : v;
    }
}

void mf_model_init_weights(mf_model *m, mf_arena *a, uint64_t seed) {
    mf_rng rng;
    mf_rng_seed(&rng, seed);
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->d.L);
    for (int i = 0; i < m->n_tensors; i++) {
        mf_tensor *t = &m->tensors[i];
        if (t->lora) break;  /* the adapters come last: mf_lora_init_weights below */
        if (t->qkind) {
            /* a quantised base matrix: the same draws, packed a part at a
             * time (its fp32 values never exist whole: a 1B model's
             * embedding would be 1 GiB of heap at start-up) */
            int emb = t->role == MF_ROLE_EMB || t->role == MF_ROLE_HEAD;
            qinit_ctx q = {&rng, rng, strstr(t->name, "c_proj.weight") ? proj_std : 0.02f,
                           emb ? t->rows_file * t->shape[1] : t->numel};
            if (mf_quant_pack_stream((mf_quant_kind)t->qkind, mf_arena_ptr(a, t->p), t->numel, qinit_fill, &q))
                mf_panic("%s", mf_error());
            continue;
        }
        /* ZeRO 3: the same values, this rank's shard [lo, hi) of them kept */
        void *p = t->ps >= 0 ? (void *)((float *)mf_arena_ptr(a, t->ps) - t->lo) : mf_arena_ptr(a, mf_tensor_weights_row(t));
        int64_t lo = t->ps >= 0 ? t->lo : 0, hi = t->ps >= 0 ? t->hi : t->numel;
        const char *nm = t->name;
        /* norms' weights: GPT-2's ln_*.weight, Llama's *norm.weight */
        int is_ln_w = (strstr(nm, "ln_") && strstr(nm, ".weight")) || strstr(nm, "norm.weight");
        if (is_ln_w) for (int64_t k = lo; k < hi; k++) put_w(m, t, p, k, 1.0f);
        else if (t->ndim == 1) for (int64_t k = lo; k < hi; k++) put_w(m, t, p, k, 0.0f);
        else {
            float std = strstr(nm, "c_proj.weight") ? proj_std : 0.02f;
            for (int64_t k = 0; k < t->numel; k++) {
                float v = std * mf_rng_normal(&rng);
                if (k >= lo && k < hi) put_w(m, t, p, k, v);
            }
        }
        if (t->role == MF_ROLE_EMB || t->role == MF_ROLE_HEAD) /* padding rows stay zero */
            for (int64_t k = t->rows_file * t->shape[1]; k < t->numel; k++)
                if (k >= lo && k < hi) put_w(m, t, p, k, 0.0f);
        mf_model_sync_params(m, a, i, 1);
        if (t->g >= 0) memset(mf_arena_ptr(a, t->g), 0, (size_t)t->numel * sizeof(float));
        if (m->mode == MF_MODE_TRAIN && !m->opt.offload_path[0]) mf_model_zero_state(m, a, t);  /* disk: the trainer */
    }
    mf_lora_init_weights(m, a, seed);
    for (int i = m->lora_first; m->lora.r > 0 && i < m->n_tensors; i++) {
        mf_tensor *t = &m->tensors[i];
        if (t->g >= 0) memset(mf_arena_ptr(a, t->g), 0, (size_t)t->numel * sizeof(float));
        if (m->mode == MF_MODE_TRAIN) mf_model_zero_state(m, a, t);
    }
}

static void zero_g(mf_model *m, mf_arena *a, int first, int n) {
    for (int i = first; i < first + n; i++)
        if (m->tensors[i].g >= 0) memset(mf_arena_get(a, m->tensors[i].g), 0, (size_t)m->tensors[i].numel * sizeof(float));
}

void mf_model_zero_grads(mf_model *m, mf_arena *a) {
    if (!grads_transient(m)) zero_g(m, a, 0, m->n_tensors);
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].gs >= 0) memset(mf_arena_get(a, m->tensors[i].gs), 0, (size_t)(m->tensors[i].hi - m->tensors[i].lo) * sizeof(float));
}

/* update_in_backward: tensors [first, first+n) start their gradient in
 * this phase (zero it) or finish it (hand it to the optimizer) */
static void grads_start(mf_model *m, mf_arena *a, int first, int n) {
    if (grads_transient(m)) zero_g(m, a, first, n);
}
static void grads_done(mf_model *m, int first, int n) {
    if (grads_transient(m) && m->grads_ready) m->grads_ready(m->grads_ctx, first, n);
}

/* ---- forward --------------------------------------------------------- */

#define P(l, k) tensor_p(m, a, 2 + (l) * MF_LAYER_TENSORS + (k))
#define G(l, k) tensor_g(m, a, 2 + (l) * MF_LAYER_TENSORS + (k))
#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define tensor_p mf_model_tensor_p
#define tensor_g mf_model_tensor_g
#define gelu_out mf_model_mlp_out
enum { LN1W, LN1B, QKVW, QKVB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB };

/* Tensor i's gradient (NULL for a frozen base weight under LoRA). */
float *mf_model_tensor_g(mf_model *m, mf_arena *a, int i) {
    return m->tensors[i].g >= 0 ? mf_arena_get(a, m->tensors[i].g) : NULL;
}
/* LoRA hooks around target k's matmul (nothing when k has no adapter) */
#define LORA_FWD(k, x, y) if (m->lora.r) mf_lora_layer_forward(m, a, l, k, x, y, N)
#define LORA_BWD_P(k, dy, x) if (m->lora.r) mf_lora_layer_backward_params(m, a, l, k, dy, x, N)
#define LORA_BWD_X(k, dx) if (m->lora.r) mf_lora_layer_backward_input(m, a, l, k, dx, N)

/* Tensor i's parameters; under ZeRO 3 the row gathered for this phase
 * (backward has its own). */
float *mf_model_tensor_p(mf_model *m, mf_arena *a, int i) {
    const mf_tensor *x = &m->tensors[i];
    return mf_arena_get(a, x->pb >= 0 && a->phase >= mf_phase_head_bwd(m) ? x->pb : x->p);
}

/* The base's linear layers: out = inp @ W + b (+ resid when non-NULL);
 * dinp = dout @ W^T (+ dW, db when they have gradients). A quantised frozen
 * W (--base_dtype) goes through quant.h's tile-dequantising GEMMs. */
static void *quant_scratch(mf_model *m, mf_arena *a) {
    return mf_arena_get(a, m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m) ? m->qscr_b : m->qscr_f);
}
static void linear_fwd(mf_model *m, mf_arena *a, int l, int k, float *out, const float *inp, const float *resid,
                       int N, int K, int OC) {
    const mf_tensor *w = &m->tensors[2 + l * MF_LAYER_TENSORS + k];
    if (!w->qkind) {
        if (resid) memcpy(out, resid, (size_t)N * OC * sizeof(float));
        mf_matmul_forward(out, inp, P(l, k), P(l, k + 1), N, K, OC, resid != NULL);
        return;
    }
    mf_quant_matmul_forward(out, inp, P(l, k), P(l, k + 1), N, K, OC, (mf_quant_kind)w->qkind, quant_scratch(m, a));
    if (resid)
        for (size_t i = 0; i < (size_t)N * OC; i++) out[i] += resid[i];
}
static void linear_bwd(mf_model *m, mf_arena *a, int l, int k, float *dinp, const float *dout, const float *inp,
                       int N, int K, int OC) {
    const mf_tensor *w = &m->tensors[2 + l * MF_LAYER_TENSORS + k];
    if (!w->qkind) {
        mf_matmul_backward(dinp, G(l, k), G(l, k + 1), dout, inp, P(l, k), N, K, OC);
        return;
    }
    memset(dinp, 0, (size_t)N * K * sizeof(float));
    mf_quant_matmul_backward_input(dinp, dout, P(l, k), N, K, OC, (mf_quant_kind)w->qkind, quant_scratch(m, a));
}

/* ZeRO 3: gathers tensors [first, first+n) for the phase that starts, or
 * waits for the prefetch that gathers them */
static void params_need(mf_model *m, mf_arena *a, int first, int n) {
    if (m->tensors[first].ps < 0 || m->comm_err) return;
    int rc = m->pf_first == first ? mf_dist_gather_wait() : mf_zero_params_needed(m, a, first, n);
    m->pf_first = -1;
    if (rc) m->comm_err = 1;
}

/* ZeRO 3: starts gathering block l's parameters (for the next phase: the
 * block above in forward, below in backward) while this phase computes */
static void params_prefetch(mf_model *m, mf_arena *a, int l) {
    int first = m->t_layer0 + l * m->nlt;
    if (l < 0 || l >= m->d.L || !m->prefetch || m->tensors[first].ps < 0 || m->comm_err) return;
    if (mf_zero_params_prefetch(m, a, first, m->nlt)) m->comm_err = 1;
    else m->pf_first = first;
}


/* The GELU output backward reads: its row, or work.dmlp when it is rebuilt
 * right before the layer's backward (see the plan). */
float *mf_model_mlp_out(mf_model *m, mf_arena *a, const mf_layer_acts *A) {
    return A->fch_gelu >= 0 ? BUF(A->fch_gelu) : BUF(m->dbig);
}

/* recompute != 0: a pass inside a backward phase that rebuilds the layer's
 * activations into the rows backward reads (it stays in that phase);
 * write_out == 0 leaves the layer's output unwritten when that buffer is no
 * longer alive */
/* fp32: hands the planned GEMM scratch to mf_sgemm for the phase that
 * starts (the row's lifetime spans the layers and the head); NULL after the
 * step, so no later call writes into a row that is gone */
static void sgemm_scratch(const mf_model *m, mf_arena *a) {
    if (m->cdt == MF_DTYPE_F32) mf_sgemm_scratch(m->gemm_scratch >= 0 ? mf_arena_get(a, m->gemm_scratch) : NULL,
                                                 m->gemm_scratch_bytes);
}

static void layer_forward(mf_model *m, mf_arena *a, int l, int B, int T, int recompute, int write_out) {
    int C = m->d.C, NH = m->d.NH, N = B * T;
    const mf_layer_acts *A = recompute ? &m->racts[l] : &m->acts[l];
    const int *res = recompute ? m->rres : m->res;
    if (!recompute) {
        mf_arena_phase(a, mf_phase_layer_fwd(m, l));
        params_need(m, a, m->t_layer0 + l * m->nlt, m->nlt);
        params_prefetch(m, a, l + 1);
    }
    sgemm_scratch(m, a);
    if (m->d.arch == MF_ARCH_LLAMA) {
        mf_llama_block_forward(m, a, l, B, T, recompute, write_out);
        return;
    }
    float *x = BUF(res[l]);
    float *ln1 = BUF(A->ln1), *qkv = BUF(A->qkv), *lse = BUF(A->lse), *atty = BUF(A->atty);
    float *ln2 = BUF(A->ln2), *fch = BUF(A->fch), *fchg = gelu_out(m, a, A);
    if (m->cdt != MF_DTYPE_F32) {
        /* 16-bit: the same block with 16-bit GEMM inputs (see mixed.c) */
        mf_dtype dt = m->cdt;
        void *gs = mf_arena_get(a, m->gemm_scratch), *in16 = mf_arena_get(a, m->in16);
        size_t gb = m->gemm_scratch_bytes;
        mf_layernorm_forward16(ln1, dt, BUF(A->ln1_mean), BUF(A->ln1_rstd), x, P(l, LN1W), P(l, LN1B), N, C);
        mf_matmul16_forward(dt, qkv, ln1, P(l, QKVW), P(l, QKVB), N, C, 3 * C, 0, gs, gb);
        mf_flash_attention_forward(atty, lse, qkv, B, T, C, NH);
        float *xmid = BUF(A->xmid);
        memcpy(xmid, x, (size_t)N * C * sizeof(float));
        mf_half_from_f32(dt, in16, atty, (size_t)N * C);
        mf_matmul16_forward(dt, xmid, in16, P(l, PROJW), P(l, PROJB), N, C, C, 1, gs, gb);
        mf_layernorm_forward16(ln2, dt, BUF(A->ln2_mean), BUF(A->ln2_rstd), xmid, P(l, LN2W), P(l, LN2B), N, C);
        mf_matmul16_forward(dt, fch, ln2, P(l, FCW), P(l, FCB), N, C, 4 * C, 0, gs, gb);
        mf_gelu_forward16(fchg, dt, fch, (size_t)N * 4 * C);
        if (!write_out) return;
        float *out = BUF(res[l + 1]);
        memcpy(out, xmid, (size_t)N * C * sizeof(float));
        mf_matmul16_forward(dt, out, fchg, P(l, FCPW), P(l, FCPB), N, 4 * C, C, 1, gs, gb);
        return;
    }
    mf_layernorm_forward(ln1, BUF(A->ln1_mean), BUF(A->ln1_rstd), x, P(l, LN1W), P(l, LN1B), N, C);
    linear_fwd(m, a, l, QKVW, qkv, ln1, NULL, N, C, 3 * C);
    LORA_FWD(MF_LORA_ATTN_C_ATTN, ln1, qkv);
    /* FlashAttention: only the output and each row's log-sum-exp are kept;
     * the T x T scores are recomputed tile by tile in backward */
    mf_flash_attention_forward(atty, lse, qkv, B, T, C, NH);
    /* xmid = x + (atty @ Wproj + b): the GEMM writes xmid (beta = 0), then
     * one pass per row adds the residual and the bias and computes ln_2
     * while the row is in cache (xmid is kept: ln_2's backward reads it) */
    float *xmid = BUF(A->xmid);
    if (!m->lora.r) {
        /* a plain fp32 base: the fused kernels */
        mf_matmul_forward(xmid, atty, P(l, PROJW), NULL, N, C, C, 0);
        mf_residual_layernorm_forward(xmid, ln2, BUF(A->ln2_mean), BUF(A->ln2_rstd), x, P(l, PROJB),
                                      P(l, LN2W), P(l, LN2B), N, C);
        /* fch = ln2 @ Wfc (beta = 0), then its bias and the GELU in one pass */
        mf_matmul_forward(fch, ln2, P(l, FCW), NULL, N, C, 4 * C, 0);
        mf_bias_gelu_forward(fchg, fch, P(l, FCB), N, 4 * C);
        if (!write_out) return;
        float *out = BUF(res[l + 1]);
        mf_matmul_forward(out, fchg, P(l, FCPW), NULL, N, 4 * C, C, 0);
        mf_residual_forward(out, xmid, P(l, FCPB), N, C);
        return;
    }
    linear_fwd(m, a, l, PROJW, xmid, atty, x, N, C, C);
    LORA_FWD(MF_LORA_ATTN_C_PROJ, atty, xmid);
    mf_layernorm_forward(ln2, BUF(A->ln2_mean), BUF(A->ln2_rstd), xmid, P(l, LN2W), P(l, LN2B), N, C);
    linear_fwd(m, a, l, FCW, fch, ln2, NULL, N, C, 4 * C);
    LORA_FWD(MF_LORA_MLP_C_FC, ln2, fch);
    mf_gelu_forward(fchg, fch, (size_t)N * 4 * C);
    if (!write_out) return;
    float *out = BUF(res[l + 1]);
    linear_fwd(m, a, l, FCPW, out, fchg, xmid, N, 4 * C, C);
    LORA_FWD(MF_LORA_MLP_C_PROJ, fchg, out);
}

#define WTE 0
#define WPE (m->t_pos)
#define LNF_W (m->t_normf)
#define LNF_B (LNF_W + 1)

int mf_model_fits(const mf_model *m, int B, int T) {
    if (B < 1 || T < 1 || T > m->d.maxT || (int64_t)B * T > (int64_t)m->B * m->T) return 0;
    if (B > m->chunk_rows) return 0;  /* a sampling forward keeps each sequence's last logits row */
    if (B == m->B && T == m->T) return 1;
    int64_t N = (int64_t)B * T;
    /* the row-linear buffers hold N rows; what else depends on the shape */
    if (m->attn_scratch >= 0 &&
        mf_flash_attention_scratch_floats(T, m->d.hd, m->nthreads) >
            mf_flash_attention_scratch_floats(m->d.maxT, m->d.hd, m->nthreads))
        return 0;
    if (m->gemm_scratch >= 0 && gemm_scratch_need(m, (int)N) > m->gemm_scratch_bytes) return 0;
    if (m->qscr_f >= 0 && quant_scratch_need(m, (int)N) > m->qscr_bytes) return 0;
    return 1;
}

double mf_model_forward(mf_model *m, mf_arena *a, int B, int T, int use_targets, float dscale) {
    if (!mf_model_fits(m, B, T)) mf_panic("forward on %dx%d does not fit the planned %dx%d", B, T, m->B, m->T);
    int C = m->d.C, N = B * T, L = m->d.L;
    m->lora_drop = m->lora.r > 0 && m->lora.dropout > 0 && use_targets && dscale != 0.0f && m->mode == MF_MODE_TRAIN;
    int llama = m->d.arch == MF_ARCH_LLAMA;
    mf_arena_phase(a, mf_phase_emb_fwd(m));
    params_need(m, a, WTE, llama ? 1 : 2);
    params_prefetch(m, a, 0);
    const int32_t *inp = mf_arena_get(a, m->inputs);
    int h16 = m->cdt != MF_DTYPE_F32;
    if (llama) {
        if (m->tensors[WTE].qkind == MF_QUANT_BF16)  /* a frozen bf16 embedding (QLoRA) */
            mf_embed_forward16(BUF(m->res[0]), inp, tensor_p(m, a, WTE), MF_DTYPE_BF16, N, C);
        else if (h16) mf_embed_forward16(BUF(m->res[0]), inp, tensor_p(m, a, WTE), m->cdt, N, C);
        else mf_embed_forward(BUF(m->res[0]), inp, tensor_p(m, a, WTE), N, C);
        mf_llama_rope_fill(m, a, T);
    } else if (h16) mf_encoder_forward16(BUF(m->res[0]), inp, tensor_p(m, a, WTE), m->cdt, tensor_p(m, a, WPE), B, T, C);
    else mf_encoder_forward(BUF(m->res[0]), inp, tensor_p(m, a, WTE), tensor_p(m, a, WPE), B, T, C);
    for (int l = 0; l < L; l++) layer_forward(m, a, l, B, T, 0, 1);
    mf_arena_phase(a, mf_phase_head_fwd(m));
    params_need(m, a, LNF_W, m->n_normf);
    /* the output head: the embedding (tied) or lm_head */
    int HW = m->t_head >= 0 ? m->t_head : WTE;
    if (HW != WTE) params_need(m, a, HW, 1);
    float *lnf = BUF(m->lnf), *logits = BUF(m->logits);
    mf_dtype dt = m->cdt;
    /* 16-bit: ln_f's output, rows of C 16-bit values */
    uint16_t *lnf16 = (uint16_t *)lnf;
    void *gs = h16 ? mf_arena_get(a, m->gemm_scratch) : NULL;
    size_t gb = m->gemm_scratch_bytes;
    sgemm_scratch(m, a);
    if (llama && h16) mf_rmsnorm_forward16(lnf, dt, BUF(m->lnf_rstd), BUF(m->res[L]), tensor_p(m, a, LNF_W), N, C, m->d.eps);
    else if (llama) mf_rmsnorm_forward(lnf, BUF(m->lnf_rstd), BUF(m->res[L]), tensor_p(m, a, LNF_W), N, C, m->d.eps);
    else if (h16) mf_layernorm_forward16(lnf, dt, BUF(m->lnf_mean), BUF(m->lnf_rstd), BUF(m->res[L]),
                                    tensor_p(m, a, LNF_W), tensor_p(m, a, LNF_B), N, C);
    else mf_layernorm_forward(lnf, BUF(m->lnf_mean), BUF(m->lnf_rstd), BUF(m->res[L]),
                              tensor_p(m, a, LNF_W), tensor_p(m, a, LNF_B), N, C);
    const float *wte = tensor_p(m, a, HW);
    int R = m->chunk_rows, Vp = m->d.Vp;
    /* a frozen bf16 head (a Llama's QLoRA): dequantised a tile at a time */
    mf_quant_kind hq = (mf_quant_kind)m->tensors[HW].qkind;
    void *hqs = hq ? mf_arena_get(a, m->qscr_f) : NULL;
    if (!use_targets) {
        /* sampling: every row if they fit at once, else each sequence's last */
        m->logits_all = R >= N;
        if (hq && m->logits_all) mf_quant_linear_forward(logits, Vp, lnf, wte, NULL, N, C, Vp, 0.0f, hq, hqs);
        else if (hq)
            for (int b = 0; b < B; b++)
                mf_quant_linear_forward(logits + (size_t)b * Vp, Vp, lnf + ((size_t)b * T + T - 1) * C, wte, NULL, 1, C,
                                        Vp, 0.0f, hq, hqs);
        else if (m->logits_all) {
            if (h16) mf_classifier16_forward(dt, logits, lnf, wte, N, C, Vp, gs, gb);
            else mf_classifier_forward(logits, lnf, wte, N, C, Vp);
        } else
            for (int b = 0; b < B; b++) {
                size_t row = (size_t)b * T + T - 1;
                if (h16) mf_classifier16_forward(dt, logits + (size_t)b * Vp, lnf16 + row * C, wte, 1, C, Vp, gs, gb);
                else mf_classifier_forward(logits + (size_t)b * Vp, lnf + row * C, wte, 1, C, Vp);
            }
        mf_sgemm_scratch(NULL, 0);
        return 0.0;
    }
    if (dscale != 0.0f && m->mode != MF_MODE_TRAIN) mf_panic("training forward on a forward-only plan");
    const int32_t *tgt = mf_arena_get(a, m->targets);
    if (dscale != 0.0f) grads_start(m, a, HW, 1);
    float *losses = BUF(m->losses), *dln = dscale != 0.0f ? BUF(m->dln) : NULL, *dwte = dln ? tensor_g(m, a, HW) : NULL;
    double sum = 0;
    void *dl16 = h16 && dln ? mf_arena_get(a, m->dlogits16) : NULL;
    for (int r0 = 0; r0 < N; r0 += R) {
        int rows = N - r0 < R ? N - r0 : R;
        if (h16) {
            /* logits and the loss in fp32; the rounded d(logits) feeds both GEMMs */
            const uint16_t *x = lnf16 + (size_t)r0 * C;
            mf_classifier16_forward(dt, logits, x, wte, rows, C, Vp, gs, gb);
            if (dt == MF_DTYPE_BF16 && dln) {
                /* bf16: the loss kernel writes the rounded gradient itself */
                sum += mf_crossentropy_forward_bf16(logits, dl16, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
                mf_classifier16_backward(dt, dln + (size_t)r0 * C, dwte, NULL, dl16, x, wte, rows, C, Vp, gs, gb);
                continue;
            }
            sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
            if (dln) mf_classifier16_backward(dt, dln + (size_t)r0 * C, dwte, logits, dl16, x, wte, rows, C, Vp, gs, gb);
            continue;
        }
        const float *x = lnf + (size_t)r0 * C;
        if (hq) {
            mf_quant_linear_forward(logits, Vp, x, wte, NULL, rows, C, Vp, 0.0f, hq, hqs);
            sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
            if (dln) {
                memset(dln + (size_t)r0 * C, 0, (size_t)rows * C * sizeof(float));
                mf_quant_linear_backward_input(dln + (size_t)r0 * C, logits, Vp, wte, rows, C, Vp, hq, hqs);
            }
            continue;
        }
        mf_classifier_forward(logits, x, wte, rows, C, Vp);
        sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
        if (dln) mf_classifier_backward(dln + (size_t)r0 * C, dwte, logits, x, wte, rows, C, Vp);
    }
    if (dln && HW != WTE) grads_done(m, HW, 1);  /* an untied head's gradient is complete */
    m->logits_all = 0;
    mf_sgemm_scratch(NULL, 0);
    return sum / N;
}

void mf_model_backward(mf_model *m, mf_arena *a, int B, int T) {
    if (m->mode != MF_MODE_TRAIN) mf_panic("backward on a forward-only plan");
    int C = m->d.C, NH = m->d.NH, N = B * T, L = m->d.L;
    int llama = m->d.arch == MF_ARCH_LLAMA;
    mf_arena_phase(a, mf_phase_head_bwd(m));
    params_need(m, a, LNF_W, m->n_normf);
    params_prefetch(m, a, L - 1);
    /* the classifier's backward ran with the loss; dln holds d(ln_f output) */
    float *dln = BUF(m->dln), *dres = BUF(m->dres);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    grads_start(m, a, LNF_W, m->n_normf);
    if (llama)
        mf_rmsnorm_backward(dres, tensor_g(m, a, LNF_W), dln, BUF(m->res[L]), tensor_p(m, a, LNF_W), BUF(m->lnf_rstd), N, C);
    else
        mf_layernorm_backward(dres, tensor_g(m, a, LNF_W), tensor_g(m, a, LNF_B), dln, BUF(m->res[L]),
                              tensor_p(m, a, LNF_W), BUF(m->lnf_mean), BUF(m->lnf_rstd), N, C);
    grads_done(m, LNF_W, m->n_normf);
    for (int l = L - 1; l >= 0; l--) {
        mf_arena_phase(a, mf_phase_layer_bwd(m, l));
        params_need(m, a, m->t_layer0 + l * m->nlt, m->nlt);
        params_prefetch(m, a, l - 1);
        grads_start(m, a, m->t_layer0 + l * m->nlt, m->nlt);
        sgemm_scratch(m, a);
        int sg = m->seg, s0 = sg ? l / sg * sg : 0;
        if (sg && l == (s0 + sg - 1 < L - 1 ? s0 + sg - 1 : L - 1)) {
            /* top block of a segment: rebuild the segment from its kept
             * input; every output but the top one's goes to a slot */
            for (int k = s0; k <= l; k++) layer_forward(m, a, k, B, T, 1, k < l);
        }
        if (l < m->auto_k) layer_forward(m, a, l, B, T, 1, 0);
        if (llama) {
            mf_llama_block_backward(m, a, l, B, T);
            grads_done(m, m->t_layer0 + l * m->nlt, m->nlt);
            continue;
        }
        const mf_layer_acts *A = &m->racts[l];
        if (m->recompute.policy == MF_RECOMPUTE_SELECTIVE && m->cdt != MF_DTYPE_F32) {
            mf_dtype dt = m->cdt;
            mf_layernorm_forward16(BUF(A->ln1), dt, BUF(A->ln1_mean), BUF(A->ln1_rstd), BUF(m->rres[l]), P(l, LN1W), P(l, LN1B), N, C);
            mf_layernorm_forward16(BUF(A->ln2), dt, BUF(A->ln2_mean), BUF(A->ln2_rstd), BUF(A->xmid), P(l, LN2W), P(l, LN2B), N, C);
            mf_gelu_forward16(gelu_out(m, a, A), dt, BUF(A->fch), (size_t)N * 4 * C);
        } else if (m->recompute.policy == MF_RECOMPUTE_SELECTIVE) {
            /* rebuild the element-wise outputs from the kept inputs; the
             * statistics come out bit-identical to the forward's */
            mf_layernorm_forward(BUF(A->ln1), BUF(A->ln1_mean), BUF(A->ln1_rstd), BUF(m->rres[l]), P(l, LN1W), P(l, LN1B), N, C);
            mf_layernorm_forward(BUF(A->ln2), BUF(A->ln2_mean), BUF(A->ln2_rstd), BUF(A->xmid), P(l, LN2W), P(l, LN2B), N, C);
            mf_gelu_forward(gelu_out(m, a, A), BUF(A->fch), (size_t)N * 4 * C);
        }
        float *dbig = BUF(m->dbig), *dqkv = BUF(m->dqkv);
        if (m->cdt != MF_DTYPE_F32) {
            /* 16-bit: the same backward; each GEMM rounds its output
             * gradient into dout16, weight gradients accumulate in fp32 */
            mf_dtype dt = m->cdt;
            void *gs = mf_arena_get(a, m->gemm_scratch), *d16 = mf_arena_get(a, m->dout16), *in16 = mf_arena_get(a, m->in16);
            size_t gb = m->gemm_scratch_bytes;
            mf_matmul16_backward(dt, dbig, G(l, FCPW), G(l, FCPB), dres, d16, gelu_out(m, a, A), P(l, FCPW), N, 4 * C, C, gs, gb);
            mf_gelu_backward(dbig, BUF(A->fch), dbig, (size_t)N * 4 * C);
            mf_matmul16_backward(dt, dln, G(l, FCW), G(l, FCB), dbig, d16, BUF(A->ln2), P(l, FCW), N, C, 4 * C, gs, gb);
            mf_layernorm_backward(dres, G(l, LN2W), G(l, LN2B), dln, BUF(A->xmid), P(l, LN2W),
                                  BUF(A->ln2_mean), BUF(A->ln2_rstd), N, C);
            mf_half_from_f32(dt, in16, BUF(A->atty), (size_t)N * C);
            mf_matmul16_backward(dt, dln, G(l, PROJW), G(l, PROJB), dres, d16, in16, P(l, PROJW), N, C, C, gs, gb);
            mf_flash_attention_backward(dqkv, BUF(m->attn_scratch), dln, BUF(A->atty), BUF(A->qkv), BUF(A->lse),
                                        B, T, C, NH);
            mf_matmul16_backward(dt, dln, G(l, QKVW), G(l, QKVB), dqkv, d16, BUF(A->ln1), P(l, QKVW), N, C, 3 * C, gs, gb);
            mf_layernorm_backward(dres, G(l, LN1W), G(l, LN1B), dln, BUF(m->rres[l]), P(l, LN1W),
                                  BUF(A->ln1_mean), BUF(A->ln1_rstd), N, C);
            grads_done(m, m->t_layer0 + l * m->nlt, m->nlt);
            continue;
        }
        /* MLP: out = xmid + gelu(ln2 @ Wfc + b) @ Wfcp + b; the GELU output
         * may live in dbig itself (matmul_backward reads inp before it
         * writes dinp) */
        LORA_BWD_P(MF_LORA_MLP_C_PROJ, dres, gelu_out(m, a, A));
        linear_bwd(m, a, l, FCPW, dbig, dres, gelu_out(m, a, A), N, 4 * C, C);
        LORA_BWD_X(MF_LORA_MLP_C_PROJ, dbig);
        mf_gelu_backward(dbig, BUF(A->fch), dbig, (size_t)N * 4 * C);
        LORA_BWD_P(MF_LORA_MLP_C_FC, dbig, BUF(A->ln2));
        linear_bwd(m, a, l, FCW, dln, dbig, BUF(A->ln2), N, C, 4 * C);
        LORA_BWD_X(MF_LORA_MLP_C_FC, dln);
        mf_layernorm_backward(dres, G(l, LN2W), G(l, LN2B), dln, BUF(A->xmid), P(l, LN2W),
                              BUF(A->ln2_mean), BUF(A->ln2_rstd), N, C);
        /* attention: xmid = x + attn(ln1(x)) @ Wproj + b */
        LORA_BWD_P(MF_LORA_ATTN_C_PROJ, dres, BUF(A->atty));
        linear_bwd(m, a, l, PROJW, dln, dres, BUF(A->atty), N, C, C);
        LORA_BWD_X(MF_LORA_ATTN_C_PROJ, dln);
        mf_flash_attention_backward(dqkv, BUF(m->attn_scratch), dln, BUF(A->atty), BUF(A->qkv), BUF(A->lse),
                                    B, T, C, NH);
        LORA_BWD_P(MF_LORA_ATTN_C_ATTN, dqkv, BUF(A->ln1));
        linear_bwd(m, a, l, QKVW, dln, dqkv, BUF(A->ln1), N, C, 3 * C);
        LORA_BWD_X(MF_LORA_ATTN_C_ATTN, dln);
        mf_layernorm_backward(dres, G(l, LN1W), G(l, LN1B), dln, BUF(m->rres[l]), P(l, LN1W),
                              BUF(A->ln1_mean), BUF(A->ln1_rstd), N, C);
        grads_done(m, m->t_layer0 + l * m->nlt, m->nlt);
    }
    mf_sgemm_scratch(NULL, 0);
    mf_arena_phase(a, mf_phase_emb_bwd(m));
    if (llama) {
        /* untied: the embedding's gradient starts here */
        if (m->t_head >= 0) grads_start(m, a, WTE, 1);
        if (!m->tensors[WTE].frozen) mf_embed_backward(tensor_g(m, a, WTE), dres, mf_arena_get(a, m->inputs), N, C);
        grads_done(m, WTE, 1);
    } else {
    grads_start(m, a, WPE, 1);
    if (!m->tensors[WTE].frozen)
        mf_encoder_backward(tensor_g(m, a, WTE), tensor_g(m, a, WPE), dres, mf_arena_get(a, m->inputs), B, T, C);
    grads_done(m, WTE, 2);
    }
}

const float *mf_model_logits(mf_model *m, mf_arena *a, int T, int b, int t) {
    if (m->logits_all) return BUF(m->logits) + ((size_t)b * T + t) * m->d.Vp;
    if (t != T - 1) mf_panic("logits of row %d were not computed (only each sequence's last)", t);
    return BUF(m->logits) + (size_t)b * m->d.Vp;
}
