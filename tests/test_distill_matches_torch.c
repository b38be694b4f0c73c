/* Distillation (--teacher, --distill) against PyTorch and against itself:
 *   - a GPT-2 student (2 layers, C 32) distilled from a GPT-2 teacher of
 *     another shape (3 layers, C 48, trained a few steps so its
 *     distribution is not flat), a batch with masked targets (-1), the loss
 *     and every student gradient against tests/ref/distill_torch.py within
 *     1e-5, with a chunked loss (loss_chunk 7, not dividing B*T) and
 *     unchunked (loss_chunk 0); the gradients of the reversed direction
 *     KL(student || teacher) differ from ours by far more than the
 *     tolerance (the check tells the directions apart);
 *   - alpha 0 trains bit for bit as without a teacher (3 steps);
 *   - a teacher equal to the student's initial weights: the KL term of the
 *     first step is 0;
 *   - planned == ledger with a teacher stored fp32, bf16, int8 and nf4,
 *     and the teacher's weight bytes
 *     shrink in that order (a Llama-family teacher: tests/test_cli_distill.sh). */
#include "memfit/distill.h"
#include "io/io.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

#define B_ 2
#define T_ 16

static int init(mf_trainer *t, mf_config *c) {
    if (mf_trainer_init(t, c, MF_MODE_TRAIN)) { CHECK(0, "init: %s", mf_error()); return -1; }
    return 0;
}

/* A trained teacher of another shape, saved as a memfit weights file */
static int make_teacher(const char *data, const char *path, int steps) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "n_layer", "3");
    mf_config_set(&c, "n_embd", "48");
    mf_config_set(&c, "seed", "99");
    mf_config_set(&c, "lr", "1e-2");
    mf_trainer t;
    if (init(&t, &c)) return -1;
    for (int i = 0; i < steps; i++) CHECK(mf_trainer_step(&t, NULL) == 0, "teacher step: %s", mf_error());
    int rc = mf_trainer_save_weights(&t, path);
    CHECK(rc == 0, "save teacher: %s", mf_error());
    mf_trainer_free(&t);
    return rc;
}

/* One forward/backward of the student on the loaded batch with some
 * targets masked; returns the loss (dscale = 1 / counted targets) */
static double one_pass(mf_trainer *t, int mask) {
    mf_arena *a = &t->arena;
    mf_arena_step(a);
    mf_model_zero_grads(&t->model, a);
    mf_trainer_load_batch(t);
    int32_t *tg = mf_arena_ptr(a, t->model.targets);
    int counted = 0;
    for (int i = 0; i < B_ * T_; i++) {
        if (mask && (i % 5 == 1 || (i >= 3 && i < 7))) tg[i] = MF_TARGET_IGNORE;
        counted += tg[i] != MF_TARGET_IGNORE;
    }
    if (t->model.teacher) mf_teacher_forward(&t->model, a, B_, T_);
    double loss = mf_model_forward(&t->model, a, B_, T_, 1, 1.0f / (float)counted);
    mf_model_backward(&t->model, a, B_, T_);
    return loss;
}

static double max_rel_diff(const float *a, const float *b, size_t n, double atol) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (atol + fabs((double)b[i]));
        if (d > worst) worst = d;
    }
    return worst;
}

