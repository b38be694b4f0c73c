/* memfit quant: storage formats for a frozen (never trained) base weight,
 * and the linear layer that multiplies by such a weight without ever
 * dequantising the whole matrix.
 *
 * Owns nothing: every buffer (the packed weight, the GEMM scratch) is the
 * caller's, from the arena. Promises: no allocation; mf_quant_bytes() is the
 * exact size of a packed tensor and mf_quant_matmul_scratch_bytes() the exact
 * scratch the GEMMs touch (both are plan rows); unpacking any range [lo,
 * lo+n) gives the same values as unpacking the whole tensor, on any thread
 * count; packing is deterministic (no randomness, thread count free).
 *
 * Formats, byte by byte. n values, flat in memory order; blocks run along
 * the flat array (for a Conv1D weight (K,N) row-major: row by row). All
 * multi-byte fields little-endian (the host's; memfit runs on x86-64/arm64).
 * The packed buffer must be 4-byte aligned (arena rows are 64-byte aligned).
 *
 *  MF_QUANT_F32  (0, "fp32": no quantisation) 4*n bytes, the floats as is.
 *
 *  MF_QUANT_BF16 2*n bytes: bf16 of each value, round to nearest even
 *    (kernels/half.h). Dequantisation is exact.
 *
 *  MF_QUANT_INT8 block-wise absmax int8, blocks of 64 values (the last may
 *    be short: len = min(64, n - 64*b)). nb = ceil(n/64). Block b starts at
 *    byte 68*b:
 *      +0  float absmax       max |x| over the block
 *      +4  int8  q[len]       round(x * (127 / absmax)), ties away
 *                             from 0;
 *                             0 for an all-zero block
 *    value = q * (absmax / 127). Bytes: n + 4*nb (8.5 bits per value).
 *
 *  MF_QUANT_NF4  NormalFloat4 with double quantisation, as QLoRA (Dettmers
 *    et al. 2023, arXiv:2305.14314, sec. 3 and appendix E) and bitsandbytes
 *    (quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True)):
 *    blocks of 64 values, each with an absmax; the nb = ceil(n/64) absmax
 *    constants double-quantised in groups of 256 constants (16384 values).
 *      [0, 4)  float offset    mean of all nb absmax (each group's sum
 *                              rounded to float, added in group order in
 *                              double, divided by nb, rounded to float)
 *    then group g (nb2 = ceil(nb/256) of them) at byte 4 + 8452*g:
 *      +0  float absmax2       max |absmax - offset| over the group's blocks
 *    then the group's block j (global block b = 256*g + j) at +4 + 33*j:
 *      +0  uint8 qabs          index into bitsandbytes' signed dynamic 8-bit
 *                              map (mf_q8_map_dynamic) nearest to
 *                              (absmax - offset) / absmax2
 *      +1  uint8 codes[ceil(len/2)]  4-bit NF4 indices, two per byte: value
 *                              2i of the block in the high nibble, 2i+1 in the
 *                              low one (bitsandbytes' order); an odd last
 *                              block leaves its last low nibble 0
 *    The code of x is the index of the NF4 value nearest to x / absmax with
 *    the block's exact fp32 absmax (ties to the lower index), as bitsandbytes
 *    does; dequantised absmax' = map[qabs] * absmax2 + offset; value =
 *    NF4[code] * absmax'. Bytes: 4 + 4*nb2 + nb + ceil(n/2), i.e.
 *    4 + 8/64 + 32/(64*256) = 4.1270 bits per value plus the 4-byte offset.
 *    (bitsandbytes keeps the same numbers in separate tensors; memfit
 *    interleaves them per block so any range unpacks without knowing n.)
 *
 * NaN or inf inputs are not supported by INT8 / NF4 (a frozen base is
 * finite); BF16 keeps them.
 */
#ifndef MEMFIT_QUANT_H
#define MEMFIT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MF_QUANT_F32 = 0, MF_QUANT_BF16 = 1, MF_QUANT_INT8, MF_QUANT_NF4 } mf_quant_kind; /* fp32 = no quantisation */

#define MF_QUANT_INT8_BLOCK 64   /* values per int8 absmax block */
#define MF_QUANT_NF4_BLOCK 64    /* values per NF4 absmax block */
#define MF_QUANT_NF4_BLOCK2 256  /* absmax constants per double-quantisation block */
#define MF_QUANT_TILE_ROWS 256   /* weight rows dequantised at a time by the GEMMs */

/* "fp32" -> 0, "bf16"/"int8"/"nf4" -> kind; -1 + mf_error message otherwise. */
int mf_quant_parse(const char *s, int *kind);
/* "fp32", "bf16", "int8", "nf4" ("?" for anything else). */
const char *mf_quant_name(mf_quant_kind k);
/* The 16 NF4 values, ascending, NF4[7] = 0 (bitsandbytes csrc/kernels.cu). */
extern const float mf_quant_nf4_table[16];

/* Exact storage bytes for n values (codes + all constants), for the plan. */
size_t mf_quant_bytes(mf_quant_kind k, int64_t n);
/* Quantise n floats (flat, memory order; blocks run along it). dst has
 * mf_quant_bytes(k, n) bytes. */
void mf_quant_pack(mf_quant_kind k, void *dst, const float *src, int64_t n);
/* Packing in parts, for a base read from disk a chunk at a time so that
 * its fp32 copy is never resident whole: the parts, taken in order, must
 * start on multiples of MF_QUANT_PART_ALIGN values (one NF4 group of
 * constants), all but the last be multiples of it too, and together cover
 * the tensor; the bytes are then identical to mf_quant_pack of the whole.
 * NF4 needs the mean of all block absmax first, so it takes two passes:
 *   mf_quant_nf4_stats st = {0};
 *   for each part in order: mf_quant_nf4_stats_add(&st, part, len);
 *   float off = mf_quant_nf4_offset(&st);
 *   for each part: mf_quant_pack_part(MF_QUANT_NF4, dst, part, lo, len, off);
 * (other kinds: one pass, nf4_offset ignored). dst is the whole tensor's
 * packed buffer; src points at value lo. A misaligned part is a bug and
 * panics. */
