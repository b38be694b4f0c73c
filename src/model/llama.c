/* The Llama block (Llama 2/3, Qwen2, Mistral, SmolLM2, TinyLlama), fp32:
 *
 *   ln1  = RMSNorm(x)                                   (N,C)   rstd (N)
 *   qkv  = [ln1 Wq^T + bq | ln1 Wk^T + bk | ln1 Wv^T + bv] (N,QKV), then RoPE on q, k
 *   atty = GQA attention(qkv), causal, optional window     (N,AO)  lse (B,NH,T)
 *   xmid = x + atty Wo^T                                 (N,C)
 *   ln2  = RMSNorm(xmid)                                 (N,C)   rstd (N)
 *   gate = ln2 Wg^T, up = ln2 Wu^T                       (N,I) each
 *   h    = silu(gate) * up                               (N,I)
 *   out  = xmid + h Wd^T                                 (N,C)
 *
 * Weights are nn.Linear (out, in), as Hugging Face stores them, so every
 * product is y = x W^T: the GEMMs take W transposed instead of the files
 * being rewritten. q, k and v are three tensors (three GEMMs writing
 * column ranges of one qkv row), so HF names, LoRA targets and ZeRO shards
 * stay one per tensor. The activation rows (fields of mf_layer_acts) are
 * GPT-2's: fch is the gate, fch_gelu h, up the up projection; the plan
 * (gpt2.c) sizes them from the dims. RoPE is applied in place after the q/k
 * GEMMs, so qkv is kept rotated (what attention's backward needs); the
 * backward rotates dq and dk back before the projections' backward.
 */
#include "internal.h"

#include "memfit/half.h"
#include "memfit/quant.h"

#include <omp.h>
#include <string.h>

#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define LP(l, k) (void *)mf_model_tensor_p(m, a, m->t_layer0 + (l) * m->nlt + m->lt[k])
#define LG(l, k) mf_model_tensor_g(m, a, m->t_layer0 + (l) * m->nlt + m->lt[k])
/* an optional tensor (the q/k/v biases) */
#define LPO(l, k) (m->lt[k] >= 0 ? LP(l, k) : NULL)
#define LGO(l, k) (m->lt[k] >= 0 ? LG(l, k) : NULL)

/* A block's GEMMs in the run's precision. fp32: operands as they are,
 * through mf_sgemm. 16-bit (bf16): the activations GEMMs read are stored
 * 16-bit (ln1, ln2, h; the attention output is rounded into in16), the
 * weights are 16-bit compute copies, and each output gradient is rounded
 * into d16 before its two products; accumulation, outputs, bias sums and
 * gradients stay fp32 (docs/precision.md). */
typedef struct {
    int h16;
    mf_dtype dt;
    void *gs, *d16;  /* the planned GEMM scratch and rounded-gradient rows */
    size_t gb;
} lin_ctx;

static lin_ctx lin_ctx_of(mf_model *m, mf_arena *a) {
    lin_ctx c = {m->cdt != MF_DTYPE_F32, m->cdt, NULL, NULL, 0};
    if (c.h16) {
        c.gs = mf_arena_get(a, m->gemm_scratch), c.gb = m->gemm_scratch_bytes;
        if (m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m)) c.d16 = mf_arena_get(a, m->dout16);
    }
    return c;
}

