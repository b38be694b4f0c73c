/* Distillation's teacher (include/memfit/distill.h): its plan, mirrored
 * into the student's in category `teacher`; its forward up to the final
 * norm; the head hook that makes its logits a chunk at a time and the
 * combined loss (Hinton et al. 2015, section 2) beside the student's
 * chunked cross-entropy. */
#include "internal.h"
#include "memfit/data.h"
#include "memfit/distill.h"
#include "io/io.h"
#include "memfit/kernels.h"
#include "quant/quant.h"
#include "kernels/vmath.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int mf_distill_parse(const char *s, mf_distill_cfg *out) {
    mf_distill_cfg c = {0.5, 2.0};
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", s ? s : "") >= (int)sizeof buf) return mf_fail("'%s' is too long", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '='), *end;
        if (!eq) return mf_fail("'%s' is not key=value (keys: alpha, temperature)", tok);
        *eq = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(v)) return mf_fail("%s='%s' is not a number", tok, eq + 1);
        if (strcmp(tok, "alpha") == 0) c.alpha = v;
        else if (strcmp(tok, "temperature") == 0) c.temperature = v;
        else return mf_fail("unknown key '%s' (keys: alpha, temperature)", tok);
    }
    if (c.alpha < 0 || c.alpha > 1) return mf_fail("alpha %g is outside [0, 1]", c.alpha);
    if (c.temperature <= 0) return mf_fail("temperature %g must be > 0", c.temperature);
    if (out) *out = c;
    return 0;
}

/* ---- the loss -------------------------------------------------------- */

