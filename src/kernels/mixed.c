/* Mixed-precision kernels: the fp32 layers of cpu.c with a 16-bit (bf16 or
 * fp16) output where that output feeds a GEMM, and GEMMs on 16-bit
 * operands with fp32 accumulation and fp32 output (see memfit/kernels.h).
 *
 * Every reduction stays fp32: LayerNorm statistics come from the same
 * dispatched row function as mf_layernorm_forward's (isa.h), so the saved
 * mean and rstd are bit-identical to the fp32 path's; only the stored
 * output is rounded (nearest-even). bf16 GEMMs go to oneDNN's matmul
 * (AVX512_BF16 here, oneDNN's own fallback elsewhere). oneDNN 2.6 has no
 * fast fp16 matmul on this CPU, so fp16 GEMMs convert K-blocks of both
 * operands to fp32 in the caller's scratch and call sgemm: fp16 keeps fp16
 * storage semantics but is a memory feature here, not a speed one. */
#include "memfit/kernels.h"
#include "memfit/core.h"
#include "kernels/half.h"
#include "vmath.h"
#include "isa.h"

#include <cblas.h>
#include <math.h>

#define MF_PAR_MIN 4096
#define MF_F16_KB 128 /* K rows of each operand converted at a time (fp16 GEMM) */

static inline uint16_t round16(mf_dtype dt, float x) {
    return dt == MF_DTYPE_BF16 ? mf_f32_to_bf16(x) : mf_f32_to_fp16(x);
}
static inline float widen16(mf_dtype dt, uint16_t h) {
    return dt == MF_DTYPE_BF16 ? mf_bf16_to_f32(h) : mf_fp16_to_f32(h);
}

void mf_half_from_f32(mf_dtype dt, void *out, const float *in, size_t n) {
    if (dt == MF_DTYPE_BF16) mf_bf16_from_f32(out, in, n);
    else mf_fp16_from_f32(out, in, n);
}

void mf_f32_from_half(mf_dtype dt, float *out, const void *in, size_t n) {
    if (dt == MF_DTYPE_BF16) mf_f32_from_bf16(out, in, n);
    else mf_f32_from_fp16(out, in, n);
}

void mf_encoder_forward16(float *out, const int32_t *inp, const void *wte, mf_dtype dt,
                          const float *wpe, int B, int T, int C) {
    const int N = B * T;
    const uint16_t *w = wte;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const uint16_t *we = w + (size_t)inp[n] * C;
        const float *pe = wpe + (size_t)(n % T) * C;
        for (int c = 0; c < C; c++) o[c] = widen16(dt, we[c]) + pe[c];
    }
}

void mf_layernorm_forward16(void *out, mf_dtype dt, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C) {
    const mf_kernel_isa *K = mf_kernels_isa_get();
    if (dt == MF_DTYPE_BF16) {
        K->layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C);
        return;
    }
#pragma omp parallel for schedule(static) if ((size_t)N * C >= MF_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        uint16_t *o = (uint16_t *)out + (size_t)n * C;
        K->layernorm_stats(mean + n, rstd + n, x, C);
        const float m = mean[n], r = rstd[n];
        for (int c = 0; c < C; c++) o[c] = round16(dt, (x[c] - m) * r * w[c] + b[c]);
    }
}

void mf_gelu_forward16(void *out, mf_dtype dt, const float *inp, size_t n) {
    const mf_kernel_isa *K = mf_kernels_isa_get();
    if (dt == MF_DTYPE_BF16) {
        K->gelu_forward_bf16(out, inp, n);
        return;
    }
    uint16_t *o = out;
    const size_t blk = 1024; /* below the kernel's own threading threshold: one thread per block */
    const size_t nb = (n + blk - 1) / blk;
    /* the dispatched fp32 GELU into a stack block, then rounded */
#pragma omp parallel for schedule(static) if (n >= MF_PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        float tmp[1024];
        size_t i0 = k * blk, m = n - i0 < blk ? n - i0 : blk;
        K->gelu_forward(tmp, inp + i0, m);
        for (size_t i = 0; i < m; i++) o[i0 + i] = round16(dt, tmp[i]);
    }
}

/* ---- GEMM -------------------------------------------------------------- */

/* fp16: C = op(A) @ op(B) summed over K-blocks, each block of both
 * operands widened to fp32 (exact) into scratch first, in the operands'
 * stored layout (contiguous runs), and sgemm told about the transposes.
 * A block holds at most MF_F16_PANEL floats of both panels (and at least
 * MF_F16_KB rows of K when that is more), so a long K (the head's
 * backward) takes few blocks: each block costs OpenMP regions that are
 * slow on a loaded machine. */
