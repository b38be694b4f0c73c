/* memfit optim: AdamW, the learning-rate schedule and gradient clipping.
 *
 * Owns nothing: state tensors are plan rows passed in by the caller.
 * Promises: the update matches torch.optim.AdamW (decoupled weight decay,
 * bias correction) operation for operation in fp32; clipping matches
 * torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6),
 * clamped to 1) and is folded into the update as a gradient scale.
 */
#ifndef MEMFIT_OPTIM_H
#define MEMFIT_OPTIM_H

#include <stddef.h>
#include "memfit/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step on n elements; t is the 1-based step count; g is
 * multiplied by gscale first. wd = 0 for tensors that do not decay. */
void mf_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float wd,
                     int t, float gscale);

/* Linear warm-up over cfg->warmup steps, then cosine decay to
 * lr * min_lr_frac at cfg->steps. step is 0-based. */
double mf_lr_at(const mf_config *cfg, int step);

/* Gradient scale for global-norm clipping (1 when clip <= 0). */
float mf_clip_scale(double grad_norm, double clip);

#ifdef __cplusplus
}
#endif
#endif