double mf_distill_loss_forward(float *z, float *u, float *losses, const int32_t *tgt, int rows, int V, int Vp,
                               float alpha, float temperature, float dscale, double *kl_out, double *ce_out) {
    double sum = 0, kls = 0, ces = 0;
    const double a = alpha, T = temperature;
    const float iT = 1.0f / temperature;
#pragma omp parallel for reduction(+ : sum, kls, ces) schedule(static)
    for (int r = 0; r < rows; r++) {
        float *zr = z + (size_t)r * Vp, *ur = u + (size_t)r * Vp;
        int y = tgt[r];
        if (y == MF_TARGET_IGNORE) {
            /* in neither term */
            losses[r] = 0.0f;
            if (dscale != 0.0f) memset(zr, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        float zmax = -INFINITY, umax = -INFINITY;
#pragma omp simd reduction(max : zmax, umax)
        for (int i = 0; i < V; i++) {
            zmax = zr[i] > zmax ? zr[i] : zmax;
            umax = ur[i] > umax ? ur[i] : umax;
        }
        /* one pass: the sums of exp(z), exp(z/T), exp(u/T) (shifted by the
         * maxima) and sum exp(u/T) (u - z) for the KL, in the vectorisable
         * exp the cross-entropy uses; exp(u/T) is kept in u for the gradient */
        double se = 0, ses = 0, seu = 0, cross = 0;
#pragma omp simd reduction(+ : se, ses, seu, cross)
        for (int i = 0; i < V; i++) {
            const float dz = zr[i] - zmax, du = ur[i] - umax;
            const float eu = mf_vexpf(du * iT);
            se += (double)mf_vexpf(dz);
            ses += (double)mf_vexpf(dz * iT);
            seu += (double)eu;
            cross += (double)eu * (double)(du - dz);
            ur[i] = eu;
        }
        const double lse = log(se), lses = log(ses), lseu = log(seu);
        const double ce = lse - ((double)zr[y] - zmax);
        /* KL(q_t || q_s) = sum q_t (log q_t - log q_s) with log q_t = du/T - lseu,
         * log q_s = dz/T - lses and sum q_t = 1 */
        const double kl = cross / (T * seu) - lseu + lses;
        const double loss = (1.0 - a) * ce + a * T * T * kl;
        losses[r] = (float)loss;
        sum += loss;
        kls += kl;
        ces += ce;
        if (dscale != 0.0f) {
            /* d/dz: (1 - alpha) (softmax(z) - onehot(y)) + alpha T (q_s - q_t) */
            const float ip = (float)(1.0 / se), is = (float)(1.0 / ses), it = (float)(1.0 / seu);
            const float a1 = (float)((1.0 - a) * dscale), a2 = (float)(a * T * dscale);
#pragma omp simd
            for (int i = 0; i < V; i++) {
                const float dz = zr[i] - zmax;
                zr[i] = a1 * mf_vexpf(dz) * ip + a2 * (mf_vexpf(dz * iT) * is - ur[i] * it);
            }
            zr[y] -= a1;
            for (int i = V; i < Vp; i++) zr[i] = 0.0f;
        }
    }
    if (kl_out) *kl_out = kls;
    if (ce_out) *ce_out = ces;
    return sum;
}

/* ---- the plan -------------------------------------------------------- */

/* The teacher's shape and tokenizer: an HF folder's config.json (and its
 * tokenizer.json), or a memfit weights file's or checkpoint's metadata */
static int teacher_dims(const char *path, mf_dims *d) {
    struct stat st;
    if (stat(path, &st) != 0) return mf_fail("teacher %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        mf_config tc;
        mf_config_defaults(&tc);
        snprintf(tc.init, sizeof tc.init, "%s", path);
        if (mf_model_dims(&tc, d)) return mf_fail("teacher %s: %s", path, mf_error());
        return 0;
    }
    mf_st_file f;
    if (mf_st_open(&f, path)) return mf_fail("teacher %s: %s", path, mf_error());
    const char *dims = mf_st_meta(&f, "dims"), *tok = mf_st_meta(&f, "tokenizer");
    int rc = 0;
    if (!dims)
        rc = mf_fail("teacher %s has no 'dims' metadata: give a memfit weights file (--save), a checkpoint, or a "
                     "Hugging Face folder", path);
    else if (mf_model_dims_parse(dims, d)) rc = mf_fail("teacher %s: %s", path, mf_error());
    else {
        snprintf(d->tokenizer, sizeof d->tokenizer, "%s", tok ? tok : (d->V >= 50257 ? "gpt2" : "bytes"));
        if (mf_model_dims_check(d)) rc = mf_fail("teacher %s: %s", path, mf_error());
    }
    mf_st_close(&f);
    return rc;
}

static size_t aligned(size_t b) { return (b + MF_ALIGN - 1) / MF_ALIGN * MF_ALIGN; }

/* --teacher_dtype: the block matrices stored as the quantised base of
 * QLoRA (src/quant; a Llama's embedding and head bf16, as there), so the
 * blocks' dequantise-in-GEMM paths run them */
static void quantise_teacher(mf_teacher *t) {
    mf_model *m = &t->model;
    const mf_block_desc *bd = mf_model_block_desc(&m->d);
    m->lora.base = t->kind;
    for (int i = 0; i < m->n_tensors; i++) {
        mf_tensor *x = &m->tensors[i];
        int q = 0;
        if (x->ndim == 2 && x->role == MF_ROLE_LAYER) q = t->kind;
        else if (bd->bf16_frozen_embed && (x->role == MF_ROLE_EMB || x->role == MF_ROLE_HEAD)) q = MF_QUANT_BF16;
        if (!q) continue;
        x->qkind = q;
        x->frozen = 1;
        mf_buf *b = &t->plan.bufs[x->p];
        b->dtype = MF_DTYPE_U8;
        b->ndim = 1;
        b->shape[0] = b->numel = (int64_t)mf_quant_bytes((mf_quant_kind)q, x->numel);
        for (int k = 1; k < MF_MAX_DIMS; k++) b->shape[k] = 0;
        b->bytes = aligned((size_t)b->numel);
    }
}

void mf_teacher_free(mf_teacher *t) {
    if (!t) return;
    free(t->arena.live);
    mf_model_free(&t->model);
    mf_plan_free(&t->plan);
    mf_plan_free(&t->sub);
    free(t->mirror);
    free(t->sub_id);
    free(t);
}

int mf_teacher_plan(const mf_config *cfg, mf_model *m, mf_plan *plan, int nthreads) {
    m->teacher = NULL;
    int has_t = cfg->teacher[0] != 0;
    if (!has_t) {
        if (mf_config_was_set(cfg, "distill")) return mf_fail("distill needs --teacher (the model to distill from)");
        if (strcmp(cfg->teacher_dtype, "fp32") != 0) return mf_fail("teacher_dtype %s needs --teacher", cfg->teacher_dtype);
        return 0;
    }
    if (m->mode != MF_MODE_TRAIN) return 0;  /* eval and sampling run the student alone */
    mf_teacher *t = calloc(1, sizeof *t);
    if (!t) return mf_fail("out of memory for the teacher");
    snprintf(t->path, sizeof t->path, "%s", cfg->teacher);
    int rc = 0;
    if (mf_distill_parse(cfg->distill, &t->cfg)) { rc = mf_fail("distill: %s", mf_error()); goto done; }
    if (mf_quant_parse(cfg->teacher_dtype, &t->kind)) { rc = mf_fail("teacher_dtype: %s", mf_error()); goto done; }
    if (m->cdt != MF_DTYPE_F32) {
        rc = mf_fail("distill: --precision %s is not supported with a teacher yet (use fp32 compute; --teacher_dtype "
                     "stores the teacher in bf16, int8 or nf4)", m->cdt == MF_DTYPE_BF16 ? "bf16" : "fp16");
        goto done;
    }
    if (teacher_dims(t->path, &t->d)) { rc = -1; goto done; }
    /* one tokenizer: the same ids mean the same text to both */
    uint64_t hs = 0, ht = 0;
    if (mf_tokenizer_spec_info(m->d.tokenizer, NULL, &hs) || mf_tokenizer_spec_info(t->d.tokenizer, NULL, &ht)) {
        rc = mf_fail("teacher %s: %s", t->path, mf_error());
        goto done;
    }
    if (hs != ht) {
        rc = mf_fail("teacher %s uses the tokenizer '%s', the student '%s': distillation needs one tokenizer", t->path,
                     t->d.tokenizer, m->d.tokenizer);
        goto done;
    }
    if (t->d.V != m->d.V) {
        rc = mf_fail("teacher %s has a vocabulary of %d, the student %d: distillation needs one vocabulary", t->path,
                     t->d.V, m->d.V);
        goto done;
    }
    if (t->d.maxT < m->T) {
        rc = mf_fail("teacher %s: block_size %d is shorter than the student's seq %d", t->path, t->d.maxT, m->T);
        goto done;
    }
    mf_model *tm = &t->model;
    mf_recompute none = {MF_RECOMPUTE_NONE, 0};
    if (mf_plan_init(&t->plan, mf_model_n_phases(&t->d, MF_MODE_INFER)) ||
        mf_model_plan(tm, &t->plan, &t->d, m->B, m->T, MF_MODE_INFER, nthreads, m->chunk_rows, none, NULL)) {
        rc = mf_fail("teacher %s: %s", t->path, mf_error());
        goto done;
    }
    int tlast = t->plan.n_phases - 1;
    if (m->pos >= 0) {
        /* packed chat data: the student's positions row (the same tokens) */
        int64_t sh[4] = {m->B, m->T, 0, 0};
        if ((tm->pos = mf_plan_add(&t->plan, "data.pos", MF_CAT_DATA, MF_DTYPE_I32, 2, sh, 0, tlast, -1)) < 0) { rc = -1; goto done; }
    }
    if (t->kind) {
        quantise_teacher(t);
        /* the dequantised tile of the GEMMs and of the head's chunk */
        size_t qs = mf_model_quant_scratch_need(tm, m->B * m->T);
        size_t hb = mf_quant_linear_scratch_bytes(MF_QUANT_BF16, tm->chunk_rows, t->d.C, t->d.Vp);
        if (mf_model_block_desc(&t->d)->bf16_frozen_embed && hb > qs) qs = hb;
        int64_t sh[4] = {(int64_t)(qs ? qs : 1), 0, 0, 0};
        tm->qscr_bytes = qs;
        if ((tm->qscr_f = mf_plan_add(&t->plan, "work.quant_gemm.fwd", MF_CAT_WORK, MF_DTYPE_U8, 1, sh, 0, tlast, -1)) < 0) {
            rc = -1;
            goto done;
        }
    }
    /* the rows, mirrored into the student's plan */
    int n = t->plan.n, hf = mf_phase_head_fwd(m), slast = plan->n_phases - 1;
    t->mirror = malloc((size_t)n * sizeof *t->mirror);
    t->sub_id = malloc((size_t)n * sizeof *t->sub_id);
    if (!t->mirror || !t->sub_id || mf_plan_init(&t->sub, t->plan.n_phases)) { rc = mf_fail("out of memory for the teacher"); goto done; }
    t->row_qscr = t->row_gs = -1;
    char nm[128];
    for (int i = 0; i < n && !rc; i++) {
        mf_buf *b = &t->plan.bufs[i];
        t->mirror[i] = t->sub_id[i] = -1;
        int first = -1, last = -1;
        if (i == tm->inputs) t->mirror[i] = m->inputs;
        else if (i == tm->targets) t->mirror[i] = m->targets;
        else if (i == tm->pos) t->mirror[i] = m->pos;
        else if (i == tm->lnf) first = 0, last = hf, snprintf(nm, sizeof nm, "teacher.hidden");
        else if (i == tm->logits) first = last = hf, snprintf(nm, sizeof nm, "teacher.logits");
        else if (i == tm->qscr_f || i == tm->gemm_scratch)
            first = 0, last = hf, snprintf(nm, sizeof nm, "teacher.%s", b->name); /* its head chunk uses them too */
        else if (b->first == 0 && b->last == tlast) {
            first = 0, last = slast, snprintf(nm, sizeof nm, "teacher.%s", b->name);
            t->weight_bytes += b->bytes;
        } else {
            t->sub_id[i] = mf_plan_add(&t->sub, b->name, b->cat, b->dtype, b->ndim, b->shape, b->first, b->last, b->layer);
            if (t->sub_id[i] < 0) rc = -1;
            continue;
        }
        if (first < 0) continue;
        t->mirror[i] = mf_plan_add(plan, nm, MF_CAT_TEACHER, b->dtype, b->ndim, b->shape, first, last, -1);
        if (t->mirror[i] < 0) { rc = -1; break; }
        /* a quantised row's bytes are the packed size (already aligned) */
        plan->bufs[t->mirror[i]].bytes = b->bytes;
        if (i == tm->lnf) t->row_hidden = t->mirror[i];
        if (i == tm->logits) t->row_logits = t->mirror[i];
        if (i == tm->qscr_f) t->row_qscr = t->mirror[i];
        if (i == tm->gemm_scratch) t->row_gs = t->mirror[i];
    }
    if (rc) goto done;
    /* its forward working set, laid out by its own phases, in one row
     * alive in the student's embedding phase (where the teacher runs) */
    mf_plan_layout(&t->sub);
    int64_t sh[4] = {(int64_t)(t->sub.arena_bytes ? t->sub.arena_bytes : 1), 0, 0, 0};
    if ((t->row_fwd = mf_plan_add(plan, "teacher.forward", MF_CAT_TEACHER, MF_DTYPE_U8, 1, sh, 0, 0, -1)) < 0) rc = -1;
done:
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mf_error());
        mf_teacher_free(t);
        return mf_fail("%s", msg);
    }
    m->teacher = t;
    return 0;
}

