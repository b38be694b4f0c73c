/* FlashAttention forward and backward with AVX-512 tile products, for the
 * avx512 kernel table (isa.h). Same contract, masks and task split as
 * flash_attention.c (grouped-query heads, sliding window, packed documents);
 * only the tile arithmetic differs, so results agree with the portable path
 * to float round-off (tests/test_kernels_isa_agree.c), not bit for bit.
 *
 * Why not cblas_sgemm on the tiles, as the portable path does: a 64 x 64 x 64
 * tile product is too small for OpenBLAS's packing and call overhead (about
 * half of the FMA rate on Zen 5), and the row-wise softmax between the
 * products ran at SSE width with strided rescales of the output rows.
 *
 * Layout: a query tile is held transposed, Qt (hs x 64), so that the score
 * tile comes out transposed too, St = K_j Qt (key rows x query columns).
 * Every tile product is then one kernel, C (n x k) = alpha * A B with A read
 * by scalar broadcasts (any strides) and B's rows contiguous, and the softmax
 * runs across the key rows with 16 queries per vector: the running max, the
 * exponentials and the row sums are element-wise vector operations with no
 * horizontal reductions, and the causal/window/document mask is a lane mask.
 * The output tile accumulates on the stack and is rescaled inside the P V
 * product's store, then written once.
 *
 * Backward: one task per (b, kv head), its query heads one after another as
 * in flash_attention.c; inside a head, query tiles outer (Qt and dO^T
 * transposed once per tile) and key tiles inner. dQ, dK and dV accumulate in
 * dqkv in a fixed order: deterministic and independent of the thread count.
 *
 * Stack per task: the score tiles (2 x 16 KiB) and the transposed tiles
 * (2 x hs x 64 floats, hs <= MF_FA512_MAX_HS); the backward's scratch is
 * flash_attention.c's (only its D part is used here).
 *
 * bf16 tiles (mf_flash_*_avx512bf16, CPUs with AVX512_BF16): the same loops,
 * with every tile product's operands rounded to bf16 (nearest even) and
 * multiplied by vdpbf16ps, which sums two products per fp32 lane: twice the
 * multiply-adds per instruction. The softmax, the running max and sums, the
 * rescales, D = rowsum(dO O), the log-sum-exps and every accumulation stay
 * fp32, as in FlashAttention-2's bf16 kernels. Each product packs its
 * operands as pairs along the reduction (two bf16 in one 32-bit lane); an
 * operand used by every key tile of a query tile (Qt, dO^T, dO, Q) is
 * packed once per query tile. Used by the 16-bit training path
 * (blocks.c); docs/precision.md has its loss gap.
 */
#if defined(__x86_64__) && defined(MEMFIT_AVX512_TU)
#include "isa.h"
#include "memfit/kernels.h"

#include <float.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

enum { BQ = 64, BK = 64, NG = BQ / 16 };

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* mf_vexpf (vmath.h), 16 lanes: the same clamp, Cody-Waite split and
 * polynomial; NaN in, NaN out */
static inline __m512 vexp(__m512 x0) {
    const __m512 x = _mm512_min_ps(_mm512_max_ps(x0, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.0f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 k = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
    const __m512i eb = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                         _mm512_set1_epi32(127)), 23);
    const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(eb));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q), x0);
}

/* ---- the one tile product -------------------------------------------------
 * C (n x k, ldc) = alpha * sum_j A(i, j) B[j][0:k]  (j < m), where A(i, j) is
 * A[i*sai + j*saj] and B's rows are contiguous (ldb). mode 0 stores, 1 adds
 * to C, 2 stores rs[i] * C + alpha * (...) (the online softmax's rescale). */
enum { ST = 0, ACC = 1, RESCALE = 2 };

/* Four vectors of C's row r: named accumulators, so gcc keeps all of them
 * in registers (an array of __m512 was spilled to the stack every step). */
