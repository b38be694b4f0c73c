/* The ISA-dispatched kernels' bodies, compiled once per instruction set
 * (see isa.h): kern_portable.c and kern_avx512.c define MF_ISA(name) to give
 * each compilation its own static names and table, then include this file.
 * Not a header to include anywhere else.
 *
 * The math follows karpathy's llm.c (train_gpt2.c, CPU reference). Rules
 * kept from cpu.c: no allocation (per-thread temporaries are small fixed
 * stack arrays); every reduction that crosses rows is split by columns or
 * into a fixed number of chunks, so results are bit-identical run to run
 * and for any OMP_NUM_THREADS. Loops are plain C with `omp simd` so the
 * compiler vectorises them for the file's target (16-byte SSE vectors in
 * the portable build, 64-byte AVX-512 vectors in the other).
 */
#ifndef MF_ISA
#error "kern_body.h is included by kern_portable.c / kern_avx512.c only"
#endif

#include "isa.h"
#include "memfit/core.h"
#include "kernels/half.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

/* Width of the column blocks that column-parallel reductions hand to one
 * thread: 64 floats = 4 cache lines, wide enough to vectorise, narrow enough
 * that C = 768 still gives every thread work. */
#define MF_COLBLK 64

/* Below this many floats of work, an OpenMP region costs more than it saves. */
#define MF_PAR_MIN 4096

/* ---- encoder --------------------------------------------------------- */

static void MF_ISA(encoder_forward)(float *out, const int32_t *inp, const float *wte,
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
static void MF_ISA(encoder_backward)(float *dwte, float *dwpe, const float *dout,
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

/* One row's statistics: two passes (mean, then centred variance: no
 * cancellation from E[x^2] - E[x]^2 on activations with a large mean).
 * Shared by the plain, the residual-fused and the 16-bit-output forward
 * (mixed.c calls it through the table), so all three save the same bits. */
static void MF_ISA(ln_stats)(float *mean, float *rstd, const float *x, int C) {
    const float eps = 1e-5f;
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
    *mean = m;
    *rstd = 1.0f / sqrtf(v / (float)C + eps);
}

/* One row: the statistics, then one pass for the output. */
static inline void MF_ISA(ln_row)(float *o, float *mean, float *rstd, const float *x,
                                  const float *w, const float *b, int C) {
    MF_ISA(ln_stats)(mean, rstd, x, C);
    const float m = *mean, r = *rstd;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
}

/* x = res + (x + bias) for one row (bias may be NULL) */
static inline void MF_ISA(residual_row)(float *x, const float *res, const float *bias, int C) {
    if (bias) {
#pragma omp simd
        for (int c = 0; c < C; c++) x[c] = res[c] + (x[c] + bias[c]);
    } else {
#pragma omp simd
        for (int c = 0; c < C; c++) x[c] = res[c] + x[c];
    }
}

static void MF_ISA(layernorm_forward)(float *out, float *mean, float *rstd,
                                      const float *inp, const float *w, const float *b,
                                      int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++)
        MF_ISA(ln_row)(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b, C);
}

/* x = res + (x + bias), then out = layernorm(x), in one pass over each row
 * while it is in cache: the residual add of a projection whose GEMM wrote
 * x (beta = 0), fused with the layernorm that reads the sum. */
static void MF_ISA(residual_layernorm_forward)(float *x, float *out, float *mean, float *rstd,
                                               const float *res, const float *bias, const float *w,
                                               const float *b, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *xr = x + (size_t)n * C;
        MF_ISA(residual_row)(xr, res + (size_t)n * C, bias, C);
        MF_ISA(ln_row)(out + (size_t)n * C, mean + n, rstd + n, xr, w, b, C);
    }
}

/* x = res + (x + bias): the same sum as residual_layernorm_forward, alone */
static void MF_ISA(residual_forward)(float *x, const float *res, const float *bias, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++)
        MF_ISA(residual_row)(x + (size_t)n * C, res + (size_t)n * C, bias, C);
}

/* With xhat = (x - mean) * rstd and g = dout * w (llm.c layernorm_backward):
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dw += sum_rows dout * xhat,   db += sum_rows dout.
 * dinp is row-parallel; dw/db are column-parallel (see encoder backward). */
