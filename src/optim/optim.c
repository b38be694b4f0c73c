/* The optimizer a run uses: its state rows in the plan, their initial
 * values, and the dispatch of one tensor's update. */
#include "memfit/optim.h"

#include <string.h>

const char *mf_optim_name(mf_optim_kind k) {
    static const char *names[] = {"adamw", "adamw8bit", "adafactor", "sgd"};
    return names[k];
}

int mf_optim_init(mf_optim *o, const mf_config *cfg) {
    memset(o, 0, sizeof *o);
    int found = 0;
    for (int k = MF_OPTIM_ADAMW; k <= MF_OPTIM_SGD; k++)
        if (strcmp(cfg->optimizer, mf_optim_name((mf_optim_kind)k)) == 0) o->kind = (mf_optim_kind)k, found = 1;
    if (!found) return mf_fail("optimizer '%s' is not one of adamw, adamw8bit, adafactor, sgd", cfg->optimizer);
    o->beta1 = (float)cfg->beta1;
    o->beta2 = (float)cfg->beta2;
    o->eps = (float)cfg->eps;
    o->momentum = (float)cfg->momentum;
    o->block = cfg->optim_block;
    if (o->block < 1 || o->block > MF_Q8_MAX_BLOCK)
        return mf_fail("optim_block %d must be in [1, %d]", o->block, MF_Q8_MAX_BLOCK);
    /* Adafactor with the run's lr schedule unless relative_step; the
     * step-size scaling by RMS(p) belongs to the relative step size */
    o->af = mf_adafactor_hp_default();
    o->af.relative_step = cfg->relative_step;
    o->af.scale_parameter = cfg->relative_step;
    o->af.beta1 = o->momentum;
    /* an update applied while backward runs sees one micro-batch's
     * gradient and cannot know the global norm yet */
    o->in_backward = cfg->update_in_backward;
    /* mixed precision (docs/precision.md) */
    if (strcmp(cfg->precision, "fp32") == 0) o->compute = MF_DTYPE_F32;
    else if (strcmp(cfg->precision, "bf16") == 0) o->compute = MF_DTYPE_BF16;
    else if (strcmp(cfg->precision, "fp16") == 0) o->compute = MF_DTYPE_F16;
    else return mf_fail("precision '%s' is not one of fp32, bf16, fp16", cfg->precision);
    o->master = o->compute != MF_DTYPE_F32 && cfg->master_weights;
    if (o->compute == MF_DTYPE_F16 && !cfg->master_weights)
        return mf_fail("master_weights 0 needs precision bf16: fp16 weights updated in place lose small updates "
                       "and have no loss-scale-safe rounding here; keep master_weights 1 with fp16");
    if (o->compute == MF_DTYPE_F16 && cfg->update_in_backward)
        return mf_fail("precision fp16 cannot update in backward: a step with inf/NaN gradients must be skipped whole "
                       "(loss scaling); use precision bf16, or turn update_in_backward off");
    o->half_state = cfg->pure_bf16;
    if (cfg->pure_bf16 && (o->compute != MF_DTYPE_BF16 || cfg->master_weights || o->kind != MF_OPTIM_ADAMW))
        return mf_fail("pure_bf16 needs precision bf16, master_weights 0 and optimizer adamw (its moments become bf16); "
                       "got precision %s, master_weights %d, optimizer %s", cfg->precision, cfg->master_weights,
                       cfg->optimizer);
    /* bf16 gradients (docs/precision.md): GEMM weight gradients rounded
     * once per GEMM, widened to fp32 by the norm and the update */
    if (strcmp(cfg->grad_dtype, "fp32") != 0 && strcmp(cfg->grad_dtype, "bf16") != 0)
        return mf_fail("grad_dtype '%s' is not one of fp32, bf16", cfg->grad_dtype);
    o->grad16 = strcmp(cfg->grad_dtype, "bf16") == 0;
    if (o->grad16 && o->compute != MF_DTYPE_BF16)
        return mf_fail("grad_dtype bf16 needs precision bf16 (the gradients of the bf16 weights' GEMMs); got precision %s",
                       cfg->precision);
    if (o->grad16 && o->kind == MF_OPTIM_ADAFACTOR)
        return mf_fail("grad_dtype bf16 is not supported with adafactor (its row and column statistics need the whole "
                       "gradient widened at once); use adamw, adamw8bit or sgd, or grad_dtype fp32");
    if (o->grad16 && cfg->offload[0])
        return mf_fail("grad_dtype bf16 cannot be combined with offload yet (the streamed update reads fp32 gradients); "
                       "drop one");
    if (o->in_backward && cfg->grad_accum > 1)
        return mf_fail("update_in_backward needs grad_accum 1 (each update would see one micro-batch); "
                       "raise batch instead, or turn update_in_backward off");
    if (o->in_backward && cfg->grad_clip > 0)
        return mf_fail("update_in_backward cannot clip by the global gradient norm (it is known only after the "
                       "last update); set grad_clip 0 (the norm is still logged)%s",
                       o->kind == MF_OPTIM_ADAFACTOR ? "; adafactor still clips each update by its RMS" : "");
    if (cfg->offload[0]) {
        const char *pre = "optimizer=disk:";
        if (strncmp(cfg->offload, pre, strlen(pre)) != 0 || !cfg->offload[strlen(pre)])
            return mf_fail("offload '%s': expected optimizer=disk:PATH", cfg->offload);
        snprintf(o->offload_path, sizeof o->offload_path, "%s", cfg->offload + strlen(pre));
        o->offload_window = cfg->offload_window;
        if (o->kind == MF_OPTIM_ADAFACTOR)
            return mf_fail("offload: adafactor's state is already only row and column statistics; offload adamw, "
                           "adamw8bit or sgd state instead");
        if (o->in_backward)
            return mf_fail("offload streams all state once per step; it cannot be combined with update_in_backward");
        if (o->offload_window < (16u << 10))
            return mf_fail("offload_window %zu bytes is too small (at least 16KiB)", o->offload_window);
    }
    mf_q8_map_dynamic(o->map_signed, 1);
    mf_q8_map_dynamic(o->map_unsigned, 0);
    return 0;
}

