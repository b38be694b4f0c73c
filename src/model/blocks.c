/* The block library: one transformer block, forward and backward, that
 * every family runs, composed of pieces a family's description
 * (mf_block_desc, arch.c) selects:
 *
 *   ln1  = norm(x)                 LayerNorm (GPT-2) | RMSNorm (Llama)
 *   qkv  = ln1 Wqkv + b            one c_attn (GPT-2) | q, k, v (+ Qwen2 biases)
 *          then RoPE on q, k       (Llama; GPT-2's positions are the embedding's)
 *   atty = attention(qkv)          causal FlashAttention, MHA or GQA, optional window
 *   xmid = x + atty Wo + b
 *   ln2  = norm(xmid)
 *   h    = act(ln2 W1 + b1 [, ln2 Wup])   GELU (GPT-2) | SwiGLU (Llama)
 *   out  = xmid + h W2 + b2
 *
 * Every product goes through one projection path (proj_fwd / proj_bwd):
 * fp32, bf16/fp16 operands (the planned GEMM scratch and rounded-gradient
 * rows), a quantised frozen base, and the LoRA adapter's hooks, for weights
 * stored (in, out) (GPT-2's Conv1D) or (out, in) (nn.Linear). The two
 * layouts keep the kernels each family has always called (mf_matmul_* vs
 * mf_sgemm with W transposed), so both give bit-identical results to the
 * code before the split. GPT-2's fp32 block without LoRA also keeps its
 * fused epilogues (bias + residual + LayerNorm, bias + GELU): a
 * description choice (fused_fp32), since unfusing them would change its
 * bits.
 *
 * The rows (fields of mf_layer_acts, planned in plan.c): fch is the first
 * MLP projection's output (GPT-2's c_fc, a Llama's gate), up the up
 * projection (SwiGLU only), fch_gelu the activation's output h. RoPE is
 * applied in place after the q/k GEMMs, so qkv is kept rotated (what
 * attention's backward needs); the backward rotates dq and dk back before
 * the projections' backward.
 */
#include "internal.h"

#include "kernels/half.h"
#include "memfit/kernels.h"
#include "quant/quant.h"

#include <omp.h>
#include <string.h>

#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define LT_I(l, k) (m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt + m->lt[k])  /* shared: l's set */
#define LP(l, k) (void *)mf_model_tensor_p(m, a, LT_I(l, k))
#define LG(l, k) mf_model_tensor_g(m, a, LT_I(l, k))
/* an optional tensor (biases) */
#define LPO(l, k) (m->lt[k] >= 0 ? LP(l, k) : NULL)
#define LGO(l, k) (m->lt[k] >= 0 ? LG(l, k) : NULL)

/* A block's GEMMs in the run's precision. fp32: operands as they are.
 * 16-bit (bf16/fp16): the activations GEMMs read are stored 16-bit (ln1,
 * ln2, h; the attention output is rounded into in16), the weights are
 * 16-bit compute copies, and each output gradient is rounded into d16
 * before its two products; accumulation, outputs, bias sums and gradients
 * stay fp32 (docs/precision.md). */
typedef struct {
    const mf_block_desc *bd;
    int h16;
    mf_dtype dt;
    void *gs, *d16;  /* the planned GEMM scratch and rounded-gradient rows */
    size_t gb;
} lin_ctx;

static lin_ctx lin_ctx_of(mf_model *m, mf_arena *a) {
    lin_ctx c = {mf_model_block_desc(&m->d), m->cdt != MF_DTYPE_F32, m->cdt, NULL, NULL, 0};
    if (c.h16) {
        c.gs = mf_arena_get(a, m->gemm_scratch), c.gb = m->gemm_scratch_bytes;
        if (m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m)) c.d16 = mf_arena_get(a, m->dout16);
    }
    return c;
}

/* nn.Linear layout: y (N rows of ldy; OC columns written) = beta * y +
 * x (N,K) W^T + bias, W (OC,K) */
static void lin_fwd(const lin_ctx *c, float *y, int ldy, const void *x, const void *W, const float *bias, int N,
                    int K, int OC, float beta) {
    if (c->h16) {
        mf_gemm16_ldc(c->dt, y, ldy, x, W, bias, N, OC, K, 0, 1, beta != 0.0f, c->gs, c->gb);
        return;
    }
    mf_sgemm(0, 1, N, OC, K, 1.0f, x, K, W, K, beta, y, ldy);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = y + (size_t)n * ldy;
        for (int o = 0; o < OC; o++) r[o] += bias[o];
    }
}