int mf_teacher_attach(mf_teacher *t, const mf_arena *sa) {
    const mf_plan *sp = sa->plan;
    for (int i = 0; i < t->plan.n; i++)
        t->plan.bufs[i].offset = t->mirror[i] >= 0 ? sp->bufs[t->mirror[i]].offset
                                                   : sp->bufs[t->row_fwd].offset + t->sub.bufs[t->sub_id[i]].offset;
    mf_arena *a = &t->arena;
    free(a->live);
    memset(a, 0, sizeof *a);
    mf_ledger_init(&t->ledger);
    a->plan = &t->plan;
    a->ledger = &t->ledger;
    a->base = sa->base;
    a->size = sa->size;
    a->live = calloc((size_t)t->plan.n, 1);
    if (!a->live) return mf_fail("out of memory for the teacher's live table");
    for (int i = 0; i < t->plan.n; i++) {
        const mf_buf *b = &t->plan.bufs[i];
        if (b->first == 0 && b->last == t->plan.n_phases - 1) a->live[i] = 1, mf_ledger_add(a->ledger, b->cat, b->bytes);
    }
    return 0;
}

/* ---- the step -------------------------------------------------------- */

void mf_teacher_forward(mf_model *s, mf_arena *sa, int B, int T) {
    mf_teacher *t = s->teacher;
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    if (!mf_model_fits(m, B, T)) mf_panic("teacher forward on %dx%d does not fit its planned %dx%d", B, T, m->B, m->T);
    /* the student's rows the teacher's live in, counted in the run's ledger */
    mf_arena_get(sa, t->row_fwd);
    mf_arena_get(sa, t->row_hidden);
    if (t->row_qscr >= 0) mf_arena_get(sa, t->row_qscr);
    if (t->row_gs >= 0) mf_arena_get(sa, t->row_gs);
    mf_arena_step(a);
    mf_embed_block_forward(m, a, B, T);
    for (int l = 0; l < m->d.L; l++) {
        mf_arena_phase(a, mf_phase_layer_fwd(m, l));
        mf_sgemm_scratch(m->gemm_scratch >= 0 ? mf_arena_get(a, m->gemm_scratch) : NULL, m->gemm_scratch_bytes);
        mf_block_forward(m, a, l, B, T, 0, 1);
    }
    mf_arena_phase(a, mf_phase_head_fwd(m));
    mf_sgemm_scratch(NULL, 0);
    int NW = m->t_normf;
    mf_norm_forward(m, MF_DTYPE_F32, mf_arena_get(a, m->lnf), m->lnf_mean >= 0 ? mf_arena_get(a, m->lnf_mean) : NULL,
                    mf_arena_get(a, m->lnf_rstd), mf_arena_get(a, m->res[m->d.L]), mf_model_tensor_p(m, a, NW),
                    m->n_normf > 1 ? mf_model_tensor_p(m, a, NW + 1) : NULL, B * T);
    t->kl_sum = t->ce_sum = 0;
    t->counted = 0;
}

