/* fp32 CPU kernels: the public entry points. Matmuls are here, their GEMMs
 * through mf_sgemm (gemm.c: oneDNN or OpenBLAS); the element-wise and
 * row-wise kernels (encoder, layernorm, bias, GELU, residual, cross-entropy,
 * gradient-norm helpers) forward to the table that isa.c picks at run time, whose bodies are in kern_body.h (portable and
 * AVX-512 builds of the same C). Attention lives in attention.c and
 * flash_attention.c.
 *
 * The math follows karpathy's llm.c (train_gpt2.c, CPU reference); formulas
 * are cited there once per layer. Three rules hold throughout:
 *  - no allocation: every buffer comes from the caller, and per-thread
 *    temporaries are small fixed-size stack arrays;
 *  - GEMMs go to mf_sgemm on the (in, out) weight layout directly, never
 *    through transposed copies;
 *  - every reduction that crosses rows (parameter gradients, sums of squares)
 *    is split by columns or into a fixed number of chunks, so each output is
 *    summed in the same order whatever the thread count: results are
 *    bit-identical run to run and across OMP_NUM_THREADS (GEMMs aside).
 */
#include "memfit/kernels.h"
#include "memfit/core.h"
#include "isa.h"

#include <math.h>

/* ---- matmul ---------------------------------------------------------- */

void mf_matmul_forward(float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC, int accumulate) {
    if (N <= 0 || OC <= 0) return;
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias) {
        /* put the bias into out first so that one GEMM with beta = 1 adds
         * the product: no second pass over out afterwards */
        mf_kernels_isa_get()->bias_fill(out, bias, N, OC, accumulate);
        beta = 1.0f;
    }
    if (C <= 0) {
        /* empty product; BLAS with K = 0 would only scale by beta */
        if (!bias && !accumulate)
            for (size_t i = 0; i < (size_t)N * OC; i++) out[i] = 0.0f;
        return;
    }
    /* beta = 0 makes BLAS overwrite out without reading it (NaN-poisoned
     * buffers stay harmless) */
    mf_sgemm(0, 0, N, OC, C, 1.0f, inp, C, w, OC, beta, out, OC);
}

void mf_matmul_backward(float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) {
        if (dinp && N > 0 && C > 0)
            for (size_t i = 0; i < (size_t)N * C; i++) dinp[i] = 0.0f;
        return;
    }
    /* dw (C,OC) += inp^T (C,N) @ dout (N,OC), first: inp may be dinp's
     * buffer (a rebuilt GELU output lives in the gradient scratch) */
    if (dw) /* NULL: a frozen weight (LoRA's base) */
        mf_sgemm(1, 0, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    if (dinp) /* dinp (N,C) = dout (N,OC) @ w^T */
        mf_sgemm(0, 1, N, C, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, C);
    if (dbias) mf_kernels_isa_get()->bias_backward(dbias, dout, N, OC);
}

/* ---- dispatched kernels (isa.h) ---------------------------------------- */

#define K (mf_kernels_isa_get())

void mf_encoder_forward(float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C) {
    K->encoder_forward(out, inp, wte, wpe, B, T, C);
}

void mf_encoder_backward(float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C) {
    K->encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}

void mf_layernorm_forward(float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b,
                          int N, int C) {
    K->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

void mf_layernorm_backward(float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
    K->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void mf_residual_forward(float *x, const float *res, const float *bias, int N, int C) {
    K->residual_forward(x, res, bias, N, C);
}

void mf_residual_layernorm_forward(float *x, float *out, float *mean, float *rstd,
                                   const float *res, const float *bias, const float *w,
                                   const float *b, int N, int C) {
    K->residual_layernorm_forward(x, out, mean, rstd, res, bias, w, b, N, C);
}

void mf_gelu_forward(float *out, const float *inp, size_t n) { K->gelu_forward(out, inp, n); }

void mf_bias_gelu_forward(float *out, float *pre, const float *bias, int N, int OC) {
    K->bias_gelu_forward(out, pre, bias, N, OC);
}

void mf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    K->gelu_backward(dinp, inp, dout, n);
}

double mf_crossentropy_forward(float *logits, float *losses,
                               const int32_t *targets, int N, int V, int Vp,
                               float dscale) {
    return K->crossentropy_forward(logits, NULL, losses, targets, N, V, Vp, dscale);
}

double mf_crossentropy_forward_bf16(float *logits, uint16_t *dl16, float *losses, const int32_t *targets, int N, int V,
                                    int Vp, float dscale) {
    return K->crossentropy_forward(logits, dscale != 0.0f ? dl16 : NULL, losses, targets, N, V, Vp, dscale);
}

double mf_sumsq(const float *x, size_t n) { return K->sumsq(x, n); }

void mf_scale(float *x, float s, size_t n) { K->scale(x, s, n); }