static void MF_ISA(layernorm_backward)(float *dinp, float *dw, float *db,
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

/* ---- bias ------------------------------------------------------------ */

static void MF_ISA(bias_fill)(float *out, const float *bias, int N, int OC, int accumulate) {
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
}

static void MF_ISA(bias_backward)(float *dbias, const float *dout, int N, int OC) {
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

/* ---- GELU ------------------------------------------------------------ */

/* gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
 * (Hendrycks & Gimpel 2016; GPT-2's gelu_new). tanh is mf_vtanhf
 * (vmath.h): libm's tanhf is a scalar call the loop could not vectorise. */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

static inline float MF_ISA(gelu1)(float x) {
    return 0.5f * x * (1.0f + mf_vtanhf(GELU_K * (x + GELU_A * x * x * x)));
}

static void MF_ISA(gelu_forward)(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = MF_ISA(gelu1)(inp[i]);
}

/* pre += bias, out = gelu(pre), row by row: the FC layer's bias and its
 * activation in one pass (its GEMM writes pre with beta = 0) */
static void MF_ISA(bias_gelu_forward)(float *out, float *pre, const float *bias, int N, int OC) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *p = pre + (size_t)n * OC, *o = out + (size_t)n * OC;
#pragma omp simd
        for (int j = 0; j < OC; j++) {
            const float x = p[j] + bias[j];
            p[j] = x;
            o[j] = MF_ISA(gelu1)(x);
        }
    }
}

/* gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(u).
 * sech^2 is written 1 - t^2 instead of llm.c's 1/cosh^2, which saves a
 * transcendental and cannot overflow. dinp may alias dout: element i is
 * read before it is written and nothing else reads it. */
/* d gelu(x) / dx */
static inline float MF_ISA(gelu_grad1)(float x) {
    const float t = mf_vtanhf(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
}

static void MF_ISA(gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) dinp[i] = MF_ISA(gelu_grad1)(inp[i]) * dout[i];
}

/* GELU's backward for a bf16 GEMM's backward with a bias, in one pass:
 * out16 = d(pre) = gelu'(inp) dout rounded to bf16, dbias (or NULL) +=
 * d(pre)'s column sums (per 64-column block, rows in order, as
 * bias_backward); the fp32 d(pre) is never stored */
static void MF_ISA(gelu_backward_bf16_colsum)(uint16_t *out16, float *dbias, const float *inp, const float *dout,
                                              int N, int OC) {
    const int nblk = (OC + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= MF_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * MF_COLBLK;
        const int w0 = OC - c0 < MF_COLBLK ? OC - c0 : MF_COLBLK;
        float acc[MF_COLBLK] = {0};
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * OC + c0;
#pragma omp simd
            for (int c = 0; c < w0; c++) {
                const float d = MF_ISA(gelu_grad1)(inp[r + c]) * dout[r + c];
                acc[c] += d;
                out16[r + c] = mf_f32_to_bf16(d);
            }
        }
        if (dbias)
            for (int c = 0; c < w0; c++) dbias[c0 + c] += acc[c];
    }
}

/* ---- cross-entropy --------------------------------------------------- */

/* loss = logsumexp(z) - z[target], with the max subtracted before exp and
 * the sum of exponentials kept in double (V = 50257 terms). The gradient is
 * softmax(z) - onehot(target) (llm.c crossentropy_softmax_backward). The
 * max is an OpenMP max reduction (a ternary would not vectorise under
 * -ftrapping-math); like the ternary it ignores NaNs, which then reach the
 * loss through the exponentials. */
static double MF_ISA(crossentropy_forward)(float *logits, uint16_t *dl16, float *losses,
                                           const int32_t *targets, int N, int V, int Vp,
                                           float dscale) {
#pragma omp parallel for schedule(static) if ((size_t)N * V >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * Vp;
        const int t = targets[n];
        if (t == -1) { /* ignored (MF_TARGET_IGNORE): no loss, no gradient */
            losses[n] = 0.0f;
            if (dscale != 0.0f && dl16) memset(dl16 + (size_t)n * Vp, 0, (size_t)Vp * sizeof *dl16);
            else if (dscale != 0.0f) memset(z, 0, (size_t)Vp * sizeof *z);
            continue;
        }
        if (t < 0 || t >= V) mf_panic("crossentropy: target %d outside [0, %d)", t, V);
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
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
            if (dl16) {
                /* the gradient rounded straight to bf16: no fp32 copy is
                 * written and read back for a separate conversion pass */
                uint16_t *d = dl16 + (size_t)n * Vp;
#pragma omp simd
                for (int j = 0; j < V; j++) d[j] = mf_f32_to_bf16(z[j] * k);
                d[t] = mf_f32_to_bf16(z[t] * k - dscale);
                for (int j = V; j < Vp; j++) d[j] = 0;
            } else {
#pragma omp simd
                for (int j = 0; j < V; j++) z[j] *= k;
                z[t] -= dscale;
                for (int j = V; j < Vp; j++) z[j] = 0.0f;
            }
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

static double MF_ISA(sumsq)(const float *x, size_t n) {
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

static void MF_ISA(scale)(float *x, float s, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- AdamW ----------------------------------------------------------- */

/* One pass over p, g, m, v (see optim/adamw.c for the coefficients, which
 * follow torch.optim.AdamW's single-tensor path): the gradient-norm clip is
 * folded in as gscale, the weight decay as `decay`. The file is compiled
 * with -fno-math-errno, so sqrtf is an instruction and the loop vectorises
 * (with errno semantics gcc keeps a scalar call for negative inputs). */
#define MF_ADAMW_ELEMENT(i)                                  \
    float gi = g[i] * gscale;                                \
    float pi = p[i] * decay;                                 \
    float mi = m[i] * beta1 + omb1 * gi;                     \
    float vi = v[i] * beta2 + omb2 * (gi * gi);              \
    float denom = sqrtf(vi) / bc2_sqrt + eps;                \
    float pn = pi - step_size * (mi / denom);                \
    p[i] = pn;                                               \
    m[i] = mi;                                               \
    v[i] = vi
/* With p16 (bf16 compute weights from fp32 masters): the new weight is
 * also rounded into p16 while it is in a register, instead of a second pass
 * that reads p again (mf_model_sync_params). */
static void MF_ISA(adamw)(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float beta1,
                          float beta2, float omb1, float omb2, float step_size, float bc2_sqrt,
                          float eps, float decay, float gscale) {
    if (p16) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            MF_ADAMW_ELEMENT(i);
            p16[i] = mf_f32_to_bf16(pn);
        }
        return;
    }
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        MF_ADAMW_ELEMENT(i);
    }
}
#undef MF_ADAMW_ELEMENT