double mf_teacher_head_chunk(mf_model *s, mf_arena *sa, float *logits, float *losses, const int32_t *tgt, int r0,
                             int rows, float dscale) {
    mf_teacher *t = s->teacher;
    mf_model *m = &t->model;
    int C = t->d.C, Vp = t->d.Vp;
    float *tl = mf_arena_get(sa, t->row_logits);
    const float *h = (const float *)mf_arena_get(sa, t->row_hidden) + (size_t)r0 * C;
    int HW = m->t_head >= 0 ? m->t_head : m->t_emb;
    const void *w = mf_arena_ptr(&t->arena, m->tensors[HW].p);
    mf_quant_kind hq = (mf_quant_kind)m->tensors[HW].qkind;
    if (hq) mf_quant_linear_forward(tl, Vp, h, w, NULL, rows, C, Vp, 0.0f, hq, mf_arena_get(sa, t->row_qscr));
    else {
        /* the teacher's GEMM scratch for its head, then the student's back */
        if (t->row_gs >= 0) mf_sgemm_scratch(mf_arena_get(sa, t->row_gs), m->gemm_scratch_bytes);
        mf_classifier_forward(tl, h, w, rows, C, Vp);
        if (t->row_gs >= 0)
            mf_sgemm_scratch(s->gemm_scratch >= 0 ? mf_arena_get(sa, s->gemm_scratch) : NULL, s->gemm_scratch_bytes);
    }
    for (int r = 0; r < rows; r++) t->counted += tgt[r] != MF_TARGET_IGNORE;
    if (t->cfg.alpha == 0.0) {
        /* alpha 0: the plain cross-entropy, bit for bit (the teacher's chunk is made all the same, so the
         * ledger sees the planned rows) */
        double sum = mf_crossentropy_forward(logits, losses, tgt, rows, s->d.V, s->d.Vp, dscale);
        t->ce_sum += sum;
        return sum;
    }
    double kl, ce;
    double sum = mf_distill_loss_forward(logits, tl, losses, tgt, rows, s->d.V, s->d.Vp, (float)t->cfg.alpha,
                                         (float)t->cfg.temperature, dscale, &kl, &ce);
    t->kl_sum += kl;
    t->ce_sum += ce;
    return sum;
}
