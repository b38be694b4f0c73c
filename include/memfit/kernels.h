/* memfit CPU kernels: one forward/backward pair per layer type, on plain
 * pointers and sizes (llm.c style). fp32, row-major; the 16-bit (bf16/fp16)
 * variants the mixed-precision model uses are at the end (mixed.c).
 *
 * Owns nothing: every buffer is passed in by the caller (from the arena).
 * Promises: no allocation; N is the number of rows (B*T); weight matrices are
 * stored in Hugging Face Conv1D layout (in, out), so y = x @ W + b. Backward
 * functions ACCUMULATE (+=) into parameter gradients and into the input
 * gradient where the comment says "accumulates"; otherwise they overwrite.
 * Kernels run OpenMP-parallel inside and call BLAS for GEMMs. The
 * element-wise and row-wise kernels exist in a portable and an AVX-512 build
 * of the same C; one is picked at run time (see mf_kernels_isa_name).
 */
#ifndef MEMFIT_KERNELS_H
#define MEMFIT_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "memfit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (B,T,C) = wte[inp[b,t]] + wpe[t]. inp (B,T); wte (V,C); wpe (maxT,C). */
void mf_encoder_forward(float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C);
/* dwte, dwpe accumulate. dout (B,T,C). */
void mf_encoder_backward(float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C);

/* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved for backward.
 * eps = 1e-5 as in GPT-2. */
void mf_layernorm_forward(float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b,
                          int N, int C);
/* dinp accumulates (+=), dw and db accumulate (both NULL: not computed). */
void mf_layernorm_backward(float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ w (C,OC) + bias (OC, may be NULL).
 * If accumulate != 0, out += inp @ w + bias instead (residual adds). */
void mf_matmul_forward(float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC, int accumulate);
/* dinp (N,C) = dout @ w^T (overwritten; skipped if dinp is NULL);
 * dw (C,OC) += inp^T @ dout (computed first, so inp may be dinp's buffer;
 * skipped if dw is NULL: a frozen weight);
 * dbias (OC) += column sums of dout (if non-NULL). */
void mf_matmul_backward(float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const float *w,
                        int N, int C, int OC);

/* Causal multi-head self-attention.
 * qkv (B,T,3C) holds q | k | v per token, head h uses columns h*hs..(h+1)*hs
 * of each of the three C-wide parts (hs = C/NH), as in GPT-2's c_attn split.
 * att (B,NH,T,T): softmax probabilities (row i has entries j <= i; entries
 * j > i are written as 0). out (B,T,C). Scale 1/sqrt(hs). */
void mf_attention_forward(float *out, float *att, const float *qkv,
                          int B, int T, int C, int NH);
/* dqkv (B,T,3C) overwritten. scratch: at least mf_attention_scratch_floats()
 * floats, contents undefined on return. */
void mf_attention_backward(float *dqkv, float *scratch, const float *dout,
                           const float *qkv, const float *att,
                           int B, int T, int C, int NH);
/* Scratch floats the backward needs for `nthreads` OpenMP threads. */
size_t mf_attention_scratch_floats(int T, int nthreads);

/* Residual adds fused with what reads them. The GEMM before them writes x
 * (beta = 0); then x (N,C) = res + (x + bias) (bias may be NULL), and for
 * the second form out = layernorm(x) as mf_layernorm_forward would give,
 * in the same pass over each row. res may not alias x or out. */
void mf_residual_forward(float *x, const float *res, const float *bias, int N, int C);
void mf_residual_layernorm_forward(float *x, float *out, float *mean, float *rstd,
                                   const float *res, const float *bias, const float *w,
                                   const float *b, int N, int C);

/* GELU, tanh approximation (GPT-2's "gelu_new"); out may be inp (in place). */
void mf_gelu_forward(float *out, const float *inp, size_t n);
/* pre (N,OC) += bias, then out = gelu(pre), in one pass (the FC layer's
 * bias and activation after a beta = 0 GEMM into pre). out may be pre. */
void mf_bias_gelu_forward(float *out, float *pre, const float *bias, int N, int OC);
/* dinp = gelu'(inp) * dout; dinp may alias dout. */
void mf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* Softmax cross-entropy over the first V of Vp logit columns (columns V..Vp-1
 * are padding and never enter the softmax). logits (N,Vp), targets (N);
 * a target of MF_TARGET_IGNORE (-1: a prompt token, padding, a document's
 * last token) is skipped as PyTorch's ignore_index is: its loss is 0 (not
 * in the sum) and its gradient row is 0.
 * Writes each row's loss into losses (N) and returns their sum (double).
 * If dscale != 0, overwrites logits with d(loss)/d(logits) * dscale, i.e.
 * (softmax - onehot) * dscale, padding columns set to 0. */
