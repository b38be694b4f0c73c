/* memfit distillation (Hinton et al. 2015, "Distilling the Knowledge in a
 * Neural Network", section 2): the student trains on
 *   alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE
 * per target that counts (MF_TARGET_IGNORE ones count in neither term; the
 * mean is over the counted targets, as the cross-entropy's).
 *
 * Owns: the teacher, a second model (any family memfit loads), frozen and
 * forward-only, planned as a forward-only model whose rows are mirrored
 * into the student's plan in category `teacher`: its weights (persistent),
 * its forward working set (one row, `teacher.forward`, laid out by the
 * teacher's own phases and alive only in the student's embedding phase, in
 * which the teacher's whole forward runs), its final hidden states
 * (`teacher.hidden`, (B*T, C_teacher), until the student's head phase) and
 * one chunk of its logits (`teacher.logits`, (loss_chunk, Vp), head phase
 * only). The teacher reads the student's data rows (no copy). Neither
 * model's B*T*V logits exist: the KL runs a chunk of rows at a time beside
 * the student's chunked loss, the teacher's logits chunk made just before.
 * Promises: plan == ledger with a teacher as without one.
 */
#ifndef MEMFIT_DISTILL_H
#define MEMFIT_DISTILL_H

#include "memfit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double alpha;        /* weight of the KL term, in [0, 1] */
    double temperature;  /* T > 0 */
} mf_distill_cfg;

/* "alpha=0.5,temperature=2.0" (either key may be left out: 0.5 and 2.0);
 * -1 with a one-line message otherwise. */
int mf_distill_parse(const char *s, mf_distill_cfg *out);

typedef struct mf_teacher {
    mf_distill_cfg cfg;
    char path[MF_PATH_MAX];
    int kind;              /* --teacher_dtype as mf_quant_kind (0 = fp32) */
    mf_dims d;
    mf_plan plan;          /* its forward-only plan (offsets point into the student's arena) */
    mf_model model;
    mf_ledger ledger;      /* its own arena's bookkeeping; the run's ledger counts the mirror rows */
    mf_arena arena;        /* base = the student's arena (set by mf_teacher_attach) */
    int *mirror;           /* per teacher row: the student row it lives in, -1 = inside teacher.forward */
    mf_plan sub;           /* the rows inside teacher.forward, laid out by the teacher's phases */
    int *sub_id;           /* per teacher row: its row in sub, else -1 */
    int row_fwd, row_hidden, row_logits, row_qscr, row_gs; /* student plan rows (scratch: -1 if none) */
    size_t weight_bytes;   /* the teacher's persistent rows (its weights and tables) */
    /* the last training forward: sums over the counted targets */
    double kl_sum, ce_sum;
    int64_t counted;
} mf_teacher;

/* Plan builder hook (build.c, before the layout): with cfg->teacher set,
 * plans the teacher for the student's B x T and loss_chunk and adds its
 * rows to `plan`; m->teacher is then set (freed by mf_model_free). No-op
 * without a teacher. Refuses (-1, one line): a missing or unreadable
 * teacher, a tokenizer or vocabulary that differs from the student's
 * (naming both), alpha outside [0, 1], temperature <= 0, a student in
 * 16-bit precision. */
int mf_teacher_plan(const mf_config *cfg, mf_model *m, mf_plan *plan, int nthreads);
/* After the student's arena is mapped: the teacher's rows get their
 * offsets in it. */
int mf_teacher_attach(mf_teacher *t, const mf_arena *student);
void mf_teacher_free(mf_teacher *t);
/* The teacher's forward on the B x T tokens in the student's data rows, up
 * to its final norm (into teacher.hidden); call in the student's first
 * phase (after mf_arena_step, before mf_model_forward). */
void mf_teacher_forward(mf_model *student, mf_arena *a, int B, int T);
/* Head hook (driver.c): rows [r0, r0+rows) of the student's logits in
 * `logits` (chunk-local): the teacher's logits chunk is computed, then the
 * combined loss per row into losses, d(loss)/d(logits) * dscale into
 * logits (as mf_crossentropy_forward does). Returns the loss summed over
 * the rows. */
double mf_teacher_head_chunk(mf_model *student, mf_arena *a, float *logits, float *losses, const int32_t *tgt, int r0,
                             int rows, float dscale);
/* The loss kernel alone (tests): student logits z (rows, Vp) in, gradient
 * out (dscale != 0); teacher logits u (rows, Vp), overwritten with
 * exp((u - max u) / T) of the counted rows; padding columns >= V take no
 * part. kl and ce (may be NULL) receive the sums over counted rows of each
 * term unweighted (KL at temperature T, without T^2). */
double mf_distill_loss_forward(float *z, float *u, float *losses, const int32_t *tgt, int rows, int V, int Vp,
                               float alpha, float temperature, float dscale, double *kl, double *ce);

#ifdef __cplusplus
}
#endif
#endif