static void torch_case(const char *src, const char *data, const char *teacher, const char *dir) {
    char p[1200], cmd[4096];
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "teacher", teacher);
    mf_config_set(&c, "distill", "alpha=0.7,temperature=2.5");
    mf_config_set(&c, "loss_chunk", "7");
    mf_trainer t, u;
    if (init(&t, &c)) return;
    mf_config_set(&c, "loss_chunk", "0");
    if (init(&u, &c)) { mf_trainer_free(&t); return; }
    snprintf(p, sizeof p, "%s/student.safetensors", dir);
    CHECK(mf_trainer_save_weights(&t, p) == 0, "save student: %s", mf_error());
    double loss = one_pass(&t, 1), loss0 = one_pass(&u, 1);
    /* the batch, as the reference reads it */
    const int32_t *in = mf_arena_ptr(&t.arena, t.model.inputs), *tg = mf_arena_ptr(&t.arena, t.model.targets);
    mf_st_entry e[2] = {{"inputs", MF_DTYPE_I32, 2, {B_, T_}, in, B_ * T_ * 4, NULL, NULL},
                        {"targets", MF_DTYPE_I32, 2, {B_, T_}, tg, B_ * T_ * 4, NULL, NULL}};
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    CHECK(mf_st_write(p, e, 2, NULL, NULL, 0) == 0, "batch: %s", mf_error());
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/distill_torch.py forward --student %s/student.safetensors --student_heads 4 "
             "--teacher %s --teacher_heads 4 --batch %s/batch.safetensors --alpha 0.7 --temperature 2.5 --out "
             "%s/ref.safetensors",
             src, dir, teacher, dir, dir);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s", cmd); goto done; }
    mf_st_file ref;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (mf_st_open(&ref, p)) { CHECK(0, "%s", mf_error()); goto done; }
    double want = atof(mf_st_meta(&ref, "loss")), rev = atof(mf_st_meta(&ref, "loss_rev"));
    printf("loss: memfit %.9g (unchunked %.9g), torch %.9g, reversed KL %.9g\n", loss, loss0, want, rev);
    CHECK(mf_close(loss, want, 1e-5, 1e-7), "loss %.9g vs torch %.9g", loss, want);
    CHECK(mf_close(loss0, want, 1e-5, 1e-7), "unchunked loss %.9g vs torch %.9g", loss0, want);
    double worst_rev = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[128];
        snprintf(nm, sizeof nm, "grad.%s", x->name);
        const mf_st_tensor *g = mf_st_find(&ref, nm);
        snprintf(nm, sizeof nm, "rev.grad.%s", x->name);
        const mf_st_tensor *gr = mf_st_find(&ref, nm);
        if (!g || !gr || g->nbytes != (size_t)x->numel * 4) { CHECK(0, "reference lacks %s", nm); continue; }
        const float *mine = mf_arena_ptr(&t.arena, x->g), *whole = mf_arena_ptr(&u.arena, u.model.tensors[i].g);
        mf_test_compare(x->name, mine, g->data, (size_t)x->numel, 1e-5, 1e-6);
        /* chunked == unchunked (the same kernels on other row splits) */
        snprintf(nm, sizeof nm, "unchunked %s", x->name);
        mf_test_compare(nm, whole, mine, (size_t)x->numel, 1e-5, 1e-7);
        double r = max_rel_diff(mine, gr->data, (size_t)x->numel, 1e-6);
        if (r > worst_rev) worst_rev = r;
    }
    printf("reversed KL direction: worst gradient difference %.3g (relative)\n", worst_rev);
    CHECK(worst_rev > 1e-2, "the reversed KL's gradients are within %.3g of ours: the check cannot tell them apart",
          worst_rev);
    CHECK(fabs(loss - rev) > 1e-4, "the reversed KL's loss %.9g is ours %.9g", rev, loss);
    mf_st_close(&ref);
done:
    mf_trainer_free(&t);
    mf_trainer_free(&u);
}

static void alpha0_bitwise(const char *data, const char *teacher) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_trainer a, b;
    if (init(&a, &c)) return;
    mf_config_set(&c, "teacher", teacher);
    mf_config_set(&c, "distill", "alpha=0,temperature=3");
    if (init(&b, &c)) { mf_trainer_free(&a); return; }
    double la[3], lb[3];
    tu_steps(&a, 0, 3, la);
    tu_steps(&b, 0, 3, lb);
    size_t na, nb;
    float *wa = tu_copy_tensors(&a, 0, &na), *wb = tu_copy_tensors(&b, 0, &nb);
    for (int i = 0; i < 3; i++) CHECK(la[i] == lb[i], "alpha 0 step %d: loss %.9g != plain %.9g", i + 1, lb[i], la[i]);
    CHECK(na == nb && wa && wb && memcmp(wa, wb, na * sizeof *wa) == 0, "alpha 0: weights differ from plain training");
    printf("alpha 0: 3 steps bit for bit as plain training (losses %.9g %.9g %.9g)\n", lb[0], lb[1], lb[2]);
    free(wa);
    free(wb);
    mf_trainer_free(&a);
    mf_trainer_free(&b);
}