/* y (N rows of ldy; OC columns written) = beta * y + x (N,K) W^T + bias,
 * W (OC,K) */
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
static void lin_bwd(const lin_ctx *c, float *dx, float beta, float *dW, float *db, const float *dy, int ldy,
                    const void *x, const void *W, int N, int K, int OC) {
    if (c->h16) {
        uint16_t *d16 = c->d16;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) mf_half_from_f32(c->dt, d16 + (size_t)n * OC, dy + (size_t)n * ldy, (size_t)OC);
        if (dW) mf_gemm16(c->dt, dW, d16, x, NULL, OC, K, N, 1, 0, 1, c->gs, c->gb);
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

/* The block's seven projections: the weight's MF_LT_* slot, its bias slot,
 * its LoRA target. */
static const int lt_bias[MF_LT_COUNT] = {-1, MF_LT_QB, -1, MF_LT_KB, -1, MF_LT_VB, -1, -1, -1, -1, -1, -1};
static const int lt_lora[MF_LT_COUNT] = {-1, MF_LORA_Q_PROJ, -1, MF_LORA_K_PROJ, -1, MF_LORA_V_PROJ, -1,
                                         MF_LORA_O_PROJ, -1, MF_LORA_GATE_PROJ, MF_LORA_UP_PROJ, MF_LORA_DOWN_PROJ};

/* the quantised base's GEMM scratch for the phase we are in */
static void *quant_scratch(mf_model *m, mf_arena *a) {
    return mf_arena_get(a, m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m) ? m->qscr_b : m->qscr_f);
}

/* Projection lt of layer l: y (ldy) = beta * y + x W^T + b, then its LoRA
 * adapter's output added; W plain (lin_fwd) or a quantised frozen base. */
static void proj_fwd(mf_model *m, mf_arena *a, const lin_ctx *c, int l, int lt, float *y, int ldy, const void *x,
                     int N, float beta) {
    int in, out, k = lt_lora[lt];
    mf_model_lora_dims(&m->d, k, &in, &out);
    const mf_tensor *w = &m->tensors[m->t_layer0 + l * m->nlt + m->lt[lt]];
    const float *bias = lt_bias[lt] >= 0 ? LPO(l, lt_bias[lt]) : NULL;
    if (w->qkind)
        mf_quant_linear_forward(y, ldy, x, LP(l, lt), bias, N, in, out, beta, (mf_quant_kind)w->qkind,
                                quant_scratch(m, a));
    else lin_fwd(c, y, ldy, x, LP(l, lt), bias, N, in, out, beta);
    if (m->lora.r) mf_lora_layer_forward_ld(m, a, l, k, x, y, ldy, N);
}

/* Its backward: the adapter's parameter gradients first (x may share dx's
 * buffer), then dx (beta: 0 overwrite, 1 accumulate) = dy W, dW and db
 * where the base is trained, then the adapter's part of dx. */
static void proj_bwd(mf_model *m, mf_arena *a, const lin_ctx *c, int l, int lt, float *dx, float beta,
                     const float *dy, int ldy, const void *x, int N) {
    int in, out, k = lt_lora[lt];
    mf_model_lora_dims(&m->d, k, &in, &out);
    const mf_tensor *w = &m->tensors[m->t_layer0 + l * m->nlt + m->lt[lt]];
    if (m->lora.r) mf_lora_layer_backward_params_ld(m, a, l, k, dy, ldy, x, N);
    if (w->qkind) {
        if (beta == 0.0f) memset(dx, 0, (size_t)N * in * sizeof(float));
        mf_quant_linear_backward_input(dx, dy, ldy, LP(l, lt), N, in, out, (mf_quant_kind)w->qkind,
                                       quant_scratch(m, a));
    } else
        lin_bwd(c, dx, beta, LG(l, lt), lt_bias[lt] >= 0 ? LGO(l, lt_bias[lt]) : NULL, dy, ldy, x, LP(l, lt), N, in,
                out);
    if (m->lora.r) mf_lora_layer_backward_input(m, a, l, k, dx, N);
}

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

void mf_llama_rope_fill(mf_model *m, mf_arena *a, int T) {
    if (m->rope_filled == T) return;  /* the table for T positions is already there */
    mf_rope_table(BUF(m->rope), T, m->d.hd, m->d.rope_theta, &m->d.rope);
    m->rope_filled = T;
}

