/* Dynamic loss scaling (GradScaler semantics; see memfit/optim.h). */
#include "memfit/optim.h"

#include <math.h>

void mf_scaler_init(mf_scaler *s, float init_scale, int growth_interval) {
    s->scale = init_scale;
    s->growth = 2.0f;
    s->backoff = 0.5f;
    s->interval = growth_interval;
    s->clean = 0;
    s->skipped = 0;
}

int mf_scaler_unscale(const mf_scaler *s, float *g, size_t n) {
    /* torch multiplies by the fp32 reciprocal (not a division per element) */
    const float inv = (float)(1.0 / (double)s->scale);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        float x = g[i] * inv;
        g[i] = x;
        bad |= !isfinite(x);
    }
    return bad;
}

int mf_scaler_update(mf_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale *= s->backoff;
        s->clean = 0;
        s->skipped++;
        return 1;
    }
    if (++s->clean == s->interval) {
        float next = s->scale * s->growth;
        if (isfinite(next)) s->scale = next;
        s->clean = 0;
    }
    return 0;
}