#define MF_F16_PANEL ((size_t)4 << 20)
static int f16_kb(int M, int N, int K) {
    size_t kb = MF_F16_PANEL / ((size_t)M + (size_t)N);
    if (kb < MF_F16_KB) kb = MF_F16_KB;
    return kb > (size_t)K ? K : (int)kb;
}

static size_t f16_scratch(int M, int N, int K) {
    return (size_t)f16_kb(M, N, K) * ((size_t)M + (size_t)N) * sizeof(float);
}

/* rows x cols of a row-major fp16 matrix with leading dimension ld, from
 * (r0, c0), widened into out (rows x cols, dense) */
static void widen_block(float *out, const mf_fp16 *in, int rows, int cols, size_t ld, int r0, int c0) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= MF_PAR_MIN)
    for (int i = 0; i < rows; i++) mf_f32_from_fp16(out + (size_t)i * cols, in + (size_t)(r0 + i) * ld + c0, (size_t)cols);
}

static void f16_gemm(float *C, int ldc, const mf_fp16 *A, const mf_fp16 *B, int M, int N, int K, int tA, int tB,
                     float beta, float *scratch) {
    const int kbmax = f16_kb(M, N, K);
    float *a = scratch, *b = scratch + (size_t)M * kbmax;
    for (int k0 = 0; k0 < K; k0 += kbmax) {
        const int kb = K - k0 < kbmax ? K - k0 : kbmax;
        /* A stored (M,K): columns k0.. of every row; stored (K,M): rows k0.. */
        if (tA) widen_block(a, A, kb, M, (size_t)M, k0, 0);
        else widen_block(a, A, M, kb, (size_t)K, 0, k0);
        if (tB) widen_block(b, B, N, kb, (size_t)K, 0, k0);
        else widen_block(b, B, kb, N, (size_t)N, k0, 0);
        cblas_sgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans, M, N, kb, 1.0f, a,
                    tA ? M : kb, b, tB ? kb : N, k0 ? 1.0f : beta, C, ldc);
    }
}

size_t mf_gemm16_scratch_bytes(mf_dtype dt, int M, int N, int K, int tA, int tB, int accumulate, int bias) {
    if (dt == MF_DTYPE_F16) return f16_scratch(M, N, K);
    return mf_gemm_bf16_scratch_bytes(M, N, K, tA, tB, accumulate, 0, bias);
}

void mf_gemm16(mf_dtype dt, float *C, const void *A, const void *B, const float *bias, int M, int N, int K,
               int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes) {
    if (M <= 0 || N <= 0) return;
    if (dt == MF_DTYPE_BF16) {
        /* one primitive description per call: the size check is inside */
        if (K <= 0) mf_panic("bf16 GEMM with K = 0");
        if (mf_gemm_bf16_sized(C, A, B, bias, M, N, K, tA, tB, accumulate, 0, scratch, scratch_bytes))
            mf_panic("bf16 GEMM %dx%dx%d failed (a memfit bug: the plan sized its scratch): %s", M, N, K, mf_error());
        return;
    }
    if (f16_scratch(M, N, K) > scratch_bytes)
        mf_panic("fp16 GEMM %dx%dx%d needs %zu bytes of scratch, %zu planned", M, N, K, f16_scratch(M, N, K), scratch_bytes);
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)M * N >= MF_PAR_MIN)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * N + j] = (accumulate ? C[(size_t)i * N + j] : 0.0f) + bias[j];
        beta = 1.0f;
    }
    if (K <= 0) {
        if (!bias && !accumulate)
            for (size_t i = 0; i < (size_t)M * N; i++) C[i] = 0.0f;
        return;
    }
    f16_gemm(C, N, A, B, M, N, K, tA, tB, beta, scratch);
}

void mf_gemm16_ldc(mf_dtype dt, float *C, int ldc, const void *A, const void *B, const float *bias, int M, int N,
                   int K, int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || ldc < N) mf_panic("mf_gemm16_ldc: K > 0 and ldc >= N only");
    if (dt == MF_DTYPE_BF16) {
        if (mf_gemm_bf16_ldc(C, ldc, A, B, bias, M, N, K, tA, tB, accumulate, scratch, scratch_bytes))
            mf_panic("bf16 GEMM %dx%dx%d failed (a memfit bug: the plan sized its scratch): %s", M, N, K, mf_error());
        return;
    }
    if (f16_scratch(M, N, K) > scratch_bytes)
        mf_panic("fp16 GEMM %dx%dx%d needs %zu bytes of scratch, %zu planned", M, N, K, f16_scratch(M, N, K), scratch_bytes);
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias) {  /* the bias first, then the product accumulates onto it */
#pragma omp parallel for schedule(static) if ((size_t)M * N >= MF_PAR_MIN)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = (accumulate ? C[(size_t)i * ldc + j] : 0.0f) + bias[j];
        beta = 1.0f;
    }
    f16_gemm(C, ldc, A, B, M, N, K, tA, tB, beta, scratch);
}

