/* The message of a step that went non-finite (issue #23): instead of
 * guessing at the learning rate, name the first NaN or infinity in forward
 * order - the weights (tensor by tensor: compute copy, fp32 master, ZeRO
 * shard), then the step's activations still in the arena (a row released
 * at a phase change may already hold another buffer's bytes, so only live
 * rows are read), then the gradients. When the weights are all finite, the
 * largest weight is named too: a huge but finite weight overflows in the
 * forward and turns every gradient into NaN, so the first NaN gradient alone
 * would point at the wrong place. Runs only after the step went bad: it
 * reads every weight, so the normal path never pays for it. */
#include "memfit/train.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    const mf_arena *a;
    int id;        /* row found, or -1 */
    int64_t idx;
    float val;
} hit;

static void first_nonfinite(hit *h, int id) {
    if (h->id < 0 && id >= 0 && mf_arena_row_nonfinite(h->a, id, &h->idx, &h->val)) h->id = id;
}

static void largest(hit *h, int id) {
    int64_t j;
    float v;
    if (id < 0 || !mf_arena_row_maxabs(h->a, id, &j, &v)) return;
    if (h->id < 0 || fabsf(v) > fabsf(h->val)) *h = (hit){h->a, id, j, v};
}

int mf_trainer_fail_nonfinite(mf_trainer *t, double loss, double norm) {
    const mf_model *m = &t->model;
    const mf_plan *p = t->arena.plan;
    hit h = {&t->arena, -1, 0, 0};
    const char *kind = "weight";
    for (int i = 0; i < m->n_tensors; i++) {
        const mf_tensor *x = &m->tensors[i];
        first_nonfinite(&h, x->p);
        first_nonfinite(&h, x->mw);
        first_nonfinite(&h, x->ps);
        first_nonfinite(&h, x->pb);
    }
    int weights_finite = h.id < 0;
    if (h.id < 0) kind = "activation";
    for (int id = 0; h.id < 0 && id < p->n; id++)
        if (p->bufs[id].cat == MF_CAT_ACTS) first_nonfinite(&h, id);
    if (h.id < 0) kind = "gradient";
    for (int i = 0; h.id < 0 && i < m->n_tensors; i++) {
        first_nonfinite(&h, m->tensors[i].g);
        first_nonfinite(&h, m->tensors[i].gs);
    }
    char what[224] = "none in the weights, the activations still in memory or the gradients (an intermediate "
                     "overflowed)";
    if (h.id >= 0)
        snprintf(what, sizeof what, "%s %s element %lld is %g", kind, p->bufs[h.id].name, (long long)h.idx,
                 (double)h.val);
    char big[192] = "";
    if (weights_finite) {
        hit w = {&t->arena, -1, 0, 0};
        for (int i = 0; i < m->n_tensors; i++) {
            largest(&w, m->tensors[i].p);
            largest(&w, m->tensors[i].mw);
            largest(&w, m->tensors[i].ps);
        }
        if (w.id >= 0)
            snprintf(big, sizeof big, "; weights all finite, largest %s element %lld = %g", p->bufs[w.id].name,
                     (long long)w.idx, (double)w.val);
    }
    return mf_fail("step %d: loss or gradient is not finite (loss %g, grad norm %g); first non-finite tensor "
                   "(weights, activations, gradients): %s%s%s", t->step + 1, loss, norm, what, big,
                   m->opt.in_backward ? " (update_in_backward: tensors updated before the bad gradient keep their "
                                        "update; resume from the last checkpoint)" : "");
}