void mf_llama_block_forward(mf_model *m, mf_arena *a, int l, int B, int T, int recompute, int write_out) {
    const mf_dims *d = &m->d;
    int C = d->C, N = B * T, AO = d->NH * d->hd, KV = d->NKV * d->hd, QKV = AO + 2 * KV, I = d->ffn;
    const mf_layer_acts *A = recompute ? &m->racts[l] : &m->acts[l];
    const int *res = recompute ? m->rres : m->res;
    lin_ctx c = lin_ctx_of(m, a);
    float *x = BUF(res[l]), *qkv = BUF(A->qkv), *atty = BUF(A->atty);
    void *ln1 = mf_arena_get(a, A->ln1), *ln2 = mf_arena_get(a, A->ln2), *h = mf_model_mlp_out(m, a, A);
    if (c.h16) mf_rmsnorm_forward16(ln1, c.dt, BUF(A->ln1_rstd), x, LP(l, MF_LT_LN1), N, C, d->eps);
    else mf_rmsnorm_forward(ln1, BUF(A->ln1_rstd), x, LP(l, MF_LT_LN1), N, C, d->eps);
    proj_fwd(m, a, &c, l, MF_LT_Q, qkv, QKV, ln1, N, 0.0f);
    proj_fwd(m, a, &c, l, MF_LT_K, qkv + AO, QKV, ln1, N, 0.0f);
    proj_fwd(m, a, &c, l, MF_LT_V, qkv + AO + KV, QKV, ln1, N, 0.0f);
    /* packed documents (pos != NULL): positions restart at each document */
    const int32_t *pos = mf_model_doc_pos(m, a);
    mf_rope_apply(qkv, BUF(m->rope), pos, B, T, d->NH, d->NKV, d->hd, 0);
    mf_flash_attention_doc_forward(atty, BUF(A->lse), qkv, B, T, d->NH, d->NKV, d->hd, d->window, pos);
    float *xmid = BUF(A->xmid);
    memcpy(xmid, x, (size_t)N * C * sizeof(float));
    const void *ain = atty;
    if (c.h16) {  /* the attention output stays fp32 (its backward reads it); o_proj reads it rounded */
        mf_half_from_f32(c.dt, mf_arena_get(a, m->in16), atty, (size_t)N * AO);
        ain = mf_arena_get(a, m->in16);
    }
    proj_fwd(m, a, &c, l, MF_LT_O, xmid, C, ain, N, 1.0f);
    float *gate = BUF(A->fch), *up = BUF(A->up);
    if (c.h16) mf_rmsnorm_forward16(ln2, c.dt, BUF(A->ln2_rstd), xmid, LP(l, MF_LT_LN2), N, C, d->eps);
    else mf_rmsnorm_forward(ln2, BUF(A->ln2_rstd), xmid, LP(l, MF_LT_LN2), N, C, d->eps);
    proj_fwd(m, a, &c, l, MF_LT_GATE, gate, I, ln2, N, 0.0f);
    proj_fwd(m, a, &c, l, MF_LT_UP, up, I, ln2, N, 0.0f);
    if (c.h16) mf_swiglu_forward16(h, c.dt, gate, up, (size_t)N * I);
    else mf_swiglu_forward(h, gate, up, (size_t)N * I);
    if (!write_out) return;
    float *out = BUF(res[l + 1]);
    memcpy(out, xmid, (size_t)N * C * sizeof(float));
    proj_fwd(m, a, &c, l, MF_LT_DOWN, out, C, h, N, 1.0f);
}