#define MF_TARGET_IGNORE (-1)
double mf_crossentropy_forward(float *logits, float *losses,
                               const int32_t *targets, int N, int V, int Vp,
                               float dscale);
/* The same with the gradient (dscale != 0) written to dl16 (N,Vp) as bf16,
 * rounded from the same fp32 values, instead of over logits. */
double mf_crossentropy_forward_bf16(float *logits, uint16_t *dl16, float *losses, const int32_t *targets, int N, int V,
                                    int Vp, float dscale);

/* Tied output head. logits (N,Vp) = x (N,C) @ wte^T, wte (Vp,C).
 * Backward: dx (N,C) overwritten; dwte accumulates (NULL: frozen). */
void mf_classifier_forward(float *logits, const float *x, const float *wte, int N, int C, int Vp);
void mf_classifier_backward(float *dx, float *dwte, const float *dlogits, const float *x,
                            const float *wte, int N, int C, int Vp);

/* Sum of squares of x (double accumulation). */
double mf_sumsq(const float *x, size_t n);
/* x *= s */
void mf_scale(float *x, float s, size_t n);

/* fp32 GEMM, row-major, C (M,N) = alpha op(A) op(B) + beta C, op = transpose
 * if ta/tb; beta = 0 never reads C. Every fp32 product of the model goes
 * here (not the attention tiles). Backend (MEMFIT_GEMM = auto | onednn |
 * matmul | openblas): oneDNN's sgemm by default (auto); oneDNN's matmul
 * primitive, whose scratch is the caller's (below); or OpenBLAS. With
 * more than one thread the sgemm backend splits each call into one slice
 * per thread itself (MEMFIT_GEMM_SPLIT = 1, default; 0: oneDNN threads
 * each call). mf_sgemm_init returns -1 (message via mf_error) for a bad
 * MEMFIT_GEMM or MEMFIT_GEMM_SPLIT;
 * mf_sgemm_name gives "onednn", "matmul" or "openblas"; mf_sgemm_use
 * switches backend (benches, tests; -1 for a bad name). */
void mf_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
int mf_sgemm_init(void);
const char *mf_sgemm_name(void);
int mf_sgemm_use(const char *name);
/* Scratch bytes the matmul backend needs for a call with dense leading
 * dimensions (0 for the other backends), SIZE_MAX on error. */
size_t mf_sgemm_scratch_bytes(int ta, int tb, int M, int N, int K, float beta);
/* The scratch later calls from outside OpenMP parallel regions use (a plan
 * row, at least the largest mf_sgemm_scratch_bytes of those calls); NULL:
 * each call allocates and frees its own. */
void mf_sgemm_scratch(void *p, size_t bytes);

/* Kernel instruction set. mf_kernels_isa_init picks it once: MEMFIT_ISA
 * = auto (default: avx512 where the CPU has AVX-512F/BW/VL/DQ, else
 * portable), portable, or avx512; returns -1 (message via mf_error) for a
 * value that cannot be honoured. Any kernel call makes the same choice
 * (and stops the program on a bad value) if init was not called.
 * mf_kernels_isa_name returns "avx512" or "portable". */
int mf_kernels_isa_init(void);
const char *mf_kernels_isa_name(void);

