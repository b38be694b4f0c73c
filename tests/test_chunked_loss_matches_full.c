/* The classifier + cross-entropy run a chunk of rows at a time (loss_chunk),
 * so the B*T*vocab logits never exist. Losses and every gradient equal those
 * of the all-rows-at-once head within 1e-6 (relative to the largest
 * gradient), for chunk sizes that do and do not divide B*T; the plan's
 * logits buffer shrinks accordingly. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

static float *grads(const char *data, const char *chunk, double *loss, size_t *n_out, size_t *logit_bytes) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "batch", "3");
    mf_config_set(&c, "loss_chunk", chunk);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return NULL; }
    *logit_bytes = t.plan.bufs[t.model.logits].bytes;
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    mf_trainer_load_batch(&t);
    *loss = mf_model_forward(&t.model, &t.arena, t.B, t.T, 1, 1.0f / (t.B * t.T));
    mf_model_backward(&t.model, &t.arena, t.B, t.T);
    float *g = tu_copy_tensors(&t, 1, n_out);
    /* a training step through the chunked head also matches the ledger */
    CHECK(mf_trainer_step(&t, NULL) == 0, "%s", mf_error());
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "chunk %s: ledger %zu != plan %zu", chunk,
          t.ledger.peak_total, t.plan.peak_bytes);
    mf_trainer_free(&t);
    return g;
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 5) == 0, "token file: %s", mf_error());
    size_t n0, bytes0;
    double l0;
    float *g0 = grads(data, "0", &l0, &n0, &bytes0);  /* 48 rows at once */
    const char *chunks[] = {"5", "16", "47"};
    for (int k = 0; k < 3 && g0; k++) {
        size_t n, bytes;
        double l;
        float *g = grads(data, chunks[k], &l, &n, &bytes);
        if (!g) continue;
        CHECK(n == n0, "sizes");
        CHECK(mf_close(l, l0, 1e-6, 0), "chunk %s: loss %.9g vs %.9g", chunks[k], l, l0);
        double worst = 0, gmax = 0;
        for (size_t i = 0; i < n; i++) {
            gmax = fmax(gmax, fabs(g0[i]));
            worst = fmax(worst, fabs(g0[i] - g[i]));
        }
        CHECK(worst <= 1e-6 * gmax, "chunk %s: worst gradient difference %.3g (max |g| %.3g)", chunks[k], worst, gmax);
        CHECK(bytes < bytes0, "chunk %s: logits buffer %zu not below %zu", chunks[k], bytes, bytes0);
        printf("chunk %-3s rows: loss %.9g, worst |dg| %.2g of max |g| %.2g, logits buffer %zu bytes (all rows: %zu)\n",
               chunks[k], l, worst, gmax, bytes, bytes0);
        free(g);
    }
    free(g0);
    unlink(data);
    return mf_test_done("test_chunked_loss_matches_full");
}