#define MM_FMA(r)                                                                      \
    do {                                                                               \
        const __m512 a_ = _mm512_set1_ps(A[(size_t)(r) * sai + (size_t)j * saj]);      \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                                    \
        c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);                                    \
        c##r##2 = _mm512_fmadd_ps(a_, b2, c##r##2);                                    \
        c##r##3 = _mm512_fmadd_ps(a_, b3, c##r##3);                                    \
    } while (0)
#define MM_STORE1(r, v)                                                                          \
    do {                                                                                         \
        float *c_ = C + (size_t)(r) * ldc + 16 * (v);                                            \
        __m512 x_ = _mm512_mul_ps(c##r##v, al);                                                  \
        if (mode == ACC) x_ = _mm512_add_ps(x_, _mm512_maskz_loadu_ps(mk[v], c_));                \
        else if (mode == RESCALE)                                                                \
            x_ = _mm512_fmadd_ps(_mm512_set1_ps(rs[r]), _mm512_maskz_loadu_ps(mk[v], c_), x_);   \
        _mm512_mask_storeu_ps(c_, mk[v], x_);                                                    \
    } while (0)
#define MM_STORE(r) do { MM_STORE1(r, 0); MM_STORE1(r, 1); MM_STORE1(r, 2); MM_STORE1(r, 3); } while (0)
#define MM_ZERO(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0

/* rows r .. r+5 of C, 64 columns: 24 accumulators + 4 B vectors + the
 * broadcast fit AVX-512's 32 registers and load B once per 6 rows */
static inline void mm_block6(float *C, int ldc, const float *A, int sai, int saj, const float *B, int ldb, int m,
                             float alpha, int mode, const float *rs, const __mmask16 *mk) {
    MM_ZERO(0); MM_ZERO(1); MM_ZERO(2); MM_ZERO(3); MM_ZERO(4); MM_ZERO(5);
    for (int j = 0; j < m; j++) {
        const float *bj = B + (size_t)j * ldb;
        const __m512 b0 = _mm512_maskz_loadu_ps(mk[0], bj), b1 = _mm512_maskz_loadu_ps(mk[1], bj + 16);
        const __m512 b2 = _mm512_maskz_loadu_ps(mk[2], bj + 32), b3 = _mm512_maskz_loadu_ps(mk[3], bj + 48);
        MM_FMA(0); MM_FMA(1); MM_FMA(2); MM_FMA(3); MM_FMA(4); MM_FMA(5);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0); MM_STORE(1); MM_STORE(2); MM_STORE(3); MM_STORE(4); MM_STORE(5);
}

/* rows r .. r+3 of C, 64 columns (mk: which of the four vectors' lanes) */
static inline void mm_block4(float *C, int ldc, const float *A, int sai, int saj, const float *B, int ldb, int m,
                             float alpha, int mode, const float *rs, const __mmask16 *mk) {
    MM_ZERO(0); MM_ZERO(1); MM_ZERO(2); MM_ZERO(3);
    for (int j = 0; j < m; j++) {
        const float *bj = B + (size_t)j * ldb;
        const __m512 b0 = _mm512_maskz_loadu_ps(mk[0], bj), b1 = _mm512_maskz_loadu_ps(mk[1], bj + 16);
        const __m512 b2 = _mm512_maskz_loadu_ps(mk[2], bj + 32), b3 = _mm512_maskz_loadu_ps(mk[3], bj + 48);
        MM_FMA(0); MM_FMA(1); MM_FMA(2); MM_FMA(3);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0); MM_STORE(1); MM_STORE(2); MM_STORE(3);
}

/* one row of C, 64 columns */
static inline void mm_block1(float *C, int ldc, const float *A, int sai, int saj, const float *B, int ldb, int m,
                             float alpha, int mode, const float *rs, const __mmask16 *mk) {
    (void)ldc;
    MM_ZERO(0);
    for (int j = 0; j < m; j++) {
        const float *bj = B + (size_t)j * ldb;
        const __m512 b0 = _mm512_maskz_loadu_ps(mk[0], bj), b1 = _mm512_maskz_loadu_ps(mk[1], bj + 16);
        const __m512 b2 = _mm512_maskz_loadu_ps(mk[2], bj + 32), b3 = _mm512_maskz_loadu_ps(mk[3], bj + 48);
        MM_FMA(0);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0);
}

static void mm(float *C, int ldc, const float *A, int sai, int saj, const float *B, int ldb, int n, int m, int k,
               float alpha, int mode, const float *rs) {
    for (int c0 = 0; c0 < k; c0 += 64) {
        const int kc = imin(64, k - c0);
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) {
            const int w = imax(0, imin(16, kc - 16 * v));
            mk[v] = (__mmask16)((1u << w) - 1u);
        }
        int i = 0;
        for (; i + 6 <= n; i += 6)
            mm_block6(C + (size_t)i * ldc + c0, ldc, A + (size_t)i * sai, sai, saj, B + c0, ldb, m, alpha, mode,
                      rs ? rs + i : NULL, mk);
        for (; i + 4 <= n; i += 4)
            mm_block4(C + (size_t)i * ldc + c0, ldc, A + (size_t)i * sai, sai, saj, B + c0, ldb, m, alpha, mode,
                      rs ? rs + i : NULL, mk);
        for (; i < n; i++)
            mm_block1(C + (size_t)i * ldc + c0, ldc, A + (size_t)i * sai, sai, saj, B + c0, ldb, m, alpha, mode,
                      rs ? rs + i : NULL, mk);
    }
}