static int q8(const mf_optim *o, int64_t n) { return o->kind == MF_OPTIM_ADAMW8BIT && n >= MF_Q8_MIN_NUMEL; }
static int adam_fp32(const mf_optim *o, int64_t n) {
    return o->kind == MF_OPTIM_ADAMW || (o->kind == MF_OPTIM_ADAMW8BIT && n < MF_Q8_MIN_NUMEL);
}

int mf_optim_half(const mf_optim *o, const mf_optim_shape *s) {
    return o->half_state && s->half && adam_fp32(o, s->rows * s->cols);
}

int mf_optim_block(const mf_optim *o, const mf_optim_shape *s) {
    return s->embedding && s->ndim == 2 && s->cols <= MF_Q8_MAX_BLOCK ? (int)s->cols : o->block;
}

int mf_optim_plan(const mf_optim *o, mf_plan *plan, const char *name, const mf_optim_shape *s,
                  int first, int last, int layer, int st[MF_OPTIM_STATES]) {
    for (int i = 0; i < MF_OPTIM_STATES; i++) st[i] = -1;
    int64_t n = s->rows * s->cols, rows = s->rows, cols = s->cols;
    int ndim = s->ndim;
    char nm[96];
#define ROW(i, fmt, cat, dt, nd, d0, d1) do { \
        int64_t sh[2] = {(d0), (d1)}; \
        snprintf(nm, sizeof nm, fmt "%s", name); \
        if ((st[i] = mf_plan_add(plan, nm, cat, dt, nd, sh, first, last, layer)) < 0) return -1; \
        plan->bufs[st[i]].disk = o->offload_path[0] != 0; \
    } while (0)
    if (adam_fp32(o, n)) {
        mf_dtype dt = mf_optim_half(o, s) ? MF_DTYPE_BF16 : MF_DTYPE_F32;
        ROW(0, "adam.m.", MF_CAT_OPTIM, dt, ndim, rows, cols);
        ROW(1, "adam.v.", MF_CAT_OPTIM, dt, ndim, rows, cols);
    } else if (q8(o, n)) {
        int64_t nb = (int64_t)mf_q8_nblocks((size_t)n, mf_optim_block(o, s));
        ROW(0, "adam8.m.", MF_CAT_OPTIM, MF_DTYPE_U8, ndim, rows, cols);
        ROW(1, "adam8.v.", MF_CAT_OPTIM, MF_DTYPE_U8, ndim, rows, cols);
        ROW(2, "adam8.m_absmax.", MF_CAT_QUANT, MF_DTYPE_F32, 1, nb, 1);
        ROW(3, "adam8.v_absmax.", MF_CAT_QUANT, MF_DTYPE_F32, 1, nb, 1);
    } else if (o->kind == MF_OPTIM_ADAFACTOR) {
        /* Shazeer & Stern 2018 section 3: a matrix keeps row and column
         * statistics of its squared gradient, a vector the full statistic */
        if (ndim == 2) {
            ROW(0, "adafactor.row.", MF_CAT_OPTIM, MF_DTYPE_F32, 1, rows, 1);
            ROW(1, "adafactor.col.", MF_CAT_OPTIM, MF_DTYPE_F32, 1, cols, 1);
        } else ROW(2, "adafactor.v.", MF_CAT_OPTIM, MF_DTYPE_F32, ndim, rows, cols);
        if (o->momentum > 0) ROW(3, "adafactor.m.", MF_CAT_OPTIM, MF_DTYPE_F32, ndim, rows, cols);
    } else if (o->kind == MF_OPTIM_SGD && o->momentum > 0) {
        ROW(0, "sgd.momentum.", MF_CAT_OPTIM, MF_DTYPE_F32, ndim, rows, cols);
    }
#undef ROW
    return 0;
}

