/* One oneDNN matmul call, shared by the fp32 (gemm.c) and bf16
 * (dnnl_mm.c) paths. Internal to kernels/.
 *
 *   C (M,N) = alpha op(A) op(B) [+ bias] + beta C
 *
 * row-major with leading dimensions, op(X) = X^T when tX. The scratchpad is
 * user-managed: every byte oneDNN needs beyond the operands is passed in
 * (a plan row during a step), so the library keeps no buffers of its own. A
 * primitive is described and created per call; oneDNN's primitive cache
 * makes repeats cheap (tens of microseconds against milliseconds of GEMM).
 * Wide or long products run as column and K blocks (dnnl_mm.c says why). */
#ifndef MEMFIT_KERNELS_DNNL_MM_H
#define MEMFIT_KERNELS_DNNL_MM_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

typedef struct {
    int M, N, K, ta, tb, lda, ldb, ldc;
    dnnl_data_type_t ab, c; /* operands' and result's types */
    float alpha, beta;
    int bias;               /* a (N) fp32 bias is added */
} mf_mm;

/* Scratch bytes the call needs (0 or more; its largest block's), or
 * SIZE_MAX with mf_error set. */
size_t mf_mm_scratch(const mf_mm *s);
/* Runs it; -1 with mf_error set on failure, or when it needs more than
 * scratch_bytes of scratch. */
int mf_mm_run(const mf_mm *s, const void *A, const void *B, const float *bias, void *C, void *scratch,
              size_t scratch_bytes);
/* The implementation oneDNN picks for s, e.g. "brg:avx512_core"; "" on error. */
const char *mf_mm_impl(const mf_mm *s, char *buf, size_t n);

#endif