/* The backward of lin_fwd for dy (N rows of ldy, OC columns):
 * dW (OC,K) += dy^T x, db (OC) += column sums of dy (each NULL: skipped),
 * then dx (N,K) = beta * dx + dy W. dW goes first, so x may be dx's buffer. */
static void lin_bwd(const lin_ctx *c, float *dx, float beta, float *dW, int dw16, float *db, const float *dy, int ldy,
                    const void *x, const void *W, int N, int K, int OC) {
    if (c->h16) {
        uint16_t *d16 = c->d16;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) mf_half_from_f32(c->dt, d16 + (size_t)n * OC, dy + (size_t)n * ldy, (size_t)OC);
        if (dW) mf_gemm16_dw(c->dt, dW, dw16, d16, x, OC, K, N, 1, 0, c->gs, c->gb);
    } else if (dW)
        mf_sgemm(1, 0, OC, K, N, 1.0f, dy, ldy, x, K, 1.0f, dW, K);
    if (db) {
        /* per column, rows in order: the same sums whatever the threads */
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) s += dy[(size_t)n * ldy + o];
            db[o] += s;
        }
    }
    if (c->h16) mf_gemm16(c->dt, dx, c->d16, W, NULL, N, K, OC, 0, 0, beta != 0.0f, c->gs, c->gb);
    else mf_sgemm(0, 0, N, K, OC, 1.0f, dy, ldy, W, K, beta, dx, K);
}

/* Each projection's bias slot (-1: none; the family may still lack it:
 * mf_model.lt says) */
static const int lt_bias[MF_LT_COUNT] = {[MF_LT_LN1] = -1, [MF_LT_Q] = MF_LT_QB, [MF_LT_QB] = -1, [MF_LT_K] = MF_LT_KB,
                                         [MF_LT_KB] = -1, [MF_LT_V] = MF_LT_VB, [MF_LT_VB] = -1, [MF_LT_O] = MF_LT_OB,
                                         [MF_LT_LN2] = -1, [MF_LT_GATE] = MF_LT_GATEB, [MF_LT_UP] = -1,
                                         [MF_LT_DOWN] = MF_LT_DOWNB, [MF_LT_LN1B] = -1, [MF_LT_OB] = -1,
                                         [MF_LT_LN2B] = -1, [MF_LT_GATEB] = -1, [MF_LT_DOWNB] = -1,
                                         [MF_LT_ROUTER] = -1, [MF_LT_W1] = -1, [MF_LT_W3] = -1, [MF_LT_W2] = -1};

/* the quantised base's GEMM scratch for the phase we are in */
static void *quant_scratch(mf_model *m, mf_arena *a) {
    return mf_arena_get(a, m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m) ? m->qscr_b : m->qscr_f);
}

/* Projection lt of layer l: y (ldy) = x W + b [+ resid], then its LoRA
 * adapter's output added; W plain or a quantised frozen base, in the
 * description's layout. epi: leave the bias to a fused epilogue (GPT-2's
 * fp32 path). A residual is copied into y first and the GEMM accumulates
 * onto it, except for a quantised Conv1D base, which adds it after (the
 * order GPT-2 has always used there). */
static void proj_fwd(mf_model *m, mf_arena *a, const lin_ctx *c, int l, int lt, float *y, int ldy, const void *x,
                     const float *resid, int epi, int N) {
    int in, out, k = c->bd->lora[lt];
    mf_model_lora_dims(&m->d, k, &in, &out);
    const mf_tensor *w = &m->tensors[LT_I(l, lt)];
    const float *bias = !epi && lt_bias[lt] >= 0 ? LPO(l, lt_bias[lt]) : NULL;
    mf_quant_kind q = (mf_quant_kind)w->qkind;
    if (resid && ldy != out) mf_panic("projection %d: a residual needs contiguous rows", lt);
    /* 16-bit compute: a quantised base and the adapter read x widened to
     * fp32 (mf_lora_x32); a 16-bit base reads x as it is */
    int ad = m->lora.r && mf_lora_tensor(m, l, k) >= 0;
    const float *x32 = c->h16 && (q || ad) ? mf_lora_x32(m, a, x, N, in) : x;
    if (c->bd->w_in_out) {
        /* Conv1D (in, out): y = x W + b on contiguous rows */
        if (ldy != out) mf_panic("projection %d: a Conv1D weight writes contiguous rows", lt);
        if (q) {
            mf_quant_matmul_forward(y, x32, LP(l, lt), bias, N, in, out, q, quant_scratch(m, a));
            if (resid)
                for (size_t i = 0; i < (size_t)N * out; i++) y[i] += resid[i];
        } else {
            if (resid) memcpy(y, resid, (size_t)N * out * sizeof(float));
            if (c->h16) mf_matmul16_forward(c->dt, y, x, LP(l, lt), bias, N, in, out, resid != NULL, c->gs, c->gb);
            else mf_matmul_forward(y, x, LP(l, lt), bias, N, in, out, resid != NULL);
        }
    } else {
        /* nn.Linear (out, in): y = x W^T + b, into a column range of a
         * wider row when ldy > out (q, k and v into qkv) */
        float beta = resid ? 1.0f : 0.0f;
        if (resid) memcpy(y, resid, (size_t)N * out * sizeof(float));
        if (q) mf_quant_linear_forward(y, ldy, x32, LP(l, lt), bias, N, in, out, beta, q, quant_scratch(m, a));
        else lin_fwd(c, y, ldy, x, LP(l, lt), bias, N, in, out, beta);
    }
    if (ad) mf_lora_layer_forward_ld(m, a, l, k, x32, y, ldy, N);
}