/* Causal attention without the T x T matrix (FlashAttention, Dao 2022):
 * qkv (B,T,3C) as for mf_attention_forward; out (B,T,C); lse (B,NH,T) gets
 * each query row's log-sum-exp of its scaled scores, kept for backward. */
void mf_flash_attention_forward(float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH);
/* dqkv (B,T,3C) overwritten. out and lse from the forward. scratch: at
 * least mf_flash_attention_scratch_floats(T, C/NH, nthreads) floats, where
 * nthreads = omp_get_max_threads() when the caller sized it. */
void mf_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                 const float *out, const float *qkv, const float *lse,
                                 int B, int T, int C, int NH);
size_t mf_flash_attention_scratch_floats(int T, int hs, int nthreads);

/* ---- Llama-family kernels (llama_kernels.c, flash_attention.c) ---------
 * Grouped-query attention layout: a token's qkv row holds NH query heads,
 * then NKV key heads, then NKV value heads, hs floats each: width
 * QKV = (NH + 2*NKV) * hs. Query head h reads key/value head h / (NH/NKV)
 * (NKV divides NH); K and V are never copied per query head. */

/* Causal GQA FlashAttention with an optional sliding window: window > 0
 * lets query i see keys j with i - window < j <= i (Mistral's
 * sliding_window), 0 = every j <= i. Key tiles wholly outside the window
 * are skipped, not masked. out (B,T,NH*hs); lse (B,NH,T). With NKV == NH,
 * hs = C/NH and window 0 the results are bit-identical to
 * mf_flash_attention_forward / _backward (which call these). */
void mf_flash_attention_gqa_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                    int hs, int window);
/* dqkv (B,T,QKV) overwritten; dK/dV of a shared head sum over its query
 * heads. scratch: mf_flash_attention_scratch_floats(T, hs, nthreads). */
void mf_flash_attention_gqa_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                     const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                     int window);

/* The same with documents packed into each row (document masking): pos
 * (B,T) gives each token's position in its document, 0 at a document's
 * first token and +1 per token after it; query i then sees only keys of its
 * own document (j >= i - pos[i]), and key tiles wholly before it are
 * skipped. pos NULL: exactly mf_flash_attention_gqa_forward / _backward. */
void mf_flash_attention_doc_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                    int hs, int window, const int32_t *pos);
void mf_flash_attention_doc_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                     const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                     int window, const int32_t *pos);
/* The same, with bf16 tile products: every product's operands (Q, K, V,
 * dO, the probabilities P and dS) rounded to bf16 (nearest even) and
 * multiplied by AVX512_BF16's vdpbf16ps; softmax, log-sum-exps and every
 * sum stay fp32. The 16-bit training path's attention (docs/precision.md
 * has the loss gap). Where mf_flash_attention_bf16_tiles() is 0 (no
 * AVX512_BF16, MEMFIT_ISA=portable, hs > 128, or MEMFIT_ATTN_BF16=0) they
 * are exactly mf_flash_attention_doc_forward / _backward. */
int mf_flash_attention_bf16_tiles(void);
void mf_flash_attention_bf16_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                     int hs, int window, const int32_t *pos);
void mf_flash_attention_bf16_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                      const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                      int window, const int32_t *pos);
/* GPT-2's learned positions for packed documents: out (N,C) += wpe[pos[n]],
 * and its backward dwpe[pos[n]] += dout[n] (rows added in order). */
void mf_pos_embed_add(float *out, const float *wpe, const int32_t *pos, int N, int C);
void mf_pos_embed_backward(float *dwpe, const float *dout, const int32_t *pos, int N, int C);

/* RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm): out = inp * rstd * w,
 * rstd = 1/sqrt(mean(inp^2) + eps), kept (N) for backward. */
void mf_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
/* dinp accumulates (+=); dw accumulates (NULL: not computed). */
void mf_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C);

