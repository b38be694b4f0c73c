/* The model driver, the same for every family: initialisation, and a
 * step's forward and backward over the pieces of blocks.c (the embedding
 * block, the L transformer blocks with their recompute policy, the final
 * norm) and the head (the embedding tied, or lm_head) with its chunked
 * loss: logits, the loss and the classifier's backward a chunk of rows at
 * a time. ZeRO 3 gathers and prefetches each block's parameters for the
 * phase that starts; update_in_backward hands each completed gradient to
 * the optimizer. The plan is plan.c's; the phases are listed there. */
#include "internal.h"
#include "dist/dist.h"
#include "memfit/distill.h"
#include "kernels/half.h"
#include "memfit/kernels.h"
#include "quant/quant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

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

int mf_tensor_keep32(const char *name) { return strstr(name, ".block_sparse_moe.gate.") != NULL; }

int mf_tensor_is16(const mf_model *m, const mf_tensor *t) {
    /* LoRA adapters stay fp32 under 16-bit compute (docs/lora.md), and so
     * does a mixture's router (docs/moe.md) */
    return m->cdt != MF_DTYPE_F32 && t->ndim == 2 && t->role != MF_ROLE_POS && !t->lora && !mf_tensor_keep32(t->name);
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
            /* expert parallel: the whole stack's draws, this rank's experts kept */
            int64_t full = t->ep_full > 0 ? t->ep_full : t->numel, e0 = t->ep_full > 0 ? t->ep_lo : 0;
            for (int64_t k = 0; k < full; k++) {
                float v = std * mf_rng_normal(&rng);
                if (k - e0 >= lo && k - e0 < hi) put_w(m, t, p, k - e0, v);
            }
        }
        if (t->role == MF_ROLE_EMB || t->role == MF_ROLE_HEAD) /* padding rows stay zero */
            for (int64_t k = t->rows_file * t->shape[1]; k < t->numel; k++)
                if (k >= lo && k < hi) put_w(m, t, p, k, 0.0f);
        mf_model_sync_params(m, a, i, 1);
        if (t->g >= 0) memset(mf_arena_ptr(a, t->g), 0, (size_t)t->gnumel * (t->g16 ? 2 : sizeof(float)));
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
        if (m->tensors[i].g >= 0)
            memset(mf_arena_get(a, m->tensors[i].g), 0, (size_t)m->tensors[i].gnumel * (m->tensors[i].g16 ? 2 : sizeof(float)));
}

/* The step's gradient zeroing: every tensor's gradient (unless they are
 * transient) and ZeRO shard split between the threads, each thread one
 * contiguous part of each buffer, in one parallel region (one thread's
 * memset reached ~25 ms of a 2.8 s smollm2-135m step). */
void mf_model_zero_grads(mf_model *m, mf_arena *a) {
    const int all = !mf_model_grads_transient(m);
    for (int i = 0; i < m->n_tensors; i++) { /* the ledger's bookkeeping, on this thread */
        if (all && m->tensors[i].g >= 0) mf_arena_get(a, m->tensors[i].g);
        if (m->tensors[i].gs >= 0) mf_arena_get(a, m->tensors[i].gs);
    }
#pragma omp parallel
    {
        const size_t nt = (size_t)omp_get_num_threads(), th = (size_t)omp_get_thread_num();
        for (int i = 0; i < m->n_tensors; i++) {
            const mf_tensor *t = &m->tensors[i];
            for (int s = 0; s < 2; s++) {
                int id = s ? t->gs : all ? t->g : -1;
                if (id < 0) continue;
                /* a bf16 gradient row (grad_dtype bf16: g16) has 2-byte elements; shards are fp32 */
                size_t n = s ? (size_t)(t->hi - t->lo) : (size_t)t->gnumel, lo = n * th / nt, hi = n * (th + 1) / nt;
                size_t es = !s && t->g16 ? 2 : sizeof(float);
                if (hi > lo) memset((char *)mf_arena_ptr(a, id) + lo * es, 0, (hi - lo) * es);
            }
        }
    }
}

/* update_in_backward: tensors [first, first+n) start their gradient in
 * this phase (zero it) or finish it (hand it to the optimizer) */
static void grads_start(mf_model *m, mf_arena *a, int first, int n) {
    if (mf_model_grads_transient(m)) zero_g(m, a, first, n);
}
static void grads_done(mf_model *m, int first, int n) {
    /* ZeRO 0-1's overlap: the last micro-batch's complete gradients too */
    if ((mf_model_grads_transient(m) || (m->overlap && m->grads_final)) && m->grads_ready) m->grads_ready(m->grads_ctx, first, n);
}

/* ---- forward --------------------------------------------------------- */

