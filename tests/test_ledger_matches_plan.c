/* For several model shapes, batch sizes and accumulation settings, the
 * ledger's peak after real training steps equals the plan's predicted peak
 * to the byte, in total and per category; and inference plans likewise.
 * Mixed precision (bf16 and fp16, with and without master weights, with
 * recompute none, selective and full) likewise, and with
 * update_in_backward (master weights off: the sliced stochastic-rounding
 * update; the tied embedding's rows split between head and embedding). */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

typedef struct {
    const char *L, *C, *H, *T, *B, *accum;
    int infer;
    const char *prec, *master, *recompute;
    int uib;          /* 1: update_in_backward (grad_clip 0): transient gradients, the tied embedding split by
                       * rows; 2: that and pure_bf16 (bf16 AdamW moments); 3: pure_bf16 alone */
    const char *opt;  /* optimizer, default adamw */
} shape;

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 7) == 0, "token file: %s", mf_error());
    const shape shapes[] = {
        {"2", "32", "4", "16", "2", "1", 0, NULL, NULL, NULL, 0, NULL},
        {"1", "48", "3", "7", "3", "1", 0, NULL, NULL, NULL, 0, NULL},
        {"3", "64", "8", "32", "1", "2", 0, NULL, NULL, NULL, 0, NULL},
        {"4", "16", "2", "13", "5", "3", 0, NULL, NULL, NULL, 0, NULL},
        {"2", "96", "6", "24", "4", "1", 0, NULL, NULL, NULL, 0, NULL},
        {"2", "32", "4", "16", "2", "1", 1, NULL, NULL, NULL, 0, NULL},
        {"3", "64", "8", "32", "3", "1", 1, NULL, NULL, NULL, 0, NULL},
        {"2", "32", "4", "16", "2", "1", 0, "bf16", "1", "none", 0, NULL},
        {"3", "64", "8", "32", "3", "2", 0, "bf16", "0", "none", 0, NULL},
        {"4", "16", "2", "13", "5", "1", 0, "bf16", "1", "full", 0, NULL},
        {"3", "48", "3", "24", "2", "1", 0, "bf16", "0", "selective", 0, NULL},
        {"4", "32", "4", "16", "2", "1", 0, "bf16", "1", "every:2", 0, NULL},
        {"2", "32", "4", "16", "2", "1", 0, "fp16", "1", "none", 0, NULL},
        {"3", "64", "8", "32", "3", "2", 0, "fp16", "1", "full", 0, NULL},
        {"3", "48", "3", "24", "2", "1", 0, "fp16", "1", "selective", 0, NULL},
        {"3", "64", "8", "32", "3", "1", 0, "bf16", "0", "full", 1, "adamw8bit"},
        {"2", "32", "4", "16", "2", "1", 0, "bf16", "1", "none", 1, "adamw"},
        {"4", "16", "2", "13", "5", "1", 0, "bf16", "0", "selective", 1, "sgd"},
        {"2", "48", "3", "24", "2", "1", 0, "bf16", "0", "every:2", 1, "adafactor"},
        {"3", "64", "8", "32", "3", "1", 0, "bf16", "0", "full", 2, "adamw"},      /* pure_bf16, in backward */
        {"2", "32", "4", "16", "2", "2", 0, "bf16", "0", "none", 3, "adamw"},      /* pure_bf16, accumulated */
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
        if (s->prec) {
            mf_config_set(&c, "precision", s->prec);
            mf_config_set(&c, "master_weights", s->master);
            mf_config_set(&c, "recompute", s->recompute);
            mf_config_set(&c, "sample_tokens", "4");
        }
        if (s->uib == 1 || s->uib == 2) mf_config_set(&c, "update_in_backward", "1"), mf_config_set(&c, "grad_clip", "0");
        if (s->uib >= 2) mf_config_set(&c, "pure_bf16", "1");
        if (s->opt) mf_config_set(&c, "optimizer", s->opt), mf_config_set(&c, "momentum", "0.9");
        mf_trainer t;
        if (mf_trainer_init(&t, &c, s->infer ? MF_MODE_INFER : MF_MODE_TRAIN)) {
            CHECK(0, "init shape %zu: %s", k, mf_error());
            continue;
        }
        if (s->infer) mf_trainer_val_loss(&t);
        else
            for (int i = 0; i < 2; i++) CHECK(mf_trainer_step(&t, NULL) == 0, "step: %s", mf_error());
        if (s->prec) {
            /* validation and sampling run on the same plan */
            mf_trainer_val_loss(&t);
            FILE *dn = fopen("/dev/null", "w");
            CHECK(dn && mf_trainer_sample(&t, "the ", 4, dn) == 0, "shape %zu: sample: %s", k, mf_error());
            if (dn) fclose(dn);
            size_t want16 = 0, master = 0;
            for (int i = 0; i < t.plan.n; i++) {
                if (t.plan.bufs[i].dtype != MF_DTYPE_F32 && t.plan.bufs[i].cat == MF_CAT_PARAMS) want16++;
                if (t.plan.bufs[i].cat == MF_CAT_MASTER) master++;
            }
            /* wte and four matrices per layer are 16-bit; master rows exactly when asked */
            CHECK(want16 == (size_t)(1 + 4 * atoi(s->L)), "shape %zu: %zu 16-bit parameter rows", k, want16);
            CHECK(master == (strcmp(s->master, "1") == 0 ? want16 : 0), "shape %zu: %zu master rows", k, master);
        }
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
