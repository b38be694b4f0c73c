/* fp16 training with dynamic loss scaling, through the trainer:
 *  - the first steps run at the initial scale 2^16 and update the weights;
 *  - an injected overflow (an inf in one gradient) skips the update: every
 *    weight (16-bit copies and fp32 master rows) and every optimizer state
 *    byte is untouched, the scale halves, the step is reported skipped and
 *    counted;
 *  - after loss_scale_interval clean steps in a row the scale doubles;
 *  - bf16 and fp32 runs have no scaler (scale 0 in the step stats). */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

/* Copies every persistent params/master/optim row (bytes) into one buffer. */
static unsigned char *snapshot(const mf_trainer *t, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < t->plan.n; i++) {
        const mf_buf *b = &t->plan.bufs[i];
        if (b->cat == MF_CAT_PARAMS || b->cat == MF_CAT_MASTER || b->cat == MF_CAT_OPTIM) total += b->bytes;
    }
    unsigned char *out = malloc(total ? total : 1), *p = out;
    for (int i = 0; out && i < t->plan.n; i++) {
        const mf_buf *b = &t->plan.bufs[i];
        if (b->cat != MF_CAT_PARAMS && b->cat != MF_CAT_MASTER && b->cat != MF_CAT_OPTIM) continue;
        memcpy(p, mf_arena_ptr(&t->arena, i), b->bytes);
        p += b->bytes;
    }
    *n = total;
    return out;
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 5) == 0, "token file: %s", mf_error());
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", "fp16");
    mf_config_set(&c, "loss_scale_interval", "3");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) {
        CHECK(0, "init: %s", mf_error());
        return mf_test_done("test_precision_scaler_trainer");
    }
    mf_step_stats st;
    size_t n0, n1;
    unsigned char *s0 = snapshot(&t, &n0), *s1;
    CHECK(mf_trainer_step(&t, &st) == 0, "step 1: %s", mf_error());
    CHECK(st.loss_scale == 65536.0 && !st.skipped, "step 1: scale %g skipped %d", st.loss_scale, st.skipped);
    s1 = snapshot(&t, &n1);
    CHECK(n0 == n1 && memcmp(s0, s1, n0) != 0, "a clean step must update the weights");
    free(s0);
    free(s1);

    /* an overflow: skipped, nothing touched, scale halved */
    s0 = snapshot(&t, &n0);
    t.inject_overflow = 1;
    CHECK(mf_trainer_step(&t, &st) == 0, "overflow step: %s", mf_error());
    CHECK(st.skipped == 1 && st.loss_scale == 65536.0, "overflow step: skipped %d at scale %g", st.skipped, st.loss_scale);
    CHECK(t.scaler.scale == 32768.0f && t.scaler.skipped == 1 && t.scaler.clean == 0, "after overflow: scale %g, skipped %lld",
          (double)t.scaler.scale, (long long)t.scaler.skipped);
    s1 = snapshot(&t, &n1);
    CHECK(n0 == n1 && memcmp(s0, s1, n0) == 0, "a skipped step changed weights or optimizer state");
    CHECK(t.step == 2, "the skipped step still counts (step %d)", t.step);
    free(s0);
    free(s1);

    /* three clean steps at 2^15, then the scale doubles */
    for (int i = 0; i < 3; i++) {
        CHECK(mf_trainer_step(&t, &st) == 0, "clean step: %s", mf_error());
        CHECK(!st.skipped && st.loss_scale == 32768.0, "clean step %d: scale %g skipped %d", i, st.loss_scale, st.skipped);
    }
    CHECK(t.scaler.scale == 65536.0f, "after 3 clean steps the scale is %g, expected 65536", (double)t.scaler.scale);
    mf_trainer_free(&t);

    /* no scaler outside fp16 */
    const char *others[] = {"bf16", "fp32"};
    for (int k = 0; k < 2; k++) {
        mf_config_set(&c, "precision", others[k]);
        if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s init: %s", others[k], mf_error()); continue; }
        CHECK(mf_trainer_step(&t, &st) == 0 && st.loss_scale == 0.0 && !t.use_scaler, "%s: scaler in use", others[k]);
        mf_trainer_free(&t);
    }
    unlink(data);
    return mf_test_done("test_precision_scaler_trainer");
}
