/* For several model shapes, batch sizes and accumulation settings, the
 * ledger's peak after real training steps equals the plan's predicted peak
 * to the byte, in total and per category; and inference plans likewise. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

typedef struct { const char *L, *C, *H, *T, *B, *accum; int infer; } shape;

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 7) == 0, "token file: %s", mf_error());
    const shape shapes[] = {
        {"2", "32", "4", "16", "2", "1", 0},
        {"1", "48", "3", "7", "3", "1", 0},
        {"3", "64", "8", "32", "1", "2", 0},
        {"4", "16", "2", "13", "5", "3", 0},
        {"2", "96", "6", "24", "4", "1", 0},
        {"2", "32", "4", "16", "2", "1", 1},
        {"3", "64", "8", "32", "3", "1", 1},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const shape *s = &shapes[k];
        mf_config c;
        tu_tiny_config(&c, data);
        mf_config_set(&c, "n_layer", s->L);
        mf_config_set(&c, "n_embd", s->C);
        mf_config_set(&c, "n_head", s->H);
        mf_config_set(&c, "block_size", s->T);
        mf_config_set(&c, "seq", s->T);
        mf_config_set(&c, "batch", s->B);
        mf_config_set(&c, "grad_accum", s->accum);
        mf_trainer t;
        if (mf_trainer_init(&t, &c, s->infer ? MF_MODE_INFER : MF_MODE_TRAIN)) {
            CHECK(0, "init shape %zu: %s", k, mf_error());
            continue;
        }
        if (s->infer) mf_trainer_val_loss(&t);
        else
            for (int i = 0; i < 2; i++) CHECK(mf_trainer_step(&t, NULL) == 0, "step: %s", mf_error());
        CHECK(t.ledger.peak_total == t.plan.peak_bytes, "shape %zu: ledger peak %zu != planned %zu", k,
              t.ledger.peak_total, t.plan.peak_bytes);
        for (int i = 0; i < MF_CAT_COUNT; i++)
            CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "shape %zu %s: ledger %zu != planned %zu", k,
                  mf_cat_name((mf_cat)i), t.ledger.at_peak[i], t.plan.peak_cat[i]);
        mf_trainer_free(&t);
    }
    unlink(data);
    return mf_test_done("test_ledger_matches_plan");
}
