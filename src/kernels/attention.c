/* Causal multi-head self-attention, fp32, one (batch, head) pair per task.
 *
 * Each head works on strided views of qkv: row t of q for head h starts at
 * qkv + t*3C + h*hs, so q, k and v are (T, hs) matrices with leading
 * dimension 3C and BLAS reads them in place, no gather copies. The (b, h)
 * loop is the OpenMP parallel loop; OpenBLAS's OpenMP build notices it is
 * inside a parallel region and runs each GEMM single-threaded there.
 *
 * Math (llm.c attention_forward/backward, written as matrix products):
 *   P = softmax_causal(Q K^T / sqrt(hs)),  O = P V
 *   dP = dO V^T,  dV = P^T dO,
 *   dS = P * (dP - rowsum(P * dP))          (softmax Jacobian),
 *   dQ = dS K / sqrt(hs),  dK = dS^T Q / sqrt(hs).
 */
#include "memfit/kernels.h"
#include "vmath.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

/* Overwrites row i of the T x T pre-attention matrix with causal softmax
 * probabilities: entries j <= i normalised with the row max subtracted,
 * entries j > i set to exactly 0 (whatever the GEMM left there). */
static void causal_softmax_rows(float *a, int T) {
    for (int i = 0; i < T; i++) {
        float *row = a + (size_t)i * T;
        float mx = -INFINITY;
        for (int j = 0; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j <= i; j++) {
            const float e = mf_vexpf(row[j] - mx);
            row[j] = e;
            s += e;
        }
        const float inv = 1.0f / s;
#pragma omp simd
        for (int j = 0; j <= i; j++) row[j] *= inv;
        for (int j = i + 1; j < T; j++) row[j] = 0.0f;
    }
}

void mf_attention_forward(float *out, float *att, const float *qkv,
                          int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *a = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + (size_t)h * hs;
        /* full Q K^T then masking; the upper triangle is wasted work but
         * its values are never read (the softmax overwrites them with 0) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                    scale, q, C3, k, C3, 0.0f, a, T);
        causal_softmax_rows(a, T);
        /* O = P V; P's zeros keep future tokens out exactly */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                    1.0f, a, T, v, C3, 0.0f, o, C);
    }
}

size_t mf_attention_scratch_floats(int T, int nthreads) {
    if (T <= 0 || nthreads <= 0) return 0;
    return (size_t)nthreads * (size_t)T * (size_t)T;
}

/* Scratch contract: the caller sizes scratch with
 * mf_attention_scratch_floats(T, omp_get_max_threads()) and calls this with
 * the same OpenMP settings (the parallel region below runs at most
 * omp_get_max_threads() threads and thread i uses the i-th T*T slice).
 *
 * dqkv needs no zeroing: for each (b, h) the three GEMMs with beta = 0 write
 * the head's q, k and v columns of every row exactly once, and the heads'
 * columns are disjoint and cover all 3C. */
void mf_attention_backward(float *dqkv, float *scratch, const float *dout,
                           const float *qkv, const float *att,
                           int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const size_t off = (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const float *p = att + (size_t)bh * T * T;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        float *ds = scratch + (size_t)omp_get_thread_num() * T * T;

        /* dP = dO V^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                    1.0f, dO, C, v, C3, 0.0f, ds, T);
        /* dV = P^T dO */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                    1.0f, p, T, dO, C, 0.0f, dv, C3);
        /* dS = P * (dP - rowsum(P * dP)), in place over dP; P is 0 above
         * the diagonal so dS is too, written explicitly so dP's values
         * there never reach dQ or dK */
        for (int i = 0; i < T; i++) {
            const float *pr = p + (size_t)i * T;
            float *r = ds + (size_t)i * T;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= i; j++) dot += pr[j] * r[j];
#pragma omp simd
            for (int j = 0; j <= i; j++) r[j] = pr[j] * (r[j] - dot);
            for (int j = i + 1; j < T; j++) r[j] = 0.0f;
        }
        /* dQ = dS K * scale, dK = dS^T Q * scale */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                    scale, ds, T, k, C3, 0.0f, dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                    scale, ds, T, q, C3, 0.0f, dk, C3);
    }
}