#define MF_QUANT_PART_ALIGN (MF_QUANT_NF4_BLOCK * MF_QUANT_NF4_BLOCK2) /* 16384 values */
typedef struct {
    double sum;     /* group absmax sums so far, in group order */
    int64_t blocks; /* blocks seen */
    int64_t values; /* values seen: the next part starts here */
} mf_quant_nf4_stats;
void mf_quant_nf4_stats_add(mf_quant_nf4_stats *st, const float *src, int64_t n);
float mf_quant_nf4_offset(const mf_quant_nf4_stats *st);
void mf_quant_pack_part(mf_quant_kind k, void *dst, const float *src, int64_t lo, int64_t n, float nf4_offset);

/* Packs n values that fill(ctx, buf, lo, len) writes into buf for [lo,
 * lo+len), a part of at most MF_QUANT_STREAM_PART values at a time through
 * one heap buffer of that size (4 MiB), so no fp32 copy of the tensor is
 * ever whole. fill is called for the parts in order from lo = 0, once for
 * most kinds, twice over for NF4 (its offset needs every block first): it
 * must give the same values each time. Bytes as mf_quant_pack of the
 * whole. -1 (message) if the buffer cannot be had. */
#define MF_QUANT_STREAM_PART ((int64_t)64 * MF_QUANT_PART_ALIGN)
typedef void (*mf_quant_fill_fn)(void *ctx, float *buf, int64_t lo, int64_t len);
int mf_quant_pack_stream(mf_quant_kind k, void *dst, int64_t n, mf_quant_fill_fn fill, void *ctx);

/* dst[0..n) = the dequantised values [lo, lo+n) of a tensor packed by
 * mf_quant_pack (lo + n <= the packed count; any lo, n). OpenMP-parallel for
 * large n. */
void mf_quant_unpack(mf_quant_kind k, float *dst, const void *src, int64_t lo, int64_t n);

/* Frozen-base linear layer, weight W stored quantised in Hugging Face Conv1D
 * layout (K rows = in, N cols = out, row-major):
 *   out(M,N) = inp(M,K) @ W (+ bias when non-NULL)   (overwrites out)
 *   dinp(M,K) += dout(M,N) @ W^T                      (accumulates)
 * No dW (the base is frozen). W is dequantised a tile at a time into scratch
 * (never the whole matrix) and each tile goes through OpenBLAS sgemm. The
 * call is one OpenMP region: forward splits out's columns between the
 * threads (each dequantises MF_QUANT_TILE_ROWS rows of its column strip,
 * then sgemm), backward splits dinp's columns (W's rows; each thread
 * dequantises MF_QUANT_TILE_ROWS / threads full rows at a time). Results do
 * not depend on the thread count beyond fp32 summation order. For
 * MF_QUANT_F32, wq is the plain float matrix and no scratch is used.
 * scratch: mf_quant_matmul_scratch_bytes(k, M, K, N) bytes =
 * min(K, MF_QUANT_TILE_ROWS) * N * 4 (0 for fp32), 4-byte aligned (64 for
 * speed), for any thread count; the functions touch nothing past it. */
size_t mf_quant_matmul_scratch_bytes(mf_quant_kind k, int M, int K, int N);
void mf_quant_matmul_forward(float *out, const float *inp, const void *wq, const float *bias, int M, int K, int N,
                             mf_quant_kind k, void *scratch);
void mf_quant_matmul_backward_input(float *dinp, const float *dout, const void *wq, int M, int K, int N,
                                    mf_quant_kind k, void *scratch);

/* The same for an nn.Linear weight (the Llama family's layout): W (N,K)
 * stored quantised, row n holding output n's K weights.
 *   out (M rows of ldo; columns 0..N-1) = beta * out + inp (M,K) @ W^T + bias
 *   dinp (M,K) += dout (M rows of ldd; N columns) @ W          (accumulates)
 * beta is 0 (overwrite) or 1 (accumulate: a residual already in out); ldo
 * and ldd >= N (q, k and v write column ranges of one wider row). W is
 * dequantised a tile of rows (forward) or a tile of row pieces (backward)
 * at a time into scratch, never whole; one OpenMP region per call; results
 * do not depend on the thread count beyond fp32 summation order. Forward
 * splits out's columns (W's rows) between the threads, each dequantising
 * MF_QUANT_TILE_ROWS / threads full rows of W at a time; backward splits
 * dinp's columns (W's columns), each thread dequantising the pieces of
 * MF_QUANT_TILE_ROWS rows that fall in its columns. Columns of out and dout
 * past N are neither written nor read. beta = 0 never reads out (it may hold
 * NaN). For MF_QUANT_F32, wq is the plain float matrix and no scratch is
 * used. scratch: mf_quant_linear_scratch_bytes(k, M, K, N) bytes =
 * min(N, MF_QUANT_TILE_ROWS) * K * 4 (0 for fp32), 4-byte aligned (64 for
 * speed), for any thread count; the functions touch nothing past it. */
size_t mf_quant_linear_scratch_bytes(mf_quant_kind k, int M, int K, int N);
void mf_quant_linear_forward(float *out, int ldo, const float *inp, const void *wq, const float *bias, int M, int K,
                             int N, float beta, mf_quant_kind k, void *scratch);
void mf_quant_linear_backward_input(float *dinp, const float *dout, int ldd, const void *wq, int M, int K, int N,
                                    mf_quant_kind k, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
