/* For every optimizer: training 8 steps straight and training 4,
 * checkpointing, and resuming for 4 more in a fresh trainer give
 * bit-identical losses, weights and optimizer state. A checkpoint of
 * another model shape or another optimizer is refused. AdamW likewise under
 * precision bf16 (with and without master weights) and fp16 (whose loss
 * scale changes before the checkpoint and must be restored). */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

static void one(const char *data, const char *ckpt, const char *opt, const char *momentum, const char *prec,
                const char *master) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", prec);
    mf_config_set(&c, "master_weights", master);
    mf_config_set(&c, "loss_scale_interval", "3");
    mf_config_set(&c, "steps", "8");
    mf_config_set(&c, "optimizer", opt);
    mf_config_set(&c, "momentum", momentum);
    double straight[8], resumed[8];
    mf_trainer a, b;
    if (mf_trainer_init(&a, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", opt, mf_error()); return; }
    for (int i = 0; i < 8; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&a, &st) == 0, "%s", mf_error());
        straight[i] = st.loss;
        if (i == 3) CHECK(mf_trainer_save_checkpoint(&a, ckpt) == 0, "%s", mf_error());
    }
    mf_config_set(&c, "resume", ckpt);
    if (mf_trainer_init(&b, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", opt, mf_error()); mf_trainer_free(&a); return; }
    CHECK(b.step == 4, "resumed at step %d", b.step);
    for (int i = 4; i < 8; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&b, &st) == 0, "%s", mf_error());
        resumed[i] = st.loss;
        CHECK(memcmp(&resumed[i], &straight[i], sizeof(double)) == 0, "%s step %d: %.17g vs %.17g", opt, i + 1,
              resumed[i], straight[i]);
    }
    CHECK(straight[7] < straight[0], "%s: loss did not fall: %g -> %g", opt, straight[0], straight[7]);
    int nstate = 0;
    for (int i = 0; i < a.model.n_tensors; i++) {
        const mf_tensor *x = &a.model.tensors[i];
        CHECK(memcmp(mf_arena_ptr(&a.arena, x->p), mf_arena_ptr(&b.arena, b.model.tensors[i].p),
                     a.plan.bufs[x->p].bytes) == 0, "%s %s: weights %s differ", opt, prec, x->name);
        if (x->mw >= 0)
            CHECK(memcmp(mf_arena_ptr(&a.arena, x->mw), mf_arena_ptr(&b.arena, b.model.tensors[i].mw),
                         a.plan.bufs[x->mw].bytes) == 0, "%s %s: master weights %s differ", opt, prec, x->name);
        for (int k = 0; k < MF_OPTIM_STATES; k++) {
            int id = x->st[k];
            CHECK(id == b.model.tensors[i].st[k], "%s: state rows differ", opt);
            if (id < 0) continue;
            nstate++;
            CHECK(memcmp(mf_arena_ptr(&a.arena, id), mf_arena_ptr(&b.arena, id), a.plan.bufs[id].bytes) == 0,
                  "%s: state %s differs", opt, a.plan.bufs[id].name);
        }
    }
    CHECK(a.data_pos == b.data_pos && a.rng.s == b.rng.s, "data position or rng differ");
    CHECK(a.scaler.scale == b.scaler.scale && a.scaler.clean == b.scaler.clean && a.scaler.skipped == b.scaler.skipped,
          "%s: loss scaler differs after resume (%g vs %g)", prec, (double)a.scaler.scale, (double)b.scaler.scale);
    printf("%-10s %s%s 8 losses, weights and %d state rows bit-identical after resume\n", opt, prec,
           strcmp(master, "1") ? " (no master)" : "", nstate);
    mf_trainer_free(&b);
    /* the same checkpoint under another optimizer is refused */
    mf_config_set(&c, "optimizer", strcmp(opt, "sgd") ? "sgd" : "adamw");
    CHECK(mf_trainer_init(&b, &c, MF_MODE_TRAIN) != 0, "checkpoint of %s accepted by another optimizer", opt);
    CHECK(strstr(mf_error(), "state but the run uses optimizer") != NULL, "message: %s", mf_error());
    /* and under another model shape */
    mf_config_set(&c, "optimizer", opt);
    mf_config_set(&c, "n_embd", "48");
    mf_config_set(&c, "n_head", "4");
    CHECK(mf_trainer_init(&b, &c, MF_MODE_TRAIN) != 0, "mismatched checkpoint accepted");
    CHECK(strstr(mf_error(), "does not match") != NULL, "message: %s", mf_error());
    mf_trainer_free(&a);
}

int main(void) {
    char data[64], ckpt[96];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 11) == 0, "token file: %s", mf_error());
    snprintf(ckpt, sizeof ckpt, "%s.ckpt.safetensors", data);
    one(data, ckpt, "adamw", "0", "fp32", "1");
    one(data, ckpt, "adamw8bit", "0", "fp32", "1");
    one(data, ckpt, "adafactor", "0.9", "fp32", "1");
    one(data, ckpt, "sgd", "0.9", "fp32", "1");
    one(data, ckpt, "adamw", "0", "bf16", "1");
    one(data, ckpt, "adamw", "0", "bf16", "0");
    one(data, ckpt, "adamw", "0", "fp16", "1");
    unlink(ckpt);
    unlink(data);
    return mf_test_done("test_resume_bitwise");
}