void mf_optim_zero_range(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], const int st[MF_OPTIM_STATES],
                         const mf_optim_shape *s, int64_t e0, int64_t n) {
    if (q8(o, s->rows * s->cols)) {
        int block = mf_optim_block(o, s);
        mf_q8_state_zero(st_ptr[0], st_ptr[2], (size_t)n, block, o->map_signed);
        mf_q8_state_zero(st_ptr[1], st_ptr[3], (size_t)n, block, o->map_unsigned);
        return;
    }
    for (int i = 0; i < MF_OPTIM_STATES; i++) {
        if (st[i] < 0) continue;
        /* adafactor's row and column statistics are never split */
        size_t len = o->kind == MF_OPTIM_ADAFACTOR && i < 2 ? (size_t)(i == 0 ? s->rows : s->cols) : (size_t)n;
        memset(st_ptr[i], 0, len * (mf_optim_half(o, s) ? 2 : sizeof(float)));  /* bf16 zero is all-zero bits */
    }
    (void)e0;
}

void mf_optim_zero(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], const int st[MF_OPTIM_STATES],
                   const mf_optim_shape *s) {
    mf_optim_zero_range(o, st_ptr, st, s, 0, s->rows * s->cols);
}

void mf_optim_update_range(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, const float *g,
                           const mf_optim_shape *s, int64_t n, float lr, float wd, int t, float gscale) {
    int64_t numel = s->rows * s->cols;
    if (adam_fp32(o, numel)) {
        mf_adamw_update(p, g, st_ptr[0], st_ptr[1], (size_t)n, lr, o->beta1, o->beta2, o->eps, wd, t, gscale);
    } else if (q8(o, numel)) {
        mf_adamw8bit_update(p, g, st_ptr[0], st_ptr[2], st_ptr[1], st_ptr[3], (size_t)n, mf_optim_block(o, s),
                            o->map_signed, o->map_unsigned, lr, o->beta1, o->beta2, o->eps, wd, t, gscale);
    } else if (o->kind == MF_OPTIM_ADAFACTOR) {
        if (n != numel) mf_panic("adafactor updates whole tensors");
        mf_adafactor_hp hp = o->af;
        hp.lr = lr;
        hp.wd = wd;
        if (s->ndim == 2) mf_adafactor_update(p, g, st_ptr[0], st_ptr[1], NULL, st_ptr[3], s->rows, s->cols, &hp, t, gscale);
        else mf_adafactor_update(p, g, NULL, NULL, st_ptr[2], st_ptr[3], numel, 1, &hp, t, gscale);
    } else {
        mf_sgd_update(p, g, st_ptr[0], (size_t)n, lr, o->momentum, wd, t, gscale);
    }
}

void mf_optim_update(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, const float *g,
                     const mf_optim_shape *s, float lr, float wd, int t, float gscale) {
    mf_optim_update_range(o, st_ptr, p, g, s, s->rows * s->cols, lr, wd, t, gscale);
}

int mf_optim_update_bf16(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, uint16_t *p16,
                         const float *g, const mf_optim_shape *s, float lr, float wd, int t, float gscale) {
    int64_t numel = s->rows * s->cols;
    /* the other optimizers: the caller updates (and rounds) itself; updating
     * here too applied their step twice */
    if (!adam_fp32(o, numel)) return 0;
    mf_adamw_update16(p, p16, g, st_ptr[0], st_ptr[1], (size_t)numel, lr, o->beta1, o->beta2, o->eps, wd, t, gscale);
    return 1;
}

int64_t mf_optim_slice(const mf_optim *o, const mf_optim_shape *s) {
    int64_t numel = s->rows * s->cols;
    if (o->kind == MF_OPTIM_ADAFACTOR) return numel;
    int64_t b = mf_optim_block(o, s), k = MF_OPTIM_SLICE / b;
    int64_t n = (k > 0 ? k : 1) * b;
    return n < numel ? n : numel;
}

void mf_optim_state_at(const mf_optim *o, const mf_optim_shape *s, void *const st[MF_OPTIM_STATES], int64_t e0,
                       void *out[MF_OPTIM_STATES]) {
    for (int k = 0; k < MF_OPTIM_STATES; k++) out[k] = NULL;
    int64_t numel = s->rows * s->cols;
    if (o->kind == MF_OPTIM_ADAFACTOR) mf_panic("adafactor updates whole tensors");
    if (q8(o, numel)) {
        int64_t b = mf_optim_block(o, s);
        if (e0 % b) mf_panic("state slice at %lld is not on a %lld-element block", (long long)e0, (long long)b);
        out[0] = (uint8_t *)st[0] + e0;
        out[1] = (uint8_t *)st[1] + e0;
        out[2] = (float *)st[2] + e0 / b;
        out[3] = (float *)st[3] + e0 / b;
        return;
    }
    for (int k = 0; k < MF_OPTIM_STATES; k++)  /* fp32 (pure_bf16: bf16) AdamW m, v; SGD's momentum */
        if (st[k]) out[k] = mf_optim_half(o, s) ? (void *)((uint16_t *)st[k] + e0) : (void *)((float *)st[k] + e0);
}
