/* Proves the loss scaler follows torch.cuda.amp.GradScaler's rules
 * (torch 1.13 _amp_foreach_non_finite_check_and_unscale_ and
 * _amp_update_scale_):
 *  - unscale multiplies by the fp32 reciprocal of the scale and reports a
 *    non-finite value wherever it is (first, middle, last element; inf,
 *    -inf, NaN; an overflow made by the unscale itself is not possible, but
 *    an inf gradient is), also when the work is split over threads;
 *  - an overflowing step is skipped: scale halves, the clean-step count
 *    restarts, the skip is counted; clean steps double the scale after
 *    exactly growth_interval of them in a row, and an overflow in between
 *    restarts the count;
 *  - growth that would make the scale infinite leaves it unchanged. */
#include "memfit/optim.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    mf_scaler s;
    mf_scaler_init(&s, 65536.0f, 2000);
    CHECK(s.scale == 65536.0f && s.clean == 0 && s.skipped == 0, "initial state");

    size_t n = 200003;
    float *g = malloc(n * sizeof *g), *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) g[i] = ((float)(i % 1000) - 500.0f) * 3.7f;
    for (size_t i = 0; i < n; i++) want[i] = g[i] * (float)(1.0 / 65536.0);
    CHECK(mf_scaler_unscale(&s, g, n) == 0, "finite gradients reported as overflow");
    CHECK(memcmp(g, want, n * sizeof *g) == 0, "unscale is not g * (1/scale)");

    float bads[] = {INFINITY, -INFINITY, NAN};
    size_t where[] = {0, n / 2, n - 1};
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int b = 0; b < 3; b++)
            for (int w = 0; w < 3; w++) {
                for (size_t i = 0; i < n; i++) g[i] = 1.0f;
                g[where[w]] = bads[b];
                CHECK(mf_scaler_unscale(&s, g, n) == 1, "%g at %zu not found (%d threads)", (double)bads[b],
                      where[w], threads);
            }
    }

    /* an injected overflow: skipped, halved, count restarted */
    for (int i = 0; i < 10; i++) CHECK(mf_scaler_update(&s, 0) == 0, "clean step skipped");
    CHECK(s.clean == 10, "clean count %d", s.clean);
    CHECK(mf_scaler_update(&s, 1) == 1, "overflow step not skipped");
    CHECK(s.scale == 32768.0f && s.clean == 0 && s.skipped == 1, "after overflow: scale %g clean %d skipped %lld",
          (double)s.scale, s.clean, (long long)s.skipped);

    /* growth after exactly 2000 clean steps */
    for (int i = 0; i < 1999; i++) mf_scaler_update(&s, 0);
    CHECK(s.scale == 32768.0f && s.clean == 1999, "grew early: scale %g clean %d", (double)s.scale, s.clean);
    mf_scaler_update(&s, 0);
    CHECK(s.scale == 65536.0f && s.clean == 0, "did not grow at 2000: scale %g", (double)s.scale);

    /* an overflow in between restarts the interval */
    for (int i = 0; i < 1500; i++) mf_scaler_update(&s, 0);
    mf_scaler_update(&s, 1);
    for (int i = 0; i < 1999; i++) mf_scaler_update(&s, 0);
    CHECK(s.scale == 32768.0f, "interval not restarted by an overflow: scale %g", (double)s.scale);
    mf_scaler_update(&s, 0);
    CHECK(s.scale == 65536.0f && s.skipped == 2, "scale %g skipped %lld", (double)s.scale, (long long)s.skipped);

    /* repeated overflows keep halving (as torch: no floor) */
    for (int i = 0; i < 20; i++) mf_scaler_update(&s, 1);
    CHECK(s.scale == 65536.0f / 1048576.0f, "scale after 20 overflows %g", (double)s.scale);

    /* growth that would overflow the scale itself is refused */
    mf_scaler_init(&s, FLT_MAX, 3);
    for (int i = 0; i < 3; i++) mf_scaler_update(&s, 0);
    CHECK(s.scale == FLT_MAX && s.clean == 0, "scale grew to %g", (double)s.scale);

    free(g); free(want);
    return mf_test_done("test_loss_scaler");
}
