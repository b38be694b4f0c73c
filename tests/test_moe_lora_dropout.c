/* LoRA dropout on the experts' adapters (--lora dropout=P with targets
 * w1, w2, w3; src/model/moe_lora.c, docs/moe.md): moe-tiny with adapters
 * on q, v and the experts, capacity 0.75 (slots drop), 4 steps:
 *  - dropout 0.1: recompute none, selective, full and every:2 give
 *    bit-identical losses (a rebuilt block draws the same masks), planned
 *    peak == ledger peak in total and per category;
 *  - dropout 0.1 changes the losses from step 2 on against dropout 0 (the
 *    masks reach the experts' adapters; lora_B is 0 in step 1), and
 *    dropout 0 equals the run without the key bit for bit. */
#include "memfit/train.h"
#include "model/internal.h"
#include "testutil.h"
#include "trainutil.h"

#include <string.h>

static int run(const char *tok, const char *lora, const char *policy, double *losses) {
    mf_config c;
    mf_config_defaults(&c);
    const char *kv[][2] = {{"model", "moe-tiny"}, {"seq", "32"}, {"batch", "4"}, {"tokenizer", "bytes"},
                           {"val_fraction", "0"}, {"sample_tokens", "0"}, {"threads", "2"}, {"loss_chunk", "0"},
                           {"lr", "1e-2"}, {"warmup", "0"}, {"capacity_factor", "0.75"}, {"lora", lora},
                           {"recompute", policy}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECK(mf_config_set(&c, kv[i][0], kv[i][1]) == 0, "%s %s: %s", kv[i][0], kv[i][1], mf_error());
    mf_config_set(&c, "data", tok);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s %s: %s", lora, policy, mf_error()); return -1; }
    for (int s = 0; s < 4; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        losses[s] = st.loss;
    }
    CHECK(t.plan.peak_bytes == t.ledger.peak_total, "%s %s: planned peak %zu, ledger peak %zu", lora, policy,
          t.plan.peak_bytes, t.ledger.peak_total);
    for (int cat = 0; cat < MF_CAT_COUNT; cat++)
        CHECK(t.plan.max_cat[cat] == t.ledger.peak[cat], "%s %s category %d: planned %zu, ledger %zu", lora, policy,
              cat, t.plan.max_cat[cat], t.ledger.peak[cat]);
    printf("%-48s recompute %-9s losses %.9g %.9g %.9g %.9g, plan %zu == ledger %zu\n", lora, policy, losses[0],
           losses[1], losses[2], losses[3], t.plan.peak_bytes, t.ledger.peak_total);
    mf_trainer_free(&t);
    return 0;
}

int main(void) {
    char tok[256];
    CHECK(tu_make_tokens(tok, sizeof tok, 1 << 14, 3) == 0, "token file: %s", mf_error());
    const char *drop = "r=4,alpha=8,dropout=0.1,targets=q_proj,v_proj,w1,w2,w3";
    const char *zero = "r=4,alpha=8,dropout=0,targets=q_proj,v_proj,w1,w2,w3";
    const char *none = "r=4,alpha=8,targets=q_proj,v_proj,w1,w2,w3";
    /* experts only: the masks on w1, w2, w3 alone move the losses */
    const char *drop_e = "r=4,alpha=8,dropout=0.1,targets=w1,w2,w3", *zero_e = "r=4,alpha=8,targets=w1,w2,w3";
    double base[4], l[4], z[4], n[4];
    if (run(tok, drop, "none", base) == 0) {
        const char *pol[] = {"selective", "full", "every:2"};
        for (int k = 0; k < 3; k++)
            if (run(tok, drop, pol[k], l) == 0)
                for (int i = 0; i < 4; i++)
                    CHECK(l[i] == base[i], "dropout 0.1: recompute %s step %d loss %.17g, none %.17g", pol[k], i, l[i],
                          base[i]);
    }
    if (run(tok, zero, "none", z) == 0 && run(tok, none, "none", n) == 0)
        for (int i = 0; i < 4; i++) CHECK(z[i] == n[i], "dropout=0 step %d: %.17g, without the key %.17g", i, z[i], n[i]);
    if (run(tok, drop_e, "none", l) == 0 && run(tok, zero_e, "none", z) == 0) {
        CHECK(l[0] == z[0], "step 1 (lora_B 0): dropout cannot change the loss (%.17g vs %.17g)", l[0], z[0]);
        CHECK(l[2] != z[2] && l[3] != z[3], "expert-only dropout 0.1 leaves the losses of steps 3-4 as dropout 0's");
    }
    remove(tok);
    return mf_test_done("test_moe_lora_dropout");
}