/* ---- bf16 outputs (mixed precision; mixed.c calls these for bf16) ----
 * The fp32 formulas above, rounded to bf16 (nearest-even, mf_f32_to_bf16)
 * as they are stored: the integer rounding vectorises, so the AVX-512 build
 * converts 16 values per instruction instead of the baseline's 4. */

static void MF_ISA(to_bf16)(uint16_t *out, const float *in, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) out[i] = mf_f32_to_bf16(in[i]);
}

/* out = dout rounded to bf16 and dbias += dout's column sums, in one pass
 * over dout (a bf16 GEMM's backward with a bias: the conversion and the
 * bias gradient each read all of dout before). The sums run as
 * bias_backward's, per 64-column block with the rows in order, so dbias
 * gets the same bits. */
static void MF_ISA(to_bf16_colsum)(uint16_t *out, float *dbias, const float *dout, int N, int OC) {
    const int nblk = (OC + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= MF_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * MF_COLBLK;
        const int w0 = OC - c0 < MF_COLBLK ? OC - c0 : MF_COLBLK;
        float acc[MF_COLBLK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC + c0;
            uint16_t *o = out + (size_t)n * OC + c0;
#pragma omp simd
            for (int c = 0; c < w0; c++) {
                acc[c] += d[c];
                o[c] = mf_f32_to_bf16(d[c]);
            }
        }
        for (int c = 0; c < w0; c++) dbias[c0 + c] += acc[c];
    }
}

static void MF_ISA(layernorm_forward_bf16)(uint16_t *out, float *mean, float *rstd, const float *inp,
                                           const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        uint16_t *o = out + (size_t)n * C;
        MF_ISA(ln_stats)(mean + n, rstd + n, x, C);
        const float m = mean[n], r = rstd[n];
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = mf_f32_to_bf16((x[c] - m) * r * w[c] + b[c]);
    }
}

static void MF_ISA(gelu_forward_bf16)(uint16_t *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = mf_f32_to_bf16(MF_ISA(gelu1)(inp[i]));
}

/* ---- Llama family: RMSNorm, RoPE, SwiGLU --------------------------------
 * The formulas and their documentation are llama_kernels.c's (whose public
 * mf_rmsnorm_* / mf_rope_apply / mf_swiglu_* functions call these through
 * the table). The 16-bit-output forms compute rstd exactly as the fp32 one
 * does in the same table, so the fp32 backward reads the same statistics
 * whether the forward was 16-bit or not. */

static inline uint16_t MF_ISA(round16)(mf_dtype dt, float x) {
    return dt == MF_DTYPE_BF16 ? mf_f32_to_bf16(x) : mf_f32_to_fp16(x);
}

static void MF_ISA(rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const float r = (float)(1.0 / sqrt(ss / C + (double)eps));
        rstd[n] = r;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] * r) * w[c];
    }
}

