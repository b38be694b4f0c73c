/* The tied output head: logits = x @ wte^T over the padded vocabulary. */
#include "memfit/kernels.h"

#include <cblas.h>

void mf_classifier_forward(float *logits, const float *x, const float *wte, int N, int C, int Vp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits, Vp);
}

void mf_classifier_backward(float *dx, float *dwte, const float *dlogits, const float *x,
                            const float *wte, int N, int C, int Vp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, Vp, 1.0f, dlogits, Vp, wte, C, 0.0f, dx, C);
    if (dwte) /* NULL: frozen embedding (LoRA's base) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Vp, C, N, 1.0f, dlogits, Vp, x, C, 1.0f, dwte, C);
}