/* Rotary position embedding as HF applies it (rotate-half: dimension i
 * pairs with i + hs/2). Scaling: MF_ROPE_LLAMA3 is Llama 3.1's
 * frequency-dependent rescaling (rope_scaling rope_type "llama3"). */
typedef enum { MF_ROPE_NONE = 0, MF_ROPE_LLAMA3 = 1 } mf_rope_type;
typedef struct {
    mf_rope_type type;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} mf_rope_scaling;
/* tab (2 * T * hs/2 floats): cos of positions 0..T-1 (T, hs/2), then sin
 * (T, hs/2); angles from inv_freq_i = theta^(-2i/hs) (scaled), computed in
 * double and rounded once. */
void mf_rope_table(float *tab, int T, int hs, double theta, const mf_rope_scaling *sc);
/* Rotates the NH query and NKV key heads of qkv (B*T rows of QKV) in place;
 * row n is at position pos[n] (pos NULL: n % T). inverse != 0 applies the
 * transpose rotation: the backward, on dqkv. Value heads are untouched. */
void mf_rope_apply(float *qkv, const float *tab, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                   int inverse);

/* SwiGLU (Shazeer 2020): out = silu(gate) * up, silu(x) = x * sigmoid(x). */
void mf_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* dgate = dout * up * silu'(gate), dup = dout * silu(gate), overwritten;
 * element-wise, so dgate may alias gate and dup may alias up. */
void mf_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* ---- mixed precision (mixed.c; docs/precision.md) ----------------------
 * dt is MF_DTYPE_BF16 or MF_DTYPE_F16; "16-bit" buffers hold uint16 values
 * of that format. Outputs that feed a GEMM are stored in 16 bits, rounded
 * to nearest-even from the fp32 result; every sum (LayerNorm statistics,
 * GEMM accumulation, bias gradients) is fp32. GEMM outputs are fp32.
 * scratch / scratch_bytes: at least mf_gemm16_scratch_bytes() for every
 * GEMM the call makes (a plan row); too little is a memfit bug (panic). */
void mf_half_from_f32(mf_dtype dt, void *out, const float *in, size_t n);
void mf_f32_from_half(mf_dtype dt, float *out, const void *in, size_t n);
/* mf_encoder_forward with a 16-bit wte (wpe and out fp32). */
void mf_encoder_forward16(float *out, const int32_t *inp, const void *wte, mf_dtype dt,
                          const float *wpe, int B, int T, int C);
/* mf_layernorm_forward with a 16-bit out; mean and rstd bit-identical to it. */
void mf_layernorm_forward16(void *out, mf_dtype dt, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C);
/* mf_gelu_forward with a 16-bit out (not in place). */
void mf_gelu_forward16(void *out, mf_dtype dt, const float *inp, size_t n);
/* C (M,N) fp32 = op(A) @ op(B) [+ bias] [+ C if accumulate]; A, B 16-bit
 * row-major, op(X) = X^T when tX (as mf_gemm_bf16). bf16: oneDNN; fp16:
 * K-blocks widened to fp32 in scratch, then sgemm. */
void mf_gemm16(mf_dtype dt, float *C, const void *A, const void *B, const float *bias, int M, int N, int K,
               int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes);
size_t mf_gemm16_scratch_bytes(mf_dtype dt, int M, int N, int K, int tA, int tB, int accumulate, int bias);
/* As mf_matmul_forward / _backward with 16-bit inp and w. Backward rounds
 * dout into dout16 (N*OC 16-bit) for the two GEMMs; dbias sums the fp32 dout.
 * dout NULL: dout16 holds the rounded gradient already and dbias is done
 * (mf_gelu_backward_bf16_colsum). */
void mf_matmul16_forward(mf_dtype dt, float *out, const void *inp, const void *w, const float *bias, int N, int C,
                         int OC, int accumulate, void *scratch, size_t scratch_bytes);
void mf_matmul16_backward(mf_dtype dt, float *dinp, void *dw, int dw16, float *dbias, const float *dout, void *dout16,
                          const void *inp, const void *w, int N, int C, int OC, void *scratch, size_t scratch_bytes);