/* Its backward: the adapter's parameter gradients first (x may share dx's
 * buffer), then dx (beta: 0 overwrite, 1 accumulate; a Conv1D weight only
 * overwrites) = dy W^T-or-W, dW and db where the base is trained, then the
 * adapter's part of dx. */
static void proj_bwd(mf_model *m, mf_arena *a, const lin_ctx *c, int l, int lt, float *dx, float beta,
                     const float *dy, int ldy, const void *x, int N) {
    int in, out, k = c->bd->lora[lt];
    mf_model_lora_dims(&m->d, k, &in, &out);
    const mf_tensor *w = &m->tensors[LT_I(l, lt)];
    mf_quant_kind q = (mf_quant_kind)w->qkind;
    float *dW = LG(l, lt), *db = lt_bias[lt] >= 0 ? LGO(l, lt_bias[lt]) : NULL;
    /* 16-bit compute: the adapter reads x widened (the base's backward
     * needs no x: it is frozen) */
    int ad = m->lora.r && mf_lora_tensor(m, l, k) >= 0;
    if (ad) mf_lora_layer_backward_params_ld(m, a, l, k, dy, ldy, c->h16 ? mf_lora_x32(m, a, x, N, in) : x, N);
    if (c->bd->w_in_out) {
        if (ldy != out || beta != 0.0f) mf_panic("projection %d: a Conv1D backward reads contiguous rows, overwrites", lt);
        if (q) {
            memset(dx, 0, (size_t)N * in * sizeof(float));
            mf_quant_matmul_backward_input(dx, dy, LP(l, lt), N, in, out, q, quant_scratch(m, a));
        } else if (c->h16)
            mf_matmul16_backward(c->dt, dx, dW, w->g16, db, dy, c->d16, x, LP(l, lt), N, in, out, c->gs, c->gb);
        else mf_matmul_backward(dx, dW, db, dy, x, LP(l, lt), N, in, out);
    } else if (q) {
        if (beta == 0.0f) memset(dx, 0, (size_t)N * in * sizeof(float));
        mf_quant_linear_backward_input(dx, dy, ldy, LP(l, lt), N, in, out, q, quant_scratch(m, a));
    } else
        lin_bwd(c, dx, beta, dW, w->g16, db, dy, ldy, x, LP(l, lt), N, in, out);
    if (ad) mf_lora_layer_backward_input(m, a, l, k, dx, N);
}

/* GPT-2's c_fc under bf16 with its bias, no adapter and no quantised base:
 * GELU's backward, the rounding of d(pre) and the bias gradient in one pass
 * over pre and d(h) (the fp32 d(pre) is never written), then the two
 * GEMMs. 0 (nothing done) for any other projection set-up. */
static int fc_bwd_bf16(mf_model *m, mf_arena *a, const lin_ctx *c, int l, float *dx, const float *pre,
                       const float *dh, const void *x, int N) {
    const int lt = MF_LT_GATE, k = c->bd->lora[lt];
    if (!c->h16 || c->dt != MF_DTYPE_BF16 || !c->bd->w_in_out || lt_bias[lt] < 0 || k < 0) return 0;
    const mf_tensor *w = &m->tensors[LT_I(l, lt)];
    if (w->qkind || (m->lora.r && mf_lora_tensor(m, l, k) >= 0)) return 0;
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_gelu_backward_bf16_colsum(c->d16, LGO(l, lt_bias[lt]), pre, dh, N, out);
    mf_matmul16_backward(c->dt, dx, LG(l, lt), w->g16, NULL, NULL, c->d16, x, LP(l, lt), N, in, out, c->gs, c->gb);
    return 1;
}

