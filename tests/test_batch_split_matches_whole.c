/* The run-time guard (mf_trainer_accumulate): a batch that does not fit the
 * plan's micro-batch (more rows, an uneven number of rows, or sequences
 * longer than the planned seq) runs in micro-batches that do, with the
 * gradients of one pass over the whole batch in a plan made for it, to
 * float round-off. A sequence that cannot fit at all is refused with a
 * message; sequence-length warm-up's step shapes are as documented. */
#include "memfit/kernels.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

static int setup(mf_trainer *t, const char *data, int B, int T) {
    mf_config c;
    tu_tiny_config(&c, data);
    char b[16], s[16];
    snprintf(b, sizeof b, "%d", B);
    snprintf(s, sizeof s, "%d", T);
    mf_config_set(&c, "block_size", "64");
    mf_config_set(&c, "batch", b);
    mf_config_set(&c, "seq", s);
    if (mf_trainer_init(t, &c, MF_MODE_TRAIN)) { CHECK(0, "init %dx%d: %s", B, T, mf_error()); return -1; }
    return 0;
}

/* gradients of `rows` x T tokens in a plan of B x planT; *micro receives
 * the micro-batches it took */
static float *grads(const char *data, int B, int planT, int rows, int T, size_t *n, double *loss, int *micro) {
    mf_trainer t;
    if (setup(&t, data, B, planT)) return NULL;
    *micro = mf_trainer_accumulate(&t, rows, T, 1.0f, loss);
    CHECK(*micro > 0, "%dx%d in plan %dx%d: %s", rows, T, B, planT, mf_error());
    float *g = *micro > 0 ? tu_copy_tensors(&t, 1, n) : NULL;
    /* nothing outside the plan: the ledger never left the planned peak */
    CHECK(t.ledger.peak_total <= t.plan.peak_bytes, "ledger %zu over plan %zu", t.ledger.peak_total, t.plan.peak_bytes);
    mf_trainer_free(&t);
    return g;
}

static void compare(const char *data, const char *what, int rows, int T, int splitB, int splitT, int want_micro) {
    size_t n1 = 0, n2 = 0;
    double l1 = 0, l2 = 0;
    int m1 = 0, m2 = 0;
    float *g1 = grads(data, rows, T, rows, T, &n1, &l1, &m1);   /* a plan for the whole batch */
    float *g2 = grads(data, splitB, splitT, rows, T, &n2, &l2, &m2);
    CHECK(g1 && g2 && n1 == n2, "%s: sizes", what);
    CHECK(m1 == 1, "%s: the whole batch took %d micro-batches in its own plan", what, m1);
    CHECK(m2 == want_micro, "%s: split into %d micro-batches, expected %d", what, m2, want_micro);
    CHECK(mf_close(l1, l2, 1e-6, 0), "%s: losses %.9g vs %.9g", what, l1, l2);
    double worst = 0, gmax = 0;
    for (size_t i = 0; g1 && g2 && n1 == n2 && i < n1; i++) {
        if (fabs(g1[i]) > gmax) gmax = fabs(g1[i]);
        if (fabs(g1[i] - g2[i]) > worst) worst = fabs(g1[i] - g2[i]);
    }
    CHECK(gmax > 0 && worst <= 2e-6 * gmax, "%s: max difference %.3g vs max |g| %.3g", what, worst, gmax);
    printf("%-44s %2d micro-batches, loss %.6f vs %.6f, worst difference %.2g of max |g| %.3g\n", what, m2, l1, l2,
           gmax > 0 ? worst / gmax : 0, gmax);
    free(g1);
    free(g2);
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 5) == 0, "token file: %s", mf_error());
    compare(data, "12 x 16 in a plan of 2 x 16", 12, 16, 2, 16, 6);
    compare(data, "5 x 24 in a plan of 4 x 16 (uneven)", 5, 24, 4, 16, 3);
    compare(data, "2 x 48 in a plan of 4 x 16 (longer seqs)", 2, 48, 4, 16, 2);
    compare(data, "1 x 64 in a plan of 4 x 16 (block_size)", 1, 64, 4, 16, 1);

    /* a sequence longer than the plan's tokens, or than block_size: refused */
    mf_trainer t;
    if (setup(&t, data, 2, 16) == 0) {
        double l;
        CHECK(mf_trainer_accumulate(&t, 1, 48, 1.0f, &l) < 0 && strstr(mf_error(), "does not fit the plan"),
              "1 x 48 in a plan of 2 x 16 not refused: %s", mf_error());
        printf("refused: %s\n", mf_error());
        CHECK(mf_trainer_accumulate(&t, 1, 65, 1.0f, &l) < 0 && strstr(mf_error(), "block_size"),
              "1 x 65 over block_size 64 not refused: %s", mf_error());
        printf("refused: %s\n", mf_error());
        mf_trainer_free(&t);
    }

    /* sequence-length warm-up: T from the start up in multiples of 8, the
     * step's tokens kept (rows rounded down), then the plan's own shape */
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "block_size", "64");
    mf_config_set(&c, "batch", "4");
    mf_config_set(&c, "seq", "64");
    mf_config_set(&c, "grad_accum", "2");
    mf_config_set(&c, "seq_warmup", "4");
    mf_config_set(&c, "seq_warmup_start", "16");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        static const int want[5][2] = {{32, 16}, {21, 24}, {12, 40}, {10, 48}, {8, 64}};
        for (int s = 0; s < 5; s++) {
            int r, T;
            mf_trainer_step_shape(&t, s, &r, &T);
            CHECK(r == want[s][0] && T == want[s][1], "step %d: %d x %d, expected %d x %d", s, r, T, want[s][0],
                  want[s][1]);
        }
        /* and the steps run, each within the plan */
        for (int s = 0; s < 5; s++) {
            mf_step_stats st;
            CHECK(mf_trainer_step(&t, &st) == 0, "warm-up step %d: %s", s, mf_error());
            CHECK(st.rows == want[s][0] && st.seq == want[s][1] && st.micro == (s == 1 ? 3 : 2),
                  "step %d ran %d x %d in %d", s, st.rows, st.seq, st.micro);
        }
        mf_trainer_free(&t);
    } else CHECK(0, "init: %s", mf_error());
    unlink(data);
    return mf_test_done("test_batch_split_matches_whole");
}