/* GELU's backward feeding a bf16 matmul's backward: dout16 (N,OC) =
 * bf16(gelu'(pre) dh), dbias (or NULL) += the column sums of the fp32
 * values; one pass, no fp32 d(pre) stored */
void mf_gelu_backward_bf16_colsum(uint16_t *dout16, float *dbias, const float *pre, const float *dh, int N, int OC);
/* A weight gradient's GEMM: dW (M,N) += op(A) op(B), fp32 accumulation;
 * dW fp32, or with dw16 (dt bf16 only: grad_dtype bf16) a bf16 row, the
 * product added to its widened values and rounded to nearest-even once.
 * dW NULL (a frozen weight): nothing. */
void mf_gemm16_dw(mf_dtype dt, void *dW, int dw16, const void *A, const void *B, int M, int N, int K, int tA, int tB,
                  void *scratch, size_t scratch_bytes);

/* As mf_classifier_forward / _backward with 16-bit x and wte; backward
 * rounds dlogits into dlogits16 (N*Vp 16-bit), or with dlogits NULL takes
 * dlogits16 as already rounded (mf_crossentropy_forward_bf16). */
void mf_classifier16_forward(mf_dtype dt, float *logits, const void *x, const void *wte, int N, int C, int Vp,
                             void *scratch, size_t scratch_bytes);
void mf_classifier16_backward(mf_dtype dt, float *dx, void *dwte, int dw16, const float *dlogits, void *dlogits16,
                              const void *x, const void *wte, int N, int C, int Vp, void *scratch,
                              size_t scratch_bytes);

/* Llama family, 16-bit outputs (llama_kernels.c): mf_rmsnorm_forward with
 * a 16-bit out (rstd bit-identical), mf_swiglu_forward with a 16-bit out
 * (not in place), the token embedding gathered from a 16-bit table into
 * fp32 rows. */
void mf_rmsnorm_forward16(void *out, mf_dtype dt, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps);
void mf_swiglu_forward16(void *out, mf_dtype dt, const float *gate, const float *up, size_t n);
void mf_embed_forward16(float *out, const int32_t *inp, const void *wte, mf_dtype dt, int N, int C);
/* mf_gemm16 writing C with leading dimension ldc (>= N; K > 0): a product
 * into a column range of a wider row (q, k and v into qkv). */
void mf_gemm16_ldc(mf_dtype dt, float *C, int ldc, const void *A, const void *B, const float *bias, int M, int N,
                   int K, int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes);

/* ==== Mixture of experts (moe.c; docs/moe.md) ============================
 * A Mixtral-style sparse MLP block (HF MixtralSparseMoeBlock): a linear
 * router picks k of E SwiGLU experts per token; the token's output is the
 * routing-weighted sum of those experts' outputs. Dropless by default: the
 * N*k token-slots (slot s = n*k + j: token n's j-th choice) are counting-
 * sorted by expert into contiguous groups of "permuted rows", each expert
 * runs its GEMMs over its group, and the results are scattered back. An
 * optional capacity (tokens per expert) drops the overflow slots, in token
 * order: a dropped slot skips the MLP and its weight contributes nothing.
 * Weights in HF nn.Linear layout (out, in): wg (E,C) = gate.weight; expert
 * e's w1 (F,C) gate_proj, w3 (F,C) up_proj, w2 (C,F) down_proj, stored
 * expert after expert: w1, w3 (E,F,C), w2 (E,C,F).
 * Functions that take sizes return -1 (mf_error) for bad ones (E < 1,
 * k < 1, k > E, N, C or F < 1, capacity < 0); nothing is written then.
 * Every buffer is the caller's; mf_moe_buffer_sizes gives their sizes. */
typedef struct {
    int N, C, F;        /* tokens, model width, expert hidden width */
    int E, k;           /* experts, experts per token */
    int norm_topk_prob; /* 1: renormalise the k weights to sum 1 (Mixtral) */
    int capacity;       /* max slots per expert; 0: dropless */
} mf_moe_dims;