/* ---- embedding: token rows gathered (a Llama's; GPT-2's encoder adds
 * learned positions, kernels.h), and the rotary table RoPE reads */
void mf_embed_forward(float *out, const int32_t *inp, const float *wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, wte + (size_t)inp[n] * C, (size_t)C * sizeof(float));
}

void mf_embed_backward(float *dwte, const float *dout, const int32_t *inp, int N, int C) {
    /* threads own column ranges and walk the rows in order: no races, and
     * a token's rows add up in the same order whatever the thread count */
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int c0 = (int)((int64_t)C * t / nt), c1 = (int)((int64_t)C * (t + 1) / nt);
        for (int n = 0; n < N; n++) {
            float *d = dwte + (size_t)inp[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

void mf_model_rope_fill(mf_model *m, mf_arena *a, int T) {
    if (m->rope_filled == T) return;  /* the table for T positions is already there */
    mf_rope_table(BUF(m->rope), T, m->d.hd, m->d.rope_theta, &m->d.rope);
    m->rope_filled = T;
}

/* The embedding block: res[0] = the tokens' rows (+ learned positions, the
 * description's), and the rotary table when attention uses RoPE. The
 * embedding is read 16-bit in 16-bit precision, or as a frozen bf16 table
 * (a quantised base's embedding, QLoRA). */
void mf_embed_block_forward(mf_model *m, mf_arena *a, int B, int T) {
    const mf_block_desc *bd = mf_model_block_desc(&m->d);
    int C = m->d.C, N = B * T, h16 = m->cdt != MF_DTYPE_F32;
    const int32_t *inp = mf_arena_get(a, m->inputs);
    float *out = BUF(m->res[0]);
    const void *wte = mf_model_tensor_p(m, a, m->t_emb);
    const int32_t *pos = mf_model_doc_pos(m, a);
    if (bd->learned_pos && pos) {
        /* packed documents: each token's learned position is its place in its document */
        const float *wpe = mf_model_tensor_p(m, a, m->t_pos);
        if (h16) mf_embed_forward16(out, inp, wte, m->cdt, N, C);
        else mf_embed_forward(out, inp, wte, N, C);
        mf_pos_embed_add(out, wpe, pos, N, C);
    } else if (bd->learned_pos) {
        const float *wpe = mf_model_tensor_p(m, a, m->t_pos);
        if (h16) mf_encoder_forward16(out, inp, wte, m->cdt, wpe, B, T, C);
        else mf_encoder_forward(out, inp, wte, wpe, B, T, C);
    } else if (m->tensors[m->t_emb].qkind == MF_QUANT_BF16) mf_embed_forward16(out, inp, wte, MF_DTYPE_BF16, N, C);
    else if (h16) mf_embed_forward16(out, inp, wte, m->cdt, N, C);
    else mf_embed_forward(out, inp, wte, N, C);
    if (bd->rope) mf_model_rope_fill(m, a, T);
}

/* Its backward: the embedding's (and positions') gradients from d(res[0])
 * in dres; nothing for a frozen embedding */
void mf_embed_block_backward(mf_model *m, mf_arena *a, int B, int T) {
    if (m->tensors[m->t_emb].frozen) return;
    const int32_t *inp = mf_arena_get(a, m->inputs);
    /* update_in_backward, tied (emb_split): the touched rows live in
     * emb_rows, a slot per distinct token (driver.c), and each position's
     * slot stands in for its token, so the sums run in the same order */
    if (m->emb_split) inp = mf_arena_get(a, m->emb_index);
    float *dres = BUF(m->dres), *dwte = m->emb_split ? BUF(m->emb_rows) : mf_model_tensor_g(m, a, m->t_emb);
    int U = 0, C = m->d.C;
    const int32_t *uniq = NULL;
    if (m->emb_fold) {
        /* grad_dtype bf16: each distinct token gets a slot (in order of
         * first appearance) in the fp32 emb_rows holding its row of the
         * classifier's (bf16) gradient widened; its positions add into the
         * slot in the plain kernel's order, and the slot is rounded back
         * into the bf16 row once (as update_in_backward's emb_split sums) */
        int32_t *map = mf_arena_get(a, m->emb_map), *slot = mf_arena_get(a, m->emb_index);
        int32_t *u = slot + (int64_t)m->B * m->T;
        memset(map, 0xff, (size_t)m->d.Vp * sizeof *map);
        for (int n = 0; n < B * T; n++) {
            if (map[inp[n]] < 0) map[inp[n]] = U, u[U++] = inp[n];
            slot[n] = map[inp[n]];
        }
        dwte = BUF(m->emb_rows);
        uint16_t *g16 = (uint16_t *)mf_model_tensor_g(m, a, m->t_emb);
#pragma omp parallel for schedule(static)
        for (int s = 0; s < U; s++) mf_f32_from_bf16(dwte + (size_t)s * C, g16 + (size_t)u[s] * C, (size_t)C);
        inp = slot, uniq = u;
    }
    const int32_t *pos = mf_model_doc_pos(m, a);
    if (mf_model_block_desc(&m->d)->learned_pos && pos) {
        mf_embed_backward(dwte, dres, inp, B * T, C);
        mf_pos_embed_backward(mf_model_tensor_g(m, a, m->t_pos), dres, pos, B * T, C);
    } else if (mf_model_block_desc(&m->d)->learned_pos)
        mf_encoder_backward(dwte, mf_model_tensor_g(m, a, m->t_pos), dres, inp, B, T, C);
    else mf_embed_backward(dwte, dres, inp, B * T, C);
    if (m->emb_fold) {
        uint16_t *g16 = (uint16_t *)mf_model_tensor_g(m, a, m->t_emb);
#pragma omp parallel for schedule(static)
        for (int s = 0; s < U; s++) mf_bf16_from_f32(g16 + (size_t)uniq[s] * C, dwte + (size_t)s * C, (size_t)C);
    } else if (m->emb_split && m->tensors[m->t_emb].g16) {
        /* the same values the bf16 row would hold: the rows rounded to
         * nearest-even as emb_fold rounds them (update_in_backward then
         * gives the plain step's weights bit for bit) */
        size_t n = (size_t)m->emb_nuniq * C;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < n; k++) dwte[k] = mf_bf16_to_f32(mf_f32_to_bf16(dwte[k]));
    }
}

/* ---- norm: LayerNorm (weight, bias; keeps mean and rstd; Ba et al.
 * 2016) | RMSNorm (weight; keeps rstd; Zhang & Sennrich 2019), the
 * description's, for the blocks and the final norm alike. out is 16-bit
 * when dt is (a GEMM reads it), else fp32. mean, b: NULL for RMSNorm. */
void mf_norm_forward(const mf_model *m, mf_dtype dt, void *out, float *mean, float *rstd, const float *x,
                     const float *w, const float *b, int N) {
    int C = m->d.C;
    if (mf_model_block_desc(&m->d)->norm == MF_NORM_LAYERNORM) {
        if (dt != MF_DTYPE_F32) mf_layernorm_forward16(out, dt, mean, rstd, x, w, b, N, C);
        else mf_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    } else if (dt != MF_DTYPE_F32) mf_rmsnorm_forward16(out, dt, rstd, x, w, N, C, m->d.eps);
    else mf_rmsnorm_forward(out, rstd, x, w, N, C, m->d.eps);
}

/* dx (+=) from dout (the fp32 gradient of the norm's output); dw, db
 * accumulate */
void mf_norm_backward(const mf_model *m, float *dx, float *dw, float *db, const float *dout, const float *x,
                      const float *w, const float *mean, const float *rstd, int N) {
    if (mf_model_block_desc(&m->d)->norm == MF_NORM_LAYERNORM)
        mf_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, m->d.C);
    else mf_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, m->d.C);
}

