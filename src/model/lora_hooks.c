/* LoRA hooks the block's projection path (blocks.c) calls around its targeted matmuls, and the
 * adapters' initialisation. The rows are the model's plan rows (plan.c
 * declares them); this file only reads them through the arena. */
#include "memfit/lora.h"
#include "memfit/model.h"
#include "memfit/core.h"
#include "memfit/kernels.h"

#include <string.h>

int mf_lora_tensor(const mf_model *m, int l, int k) {
    if (m->lora.r <= 0 || !(m->lora.targets >> k & 1)) return -1;
    int nt = mf_lora_n_targets(&m->lora), pos = 0;
    for (int j = 0; j < k; j++) pos += m->lora.targets >> j & 1;
    return m->lora_first + 2 * (l * nt + pos);
}

/* the fp32 input row of the phase we are in (forward or backward) */
static float *x_row(mf_model *m, mf_arena *a) {
    int bwd = m->mode == MF_MODE_TRAIN && a->phase >= mf_phase_head_bwd(m);
    return mf_arena_get(a, bwd ? m->lora_xb : m->lora_xf);
}

/* the dropout scratch: the same row (under 16-bit compute dropout(x) is
 * written over the widened x, element by element in place) */
static float *drop_scratch(mf_model *m, mf_arena *a) {
    return m->lora_drop ? x_row(m, a) : NULL;
}

const float *mf_lora_x32(mf_model *m, mf_arena *a, const void *x, int N, int in) {
    if (m->lora_xf < 0) mf_panic("16-bit input widened without a planned work.lora_x32 row");
    float *w = x_row(m, a);
    const uint16_t *h = x;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) mf_f32_from_half(m->cdt, w + (size_t)n * in, h + (size_t)n * in, (size_t)in);
    return w;
}

static float dropout_p(const mf_model *m) { return m->lora_drop ? m->lora.dropout : 0.0f; }

/* Under data parallelism this rank's N rows are rows [rank N, (rank+1) N)
 * of the global micro-batch (train.c reads its slice of the window), so its
 * mask continues the single process's there: the adapters see the masks a
 * one-process run of the global batch draws, and ranks do not repeat rank
 * 0's. */
static uint64_t dseed(const mf_model *m, int l, int k, int N, int in) {
    uint64_t s = mf_lora_dropout_seed(m->lora_seed, m->lora_micro, l, k);
    if (m->opt.rank <= 0) return s;
    return mf_lora_dropout_at(s, (uint64_t)m->opt.rank * (uint64_t)N * (uint64_t)in);
}

void mf_lora_layer_forward(mf_model *m, mf_arena *a, int l, int k, const float *x, float *y, int N) {
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_lora_layer_forward_ld(m, a, l, k, x, y, out, N);
}

void mf_lora_layer_forward_ld(mf_model *m, mf_arena *a, int l, int k, const float *x, float *y, int ldy, int N) {
    int i = mf_lora_tensor(m, l, k);
    if (i < 0) return;
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_lora_forward_ld(y, ldy, mf_arena_get(a, m->lora_u), drop_scratch(m, a), x, mf_arena_get(a, m->tensors[i].p),
                    mf_arena_get(a, m->tensors[i + 1].p), N, in, out, m->lora.r, mf_lora_scale(&m->lora),
                    dropout_p(m), dseed(m, l, k, N, in));
}

void mf_lora_layer_backward_params(mf_model *m, mf_arena *a, int l, int k, const float *dy, const float *x, int N) {
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_lora_layer_backward_params_ld(m, a, l, k, dy, out, x, N);
}

void mf_lora_layer_backward_params_ld(mf_model *m, mf_arena *a, int l, int k, const float *dy, int ldy,
                                      const float *x, int N) {
    int i = mf_lora_tensor(m, l, k);
    if (i < 0) return;
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_lora_backward_params_ld(mf_arena_get(a, m->lora_du), mf_arena_get(a, m->tensors[i].g),
                               mf_arena_get(a, m->tensors[i + 1].g), mf_arena_get(a, m->lora_u), drop_scratch(m, a),
                               dy, ldy, x, mf_arena_get(a, m->tensors[i].p), mf_arena_get(a, m->tensors[i + 1].p), N, in, out,
                            m->lora.r, mf_lora_scale(&m->lora), dropout_p(m), dseed(m, l, k, N, in));
}

void mf_lora_layer_backward_input(mf_model *m, mf_arena *a, int l, int k, float *dx, int N) {
    int i = mf_lora_tensor(m, l, k);
    if (i < 0) return;
    int in, out;
    mf_model_lora_dims(&m->d, k, &in, &out);
    mf_lora_backward_input(dx, drop_scratch(m, a), mf_arena_get(a, m->lora_du), mf_arena_get(a, m->tensors[i].p), N,
                           in, m->lora.r, dropout_p(m), dseed(m, l, k, N, in));
}

void mf_lora_init_weights(mf_model *m, mf_arena *a, uint64_t seed) {
    for (int i = m->lora_first; m->lora.r > 0 && i < m->n_tensors; i++) {
        mf_tensor *t = &m->tensors[i];
        float *p = mf_arena_ptr(a, t->p);
        /* expert parallel: the rank's slice of the whole stack's values */
        if (strstr(t->name, ".lora_A."))
            mf_lora_init_a_part(p, t->ep_full > 0 ? t->ep_lo : 0, t->numel, (int)t->shape[1], seed ^ ((uint64_t)i << 32));
        else memset(p, 0, (size_t)t->numel * sizeof(float));
    }
}

int64_t mf_model_n_trainable(const mf_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].frozen)  /* (expert parallel: the whole stack's, not the rank's slice) */
            n += m->tensors[i].rows_file * (m->tensors[i].ndim > 1 ? m->tensors[i].shape[1] : 1) *
                 (m->tensors[i].ep_full > 0 ? m->tensors[i].ep_full / m->tensors[i].numel : 1);
    return n;
}