/* The router's saved state: written by mf_moe_router_forward, read by
 * every later step and by backward (kept, not recomputed: a recomputed
 * block routes identically). */
typedef struct {
    float *probs;      /* (N,E) softmax of the logits x @ wg^T */
    float *lse;        /* (N) logsumexp of each row of logits */
    int32_t *topk_idx; /* (N,k) chosen experts, by falling prob; ties: lower index */
    float *topk_w;     /* (N,k) routing weights: probs of the chosen (renormalised) */
    float *frac;       /* (E) f_e = slots routed to e / N (before capacity drops) */
} mf_moe_route;

/* The permutation (mf_moe_dispatch) and the activations the experts keep
 * for backward; R = mf_moe_buffer_sizes' rows. */
typedef struct {
    int32_t *offsets;  /* (E+1) expert e's rows are offsets[e] .. offsets[e+1]-1 */
    int32_t *slot_row; /* (N*k) permuted row of each slot; -1: dropped */
    float *xp;         /* (R,C) gathered input rows */
    float *h1, *h3;    /* (R,F) gate and up pre-activations */
    float *ha;         /* (R,F) silu(h1) * h3 */
    float *yp;         /* (R,C) expert outputs, before the routing weight */
} mf_moe_acts;

/* Backward scratch (contents undefined on return). */
typedef struct {
    float *dlogits;    /* (N,E) */
    float *dtopk_w;    /* (N,k) gradient to the routing weights */
    float *dyp;        /* (R,C) gradient to yp, then to xp */
    float *dh1, *dh3;  /* (R,F) */
} mf_moe_work;

/* The buffers above, one plan row each. */
typedef enum {
    MF_MOE_BUF_PROBS, MF_MOE_BUF_LSE, MF_MOE_BUF_TOPK_IDX, MF_MOE_BUF_TOPK_W, MF_MOE_BUF_FRAC,
    MF_MOE_BUF_OFFSETS, MF_MOE_BUF_SLOT_ROW, MF_MOE_BUF_XP, MF_MOE_BUF_H1, MF_MOE_BUF_H3, MF_MOE_BUF_HA,
    MF_MOE_BUF_YP, MF_MOE_BUF_DLOGITS, MF_MOE_BUF_DTOPK_W, MF_MOE_BUF_DYP, MF_MOE_BUF_DH1, MF_MOE_BUF_DH3,
    MF_MOE_BUF_COUNT
} mf_moe_buf;
const char *mf_moe_buf_name(mf_moe_buf b);

/* capacity = ceil(cf * N * k / E) slots per expert (Switch Transformer's
 * expert capacity, counted in slots); cf <= 0: 0 (dropless). -1 for bad
 * sizes or a capacity above INT_MAX. */
int mf_moe_capacity(int N, int k, int E, double cf, int *capacity);
/* Worst-case bytes of each buffer (unaligned; bytes[MF_MOE_BUF_COUNT]) for
 * N tokens and capacity factor cf (<= 0: dropless). rows: permuted rows R =
 * N*k dropless, min(N*k, E*capacity) with a capacity; group_rows: the
 * largest one expert can get, N dropless (a token picks an expert at most
 * once), min(N, capacity) with one. bytes, rows, group_rows may be NULL. */
int mf_moe_buffer_sizes(size_t *bytes, int64_t *rows, int64_t *group_rows, int N, int k, int E, int C, int F,
                        double cf);

/* Router forward: logits = x (N,C) @ wg^T, softmax, top-k, weights (see
 * mf_moe_route). aux (may be NULL) = E * sum_e f_e * P_e, P_e = mean over
 * tokens of probs[:,e] (HF load_balancing_loss_func for one layer); z (may
 * be NULL) = mean over tokens of lse^2 (ST-MoE router z-loss). */
int mf_moe_router_forward(mf_moe_route *r, double *aux, double *z, const float *x, const float *wg,
                          const mf_moe_dims *d);