#define BUFO(id) ((id) >= 0 ? BUF(id) : NULL)
/* a block's norm ln (0: before attention, 1: before the MLP) */
static void norm_fwd(mf_model *m, mf_arena *a, const lin_ctx *c, int l, int ln, void *out, int mean, int rstd,
                     const float *x, int N) {
    int w = ln ? MF_LT_LN2 : MF_LT_LN1, b = ln ? MF_LT_LN2B : MF_LT_LN1B;
    mf_norm_forward(m, c->dt, out, BUFO(mean), BUF(rstd), x, LP(l, w), LPO(l, b), N);
}

static void norm_bwd(mf_model *m, mf_arena *a, int l, int ln, float *dx, const float *dout, const float *x, int mean,
                     int rstd, int N) {
    int w = ln ? MF_LT_LN2 : MF_LT_LN1, b = ln ? MF_LT_LN2B : MF_LT_LN1B;
    mf_norm_backward(m, dx, LG(l, w), LGO(l, b), dout, x, LP(l, w), BUFO(mean), BUF(rstd), N);
}

/* ---- attention: RoPE (when the description has it) on the q and k heads
 * of the projected rows, then causal FlashAttention (Dao 2022): MHA is GQA
 * with NKV == NH; only the output and each row's log-sum-exp are kept, the
 * T x T scores are recomputed tile by tile in backward. Positions are
 * 0..T-1 in every sequence, or, for packed documents (the plan's data.pos
 * row), each token's place in its document: RoPE takes those positions and
 * attention stays inside each document (block-diagonal causal mask). In
 * bf16 precision the tile products are bf16 too (vdpbf16ps, where the CPU
 * has it: mf_flash_attention_bf16_forward). */