/* ---- bf16 tile products (AVX512_BF16) ------------------------------------
 * Pairs: lane c of a packed row holds (x_2p[c], x_2p+1[c]) as two bf16, the
 * even reduction index in the low half; past an odd m the high half is 0.
 * These functions carry their own target so the rest of the file needs no
 * AVX512_BF16 (the table runs on AVX-512 CPUs without it). */
#define BF16_FN __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))
enum { MAXP = (MF_FA512_MAX_HS > BK ? MF_FA512_MAX_HS : BK) / 2 }; /* pairs along a reduction */

static inline __mmask16 lanes(int w) { return (__mmask16)(w >= 16 ? 0xFFFFu : w <= 0 ? 0u : (1u << w) - 1u); }

/* 16 lanes of pairs from rows x and y (y NULL: zero high halves) */
BF16_FN static inline __m512i pair16(const float *x, const float *y, __mmask16 k) {
    __m512i v = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x)));
    if (y) {
        const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, y)));
        v = _mm512_or_si512(v, _mm512_slli_epi32(h, 16));
    }
    return v;
}

/* dst[c] = pair(x[c], y[c]) for c < cnt, 0 for cnt <= c < pad (pad: a
 * multiple of 16) */
BF16_FN static void pack_pairs(uint32_t *dst, const float *x, const float *y, int cnt, int pad) {
    for (int c = 0; c < pad; c += 16) _mm512_storeu_si512(dst + c, pair16(x + c, y ? y + c : NULL, lanes(cnt - c)));
}

/* B2 (m2 x ldb2 pairs) from B's first m rows (k floats each, row stride
 * ldb); ldb2 = k rounded up to 64, the padding 0 */
BF16_FN static void pack_b(uint32_t *B2, const float *B, int ldb, int m, int k) {
    const int ldb2 = (k + 63) / 64 * 64;
    for (int p = 0; 2 * p < m; p++)
        pack_pairs(B2 + (size_t)p * ldb2, B + (size_t)2 * p * ldb, 2 * p + 1 < m ? B + (size_t)(2 * p + 1) * ldb : NULL,
                   k, ldb2);
}

