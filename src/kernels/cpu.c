/* fp32 CPU kernels: encoder, layernorm, matmul, GELU, cross-entropy and the
 * gradient-norm helpers. Attention lives in attention.c.
 *
 * The math follows karpathy's llm.c (train_gpt2.c, CPU reference); formulas
 * are cited there once per layer. Three rules hold throughout:
 *  - no allocation: every buffer comes from the caller, and per-thread
 *    temporaries are small fixed-size stack arrays;
 *  - GEMMs go to CBLAS on the (in, out) weight layout directly, never
 *    through transposed copies;
 *  - every reduction that crosses rows (parameter gradients, sums of squares)
 *    is split by columns or into a fixed number of chunks, so each output is
 *    summed in the same order whatever the thread count: results are
 *    bit-identical run to run and across OMP_NUM_THREADS (BLAS aside).
 */
#include "memfit/kernels.h"
#include "memfit/core.h"
#include "vmath.h"

#include <cblas.h>
#include <math.h>

/* Width of the column blocks that column-parallel reductions hand to one
 * thread: 64 floats = 4 cache lines, wide enough to vectorise, narrow enough
 * that C = 768 still gives every thread work. */
#define MF_COLBLK 64

/* Below this many floats of work, an OpenMP region costs more than it saves. */
#define MF_PAR_MIN 4096

/* ---- encoder --------------------------------------------------------- */

void mf_encoder_forward(float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C) {
    const int N = B * T;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const float *we = wte + (size_t)inp[n] * C;
        const float *pe = wpe + (size_t)(n % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

/* Several rows may carry the same token, so rows cannot be split between
 * threads without racing on dwte. Splitting by columns instead gives each
 * thread whole columns of dwte and dwpe, summed in row order: race-free,
 * deterministic, no scratch. */
void mf_encoder_backward(float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C) {
    const int N = B * T;
    const int nblk = (C + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * MF_COLBLK;
        const int c1 = c0 + MF_COLBLK < C ? c0 + MF_COLBLK : C;
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            float *we = dwte + (size_t)inp[n] * C;
            float *pe = dwpe + (size_t)(n % T) * C;
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                we[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

/* ---- layernorm ------------------------------------------------------- */

void mf_layernorm_forward(float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b,
                          int N, int C) {
    const float eps = 1e-5f;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        /* two passes (mean, then centred variance): no cancellation from
         * E[x^2] - E[x]^2 on activations with a large mean */
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += x[c];
        const float m = s / (float)C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) {
            const float d = x[c] - m;
            v += d * d;
        }
        const float r = 1.0f / sqrtf(v / (float)C + eps);
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

/* With xhat = (x - mean) * rstd and g = dout * w (llm.c layernorm_backward):
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dw += sum_rows dout * xhat,   db += sum_rows dout.
 * dinp is row-parallel; dw/db are column-parallel (see encoder backward). */
void mf_layernorm_backward(float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
    const int par = (size_t)N * C >= MF_PAR_MIN;
    const int nblk = (C + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel if (par)
    {
#pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            const float m = mean[n], r = rstd[n];
            float gm = 0.0f, gxm = 0.0f;
#pragma omp simd reduction(+ : gm, gxm)
            for (int c = 0; c < C; c++) {
                const float g = d[c] * w[c];
                gm += g;
                gxm += g * (x[c] - m) * r;
            }
            gm /= (float)C;
            gxm /= (float)C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                const float xhat = (x[c] - m) * r;
                dx[c] += r * (d[c] * w[c] - gm - xhat * gxm);
            }
        }
#pragma omp for schedule(static)
        for (int blk = 0; blk < (dw ? nblk : 0); blk++) {  /* dw NULL: frozen (LoRA's base) */
            const int c0 = blk * MF_COLBLK;
            const int w0 = C - c0 < MF_COLBLK ? C - c0 : MF_COLBLK;
            float aw[MF_COLBLK] = {0}, ab[MF_COLBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0;
                const float *d = dout + (size_t)n * C + c0;
                const float m = mean[n], r = rstd[n];
#pragma omp simd
                for (int c = 0; c < w0; c++) {
                    aw[c] += d[c] * (x[c] - m) * r;
                    ab[c] += d[c];
                }
            }
            for (int c = 0; c < w0; c++) {
                dw[c0 + c] += aw[c];
                db[c0 + c] += ab[c];
            }
        }
    }
}

/* ---- matmul ---------------------------------------------------------- */

void mf_matmul_forward(float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC, int accumulate) {
    if (N <= 0 || OC <= 0) return;
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias) {
        /* put the bias into out first so that one GEMM with beta = 1 adds
         * the product: no second pass over out afterwards */
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= MF_PAR_MIN)
        for (int n = 0; n < N; n++) {
            float *o = out + (size_t)n * OC;
            if (accumulate) {
#pragma omp simd
                for (int j = 0; j < OC; j++) o[j] += bias[j];
            } else {
#pragma omp simd
                for (int j = 0; j < OC; j++) o[j] = bias[j];
            }
        }
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C,
                1.0f, inp, C, w, OC, beta, out, OC);
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
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N,
                    1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    if (dinp) /* dinp (N,C) = dout (N,OC) @ w^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC,
                    1.0f, dout, OC, w, OC, 0.0f, dinp, C);
    if (dbias) {
        const int nblk = (OC + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= MF_PAR_MIN)
        for (int blk = 0; blk < nblk; blk++) {
            const int c0 = blk * MF_COLBLK;
            const int w0 = OC - c0 < MF_COLBLK ? OC - c0 : MF_COLBLK;
            float acc[MF_COLBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC + c0;
#pragma omp simd
                for (int c = 0; c < w0; c++) acc[c] += d[c];
            }
            for (int c = 0; c < w0; c++) dbias[c0 + c] += acc[c];
        }
    }
}

/* ---- GELU ------------------------------------------------------------ */

/* gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
 * (Hendrycks & Gimpel 2016; GPT-2's gelu_new). */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
/* tanh is mf_vtanhf (vmath.h): libm's tanhf is a scalar call, ~14 ns per
 * element here against ~1.3 ns for the vectorised loop (SSE4, one core). */

void mf_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + mf_vtanhf(GELU_K * (x + GELU_A * x * x * x)));
    }
}

/* gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(u).
 * sech^2 is written 1 - t^2 instead of llm.c's 1/cosh^2, which saves a
 * transcendental and cannot overflow. dinp may alias dout: element i is
 * read before it is written and nothing else reads it. */
void mf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float t = mf_vtanhf(GELU_K * (x + GELU_A * x * x * x));
        const float g = 0.5f * (1.0f + t) +
                        0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = g * dout[i];
    }
}

/* ---- cross-entropy --------------------------------------------------- */

/* loss = logsumexp(z) - z[target], with the max subtracted before exp and
 * the sum of exponentials kept in double (V = 50257 terms). The gradient is
 * softmax(z) - onehot(target) (llm.c crossentropy_softmax_backward). */
double mf_crossentropy_forward(float *logits, float *losses,
                               const int32_t *targets, int N, int V, int Vp,
                               float dscale) {
#pragma omp parallel for schedule(static) if ((size_t)N * V >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * Vp;
        const int t = targets[n];
        if (t < 0 || t >= V) mf_panic("crossentropy: target %d outside [0, %d)", t, V);
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        const float zt = z[t];
        double s = 0.0;
        if (dscale != 0.0f) {
            /* keep each exp in place: the gradient pass reuses it */
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < V; j++) {
                const float e = mf_vexpf(z[j] - mx);
                z[j] = e;
                s += (double)e;
            }
            const float k = (float)(1.0 / s) * dscale;
#pragma omp simd
            for (int j = 0; j < V; j++) z[j] *= k;
            z[t] -= dscale;
            for (int j = V; j < Vp; j++) z[j] = 0.0f;
        } else {
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < V; j++) s += (double)mf_vexpf(z[j] - mx);
        }
        losses[n] = (float)((double)mx + log(s) - (double)zt);
    }
    /* summed here in row order, not by an OpenMP reduction (whose order
     * follows thread arrival): the loss is bit-identical run to run */
    double total = 0.0;
    for (int n = 0; n < N; n++) total += (double)losses[n];
    return total;
}

/* ---- gradient-norm helpers ------------------------------------------- */

/* Sum in a fixed number of chunks regardless of thread count, then add the
 * chunk sums in order: the result is bit-identical for any OMP_NUM_THREADS. */
#define MF_SUMSQ_CHUNKS 256

double mf_sumsq(const float *x, size_t n) {
    double part[MF_SUMSQ_CHUNKS];
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int k = 0; k < MF_SUMSQ_CHUNKS; k++) {
        /* chunk k: q or q+1 elements, the first r chunks one longer */
        const size_t q = n / MF_SUMSQ_CHUNKS, r = n % MF_SUMSQ_CHUNKS, kk = (size_t)k;
        const size_t i0 = q * kk + (kk < r ? kk : r);
        const size_t i1 = i0 + q + (kk < r);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * (double)x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < MF_SUMSQ_CHUNKS; k++) total += part[k];
    return total;
}

void mf_scale(float *x, float s, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
