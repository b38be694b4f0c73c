/* offload optimizer=disk:PATH gives bitwise the losses, weights and state
 * of in-memory training, for every optimizer that can offload, with a
 * window small enough that tensors span several chunks; a checkpoint
 * written with offload resumes without it and the other way round, bit
 * for bit; the state takes no arena bytes and the ledger matches the plan. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

static void config(mf_config *c, const char *data, const char *opt, const char *offload) {
    tu_tiny_config(c, data);
    mf_config_set(c, "optimizer", opt);
    mf_config_set(c, "momentum", strcmp(opt, "sgd") == 0 ? "0.9" : "0");
    mf_config_set(c, "offload", offload);
    mf_config_set(c, "offload_window", "16KiB");
}

/* Bytes of state row k of tensor i, wherever it lives. */
static unsigned char *state_bytes(mf_trainer *t, int i, int k, size_t *n) {
    int id = t->model.tensors[i].st[k];
    const mf_buf *b = &t->plan.bufs[id];
    *n = (size_t)b->numel * mf_dtype_size(b->dtype);
    unsigned char *out = malloc(*n);
    if (b->disk) { if (mf_offstate_row_io(t, i, id, 0, out, *n, 0)) CHECK(0, "%s", mf_error()); }
    else memcpy(out, mf_arena_ptr(&t->arena, id), *n);
    return out;
}

static void same_state(mf_trainer *a, mf_trainer *b, const char *what) {
    for (int i = 0; i < a->model.n_tensors; i++) {
        const mf_tensor *x = &a->model.tensors[i];
        CHECK(memcmp(mf_arena_ptr(&a->arena, x->p), mf_arena_ptr(&b->arena, b->model.tensors[i].p),
                     (size_t)x->numel * sizeof(float)) == 0, "%s: weights %s differ", what, x->name);
        for (int k = 0; k < MF_OPTIM_STATES; k++) {
            if (x->st[k] < 0) continue;
            size_t na, nb;
            unsigned char *sa = state_bytes(a, i, k, &na), *sb = state_bytes(b, i, k, &nb);
            CHECK(na == nb && memcmp(sa, sb, na) == 0, "%s: state %s differs", what, a->plan.bufs[x->st[k]].name);
            free(sa);
            free(sb);
        }
    }
}

static void one(const char *data, const char *opt) {
    char path[96], ckpt[96], off[128];
    snprintf(path, sizeof path, "%s.%s.state", data, opt);
    snprintf(ckpt, sizeof ckpt, "%s.%s.ckpt", data, opt);
    snprintf(off, sizeof off, "optimizer=disk:%s", path);
    mf_config cm, cd;
    config(&cm, data, opt, "");
    config(&cd, data, opt, off);
    mf_trainer a, b;
    if (mf_trainer_init(&a, &cm, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    if (mf_trainer_init(&b, &cd, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); mf_trainer_free(&a); return; }
    CHECK(b.plan.peak_cat[MF_CAT_OPTIM] == 0 && b.plan.disk_bytes == a.plan.total_cat[MF_CAT_OPTIM] +
          a.plan.total_cat[MF_CAT_QUANT] - b.plan.total_cat[MF_CAT_QUANT] - b.plan.total_cat[MF_CAT_OPTIM],
          "%s: state not moved to disk (%zu on disk)", opt, b.plan.disk_bytes);
    CHECK(b.off_n > 2, "%s: only %d chunks", opt, b.off_n);
    for (int s = 0; s < 5; s++) {
        mf_step_stats sa, sb;
        CHECK(mf_trainer_step(&a, &sa) == 0 && mf_trainer_step(&b, &sb) == 0, "%s", mf_error());
        CHECK(sa.loss == sb.loss, "%s step %d: %.17g vs %.17g", opt, s + 1, sa.loss, sb.loss);
    }
    same_state(&a, &b, opt);
    CHECK(b.ledger.peak_total == b.plan.peak_bytes, "%s: ledger %zu != plan %zu", opt, b.ledger.peak_total, b.plan.peak_bytes);
    printf("%-10s 5 steps: losses, weights and state bitwise equal; %.1f KiB state on disk in %d chunks\n",
           opt, b.plan.disk_bytes / 1024.0, b.off_n);
    /* an offloaded run's checkpoint resumes in memory, and the reverse */
    CHECK(mf_trainer_save_checkpoint(&b, ckpt) == 0, "%s", mf_error());
    mf_trainer c;
    mf_config_set(&cm, "resume", ckpt);
    if (mf_trainer_init(&c, &cm, MF_MODE_TRAIN) == 0) {
        same_state(&a, &c, "disk checkpoint -> memory");
        mf_trainer_free(&c);
    } else CHECK(0, "%s", mf_error());
    CHECK(mf_trainer_save_checkpoint(&a, ckpt) == 0, "%s", mf_error());
    mf_config_set(&cd, "resume", ckpt);
    if (mf_trainer_init(&c, &cd, MF_MODE_TRAIN) == 0) {
        same_state(&a, &c, "memory checkpoint -> disk");
        mf_step_stats sa, sc;
        CHECK(mf_trainer_step(&a, &sa) == 0 && mf_trainer_step(&c, &sc) == 0 && sa.loss == sc.loss,
              "%s: step after resuming differs", opt);
        same_state(&a, &c, "a step after resuming on disk");
        mf_trainer_free(&c);
    } else CHECK(0, "%s", mf_error());
    mf_trainer_free(&a);
    mf_trainer_free(&b);
    CHECK(access(path, F_OK) != 0, "%s: state file left behind", opt);
    unlink(ckpt);
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 9) == 0, "token file: %s", mf_error());
    one(data, "adamw");
    one(data, "adamw8bit");
    one(data, "sgd");
    /* refused: a combination that cannot stream, a bad spec, a missing directory */
    mf_config c;
    mf_trainer t;
    config(&c, data, "adafactor", "optimizer=disk:/tmp/x");
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "adafactor"), "adafactor: %s", mf_error());
    CHECK(mf_config_set(&c, "offload", "optimizer=ram") == 0, "set");
    config(&c, data, "adamw", "optimizer=ram");
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "optimizer=disk:PATH"), "spec: %s", mf_error());
    config(&c, data, "adamw", "optimizer=disk:/nonexistent-memfit/state");
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "/nonexistent-memfit/state"),
          "missing dir: %s", mf_error());
    unlink(data);
    return mf_test_done("test_offload_matches_memory");
}