#define BUF(id) ((float *)mf_arena_get(a, (id)))
#define tensor_p mf_model_tensor_p
#define tensor_g mf_model_tensor_g

/* Tensor i's gradient (NULL for a frozen base weight under LoRA). */
float *mf_model_tensor_g(mf_model *m, mf_arena *a, int i) {
    return m->tensors[i].g >= 0 ? mf_arena_get(a, m->tensors[i].g) : NULL;
}

/* Tensor i's parameters; under ZeRO 3 the row gathered for this phase
 * (backward has its own). */
float *mf_model_tensor_p(mf_model *m, mf_arena *a, int i) {
    const mf_tensor *x = &m->tensors[i];
    return mf_arena_get(a, x->pb >= 0 && a->phase >= mf_phase_head_bwd(m) ? x->pb : x->p);
}

/* ZeRO 3: gathers tensors [first, first+n) for the phase that starts, or
 * waits for the prefetch that gathers them (only: the gradient reduction
 * queued behind it keeps running) */
static void params_need(mf_model *m, mf_arena *a, int first, int n) {
    if (m->tensors[first].ps < 0 || m->comm_err) return;
    int rc = m->pf_first == first ? mf_dist_prefetch_wait() : mf_zero_params_needed(m, a, first, n);
    m->pf_first = -1;
    if (rc) m->comm_err = 1;
}

/* ZeRO 3: starts gathering block l's parameters (for the next phase: the
 * block above in forward, below in backward) while this phase computes */
static void params_prefetch(mf_model *m, mf_arena *a, int l) {
    int first = m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt;
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
    if (!recompute) {
        mf_arena_phase(a, mf_phase_layer_fwd(m, l));
        params_need(m, a, m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt, m->nlt);
        params_prefetch(m, a, l + 1);
    }
    sgemm_scratch(m, a);
    mf_block_forward(m, a, l, B, T, recompute, write_out);
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
    if (m->gemm_scratch >= 0 && mf_model_gemm_scratch_need(m, (int)N) > m->gemm_scratch_bytes) return 0;
    if (m->qscr_f >= 0 && mf_model_quant_scratch_need(m, (int)N) > m->qscr_bytes) return 0;
    return 1;
}

/* update_in_backward with a tied embedding (emb_split): the head's part of
 * the gradient is complete. Each distinct input token gets a slot in
 * emb_rows (in order of first appearance), its row of the head's gradient
 * moves there (and is zeroed in the full gradient), and the optimizer
 * updates every other row now (stage 1); the full gradient then dies. */
static void emb_split_head(mf_model *m, mf_arena *a, int N) {
    int C = m->d.C;
    const int32_t *inp = mf_arena_get(a, m->inputs);
    int32_t *map = mf_arena_get(a, m->emb_map), *slot = mf_arena_get(a, m->emb_index);
    int32_t *uniq = slot + (int64_t)m->B * m->T;  /* the planned rows: the second half of emb_index */
    float *g = tensor_g(m, a, WTE), *rows = BUF(m->emb_rows);
    memset(map, 0xff, (size_t)m->d.Vp * sizeof *map);
    int U = 0;
    for (int n = 0; n < N; n++) {
        int32_t tok = inp[n];
        if (map[tok] < 0) {
            map[tok] = U;
            uniq[U] = tok;
            if (m->tensors[WTE].g16) {  /* grad_dtype bf16: widened (exact) */
                mf_bf16 *g16 = (mf_bf16 *)g + (size_t)tok * C;
                mf_f32_from_bf16(rows + (size_t)U * C, g16, (size_t)C);
                memset(g16, 0, (size_t)C * sizeof *g16);
            } else {
                memcpy(rows + (size_t)U * C, g + (size_t)tok * C, (size_t)C * sizeof *rows);
                memset(g + (size_t)tok * C, 0, (size_t)C * sizeof *g);
            }
            U++;
        }
        slot[n] = map[tok];
    }
    m->emb_nuniq = U;
    m->emb_stage = 1;
    grads_done(m, WTE, 1);
    m->emb_stage = 2;
}

/* The head and the loss, after the final norm wrote lnf: logits = lnf
 * W_head^T (the embedding tied, or lm_head; 16-bit operands in 16-bit
 * precision; a frozen bf16 head dequantised a tile at a time). Sampling
 * (use_targets 0): the logits only. Training: a chunk of rows at a time,
 * the logits, the cross-entropy and the classifier's backward (d(lnf) into
 * dln, the head's gradient), so at most chunk_rows x Vp logits exist. */
