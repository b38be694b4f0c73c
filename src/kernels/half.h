/* memfit half: 16-bit float formats (bf16, IEEE fp16) and their conversions
 * to and from fp32, element-wise on plain arrays.
 *
 * Owns nothing. Promises:
 *  - fp32 -> bf16 and fp32 -> fp16 round to nearest, ties to even (as
 *    PyTorch's .to(torch.bfloat16) / .half() and the F16C instruction),
 *    subnormals kept (no flush to zero), NaN stays NaN (quiet), overflow
 *    goes to +-inf;
 *  - 16 -> 32 bit conversions are exact;
 *  - stochastic rounding to bf16 rounds up with probability equal to the
 *    dropped fraction, from a counter-based hash of (seed, element index),
 *    so the result depends on neither the thread count nor the call order;
 *  - the array versions split work over OpenMP threads for large n.
 */
#ifndef MEMFIT_HALF_H
#define MEMFIT_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t mf_bf16;
typedef uint16_t mf_fp16;

static inline float mf_bf16_to_f32(mf_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline mf_bf16 mf_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mf_bf16)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mf_bf16)(u >> 16);
}

/* fp32 -> bf16 rounding up with probability (dropped bits) / 2^16; rnd is
 * 16 uniformly random bits. */
static inline mf_bf16 mf_f32_to_bf16_sr(float f, uint32_t rnd) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return mf_f32_to_bf16(f); /* inf, NaN */
    u += rnd & 0xffffu;
    return (mf_bf16)(u >> 16);
}

float mf_fp16_to_f32(mf_fp16 h);
mf_fp16 mf_f32_to_fp16(float f);

/* The 16 random bits stochastic rounding uses for element i under seed. */
uint32_t mf_half_sr_bits(uint64_t seed, uint64_t i);

void mf_bf16_from_f32(mf_bf16 *out, const float *in, size_t n);
void mf_f32_from_bf16(float *out, const mf_bf16 *in, size_t n);
void mf_fp16_from_f32(mf_fp16 *out, const float *in, size_t n);
void mf_f32_from_fp16(float *out, const mf_fp16 *in, size_t n);
/* out[i] = stochastic bf16 of in[i] with mf_half_sr_bits(seed, first + i). */
void mf_bf16_from_f32_sr(mf_bf16 *out, const float *in, size_t n, uint64_t seed, uint64_t first);

/* bf16 GEMM with fp32 accumulation, through oneDNN's matmul (its AVX512_BF16
 * kernels where the CPU has them, its own fallback where it does not):
 *   C (M,N) = op(A) (M,K) @ op(B) (K,N) [+ bias (N)] [+ C if accumulate]
 * A and B are bf16 row-major; op(X) is X, or X^T when tX is 1 (X then
 * stored (K,M) / (N,K)). C is fp32, or bf16 when c_bf16 is 1 (rounded to
 * nearest-even from the fp32 accumulator). bias is fp32 or NULL.
 * scratch: at least mf_gemm_bf16_scratch_bytes() for the same arguments (a
 * plan row: oneDNN is told not to allocate its own). Returns 0, or -1 with
 * mf_error() set. Calls come from one thread; the work runs on OpenMP's. */
int mf_gemm_bf16(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                 int tA, int tB, int accumulate, int c_bf16, void *scratch);
/* The same with the scratch's size: -1 when the call needs more. */
int mf_gemm_bf16_sized(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                       int tA, int tB, int accumulate, int c_bf16, void *scratch, size_t scratch_bytes);
/* Scratch bytes the call above needs (0 or more), or SIZE_MAX on error. */
size_t mf_gemm_bf16_scratch_bytes(int M, int N, int K, int tA, int tB, int accumulate, int c_bf16, int bias);
/* The oneDNN implementation chosen for a typical shape, e.g.
 * "brg:avx512_core_bf16"; "" if oneDNN cannot run. */
/* mf_gemm_bf16_sized with an fp32 C of leading dimension ldc. */
int mf_gemm_bf16_ldc(float *C, int ldc, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                     int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes);
const char *mf_gemm_bf16_impl(void);

#ifdef __cplusplus
}
#endif
#endif