void mf_llama_block_backward(mf_model *m, mf_arena *a, int l, int B, int T) {
    const mf_dims *d = &m->d;
    int C = d->C, N = B * T, AO = d->NH * d->hd, KV = d->NKV * d->hd, QKV = AO + 2 * KV, I = d->ffn;
    const mf_layer_acts *A = &m->racts[l];
    lin_ctx c = lin_ctx_of(m, a);
    float *x = BUF(m->rres[l]), *gate = BUF(A->fch), *up = BUF(A->up);
    void *ln1 = mf_arena_get(a, A->ln1), *ln2 = mf_arena_get(a, A->ln2), *h = mf_model_mlp_out(m, a, A);
    if (m->recompute.policy == MF_RECOMPUTE_SELECTIVE) {
        /* rebuild the element-wise outputs from the kept inputs (the same
         * kernels on the same inputs: bit-identical to the forward's) */
        if (c.h16) {
            mf_rmsnorm_forward16(ln1, c.dt, BUF(A->ln1_rstd), x, LP(l, MF_LT_LN1), N, C, d->eps);
            mf_rmsnorm_forward16(ln2, c.dt, BUF(A->ln2_rstd), BUF(A->xmid), LP(l, MF_LT_LN2), N, C, d->eps);
            mf_swiglu_forward16(h, c.dt, gate, up, (size_t)N * I);
        } else {
            mf_rmsnorm_forward(ln1, BUF(A->ln1_rstd), x, LP(l, MF_LT_LN1), N, C, d->eps);
            mf_rmsnorm_forward(ln2, BUF(A->ln2_rstd), BUF(A->xmid), LP(l, MF_LT_LN2), N, C, d->eps);
            mf_swiglu_forward(h, gate, up, (size_t)N * I);
        }
    }
    float *dres = BUF(m->dres), *dln = BUF(m->dln), *dbig = BUF(m->dbig), *dqkv = BUF(m->dqkv);
    /* MLP: out = xmid + (silu(gate) * up) Wd^T. h may live in dbig itself:
     * lin_bwd reads it for dWd before dh overwrites it. dgate and dup then
     * overwrite the gate and up rows (their last reader is this step). */
    proj_bwd(m, a, &c, l, MF_LT_DOWN, dbig, 0.0f, dres, C, h, N);
    mf_swiglu_backward(gate, up, dbig, gate, up, (size_t)N * I);
    proj_bwd(m, a, &c, l, MF_LT_GATE, dln, 0.0f, gate, I, ln2, N);
    proj_bwd(m, a, &c, l, MF_LT_UP, dln, 1.0f, up, I, ln2, N);
    mf_rmsnorm_backward(dres, LG(l, MF_LT_LN2), dln, BUF(A->xmid), LP(l, MF_LT_LN2), BUF(A->ln2_rstd), N, C);
    /* attention: xmid = x + attn(rope(ln1 Wqkv^T)) Wo^T; d(atty) in dln */
    const void *ain = BUF(A->atty);
    if (c.h16) {
        mf_half_from_f32(c.dt, mf_arena_get(a, m->in16), BUF(A->atty), (size_t)N * AO);
        ain = mf_arena_get(a, m->in16);
    }
    proj_bwd(m, a, &c, l, MF_LT_O, dln, 0.0f, dres, C, ain, N);
    const int32_t *pos = mf_model_doc_pos(m, a);
    mf_flash_attention_doc_backward(dqkv, BUF(m->attn_scratch), dln, BUF(A->atty), BUF(A->qkv), BUF(A->lse), B, T,
                                    d->NH, d->NKV, d->hd, d->window, pos);
    mf_rope_apply(dqkv, BUF(m->rope), pos, B, T, d->NH, d->NKV, d->hd, 1);
    proj_bwd(m, a, &c, l, MF_LT_Q, dln, 0.0f, dqkv, QKV, ln1, N);
    proj_bwd(m, a, &c, l, MF_LT_K, dln, 1.0f, dqkv + AO, QKV, ln1, N);
    proj_bwd(m, a, &c, l, MF_LT_V, dln, 1.0f, dqkv + AO + KV, QKV, ln1, N);
    mf_rmsnorm_backward(dres, LG(l, MF_LT_LN1), dln, x, LP(l, MF_LT_LN1), BUF(A->ln1_rstd), N, C);
}