static double head_loss(mf_model *m, mf_arena *a, int B, int T, int HW, int use_targets, float dscale) {
    int C = m->d.C, N = B * T, h16 = m->cdt != MF_DTYPE_F32;
    float *lnf = BUF(m->lnf), *logits = BUF(m->logits);
    mf_dtype dt = m->cdt;
    /* 16-bit: ln_f's output, rows of C 16-bit values */
    uint16_t *lnf16 = (uint16_t *)lnf;
    void *gs = h16 ? mf_arena_get(a, m->gemm_scratch) : NULL;
    size_t gb = m->gemm_scratch_bytes;
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
    /* distillation: a training forward's loss takes the teacher's chunk too (teacher.c; fp32 compute) */
    int kd = m->teacher && dscale != 0.0f;
    if (kd && h16) mf_panic("distillation with 16-bit compute was not refused by the plan");
    /* 16-bit: d(logits) of head_dw_rows rows (whole chunks) are kept for
     * one weight-gradient GEMM over all of them (model.h MF_HEAD_DW_ROWS) */
    const int D = m->head_dw_rows;
    for (int r0 = 0; r0 < N; r0 += R) {
        int rows = N - r0 < R ? N - r0 : R;
        if (h16) {
            /* logits and the loss in fp32; the rounded d(logits) feeds both GEMMs */
            const uint16_t *x = lnf16 + (size_t)r0 * C;
            const int g0 = r0 / D * D;  /* the first row of this chunk's dW group */
            uint16_t *dlc = dl16 ? (uint16_t *)dl16 + (size_t)(r0 - g0) * Vp : NULL;
            mf_classifier16_forward(dt, logits, x, wte, rows, C, Vp, gs, gb);
            if (dt == MF_DTYPE_BF16 && dln)
                /* bf16: the loss kernel writes the rounded gradient itself */
                sum += mf_crossentropy_forward_bf16(logits, dlc, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
            else
                sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
            if (!dln) continue;
            mf_classifier16_backward(dt, dln + (size_t)r0 * C, NULL, 0, dt == MF_DTYPE_BF16 ? NULL : logits, dlc, x, wte,
                                     rows, C, Vp, gs, gb);
            if (r0 + rows == N || r0 + rows - g0 == D)
                mf_gemm16_dw(dt, dwte, m->tensors[HW].g16, dl16, lnf16 + (size_t)g0 * C, Vp, C, r0 + rows - g0, 1, 0,
                             gs, gb);
            continue;
        }
        const float *x = lnf + (size_t)r0 * C;
        if (hq) {
            mf_quant_linear_forward(logits, Vp, x, wte, NULL, rows, C, Vp, 0.0f, hq, hqs);
            if (kd) sum += mf_teacher_head_chunk(m, a, logits, losses + r0, tgt + r0, r0, rows, dscale);
            else sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
            if (dln) {
                memset(dln + (size_t)r0 * C, 0, (size_t)rows * C * sizeof(float));
                mf_quant_linear_backward_input(dln + (size_t)r0 * C, logits, Vp, wte, rows, C, Vp, hq, hqs);
            }
            continue;
        }
        mf_classifier_forward(logits, x, wte, rows, C, Vp);
        if (kd) sum += mf_teacher_head_chunk(m, a, logits, losses + r0, tgt + r0, r0, rows, dscale);
        else sum += mf_crossentropy_forward(logits, losses + r0, tgt + r0, rows, m->d.V, Vp, dscale);
        if (dln) mf_classifier_backward(dln + (size_t)r0 * C, dwte, logits, x, wte, rows, C, Vp);
    }
    if (dln && HW != WTE) grads_done(m, HW, 1);  /* an untied head's gradient is complete */
    if (dln && HW == WTE && m->emb_split) emb_split_head(m, a, N);
    m->logits_all = 0;
    mf_sgemm_scratch(NULL, 0);
    /* the mean over the targets that count (MF_TARGET_IGNORE ones do not),
     * as PyTorch's cross_entropy with ignore_index; all of them in plain text */
    int counted = 0;
    for (int n = 0; n < N; n++) counted += tgt[n] != MF_TARGET_IGNORE;
    double loss = counted ? sum / counted : 0.0;
    if (m->d.n_experts > 0 && dscale != 0.0f) {
        /* training: the routers' losses join the loss with the weight the
         * mean cross-entropy has (its gradient is dscale per counted target) */
        m->moe_gscale = dscale * (float)counted;
        loss += m->d.aux_coef * m->moe_aux + m->d.z_coef * m->moe_z;
    }
    return loss;
}

double mf_model_forward(mf_model *m, mf_arena *a, int B, int T, int use_targets, float dscale) {
    if (!mf_model_fits(m, B, T)) mf_panic("forward on %dx%d does not fit the planned %dx%d", B, T, m->B, m->T);
    int N = B * T, L = m->d.L;
    m->lora_drop = m->lora.r > 0 && m->lora.dropout > 0 && use_targets && dscale != 0.0f && m->mode == MF_MODE_TRAIN;
    /* the routers' losses and drops, summed over the layers; an evaluation
     * or sampling forward leaves the last training forward's for the log */
    double keep_aux = m->moe_aux, keep_z = m->moe_z;
    int64_t keep_dropped = m->moe_dropped;
    m->moe_aux = m->moe_z = 0.0, m->moe_dropped = 0;
    m->moe_count = dscale != 0.0f;
    mf_arena_phase(a, mf_phase_emb_fwd(m));
    params_need(m, a, WTE, m->t_pos >= 0 ? 2 : 1);
    params_prefetch(m, a, 0);
    mf_embed_block_forward(m, a, B, T);
    for (int l = 0; l < L; l++) layer_forward(m, a, l, B, T, 0, 1);
    mf_arena_phase(a, mf_phase_head_fwd(m));
    params_need(m, a, LNF_W, m->n_normf);
    /* the output head: the embedding (tied) or lm_head */
    int HW = m->t_head >= 0 ? m->t_head : WTE;
    if (HW != WTE) params_need(m, a, HW, 1);
    float *lnf = BUF(m->lnf);
    sgemm_scratch(m, a);
    mf_norm_forward(m, m->cdt, lnf, m->lnf_mean >= 0 ? BUF(m->lnf_mean) : NULL, BUF(m->lnf_rstd), BUF(m->res[L]),
                    tensor_p(m, a, LNF_W), m->n_normf > 1 ? tensor_p(m, a, LNF_B) : NULL, N);
    double loss = head_loss(m, a, B, T, HW, use_targets, dscale);
    if (dscale == 0.0f) m->moe_aux = keep_aux, m->moe_z = keep_z, m->moe_dropped = keep_dropped;
    return loss;
}

void mf_model_backward(mf_model *m, mf_arena *a, int B, int T) {
    if (m->mode != MF_MODE_TRAIN) mf_panic("backward on a forward-only plan");
    int C = m->d.C, N = B * T, L = m->d.L;
    mf_arena_phase(a, mf_phase_head_bwd(m));
    params_need(m, a, LNF_W, m->n_normf);
    params_prefetch(m, a, L - 1);
    /* the classifier's backward ran with the loss; dln holds d(ln_f output) */
    float *dln = BUF(m->dln), *dres = BUF(m->dres);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    grads_start(m, a, LNF_W, m->n_normf);
    mf_norm_backward(m, dres, tensor_g(m, a, LNF_W), m->n_normf > 1 ? tensor_g(m, a, LNF_B) : NULL, dln, BUF(m->res[L]),
                     tensor_p(m, a, LNF_W), m->lnf_mean >= 0 ? BUF(m->lnf_mean) : NULL, BUF(m->lnf_rstd), N);
    grads_done(m, LNF_W, m->n_normf);
    for (int l = L - 1; l >= 0; l--) {
        mf_arena_phase(a, mf_phase_layer_bwd(m, l));
        params_need(m, a, m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt, m->nlt);
        params_prefetch(m, a, l - 1);
        grads_start(m, a, m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt, m->nlt);
        sgemm_scratch(m, a);
        int sg = m->seg, s0 = sg ? l / sg * sg : 0;
        if (sg && l == (s0 + sg - 1 < L - 1 ? s0 + sg - 1 : L - 1)) {
            /* top block of a segment: rebuild the segment from its kept
             * input; every output but the top one's goes to a slot */
            for (int k = s0; k <= l; k++) layer_forward(m, a, k, B, T, 1, k < l);
        }
        if (l < m->auto_k) layer_forward(m, a, l, B, T, 1, 0);
        mf_block_backward(m, a, l, B, T);
        grads_done(m, m->t_layer0 + mf_model_weight_set(&m->d, l) * m->nlt, m->nlt);
    }
    mf_sgemm_scratch(NULL, 0);
    mf_arena_phase(a, mf_phase_emb_bwd(m));
    /* an untied head's embedding gradient starts here (a tied one's
     * started with the loss), as do learned positions' */
    if (m->t_head >= 0) grads_start(m, a, WTE, 1);
    if (m->t_pos >= 0) grads_start(m, a, WPE, 1);
    mf_embed_block_backward(m, a, B, T);
    grads_done(m, WTE, m->t_pos >= 0 ? 2 : 1);
}

const float *mf_model_logits(mf_model *m, mf_arena *a, int T, int b, int t) {
    if (m->logits_all) return BUF(m->logits) + ((size_t)b * T + t) * m->d.Vp;
    if (t != T - 1) mf_panic("logits of row %d were not computed (only each sequence's last)", t);
    return BUF(m->logits) + (size_t)b * m->d.Vp;
}