static void attn_fwd(mf_model *m, mf_arena *a, const lin_ctx *c, const mf_layer_acts *A, int B, int T) {
    const mf_dims *d = &m->d;
    float *qkv = BUF(A->qkv);
    const int32_t *pos = mf_model_doc_pos(m, a);  /* packed documents, or NULL */
    if (c->bd->rope) mf_rope_apply(qkv, BUF(m->rope), pos, B, T, d->NH, d->NKV, d->hd, 0);
    if (c->dt == MF_DTYPE_BF16)
        mf_flash_attention_bf16_forward(BUF(A->atty), BUF(A->lse), qkv, B, T, d->NH, d->NKV, d->hd, d->window, pos);
    else mf_flash_attention_doc_forward(BUF(A->atty), BUF(A->lse), qkv, B, T, d->NH, d->NKV, d->hd, d->window, pos);
}

/* dqkv (overwritten) from d(atty) in dout; dq and dk rotated back */
static void attn_bwd(mf_model *m, mf_arena *a, const lin_ctx *c, const mf_layer_acts *A, float *dqkv,
                     const float *dout, int B, int T) {
    const mf_dims *d = &m->d;
    const int32_t *pos = mf_model_doc_pos(m, a);
    if (c->dt == MF_DTYPE_BF16)
        mf_flash_attention_bf16_backward(dqkv, BUF(m->attn_scratch), dout, BUF(A->atty), BUF(A->qkv), BUF(A->lse), B,
                                         T, d->NH, d->NKV, d->hd, d->window, pos);
    else mf_flash_attention_doc_backward(dqkv, BUF(m->attn_scratch), dout, BUF(A->atty), BUF(A->qkv), BUF(A->lse), B,
                                         T, d->NH, d->NKV, d->hd, d->window, pos);
    if (c->bd->rope) mf_rope_apply(dqkv, BUF(m->rope), pos, B, T, d->NH, d->NKV, d->hd, 1);
}

/* the attention projections' column offsets in a qkv row: q | k | v
 * (GPT-2's c_attn writes all three at once) */
static int qkv_off(const mf_model *m, int lt) {
    int AO = m->d.NH * m->d.hd, KV = m->d.NKV * m->d.hd;
    return lt == MF_LT_Q ? 0 : lt == MF_LT_K ? AO : AO + KV;
}

/* ---- MLP activation: h = gelu(fch) | silu(gate) * up; 16-bit h in
 * 16-bit precision. Backward: GELU's d(fch) in dh's own row; SwiGLU's
 * d(gate) and d(up) overwrite the gate and up rows (their last reader). */
static void act_fwd(mf_arena *a, const lin_ctx *c, const mf_layer_acts *A, void *h, size_t n) {
    float *fch = BUF(A->fch);
    if (c->bd->mlp != MF_MLP_GELU) {  /* SwiGLU: a Llama's MLP, Qwen2-MoE's shared expert */
        if (c->h16) mf_swiglu_forward16(h, c->dt, fch, BUF(A->up), n);
        else mf_swiglu_forward(h, fch, BUF(A->up), n);
    } else if (c->h16) mf_gelu_forward16(h, c->dt, fch, n);
    else mf_gelu_forward(h, fch, n);
}

