/* SGD with momentum, following torch.optim.SGD's single-tensor path with
 * dampening 0 and nesterov off: the momentum form of Sutskever et al. 2013
 * ("On the importance of initialization and momentum in deep learning"). */
#include "memfit/core.h"
#include "memfit/optim.h"

void mf_sgd_update(float *p, const float *g, float *buf, size_t n, float lr,
                   float momentum, float wd, int t, float gscale) {
    if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float d = g[i] * gscale + wd * p[i]; /* coupled decay, as torch */
            p[i] = p[i] - lr * d;
        }
        return;
    }
    if (!buf) mf_panic("mf_sgd_update: momentum %g needs buf", (double)momentum);
    /* torch creates buf as a copy of d on the first step (buf is not read) */
    int first = t <= 1;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = g[i] * gscale + wd * p[i];
        float b = first ? d : momentum * buf[i] + d;
        buf[i] = b;
        p[i] = p[i] - lr * b;
    }
}