#define MM16_FMA(r)                                                                          \
    do {                                                                                     \
        const __m512bh a_ = (__m512bh)_mm512_set1_epi32((int)A2[(size_t)(r) * s2i + (size_t)p * s2p]); \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, a_, b0);                                         \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, a_, b1);                                         \
        c##r##2 = _mm512_dpbf16_ps(c##r##2, a_, b2);                                         \
        c##r##3 = _mm512_dpbf16_ps(c##r##3, a_, b3);                                         \
    } while (0)
#define MM16_LOADB                                                                           \
    const uint32_t *bp = B2 + (size_t)p * ldb2;                                              \
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16); \
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(bp + 32), b3 = (__m512bh)_mm512_loadu_si512(bp + 48)

/* rows r .. r+5 (then r .. r+3, then one row) of C, 64 columns, from m2
 * pairs: A2's pair (i, p) at A2[i*s2i + p*s2p], B2's 64 columns (padded) */
BF16_FN static inline void mm16_block6(float *C, int ldc, const uint32_t *A2, int s2i, int s2p, const uint32_t *B2,
                                       int ldb2, int m2, float alpha, int mode, const float *rs, const __mmask16 *mk) {
    MM_ZERO(0); MM_ZERO(1); MM_ZERO(2); MM_ZERO(3); MM_ZERO(4); MM_ZERO(5);
    for (int p = 0; p < m2; p++) {
        MM16_LOADB;
        MM16_FMA(0); MM16_FMA(1); MM16_FMA(2); MM16_FMA(3); MM16_FMA(4); MM16_FMA(5);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0); MM_STORE(1); MM_STORE(2); MM_STORE(3); MM_STORE(4); MM_STORE(5);
}

BF16_FN static inline void mm16_block4(float *C, int ldc, const uint32_t *A2, int s2i, int s2p, const uint32_t *B2,
                                       int ldb2, int m2, float alpha, int mode, const float *rs, const __mmask16 *mk) {
    MM_ZERO(0); MM_ZERO(1); MM_ZERO(2); MM_ZERO(3);
    for (int p = 0; p < m2; p++) {
        MM16_LOADB;
        MM16_FMA(0); MM16_FMA(1); MM16_FMA(2); MM16_FMA(3);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0); MM_STORE(1); MM_STORE(2); MM_STORE(3);
}

BF16_FN static inline void mm16_block1(float *C, int ldc, const uint32_t *A2, int s2i, int s2p, const uint32_t *B2,
                                       int ldb2, int m2, float alpha, int mode, const float *rs, const __mmask16 *mk) {
    (void)ldc;
    MM_ZERO(0);
    for (int p = 0; p < m2; p++) {
        MM16_LOADB;
        MM16_FMA(0);
    }
    const __m512 al = _mm512_set1_ps(alpha);
    MM_STORE(0);
}

/* mm's product with bf16 operands: C (n x k) = alpha * A B (+ mode), n <=
 * 64, m <= 2 MAXP, B already packed by pack_b (m rows, k columns). A is
 * packed here: rows contiguous along the reduction (saj == 1) become bf16
 * rows, whose neighbours are already pairs; a transposed A (sai == 1) pairs
 * its reduction rows lane by lane, as pack_b does. */