void mf_block_forward(mf_model *m, mf_arena *a, int l, int B, int T, int recompute, int write_out) {
    const mf_dims *d = &m->d;
    /* I: the dense MLP's width (a mixture's: its shared expert's, Qwen2-MoE; 0: none) */
    int C = d->C, N = B * T, AO = d->NH * d->hd, QKV = (d->NH + 2 * d->NKV) * d->hd;
    int I = mf_model_block_desc(d)->mlp == MF_MLP_MOE ? d->shared_ffn : d->ffn;
    const mf_layer_acts *A = recompute ? &m->racts[l] : &m->acts[l];
    const int *res = recompute ? m->rres : m->res;
    lin_ctx c = lin_ctx_of(m, a);
    /* GPT-2 in fp32 without adapters: the fused bias/residual epilogues */
    int fused = c.bd->fused_fp32 && !c.h16 && !m->lora.r && !m->lora.base;  /* (a quantised teacher or model: lora.base, no adapters) */
    int moe = c.bd->mlp == MF_MLP_MOE && !I;  /* no dense MLP rows */
    float *x = BUF(res[l]), *xmid = BUF(A->xmid), *fch = moe ? NULL : BUF(A->fch);
    void *ln1 = mf_arena_get(a, A->ln1), *ln2 = mf_arena_get(a, A->ln2), *h = moe ? NULL : mf_model_mlp_out(m, a, A);
    norm_fwd(m, a, &c, l, 0, ln1, A->ln1_mean, A->ln1_rstd, x, N);
    static const int qkv_lt[3] = {MF_LT_Q, MF_LT_K, MF_LT_V};
    for (int i = 0; i < 3; i++)
        if (m->lt[qkv_lt[i]] >= 0)
            proj_fwd(m, a, &c, l, qkv_lt[i], BUF(A->qkv) + qkv_off(m, qkv_lt[i]), QKV, ln1, NULL, 0, N);
    attn_fwd(m, a, &c, A, B, T);
    if (fused) {
        /* xmid = atty Wo (beta 0), then one pass per row adds the residual
         * and the bias and computes ln_2 while the row is in cache */
        proj_fwd(m, a, &c, l, MF_LT_O, xmid, C, BUF(A->atty), NULL, 1, N);
        mf_residual_layernorm_forward(xmid, ln2, BUF(A->ln2_mean), BUF(A->ln2_rstd), x, LP(l, MF_LT_OB),
                                      LP(l, MF_LT_LN2), LP(l, MF_LT_LN2B), N, C);
        /* fch = ln2 W1 (beta 0), then its bias and the GELU in one pass */
        proj_fwd(m, a, &c, l, MF_LT_GATE, fch, I, ln2, NULL, 1, N);
        mf_bias_gelu_forward(h, fch, LP(l, MF_LT_GATEB), N, I);
        if (!write_out) return;
        float *out = BUF(res[l + 1]);
        proj_fwd(m, a, &c, l, MF_LT_DOWN, out, C, h, NULL, 1, N);
        mf_residual_forward(out, xmid, LP(l, MF_LT_DOWNB), N, C);
        return;
    }
    const void *ain = BUF(A->atty);
    if (c.h16) {  /* the attention output stays fp32 (its backward reads it); Wo reads it rounded */
        mf_half_from_f32(c.dt, mf_arena_get(a, m->in16), BUF(A->atty), (size_t)N * AO);
        ain = mf_arena_get(a, m->in16);
    }
    proj_fwd(m, a, &c, l, MF_LT_O, xmid, C, ain, x, 0, N);
    norm_fwd(m, a, &c, l, 1, ln2, A->ln2_mean, A->ln2_rstd, xmid, N);
    if (c.bd->mlp == MF_MLP_MOE) {
        float *out = write_out ? BUF(res[l + 1]) : NULL;
        mf_moe_block_forward(m, a, l, A, ln2, xmid, out, N, recompute);
        if (!I) return;
        /* Qwen2-MoE: out += sigmoid(ln2 . shared_expert_gate) * shared_expert(ln2) */
        proj_fwd(m, a, &c, l, MF_LT_GATE, fch, I, ln2, NULL, 0, N);
        proj_fwd(m, a, &c, l, MF_LT_UP, BUF(A->up), I, ln2, NULL, 0, N);
        act_fwd(a, &c, A, h, (size_t)N * I);
        proj_fwd(m, a, &c, l, MF_LT_DOWN, BUF(A->sh_y), C, h, NULL, 0, N);
        mf_moe_shared_gate_forward(out, BUF(A->sh_s), BUF(A->sh_y), ln2, LP(l, MF_LT_SHGATE), N, C);
        return;
    }
    proj_fwd(m, a, &c, l, MF_LT_GATE, fch, I, ln2, NULL, 0, N);
    if (m->lt[MF_LT_UP] >= 0) proj_fwd(m, a, &c, l, MF_LT_UP, BUF(A->up), I, ln2, NULL, 0, N);
    act_fwd(a, &c, A, h, (size_t)N * I);
    if (!write_out) return;
    proj_fwd(m, a, &c, l, MF_LT_DOWN, BUF(res[l + 1]), C, h, xmid, 0, N);
}