/* Router backward from w->dtopk_w (the experts' backward fills it) plus
 * aux_scale * d(aux) + z_scale * d(z) (scale: the loss's coefficient times
 * its gradient scale; 0: that loss is off). dx (N,C) and dwg (E,C)
 * accumulate (dwg NULL: frozen). Uses w->dlogits. */
int mf_moe_router_backward(float *dx, float *dwg, mf_moe_work *w, const mf_moe_route *r, const float *x,
                           const float *wg, float aux_scale, float z_scale, const mf_moe_dims *d);

/* Counting sort of the slots by expert (stable: token order within a
 * group) into a->offsets and a->slot_row; with d->capacity > 0 slot s of
 * expert e is dropped when e already has capacity earlier slots. Writes
 * the number of dropped slots to *dropped (may be NULL). An expert index
 * outside 0..E-1 in r->topk_idx is -1 too (offsets/slot_row then undefined). */
int mf_moe_dispatch(mf_moe_acts *a, int *dropped, const mf_moe_route *r, const mf_moe_dims *d);
/* Experts forward (after dispatch): gathers x (N,C) into xp, runs each
 * expert's SwiGLU MLP on its group, y (N,C) = sum over the token's kept
 * slots of topk_w * yp (overwritten; a token whose slots all dropped gets 0). */
int mf_moe_experts_forward(float *y, mf_moe_acts *a, const float *x, const mf_moe_route *r, const float *w1,
                           const float *w3, const float *w2, const mf_moe_dims *d);
/* Experts backward: dx (N,C) accumulates the input gradient through the
 * experts; dw1, dw3, dw2 accumulate (NULL: all three frozen); w->dtopk_w
 * (N,k) gets d(loss)/d(topk_w) (0 for dropped slots) for
 * mf_moe_router_backward, which must run after this. */
int mf_moe_experts_backward(float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, const float *dy,
                            const mf_moe_acts *a, const mf_moe_route *r, const float *w1, const float *w3,
                            const float *w2, const mf_moe_dims *d);
/* Per-expert hooks for the two functions below (all may be NULL):
 *  - weights: expert e's matrices w1 (F,C), w3 (F,C), w2 (C,F) in fp32,
 *    replacing the stacks' slices (a quantised base dequantises one expert
 *    at a time into one tile). With it the experts run one after another
 *    (the tile is shared), each GEMM parallel inside.
 *  - lora_fwd: after projection p's base GEMM (0 w1, 1 w3, 2 w2) on expert
 *    e's m rows starting at permuted row r0: out (m,out) += adapter(in (m,in)).
 *  - lora_bwd: after the base input gradient of projection p is written
 *    into din (m,in): the adapter's parameter gradients from dout (m,out)
 *    and in, and din += its input gradient.
 *  - grads, grads_done (backward only; both or neither): expert e's weight
 *    gradients go to the rows grads gives (w1, w3 (F,C), w2 (C,F), zeroed
 *    by it; they accumulate there) instead of the stacks' slices of
 *    dw1/dw3/dw2, and grads_done(e) runs once they are complete and the
 *    expert's weights are read for the last time (it may update them), so
 *    one expert's rows serve every expert (update_in_backward). Called for
 *    every expert, one whose group is empty too (its gradient is zero).
 *    With them the experts run one after another, each GEMM parallel inside.
 * The LoRA hooks may run on several threads at once, for different e. */
typedef struct {
    void *ctx;
    void (*weights)(void *ctx, int e, const float **w1, const float **w3, const float **w2);
    void (*lora_fwd)(void *ctx, int e, int p, const float *in, float *out, int m, int r0);
    void (*lora_bwd)(void *ctx, int e, int p, const float *dout, const float *in, float *din, int m, int r0);
    void (*grads)(void *ctx, int e, float **dw1, float **dw3, float **dw2);
    void (*grads_done)(void *ctx, int e);
} mf_moe_expert_ops;
/* mf_moe_experts_forward / _backward with per-expert hooks (ops may be
 * NULL: exactly the functions above). */
