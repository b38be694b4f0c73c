/* The arena layout never lets two buffers that are alive at the same time
 * share a byte, keeps every offset aligned, and reaches the lower bound
 * (the peak of live bytes) on a stack-shaped plan. */
#include "memfit/core.h"
#include "memfit/model.h"
#include "memfit/train.h"
#include "testutil.h"

#include <string.h>

static void check_plan(const mf_plan *p, const char *what) {
    CHECK(p->arena_bytes >= p->peak_bytes, "%s: arena %zu < peak %zu", what, p->arena_bytes, p->peak_bytes);
    for (int i = 0; i < p->n; i++) {
        const mf_buf *a = &p->bufs[i];
        CHECK(a->offset % MF_ALIGN == 0, "%s: %s misaligned", what, a->name);
        CHECK(a->offset + a->bytes <= p->arena_bytes, "%s: %s outside the arena", what, a->name);
        for (int j = i + 1; j < p->n; j++) {
            const mf_buf *b = &p->bufs[j];
            int live = a->first <= b->last && b->first <= a->last;
            int mem = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            if (live && mem && a->bytes && b->bytes)
                CHECK(0, "%s: %s and %s overlap in time and memory", what, a->name, b->name);
        }
    }
}

int main(void) {
    /* hand-made: a persistent buffer, two disjoint temporaries, one spanning */
    mf_plan p;
    mf_plan_init(&p, 4);
    int64_t s1[1] = {1000}, s2[1] = {500}, s3[1] = {700};
    mf_plan_add(&p, "w", MF_CAT_PARAMS, MF_DTYPE_F32, 1, s1, 0, 3, -1);
    mf_plan_add(&p, "a", MF_CAT_ACTS, MF_DTYPE_F32, 1, s2, 0, 1, -1);
    mf_plan_add(&p, "b", MF_CAT_WORK, MF_DTYPE_F32, 1, s2, 2, 3, -1);
    mf_plan_add(&p, "c", MF_CAT_WORK, MF_DTYPE_F32, 1, s3, 1, 2, -1);
    mf_plan_layout(&p);
    check_plan(&p, "hand-made");
    /* a and b can share: peak is w + max(a, c) + ... = 4000 + 2000 + 2816 */
    CHECK(p.peak_bytes == 4032 + 2048 + 2816, "peak %zu", p.peak_bytes);
    CHECK(p.arena_bytes == p.peak_bytes, "arena %zu should equal peak %zu", p.arena_bytes, p.peak_bytes);
    CHECK(p.bufs[1].offset == p.bufs[2].offset, "a and b should share bytes");
    /* bad rows are refused */
    CHECK(mf_plan_add(&p, "bad", MF_CAT_WORK, MF_DTYPE_F32, 1, s1, 3, 1, -1) < 0, "reversed lifetime accepted");
    CHECK(mf_plan_add(&p, "bad", MF_CAT_WORK, MF_DTYPE_F32, 1, s1, 0, 9, -1) < 0, "lifetime past the end accepted");
    mf_plan_free(&p);

    /* the model's plans, train and inference, several shapes */
    const char *models[] = {"gpt2-1m", "gpt2-10m", "gpt2-124m"};
    for (int k = 0; k < 3; k++) {
        for (int mode = 0; mode < 2; mode++) {
            mf_config c;
            mf_config_defaults(&c);
            mf_config_set(&c, "model", models[k]);
            mf_config_set(&c, "batch", "2");
            mf_config_set(&c, "seq", "64");
            mf_dims d;
            mf_model m;
            CHECK(mf_model_build_plan(&c, mode ? MF_MODE_INFER : MF_MODE_TRAIN, 2, 0, &d, &p, &m) == 0, "%s", mf_error());
            check_plan(&p, models[k]);
            /* fragmentation stays small */
            CHECK((double)p.arena_bytes <= 1.05 * (double)p.peak_bytes, "%s mode %d: arena %zu vs peak %zu",
                  models[k], mode, p.arena_bytes, p.peak_bytes);
            if (mode == 1) CHECK(p.total_cat[MF_CAT_GRADS] == 0 && p.total_cat[MF_CAT_OPTIM] == 0, "inference plan has grads");
            mf_model_free(&m);
            mf_plan_free(&p);
        }
    }
    /* the 124M parameter count matches Hugging Face's */
    mf_config c;
    mf_config_defaults(&c);
    mf_config_set(&c, "model", "gpt2-124m");
    mf_dims d;
    CHECK(mf_model_dims(&c, &d) == 0, "dims");
    CHECK(mf_model_n_params(&d) == 124439808LL, "gpt2-124m has %lld params", (long long)mf_model_n_params(&d));
    mf_config_set(&c, "model", "gpt2-350m");
    mf_model_dims(&c, &d);
    CHECK(mf_model_n_params(&d) == 354823168LL, "gpt2-350m has %lld params", (long long)mf_model_n_params(&d));
    return mf_test_done("test_plan_layout_no_overlap");
}