static void MF_ISA(rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const int nblk = (C + MF_COLBLK - 1) / MF_COLBLK;
#pragma omp parallel if ((size_t)N * C >= MF_PAR_MIN)
    {
#pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            const float r = rstd[n];
            double gx = 0.0;
#pragma omp simd reduction(+ : gx)
            for (int c = 0; c < C; c++) gx += (double)(d[c] * w[c]) * x[c];
            /* x_c * r^2 * mean(g x), the r^2 * mean factor folded once */
            const float k = (float)(gx / C * (double)r * r);
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += r * (d[c] * w[c] - x[c] * k);
        }
#pragma omp for schedule(static)
        for (int blk = 0; blk < (dw ? nblk : 0); blk++) { /* dw NULL: frozen weight */
            const int c0 = blk * MF_COLBLK;
            const int w0 = C - c0 < MF_COLBLK ? C - c0 : MF_COLBLK;
            float aw[MF_COLBLK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0;
                const float *d = dout + (size_t)n * C + c0;
                const float r = rstd[n];
#pragma omp simd
                for (int c = 0; c < w0; c++) aw[c] += d[c] * (x[c] * r);
            }
            for (int c = 0; c < w0; c++) dw[c0 + c] += aw[c];
        }
    }
}

static void MF_ISA(rope_apply)(float *qkv, const float *tab, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                   int inverse) {
    const int half = hs / 2, nh = NH + NKV, QKV = (NH + 2 * NKV) * hs;
    if (B <= 0 || T <= 0 || half <= 0 || nh <= 0) return;
    const int N = B * T;
    const float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if ((size_t)N * nh * hs >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const int p = pos ? pos[n] : n % T;
        const float *cs = tab + (size_t)p * half;
        const float *sn = tab + (size_t)T * half + (size_t)p * half;
        float *row = qkv + (size_t)n * QKV;
        for (int h = 0; h < nh; h++) {
            float *x1 = row + (size_t)h * hs, *x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i], c = cs[i], s = sgn * sn[i];
                x1[i] = a * c - b * s;
                x2[i] = b * c + a * s;
            }
        }
    }
}

static void MF_ISA(swiglu_forward)(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + mf_vexpf(-g)) * up[i];
    }
}

static void MF_ISA(swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], u = up[i], d = dout[i];
        const float s = 1.0f / (1.0f + mf_vexpf(-g));
        dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
        dup[i] = d * (g * s);
    }
}

static void MF_ISA(rmsnorm_forward16)(void *out, mf_dtype dt, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps) {
    if (N <= 0 || C <= 0) return;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        uint16_t *o = (uint16_t *)out + (size_t)n * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const float r = (float)(1.0 / sqrt(ss / C + (double)eps));
        rstd[n] = r;
        for (int c = 0; c < C; c++) o[c] = MF_ISA(round16)(dt, (x[c] * r) * w[c]);
    }
}

static void MF_ISA(swiglu_forward16)(void *out, mf_dtype dt, const float *gate, const float *up, size_t n) {
    uint16_t *o = out;
#pragma omp parallel for schedule(static) if (n >= MF_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        o[i] = MF_ISA(round16)(dt, g / (1.0f + mf_vexpf(-g)) * up[i]);  /* mf_swiglu_forward's value, rounded */
    }
}

const mf_kernel_isa MF_ISA(mf_kernels) = {
    .name = MF_ISA_NAME,
    .encoder_forward = MF_ISA(encoder_forward),
    .encoder_backward = MF_ISA(encoder_backward),
    .layernorm_stats = MF_ISA(ln_stats),
    .layernorm_forward = MF_ISA(layernorm_forward),
    .layernorm_backward = MF_ISA(layernorm_backward),
    .bias_fill = MF_ISA(bias_fill),
    .bias_backward = MF_ISA(bias_backward),
    .gelu_forward = MF_ISA(gelu_forward),
    .gelu_backward = MF_ISA(gelu_backward),
    .bias_gelu_forward = MF_ISA(bias_gelu_forward),
    .residual_forward = MF_ISA(residual_forward),
    .residual_layernorm_forward = MF_ISA(residual_layernorm_forward),
    .crossentropy_forward = MF_ISA(crossentropy_forward),
    .sumsq = MF_ISA(sumsq),
    .scale = MF_ISA(scale),
    .adamw = MF_ISA(adamw),
    .to_bf16 = MF_ISA(to_bf16),
    .to_bf16_colsum = MF_ISA(to_bf16_colsum),
    .gelu_backward_bf16_colsum = MF_ISA(gelu_backward_bf16_colsum),
    .layernorm_forward_bf16 = MF_ISA(layernorm_forward_bf16),
    .gelu_forward_bf16 = MF_ISA(gelu_forward_bf16),
    .rmsnorm_forward = MF_ISA(rmsnorm_forward),
    .rmsnorm_backward = MF_ISA(rmsnorm_backward),
    .rope_apply = MF_ISA(rope_apply),
    .swiglu_forward = MF_ISA(swiglu_forward),
    .swiglu_backward = MF_ISA(swiglu_backward),
    .rmsnorm_forward16 = MF_ISA(rmsnorm_forward16),
    .swiglu_forward16 = MF_ISA(swiglu_forward16),
#ifdef __AVX512F__
    .flash_forward = mf_flash_forward_avx512,
    .flash_backward = mf_flash_backward_avx512,
#endif
};
