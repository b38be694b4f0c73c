/* Distillation, the trainer's side: the teacher's weights loaded into its
 * rows (the same loaders as --init, on a forward-only trainer view of the
 * teacher), after the student's arena is mapped. The plan and the step are
 * src/model/teacher.c's. */
#include "memfit/distill.h"
#include "memfit/train.h"

#include <stdlib.h>
#include <string.h>

int mf_trainer_load_teacher(mf_trainer *t) {
    mf_teacher *te = t->model.teacher;
    if (!te) return 0;
    if (mf_teacher_attach(te, &t->arena)) return -1;
    /* a view of the teacher as a forward-only trainer: the loaders read
     * only its shape, plan, model and arena */
    mf_trainer *v = calloc(1, sizeof *v);
    if (!v) return mf_fail("out of memory loading the teacher");
    v->mode = MF_MODE_INFER;
    v->d = te->d;
    v->plan = te->plan;
    v->model = te->model;
    v->arena = te->arena;
    v->world = 1;
    int rc = mf_trainer_load_weights(v, te->path);
    free(v);
    if (rc) return mf_fail("teacher %s", mf_error());
    return 0;
}
