/* Activation checkpointing "full" (keep each block's input, recompute the
 * block in its backward), "every:N" and "sqrt" (keep every N-th block's
 * input, recompute segments) and "selective" (rebuild the LayerNorm and
 * GELU outputs in backward) change no maths: the same operations run in the
 * same order, so gradients and 20 steps of losses are bit-identical to
 * "none", while the planned activation bytes fall and the ledger still
 * equals the plan. The same holds under precision bf16 and fp16 (16-bit
 * activations are rebuilt by the same kernels). */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

static void run(const char *data, const char *prec, const char *policy, double *losses, float **w, size_t *nw, size_t *acts,
                size_t *peak_ok) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "n_layer", "4");
    mf_config_set(&c, "recompute", policy);
    mf_config_set(&c, "precision", prec);
    mf_config_set(&c, "steps", "20");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    tu_steps(&t, 0, 20, losses);
    *acts = t.plan.peak_cat[MF_CAT_ACTS];
    *peak_ok = t.ledger.peak_total == t.plan.peak_bytes;
    *w = tu_copy_tensors(&t, 0, nw);
    mf_trainer_free(&t);
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 13) == 0, "token file: %s", mf_error());
    const char *precs[] = {"fp32", "bf16", "fp16"};
    for (int pi = 0; pi < 3; pi++) {
    const char *prec = precs[pi];
    double l0[20], l1[20];
    float *w0 = NULL, *w1 = NULL;
    size_t n0 = 0, n1 = 0, a0 = 0, a1 = 0, ok0 = 0, ok1 = 0;
    run(data, prec, "none", l0, &w0, &n0, &a0, &ok0);
    CHECK(ok0, "%s none: ledger != plan", prec);
    /* 4 blocks: every:3 makes uneven segments [0,3) and [3,4); sqrt = every:2 */
    const char *policies[] = {"selective", "every:3", "every:2", "sqrt", "full"};
    for (int k = 0; k < 5; k++) {
        run(data, prec, policies[k], l1, &w1, &n1, &a1, &ok1);
        for (int i = 0; i < 20; i++)
            CHECK(l0[i] == l1[i], "%s step %d: loss %.17g vs none %.17g", policies[k], i + 1, l1[i], l0[i]);
        CHECK(n0 == n1 && w0 && w1 && memcmp(w0, w1, n0 * sizeof *w0) == 0, "%s: weights after 20 steps differ", policies[k]);
        CHECK(a1 < a0, "%s keeps %zu activation bytes, none %zu", policies[k], a1, a0);
        CHECK(ok1, "%s: ledger != plan", policies[k]);
        printf("%s %-9s activation bytes at the peak %zu (none %zu, %.2fx less); 20 losses and the weights identical\n",
               prec, policies[k], a1, a0, (double)a0 / (double)(a1 ? a1 : 1));
        free(w1);
        w1 = NULL;
    }
    free(w0);
    }
    CHECK(mf_config_set(&(mf_config){0}, "recompute", "sometimes") < 0, "bad policy accepted");
    CHECK(mf_config_set(&(mf_config){0}, "recompute", "every:0") < 0, "every:0 accepted");
    CHECK(mf_config_set(&(mf_config){0}, "recompute", "every:x") < 0, "every:x accepted");
    unlink(data);
    return mf_test_done("test_recompute_matches_none");
}
