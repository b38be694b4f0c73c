/* Gradients of one batch of 4 sequences equal those of 2 micro-batches of
 * 2 and 4 of 1 accumulated (same windows, same order), to float round-off. */
#include "memfit/kernels.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

/* Runs the step's forward/backward part and returns the gradients. */
static float *grads(const char *data, const char *B, const char *accum, size_t *n_out, double *loss) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "batch", B);
    mf_config_set(&c, "grad_accum", accum);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return NULL; }
    int k = c.grad_accum;
    float dscale = 1.0f / ((float)t.B * t.T * k);
    *loss = 0;
    for (int i = 0; i < k; i++) {
        mf_arena_step(&t.arena);
        if (i == 0) mf_model_zero_grads(&t.model, &t.arena);
        mf_trainer_load_batch(&t);
        *loss += mf_model_forward(&t.model, &t.arena, t.B, t.T, 1, dscale) / k;
        mf_model_backward(&t.model, &t.arena, t.B, t.T);
    }
    float *g = tu_copy_tensors(&t, 1, n_out);
    mf_trainer_free(&t);
    return g;
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 3) == 0, "token file: %s", mf_error());
    size_t n1, n2, n4;
    double l1, l2, l4;
    float *g1 = grads(data, "4", "1", &n1, &l1);
    float *g2 = grads(data, "2", "2", &n2, &l2);
    float *g4 = grads(data, "1", "4", &n4, &l4);
    CHECK(g1 && g2 && g4 && n1 == n2 && n1 == n4, "sizes");
    CHECK(mf_close(l1, l2, 1e-6, 0) && mf_close(l1, l4, 1e-6, 0), "losses %.9g %.9g %.9g", l1, l2, l4);
    double worst = 0, gmax = 0;
    for (size_t i = 0; g1 && g2 && g4 && i < n1; i++) {
        double m = fabs(g1[i]);
        if (m > gmax) gmax = m;
        double d = fmax(fabs(g1[i] - g2[i]), fabs(g1[i] - g4[i]));
        if (d > worst) worst = d;
    }
    /* relative to the largest gradient entry: float round-off of sums */
    CHECK(worst <= 1e-6 * gmax, "max difference %.3g vs max |g| %.3g", worst, gmax);
    printf("max |g| %.4g, worst difference %.3g (%.2g relative)\n", gmax, worst, worst / gmax);
    free(g1); free(g2); free(g4);
    unlink(data);
    return mf_test_done("test_grad_accum_matches_big_batch");
}