void mf_block_backward(mf_model *m, mf_arena *a, int l, int B, int T) {
    const mf_dims *d = &m->d;
    int C = d->C, N = B * T, AO = d->NH * d->hd, QKV = (d->NH + 2 * d->NKV) * d->hd;
    int I = mf_model_block_desc(d)->mlp == MF_MLP_MOE ? d->shared_ffn : d->ffn;  /* as in forward */
    const mf_layer_acts *A = &m->racts[l];
    lin_ctx c = lin_ctx_of(m, a);
    int moe = c.bd->mlp == MF_MLP_MOE && !I, shared = c.bd->mlp == MF_MLP_MOE && I;
    float *x = BUF(m->rres[l]), *xmid = BUF(A->xmid), *fch = moe ? NULL : BUF(A->fch);
    void *ln1 = mf_arena_get(a, A->ln1), *ln2 = mf_arena_get(a, A->ln2), *h = moe ? NULL : mf_model_mlp_out(m, a, A);
    if (m->recompute.policy == MF_RECOMPUTE_SELECTIVE) {
        /* rebuild the element-wise outputs from the kept inputs (the same
         * kernels on the same inputs: bit-identical to the forward's) */
        norm_fwd(m, a, &c, l, 0, ln1, A->ln1_mean, A->ln1_rstd, x, N);
        norm_fwd(m, a, &c, l, 1, ln2, A->ln2_mean, A->ln2_rstd, xmid, N);
        if (!moe) act_fwd(a, &c, A, h, (size_t)N * I);
    }
    float *dres = BUF(m->dres), *dln = BUF(m->dln), *dbig = moe ? NULL : BUF(m->dbig), *dqkv = BUF(m->dqkv);
    /* MLP: out = xmid + act(ln2 W1 [, ln2 Wup]) W2. h may live in dbig
     * itself: the projection reads it for dW2 before dh overwrites it. */
    if (moe || shared) mf_moe_block_backward(m, a, l, A, ln2, N);  /* d(ln2) into dln */
    if (shared) {
        /* Qwen2-MoE's shared expert: the gate's part of d(ln2) into dln, and
         * d(its output) into sh_y's row; then its SwiGLU adds to dln */
        float *shy = BUF(A->sh_y);
        mf_moe_shared_gate_backward(dln, LG(l, MF_LT_SHGATE), shy, BUF(A->sh_s), dres, ln2, LP(l, MF_LT_SHGATE), N, C);
        proj_bwd(m, a, &c, l, MF_LT_DOWN, dbig, 0.0f, shy, C, h, N);
        float *up = BUF(A->up);
        mf_swiglu_backward(fch, up, dbig, fch, up, (size_t)N * I);
        proj_bwd(m, a, &c, l, MF_LT_GATE, dln, 1.0f, fch, I, ln2, N);
        proj_bwd(m, a, &c, l, MF_LT_UP, dln, 1.0f, up, I, ln2, N);
    } else if (!moe) proj_bwd(m, a, &c, l, MF_LT_DOWN, dbig, 0.0f, dres, C, h, N);
    if (moe || shared) {
    } else if (c.bd->mlp == MF_MLP_SWIGLU) {
        float *up = BUF(A->up);
        mf_swiglu_backward(fch, up, dbig, fch, up, (size_t)N * I);
        proj_bwd(m, a, &c, l, MF_LT_GATE, dln, 0.0f, fch, I, ln2, N);
        proj_bwd(m, a, &c, l, MF_LT_UP, dln, 1.0f, up, I, ln2, N);
    } else if (!fc_bwd_bf16(m, a, &c, l, dln, fch, dbig, ln2, N)) {
        mf_gelu_backward(dbig, fch, dbig, (size_t)N * I);
        proj_bwd(m, a, &c, l, MF_LT_GATE, dln, 0.0f, dbig, I, ln2, N);
    }
    norm_bwd(m, a, l, 1, dres, dln, xmid, A->ln2_mean, A->ln2_rstd, N);
    /* attention: xmid = x + attn(qkv(ln1)) Wo; d(atty) in dln */
    const void *ain = BUF(A->atty);
    if (c.h16) {
        mf_half_from_f32(c.dt, mf_arena_get(a, m->in16), BUF(A->atty), (size_t)N * AO);
        ain = mf_arena_get(a, m->in16);
    }
    proj_bwd(m, a, &c, l, MF_LT_O, dln, 0.0f, dres, C, ain, N);
    attn_bwd(m, a, &c, A, dqkv, dln, B, T);
    static const int qkv_lt[3] = {MF_LT_Q, MF_LT_K, MF_LT_V};
    for (int i = 0, first = 1; i < 3; i++)
        if (m->lt[qkv_lt[i]] >= 0) {
            proj_bwd(m, a, &c, l, qkv_lt[i], dln, first ? 0.0f : 1.0f, dqkv + qkv_off(m, qkv_lt[i]), QKV, ln1, N);
            first = 0;
        }
    norm_bwd(m, a, l, 0, dres, dln, x, A->ln1_mean, A->ln1_rstd, N);
}