void mf_matmul16_forward(mf_dtype dt, float *out, const void *inp, const void *w, const float *bias, int N, int C,
                         int OC, int accumulate, void *scratch, size_t scratch_bytes) {
    mf_gemm16(dt, out, inp, w, bias, N, OC, C, 0, 0, accumulate, scratch, scratch_bytes);
}

void mf_gemm16_dw(mf_dtype dt, void *dW, int dw16, const void *A, const void *B, int M, int N, int K, int tA, int tB,
                  void *scratch, size_t scratch_bytes) {
    if (!dW) return;  /* a frozen weight (LoRA's base): no gradient */
    if (!dw16) {
        mf_gemm16(dt, dW, A, B, NULL, M, N, K, tA, tB, 1, scratch, scratch_bytes);
        return;
    }
    if (dt != MF_DTYPE_BF16) mf_panic("a bf16 weight gradient needs bf16 operands");
    if (M <= 0 || N <= 0 || K <= 0) return;
    /* oneDNN's sum post-op: the fp32 accumulator plus the widened bf16
     * values, rounded once (a bf16 result is never K-blocked: dnnl_mm.c) */
    if (mf_gemm_bf16_sized(dW, A, B, NULL, M, N, K, tA, tB, 1, 1, scratch, scratch_bytes))
        mf_panic("bf16 GEMM %dx%dx%d (bf16 gradient) failed (a memfit bug: the plan sized its scratch): %s", M, N, K,
                 mf_error());
}

void mf_matmul16_backward(mf_dtype dt, float *dinp, void *dw, int dw16, float *dbias, const float *dout, void *dout16,
                          const void *inp, const void *w, int N, int C, int OC, void *scratch, size_t scratch_bytes) {
    if (N <= 0 || C <= 0 || OC <= 0) return;
    /* bf16 with a bias: the rounding and the bias gradient (column sums of
     * the fp32 gradient) in one pass over dout */
    int fused = dbias && dt == MF_DTYPE_BF16;
    if (!dout) fused = 1;  /* rounded and summed by the caller */
    else if (fused) mf_kernels_isa_get()->to_bf16_colsum(dout16, dbias, dout, N, OC);
    else mf_half_from_f32(dt, dout16, dout, (size_t)N * OC);
    /* dw (C,OC) += inp^T @ dout first: inp may live in dinp's buffer */
    mf_gemm16_dw(dt, dw, dw16, inp, dout16, C, OC, N, 1, 0, scratch, scratch_bytes);
    if (dinp) mf_gemm16(dt, dinp, dout16, w, NULL, N, C, OC, 0, 1, 0, scratch, scratch_bytes);
    if (dbias && !fused) mf_kernels_isa_get()->bias_backward(dbias, dout, N, OC);
}

void mf_gelu_backward_bf16_colsum(uint16_t *dout16, float *dbias, const float *pre, const float *dh, int N, int OC) {
    mf_kernels_isa_get()->gelu_backward_bf16_colsum(dout16, dbias, pre, dh, N, OC);
}

void mf_classifier16_forward(mf_dtype dt, float *logits, const void *x, const void *wte, int N, int C, int Vp,
                             void *scratch, size_t scratch_bytes) {
    mf_gemm16(dt, logits, x, wte, NULL, N, Vp, C, 0, 1, 0, scratch, scratch_bytes);
}

void mf_classifier16_backward(mf_dtype dt, float *dx, void *dwte, int dw16, const float *dlogits, void *dlogits16,
                              const void *x, const void *wte, int N, int C, int Vp, void *scratch,
                              size_t scratch_bytes) {
    if (dlogits) mf_half_from_f32(dt, dlogits16, dlogits, (size_t)N * Vp);
    mf_gemm16(dt, dx, dlogits16, wte, NULL, N, C, Vp, 0, 0, 0, scratch, scratch_bytes);
    mf_gemm16_dw(dt, dwte, dw16, dlogits16, x, Vp, C, N, 1, 0, scratch, scratch_bytes);
}