static void self_teacher(const char *data, const char *dir) {
    char p[1200];
    mf_config c;
    tu_tiny_config(&c, data);
    mf_trainer a, b;
    if (init(&a, &c)) return;
    snprintf(p, sizeof p, "%s/self.safetensors", dir);
    CHECK(mf_trainer_save_weights(&a, p) == 0, "save: %s", mf_error());
    mf_trainer_free(&a);
    mf_config_set(&c, "teacher", p);
    if (init(&b, &c)) return;
    mf_step_stats st;
    CHECK(mf_trainer_step(&b, &st) == 0, "step: %s", mf_error());
    const mf_teacher *te = b.model.teacher;
    CHECK(te && te->counted == B_ * T_, "counted %lld", te ? (long long)te->counted : -1LL);
    printf("teacher = the student's initial weights: KL at step 1 %.3g (over %lld targets), CE %.6f\n",
           te ? te->kl_sum : -1.0, te ? (long long)te->counted : -1LL, te ? te->ce_sum / te->counted : -1.0);
    CHECK(te && fabs(te->kl_sum) <= 1e-9 * (double)te->counted, "KL term %.3g is not 0", te ? te->kl_sum : -1.0);
    mf_trainer_free(&b);
}

static void ledger_per_dtype(const char *data, const char *teacher) {
    const char *dt[] = {"fp32", "bf16", "int8", "nf4"};
    size_t prev = 0;
    for (int k = 0; k < 4; k++) {
        mf_config c;
        tu_tiny_config(&c, data);
        mf_config_set(&c, "teacher", teacher);
        mf_config_set(&c, "teacher_dtype", dt[k]);
        mf_config_set(&c, "loss_chunk", "5");
        mf_trainer t;
        if (init(&t, &c)) continue;
        for (int i = 0; i < 2; i++) CHECK(mf_trainer_step(&t, NULL) == 0, "%s step: %s", dt[k], mf_error());
        CHECK(t.ledger.peak_total == t.plan.peak_bytes, "%s: ledger peak %zu != planned %zu", dt[k],
              t.ledger.peak_total, t.plan.peak_bytes);
        for (int i = 0; i < MF_CAT_COUNT; i++)
            CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "%s %s: ledger %zu != planned %zu", dt[k],
                  mf_cat_name((mf_cat)i), t.ledger.at_peak[i], t.plan.peak_cat[i]);
        size_t wb = t.model.teacher->weight_bytes;
        printf("teacher %s: weights %zu bytes, category teacher at peak %zu, plan == ledger (%zu)\n", dt[k], wb,
               t.plan.peak_cat[MF_CAT_TEACHER], t.plan.peak_bytes);
        CHECK(t.plan.max_cat[MF_CAT_TEACHER] > wb, "%s: the teacher's forward rows are not planned", dt[k]);
        CHECK(k == 0 || wb < prev, "%s: %zu teacher bytes, not fewer than %s's %zu", dt[k], wb, dt[k - 1], prev);
        prev = wb;
        mf_trainer_free(&t);
    }
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    if (!src) src = "..";
    char data[64], dir[] = "/tmp/memfit-distill-XXXXXX", teacher[1200];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 7) == 0, "token file: %s", mf_error());
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return mf_test_done("test_distill_matches_torch"); }
    snprintf(teacher, sizeof teacher, "%s/teacher.safetensors", dir);
    if (make_teacher(data, teacher, 15) == 0) {
        torch_case(src, data, teacher, dir);
        alpha0_bitwise(data, teacher);
        self_teacher(data, dir);
        ledger_per_dtype(data, teacher);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    unlink(data);
    return mf_test_done("test_distill_matches_torch");
}
