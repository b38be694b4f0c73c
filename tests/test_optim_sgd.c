/* Proves mf_sgd_update is torch.optim.SGD (dampening 0, nesterov off) for
 * three steps: with momentum and weight decay, without momentum (buf NULL),
 * and with momentum only. The expected values are torch 1.13's, printed by
 *   p = Parameter(tensor(P0)); opt = SGD([p], lr=0.1, momentum=M, weight_decay=WD)
 *   for g in G: p.grad = tensor(g) * 0.5; opt.step()
 * and the first element of the first case is worked by hand below. The
 * first step must not read buf (torch creates it there), so it starts NaN. */
#include "memfit/optim.h"
#include "testutil.h"

#include <math.h>

#define N 4
static const float P0[N] = {1.0f, -2.0f, 0.5f, 3.0f};
static const float G[3][N] = {{0.2f, -0.4f, 1.0f, 0.0f},
                              {-0.6f, 0.8f, 0.3f, -1.2f},
                              {0.1f, 0.1f, -0.5f, 2.0f}};

/* element 0, momentum 0.9, wd 0.01, lr 0.1, gscale 0.5:
 *  t=1: d = 0.1 + 0.01*1 = 0.11;            buf = 0.11;     p = 1 - 0.011 = 0.989
 *  t=2: d = -0.3 + 0.00989 = -0.29011;      buf = 0.099 - 0.29011 = -0.19111;
 *       p = 0.989 + 0.019111 = 1.008111
 *  t=3: d = 0.05 + 0.01008111 = 0.06008111; buf = -0.171999 + 0.06008111 = -0.11191789;
 *       p = 1.008111 + 0.011191789 = 1.019302789 */
static const struct {
    const char *name;
    float momentum, wd;
    float want[3][N];
} CASES[] = {
    {"momentum 0.9, wd 0.01", 0.9f, 0.01f,
     {{0.989000022f, -1.97800004f, 0.449499995f, 2.99699998f},
      {1.008111f, -1.99622202f, 0.388600498f, 3.05130291f},
      {1.01930285f, -2.01562572f, 0.358402342f, 2.9971242f}}},
    {"no momentum, wd 0.01", 0.0f, 0.01f,
     {{0.989000022f, -1.97800004f, 0.449499995f, 2.99699998f},
      {1.01801097f, -2.01602197f, 0.4340505f, 3.054003f},
      {1.01199293f, -2.01900601f, 0.458616465f, 2.95094895f}}},
    {"momentum 0.9, no wd", 0.9f, 0.0f,
     {{0.99000001f, -1.98000002f, 0.449999988f, 3.0f},
      {1.01100004f, -2.00200009f, 0.389999986f, 3.05999994f},
      {1.02490008f, -2.02680016f, 0.360999972f, 3.01399994f}}},
};

int main(void) {
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        float p[N], buf[N];
        for (int i = 0; i < N; i++) p[i] = P0[i], buf[i] = NAN;
        float *b = CASES[c].momentum != 0.0f ? buf : NULL;
        double worst = 0.0;
        for (int t = 1; t <= 3; t++) {
            mf_sgd_update(p, G[t - 1], b, N, 0.1f, CASES[c].momentum, CASES[c].wd, t, 0.5f);
            for (int i = 0; i < N; i++) {
                double want = CASES[c].want[t - 1][i];
                CHECK(mf_close(p[i], want, 1e-6, 0.0), "%s: step %d p[%d] = %.9g, torch %.9g",
                      CASES[c].name, t, i, (double)p[i], want);
                worst = fmax(worst, fabs(p[i] - want) / fabs(want));
            }
        }
        printf("%-24s worst relative difference from torch %.2e\n", CASES[c].name, worst);
    }
    return mf_test_done("test_optim_sgd");
}
