/* AdamW (Loshchilov & Hutter 2019), written to follow torch.optim.AdamW's
 * single-tensor path step for step so results agree to fp32 round-off.
 * The loop itself is a dispatched kernel (kernels/kern_body.h). */
#include "memfit/optim.h"
#include "../kernels/isa.h"

#include <math.h>

void mf_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float wd,
                     int t, float gscale) {
    mf_adamw_update16(p, NULL, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale);
}

void mf_adamw_update16(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float wd, int t, float gscale) {
    /* coefficients in double, as torch computes them in Python */
    double bc1 = 1.0 - pow((double)beta1, t);
    double bc2 = 1.0 - pow((double)beta2, t);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - (double)lr * wd);
    float omb1 = (float)(1.0 - (double)beta1), omb2 = (float)(1.0 - (double)beta2);
    mf_kernels_isa_get()->adamw(p, p16, g, m, v, n, beta1, beta2, omb1, omb2, step_size, bc2_sqrt, eps, decay,
                                gscale);
}

double mf_lr_at(const mf_config *cfg, int step) {
    if (cfg->warmup > 0 && step < cfg->warmup) return cfg->lr * (step + 1) / cfg->warmup;
    int span = cfg->steps - cfg->warmup;
    if (span <= 0) return cfg->lr;
    double r = (double)(step - cfg->warmup) / span;
    if (r > 1) r = 1;
    double lo = cfg->lr * cfg->min_lr_frac;
    return lo + 0.5 * (cfg->lr - lo) * (1.0 + cos(M_PI * r));
}

float mf_clip_scale(double grad_norm, double clip) {
    if (clip <= 0) return 1.0f;
    double c = clip / (grad_norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}
