/* The tied output head: logits = x @ wte^T over the padded vocabulary. */
#include "memfit/kernels.h"


void mf_classifier_forward(float *logits, const float *x, const float *wte, int N, int C, int Vp) {
    mf_sgemm(0, 1, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits, Vp);
}

void mf_classifier_backward(float *dx, float *dwte, const float *dlogits, const float *x,
                            const float *wte, int N, int C, int Vp) {
    mf_sgemm(0, 0, N, C, Vp, 1.0f, dlogits, Vp, wte, C, 0.0f, dx, C);
    if (dwte) /* NULL: frozen embedding (LoRA's base) */
        mf_sgemm(1, 0, Vp, C, N, 1.0f, dlogits, Vp, x, C, 1.0f, dwte, C);
}
