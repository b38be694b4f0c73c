/* Run-time ISA dispatch for the non-GEMM kernels (internal to libmemfit).
 *
 * The element-wise and row-wise kernels (encoder, layernorm, bias/GELU,
 * residual, cross-entropy, sums of squares, AdamW; the Llama family's
 * RMSNorm, RoPE and SwiGLU) are written once, in
 * kern_body.h, and compiled twice: kern_portable.c with the build's baseline
 * flags (-march=x86-64-v2: SSE4.2, runs anywhere the binary runs) and
 * kern_avx512.c with AVX-512F/BW/VL/DQ enabled for that one file. Each
 * compilation fills a table of function pointers; mf_kernels_isa_get()
 * picks one table, once, from the CPU (__builtin_cpu_supports) and the
 * MEMFIT_ISA environment variable (auto | portable | avx512), so the same
 * binary runs on a CPU without AVX-512 and the portable path can be forced
 * (and tested) on one that has it.
 *
 * Both tables compute the same formulas in the same order within a vector
 * lane; they may differ only where a reduction's vector width changes the
 * order of the additions (layernorm statistics, loss sums, sums of squares,
 * column sums), i.e. by float round-off. tests/test_kernels_isa_agree.c
 * checks that bound. Thread count never changes results (see cpu.c).
 */
#ifndef MEMFIT_KERNELS_ISA_H
#define MEMFIT_KERNELS_ISA_H

#include <stddef.h>
#include <stdint.h>

#include "memfit/core.h"

typedef struct {
    const char *name; /* "portable" or "avx512" */
    void (*encoder_forward)(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C);
    /* one row's mean and rstd (the statistics every layernorm forward uses) */
    void (*layernorm_stats)(float *mean, float *rstd, const float *x, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C);
    /* out (N,OC) = bias (accumulate == 0) or out += bias */
    void (*bias_fill)(float *out, const float *bias, int N, int OC, int accumulate);
    /* dbias (OC) += column sums of dout (N,OC) */
    void (*bias_backward)(float *dbias, const float *dout, int N, int OC);
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* pre (N,OC) += bias; out = gelu(pre) (out may be pre) */
    void (*bias_gelu_forward)(float *out, float *pre, const float *bias, int N, int OC);
    /* x (N,C) += res + bias (bias may be NULL) */
    void (*residual_forward)(float *x, const float *res, const float *bias, int N, int C);
    /* x += res + bias, then out = layernorm(x) with mean/rstd, row by row */
    void (*residual_layernorm_forward)(float *x, float *out, float *mean, float *rstd, const float *res,
                                       const float *bias, const float *w, const float *b, int N, int C);
    /* dl16 NULL: the gradient overwrites logits; else it goes to dl16 as
     * bf16 (nearest-even) and logits keep the exponentials */
    double (*crossentropy_forward)(float *logits, uint16_t *dl16, float *losses, const int32_t *targets, int N,
                                   int V, int Vp, float dscale);
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, float s, size_t n);
    /* AdamW with coefficients precomputed by mf_adamw_update; p16 (or
     * NULL) gets the new weights rounded to bf16 in the same pass */
    void (*adamw)(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float beta1, float beta2,
                  float omb1, float omb2, float step_size, float bc2_sqrt, float eps, float decay, float gscale);
    /* bf16 outputs (nearest-even) of the fp32 formulas: a conversion, the
     * layernorm forward (statistics as layernorm_stats) and GELU */
    void (*to_bf16)(uint16_t *out, const float *in, size_t n);
    /* out (N,OC) = dout rounded to bf16, and dbias += dout's column sums
     * (bias_backward's sums, bit for bit) */
    void (*to_bf16_colsum)(uint16_t *out, float *dbias, const float *dout, int N, int OC);
    /* out16 = bf16(gelu'(inp) dout), dbias (or NULL) += its column sums */
    void (*gelu_backward_bf16_colsum)(uint16_t *out16, float *dbias, const float *inp, const float *dout, int N,
                                      int OC);
    void (*layernorm_forward_bf16)(uint16_t *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, int N, int C);
    void (*gelu_forward_bf16)(uint16_t *out, const float *inp, size_t n);
    /* the Llama family's kernels, as declared in memfit/kernels.h
     * (mf_rmsnorm_forward ... mf_swiglu_forward16, llama_kernels.c) */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C);
    void (*rope_apply)(float *qkv, const float *tab, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                       int inverse);
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                            size_t n);
    void (*rmsnorm_forward16)(void *out, mf_dtype dt, float *rstd, const float *inp, const float *w, int N, int C,
                              float eps);
    void (*swiglu_forward16)(void *out, mf_dtype dt, const float *gate, const float *up, size_t n);
    /* FlashAttention with flash_attention.c's contract (grouped-query heads,
     * window already normalised, documents via pos); NULL: flash_attention.c's
     * own tile loops. Called for hs <= MF_FA512_MAX_HS only (fa_avx512.c). */
    void (*flash_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                          int window, const int32_t *pos);
    void (*flash_backward)(float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                           const float *lse, int B, int T, int NH, int NKV, int hs, int window, const int32_t *pos);
} mf_kernel_isa;

/* head size the AVX-512 FlashAttention keeps its transposed tiles for on the
 * stack (2 x hs x 64 floats per task); larger heads take the portable path */
#define MF_FA512_MAX_HS 128
/* flash_attention.c's own tile loops (cblas tiles), what the portable table
 * runs; the arguments already checked and the window normalised */
void mf_flash_forward_tiles(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                            int window, const int32_t *pos);
void mf_flash_backward_tiles(float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                             const float *lse, int B, int T, int NH, int NKV, int hs, int window,
                             const int32_t *pos);
#ifdef MEMFIT_AVX512_TU
void mf_flash_forward_avx512(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                             int window, const int32_t *pos);
void mf_flash_backward_avx512(float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                              const float *lse, int B, int T, int NH, int NKV, int hs, int window,
                              const int32_t *pos);
/* the same with bf16 tile products (fa_avx512.c); only where
 * mf_kernels_isa_bf16dot_ok() */
void mf_flash_forward_avx512bf16(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                                 int window, const int32_t *pos);
void mf_flash_backward_avx512bf16(float *dqkv, float *scratch, const float *dout, const float *out,
                                  const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                  int window, const int32_t *pos);
#endif

extern const mf_kernel_isa mf_kernels_portable;
#if defined(__x86_64__) && defined(MEMFIT_AVX512_TU)
#define MF_HAVE_AVX512_TABLE 1
extern const mf_kernel_isa mf_kernels_avx512;
#endif

/* The table in use: chosen on the first call (MEMFIT_ISA, then the CPU);
 * an unusable MEMFIT_ISA value stops the program with a message. */
const mf_kernel_isa *mf_kernels_isa_get(void);
/* 1 if this CPU can run the avx512 table (and the build has one). */
int mf_kernels_isa_avx512_ok(void);
/* 1 if the avx512 table is in use and the CPU has AVX512_BF16 (vdpbf16ps),
 * which the bf16 FlashAttention tiles need. */
int mf_kernels_isa_bf16dot_ok(void);

#endif