BF16_FN static void mm16(float *C, int ldc, const float *A, int sai, int saj, const uint32_t *B2, int n, int m, int k,
                         float alpha, int mode, const float *rs) {
    _Alignas(64) uint32_t A2[BQ * MAXP];
    const int m2 = (m + 1) / 2, ldb2 = (k + 63) / 64 * 64;
    int s2i, s2p;
    if (saj == 1) {
        s2i = m2, s2p = 1;
        for (int i = 0; i < n; i++) {
            uint16_t *d = (uint16_t *)(A2 + (size_t)i * m2);
            const float *x = A + (size_t)i * sai;
            for (int j = 0; j < 2 * m2; j += 16) /* bf16 of x[j..], and 0 at m when m is odd */
                _mm256_mask_storeu_epi16(d + j, lanes(2 * m2 - j),
                                         (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes(m - j), x + j)));
        }
    } else {
        const int npad = (n + 15) / 16 * 16;
        s2i = 1, s2p = npad;
        for (int p = 0; p < m2; p++)
            pack_pairs(A2 + (size_t)p * npad, A + (size_t)2 * p * saj,
                       2 * p + 1 < m ? A + (size_t)(2 * p + 1) * saj : NULL, n, npad);
    }
    for (int c0 = 0; c0 < k; c0 += 64) {
        const int kc = imin(64, k - c0);
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) mk[v] = lanes(kc - 16 * v);
        int i = 0;
        for (; i + 6 <= n; i += 6)
            mm16_block6(C + (size_t)i * ldc + c0, ldc, A2 + (size_t)i * s2i, s2i, s2p, B2 + c0, ldb2, m2, alpha,
                        mode, rs ? rs + i : NULL, mk);
        for (; i + 4 <= n; i += 4)
            mm16_block4(C + (size_t)i * ldc + c0, ldc, A2 + (size_t)i * s2i, s2i, s2p, B2 + c0, ldb2, m2, alpha,
                        mode, rs ? rs + i : NULL, mk);
        for (; i < n; i++)
            mm16_block1(C + (size_t)i * ldc + c0, ldc, A2 + (size_t)i * s2i, s2i, s2p, B2 + c0, ldb2, m2, alpha,
                        mode, rs ? rs + i : NULL, mk);
    }
}

/* one tile product in the task's precision: fp32 (B as given) or bf16
 * (B2 packed by pack_b from the same B) */
static void tile_mm(int b16, float *C, int ldc, const float *A, int sai, int saj, const float *B, int ldb,
                    const uint32_t *B2, int n, int m, int k, float alpha, int mode, const float *rs) {
    if (b16) mm16(C, ldc, A, sai, saj, B2, n, m, k, alpha, mode, rs);
    else mm(C, ldc, A, sai, saj, B, ldb, n, m, k, alpha, mode, rs);
}

/* Xt (hs x BQ) = rows i0.. of X (nq x hs, ld) transposed, zero past nq. */
static void transpose_tile(float *Xt, const float *X, int ld, int nq, int hs) {
    for (int e = 0; e < hs; e++) {
        float *t = Xt + (size_t)e * BQ;
        int i = 0;
        for (; i < nq; i++) t[i] = X[(size_t)i * ld + e];
        for (; i < BQ; i++) t[i] = 0.0f;
    }
}

/* First visible key of each query row of the tile (INT_MAX past nq: that
 * lane never sees anything): the window's and the document's bounds. */
static void row_bounds(int *lb, int i0, int nq, int window, const int32_t *pos) {
    for (int i = 0; i < BQ; i++) {
        if (i >= nq) { lb[i] = INT_MAX; continue; }
        const int ia = i0 + i;
        int lo = window > 0 ? ia - window + 1 : 0;
        if (pos) lo = imax(lo, ia - pos[ia]);
        lb[i] = imax(lo, 0);
    }
}

/* lanes of query group g that see key ja: lb <= ja <= i */
static inline __mmask16 vis_mask(int ja, __m512i iv, __m512i lbv) {
    const __m512i jv = _mm512_set1_epi32(ja);
    return _mm512_cmp_epi32_mask(jv, iv, _MM_CMPINT_LE) & _mm512_cmp_epi32_mask(lbv, jv, _MM_CMPINT_LE);
}

