/* Training 8 steps straight and training 4, checkpointing, and resuming
 * for 4 more in a fresh trainer give bit-identical losses and weights. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

int main(void) {
    char data[64], ckpt[96];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 11) == 0, "token file: %s", mf_error());
    snprintf(ckpt, sizeof ckpt, "%s.ckpt.safetensors", data);
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "steps", "8");
    double straight[8], resumed[8];
    mf_trainer a, b;
    CHECK(mf_trainer_init(&a, &c, MF_MODE_TRAIN) == 0, "%s", mf_error());
    for (int i = 0; i < 8; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&a, &st) == 0, "%s", mf_error());
        straight[i] = st.loss;
        if (i == 3) CHECK(mf_trainer_save_checkpoint(&a, ckpt) == 0, "%s", mf_error());
    }
    /* a fresh trainer from the checkpoint */
    mf_config_set(&c, "resume", ckpt);
    CHECK(mf_trainer_init(&b, &c, MF_MODE_TRAIN) == 0, "%s", mf_error());
    CHECK(b.step == 4, "resumed at step %d", b.step);
    for (int i = 4; i < 8; i++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&b, &st) == 0, "%s", mf_error());
        resumed[i] = st.loss;
        CHECK(memcmp(&resumed[i], &straight[i], sizeof(double)) == 0, "step %d: %.17g vs %.17g", i + 1,
              resumed[i], straight[i]);
    }
    CHECK(straight[7] < straight[0], "loss did not fall: %g -> %g", straight[0], straight[7]);
    for (int i = 0; i < a.model.n_tensors; i++) {
        const mf_tensor *x = &a.model.tensors[i];
        CHECK(memcmp(mf_arena_ptr(&a.arena, x->p), mf_arena_ptr(&b.arena, b.model.tensors[i].p),
                     (size_t)x->numel * sizeof(float)) == 0, "weights %s differ", x->name);
        CHECK(memcmp(mf_arena_ptr(&a.arena, x->v), mf_arena_ptr(&b.arena, b.model.tensors[i].v),
                     (size_t)x->numel * sizeof(float)) == 0, "adam v %s differs", x->name);
    }
    CHECK(a.data_pos == b.data_pos && a.rng.s == b.rng.s, "data position or rng differ");
    /* a checkpoint of another model shape is refused with a clear message */
    mf_trainer_free(&b);
    mf_config_set(&c, "n_embd", "48");
    mf_config_set(&c, "n_head", "4");
    CHECK(mf_trainer_init(&b, &c, MF_MODE_TRAIN) != 0, "mismatched checkpoint accepted");
    CHECK(strstr(mf_error(), "does not match") != NULL, "message: %s", mf_error());
    mf_trainer_free(&a);
    unlink(ckpt);
    unlink(data);
    return mf_test_done("test_resume_bitwise");
}