int mf_moe_experts_forward_ops(float *y, mf_moe_acts *a, const float *x, const mf_moe_route *r, const float *w1,
                               const float *w3, const float *w2, const mf_moe_dims *d, const mf_moe_expert_ops *ops);
int mf_moe_experts_backward_ops(float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, const float *dy,
                                const mf_moe_acts *a, const mf_moe_route *r, const float *w1, const float *w3,
                                const float *w2, const mf_moe_dims *d, const mf_moe_expert_ops *ops);
/* Expert parallel (docs/moe.md): mf_moe_dispatch where the capacity
 * counts, per expert e, before[e] slots that earlier ranks of the group
 * routed to e first (their tokens come first in the global order): slot s
 * of expert e is kept while before[e] + its place among this rank's slots
 * to e < capacity. before NULL: mf_moe_dispatch. */
int mf_moe_dispatch_after(mf_moe_acts *a, int *dropped, const mf_moe_route *r, const mf_moe_dims *d,
                          const int32_t *before);
/* The gather and the weighted scatter of mf_moe_experts_forward on their
 * own, for a caller whose experts run elsewhere: xp[row of slot] = x[n];
 * y[n] = sum over kept slots of topk_w * yp[row] (overwritten). Their
 * backward: dyp[row] = topk_w * dy[n] and dtopk_w = dy[n] . yp[row] (0 for
 * a dropped slot); dx[n] += sum over kept slots of dxp[row]. */
void mf_moe_gather(float *xp, const float *x, const int32_t *slot_row, int N, int k, int C);
void mf_moe_combine(float *y, const float *yp, const int32_t *slot_row, const float *topk_w, int N, int k, int C);
void mf_moe_combine_backward(float *dyp, float *dtopk_w, const float *dy, const float *yp, const int32_t *slot_row,
                             const float *topk_w, int N, int k, int C);
void mf_moe_gather_backward(float *dx, const float *dxp, const int32_t *slot_row, int N, int k, int C);
/* 16-bit experts (precision bf16/fp16, dt): x is the 16-bit (N,C) input,
 * w1/w3/w2 the stacks' 16-bit compute copies, and a->xp, a->ha hold 16-bit
 * values ((R,C), (R,F) of dt); h1, h3, yp, y and the gradients are fp32
 * (dw1/dw3/dw2 accumulate; NULL: frozen). d16: at least G*max(C, 2F)
 * 16-bit elements (G: one expert's largest group), the rounded output
 * gradients; scratch: mf_gemm16_scratch_bytes for the experts' GEMMs.
 * The experts run one after another; no weight or LoRA hooks (no LoRA, no
 * quantised base). _ops: with the grads/grads_done hooks of
 * mf_moe_expert_ops (ops may be NULL: mf_moe_experts_backward16). */
int mf_moe_experts_forward16(mf_dtype dt, float *y, mf_moe_acts *a, const void *x, const mf_moe_route *r,
                             const void *w1, const void *w3, const void *w2, const mf_moe_dims *d, void *scratch,
                             size_t scratch_bytes);
int mf_moe_experts_backward16(mf_dtype dt, float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w, void *d16,
                              const float *dy, const mf_moe_acts *a, const mf_moe_route *r, const void *w1,
                              const void *w3, const void *w2, const mf_moe_dims *d, void *scratch,
                              size_t scratch_bytes);
int mf_moe_experts_backward16_ops(mf_dtype dt, float *dx, float *dw1, float *dw3, float *dw2, mf_moe_work *w,
                                  void *d16, const float *dy, const mf_moe_acts *a, const mf_moe_route *r,
                                  const void *w1, const void *w3, const void *w2, const mf_moe_dims *d,
                                  void *scratch, size_t scratch_bytes, const mf_moe_expert_ops *ops);
/* ==== end of mixture of experts ========================================== */

#ifdef __cplusplus
}
#endif
#endif