static inline __m512i lane_index(int base) {
    return _mm512_add_epi32(_mm512_set1_epi32(base),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* ---- forward ------------------------------------------------------------- */

/* gcc 12 cannot see that transpose_tile writes the hs rows pack_b then
 * reads (Qt, dOt); it warns, wrongly, that they may be uninitialised */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

static void fwd_task(int b16, float *out, float *lse, const float *qkv, int b, int h, int qt, int T, int NH,
                     int NKV, int hs, int window, const int32_t *pos) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, kvh = h / (NH / NKV);
    const float scale = 1.0f / sqrtf((float)hs);
    const int i0 = qt * BQ, nq = imin(BQ, T - i0);
    const float *base = qkv + (size_t)b * T * QKV;
    const float *kbase = base + (size_t)(NH + kvh) * hs, *vbase = base + (size_t)(NH + NKV + kvh) * hs;
    const int32_t *P = pos ? pos + (size_t)b * T : NULL;

    _Alignas(64) float Qt[MF_FA512_MAX_HS * BQ], O[BQ * MF_FA512_MAX_HS], St[BK * BQ];
    float m[BQ], l[BQ], a[BQ];
    _Alignas(64) uint32_t Qt2[MAXP * BQ], V2[BK / 2 * MF_FA512_MAX_HS]; /* packed pairs */
    int lb[BQ];
    transpose_tile(Qt, base + (size_t)i0 * QKV + (size_t)h * hs, QKV, nq, hs);
    if (b16) pack_b(Qt2, Qt, BQ, hs, BQ);
    row_bounds(lb, i0, nq, window, P);
    for (int i = 0; i < BQ; i++) {
        m[i] = -FLT_MAX; /* not -inf: exp(m - m) stays 1 for a row with nothing visible yet */
        l[i] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)nq * hs);
    const int jend = i0 + nq;
    const int jbeg = lb[0] / BK * BK; /* rows' bounds do not decrease: row 0 has the smallest */
    for (int j0 = jbeg; j0 < jend; j0 += BK) {
        const int nk = imin(BK, jend - j0);
        const float *k = kbase + (size_t)j0 * QKV, *v = vbase + (size_t)j0 * QKV;
        tile_mm(b16, St, BQ, k, QKV, 1, Qt, BQ, Qt2, nk, hs, BQ, scale, ST, NULL);
        for (int g = 0; g < NG; g++) {
            const __m512i iv = lane_index(i0 + 16 * g), lbv = _mm512_loadu_si512(lb + 16 * g);
            const __m512 m0 = _mm512_loadu_ps(m + 16 * g);
            __m512 mx = m0;
            for (int j = 0; j < nk; j++) {
                const __mmask16 vm = vis_mask(j0 + j, iv, lbv);
                mx = _mm512_mask_max_ps(mx, vm, mx, _mm512_loadu_ps(St + (size_t)j * BQ + 16 * g));
            }
            __m512 sum = _mm512_setzero_ps();
            for (int j = 0; j < nk; j++) {
                float *s = St + (size_t)j * BQ + 16 * g;
                const __mmask16 vm = vis_mask(j0 + j, iv, lbv);
                const __m512 e = _mm512_maskz_mov_ps(vm, vexp(_mm512_sub_ps(_mm512_loadu_ps(s), mx)));
                _mm512_storeu_ps(s, e);
                sum = _mm512_add_ps(sum, e);
            }
            const __m512 av = vexp(_mm512_sub_ps(m0, mx));
            _mm512_storeu_ps(l + 16 * g, _mm512_fmadd_ps(av, _mm512_loadu_ps(l + 16 * g), sum));
            _mm512_storeu_ps(m + 16 * g, mx);
            _mm512_storeu_ps(a + 16 * g, av);
        }
        /* O = a * O + P V, with P(i, j) = St[j][i] */
        if (b16) pack_b(V2, v, QKV, nk, hs);
        tile_mm(b16, O, hs, St, 1, BQ, v, QKV, V2, nq, nk, hs, 1.0f, RESCALE, a);
    }
    float *o = out + ((size_t)b * T + i0) * C + (size_t)h * hs;
    float *L = lse + ((size_t)b * NH + h) * T + i0;
    for (int i = 0; i < nq; i++) {
        const float inv = 1.0f / l[i];
        const float *src = O + (size_t)i * hs;
        float *dst = o + (size_t)i * C;
        for (int e = 0; e < hs; e++) dst[e] = src[e] * inv;
        L[i] = m[i] + logf(l[i]);
    }
}

static void forward(int b16, float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                    int window, const int32_t *pos) {
    const int nqt = (T + BQ - 1) / BQ, ntask = B * NH * nqt;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
        const int qt = nqt - 1 - t / (B * NH), bh = t % (B * NH);
        fwd_task(b16, out, lse, qkv, bh / NH, bh % NH, qt, T, NH, NKV, hs, window, pos);
    }
}

void mf_flash_forward_avx512(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                             int window, const int32_t *pos) {
    forward(0, out, lse, qkv, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_forward_avx512bf16(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                                 int window, const int32_t *pos) {
    forward(1, out, lse, qkv, B, T, NH, NKV, hs, window, pos);
}


/* ---- backward ------------------------------------------------------------ */

static void backward(int b16, float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                     const float *lse, int B, int T, int NH, int NKV, int hs, int window, const int32_t *pos) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, G = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hs);
    /* flash_attention.c's per-thread slice; D sits after its two tiles */
    const int tq = imin(64, T), tk = imin(64, T);
    const size_t per = 2 * (size_t)tq * tk + (size_t)T;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bk = 0; bk < B * NKV; bk++) {
        const int b = bk / NKV, kvh = bk % NKV;
        const size_t boff = (size_t)b * T * QKV;
        const size_t koff = boff + (size_t)(NH + kvh) * hs, voff = boff + (size_t)(NH + NKV + kvh) * hs;
        const float *k = qkv + koff, *v = qkv + voff;
        float *dk = dqkv + koff, *dv = dqkv + voff;
        const int32_t *Pd = pos ? pos + (size_t)b * T : NULL;
        float *D = scratch + (size_t)omp_get_thread_num() * per + 2 * (size_t)tq * tk;
        _Alignas(64) float Qt[MF_FA512_MAX_HS * BQ], dOt[MF_FA512_MAX_HS * BQ], Pt[BK * BQ], dPt[BK * BQ];
        /* packed pairs (bf16): Q^T and dO^T (hs rows), dO_i and Q_i (query
         * rows), K_j (key rows) */
        _Alignas(64) uint32_t Qt2[MAXP * BQ], dOt2[MAXP * BQ];
        _Alignas(64) uint32_t dO2[BQ / 2 * MF_FA512_MAX_HS], Q2[BQ / 2 * MF_FA512_MAX_HS];
        _Alignas(64) uint32_t K2[BK / 2 * MF_FA512_MAX_HS];
        int lb[BQ];

        for (int t = 0; t < T; t++) {
            memset(dk + (size_t)t * QKV, 0, (size_t)hs * sizeof(float));
            memset(dv + (size_t)t * QKV, 0, (size_t)hs * sizeof(float));
        }
        for (int h = kvh * G; h < (kvh + 1) * G; h++) {
            const float *q = qkv + boff + (size_t)h * hs;
            float *dq = dqkv + boff + (size_t)h * hs;
            const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
            const float *dO = dout + ooff, *O = out + ooff;
            const float *L = lse + ((size_t)b * NH + h) * T;
            for (int t = 0; t < T; t++) {
                const float *x = dO + (size_t)t * C, *y = O + (size_t)t * C;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int e = 0; e < hs; e++) d += x[e] * y[e];
                D[t] = d;
                memset(dq + (size_t)t * QKV, 0, (size_t)hs * sizeof(float));
            }
            for (int i0 = 0; i0 < T; i0 += BQ) {
                const int nq = imin(BQ, T - i0);
                const float *qi = q + (size_t)i0 * QKV, *dOi = dO + (size_t)i0 * C;
                float *dqi = dq + (size_t)i0 * QKV;
                transpose_tile(Qt, qi, QKV, nq, hs);
                transpose_tile(dOt, dOi, C, nq, hs);
                if (b16) {
                    pack_b(Qt2, Qt, BQ, hs, BQ);
                    pack_b(dOt2, dOt, BQ, hs, BQ);
                    pack_b(dO2, dOi, C, nq, hs);
                    pack_b(Q2, qi, QKV, nq, hs);
                }
                row_bounds(lb, i0, nq, window, Pd);
                const int jend = i0 + nq;
                for (int j0 = lb[0] / BK * BK; j0 < jend; j0 += BK) {
                    const int nk = imin(BK, jend - j0);
                    const float *kj = k + (size_t)j0 * QKV, *vj = v + (size_t)j0 * QKV;
                    float *dkj = dk + (size_t)j0 * QKV, *dvj = dv + (size_t)j0 * QKV;
                    tile_mm(b16, Pt, BQ, kj, QKV, 1, Qt, BQ, Qt2, nk, hs, BQ, scale, ST, NULL);   /* S^T */
                    tile_mm(b16, dPt, BQ, vj, QKV, 1, dOt, BQ, dOt2, nk, hs, BQ, 1.0f, ST, NULL); /* dP^T = V dO^T */
                    for (int g = 0; g < NG; g++) {
                        const __m512i iv = lane_index(i0 + 16 * g), lbv = _mm512_loadu_si512(lb + 16 * g);
                        /* lanes past nq read L/D beyond the tile: masked below, but keep the loads in bounds */
                        const __mmask16 in = (__mmask16)(nq - 16 * g >= 16 ? 0xFFFF
                                                          : nq - 16 * g <= 0 ? 0 : (1u << (nq - 16 * g)) - 1u);
                        const __m512 Lv = _mm512_maskz_loadu_ps(in, L + i0 + 16 * g);
                        const __m512 Dv = _mm512_maskz_loadu_ps(in, D + i0 + 16 * g);
                        for (int j = 0; j < nk; j++) {
                            float *p = Pt + (size_t)j * BQ + 16 * g, *dp = dPt + (size_t)j * BQ + 16 * g;
                            const __mmask16 vm = vis_mask(j0 + j, iv, lbv);
                            const __m512 pv = _mm512_maskz_mov_ps(vm, vexp(_mm512_sub_ps(_mm512_loadu_ps(p), Lv)));
                            _mm512_storeu_ps(p, pv);
                            /* dS = P (dP - D), over dP's tile */
                            _mm512_storeu_ps(dp, _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_loadu_ps(dp), Dv)));
                        }
                    }
                    /* dV_j += P^T dO_i: A(j, i) = Pt[j][i] */
                    tile_mm(b16, dvj, QKV, Pt, BQ, 1, dOi, C, dO2, nk, nq, hs, 1.0f, ACC, NULL);
                    /* dQ_i += scale dS K_j: A(i, j) = dSt[j][i] */
                    if (b16) pack_b(K2, kj, QKV, nk, hs);
                    tile_mm(b16, dqi, QKV, dPt, 1, BQ, kj, QKV, K2, nq, nk, hs, scale, ACC, NULL);
                    /* dK_j += scale dS^T Q_i: A(j, i) = dSt[j][i] */
                    tile_mm(b16, dkj, QKV, dPt, BQ, 1, qi, QKV, Q2, nk, nq, hs, scale, ACC, NULL);
                }
            }
        }
    }
}
void mf_flash_backward_avx512(float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                              const float *lse, int B, int T, int NH, int NKV, int hs, int window,
                              const int32_t *pos) {
    backward(0, dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_backward_avx512bf16(float *dqkv, float *scratch, const float *dout, const float *out,
                                  const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                  int window, const int32_t *pos) {
    backward(1, dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
}
#pragma GCC diagnostic pop
#else
typedef int mf_fa_avx512_unused; /* ISO C: a file must declare something */
#endif
