/* Causal multi-head self-attention without the T x T probability matrix:
 * FlashAttention (Dao et al. 2022, Algorithm 1) forward, FlashAttention-2
 * (Dao 2023, Algorithm 2) backward, fp32, on the CPU.
 *
 * Forward, per (batch b, head h, query tile of BQ rows): walk the key tiles
 * j0 = 0, BK, ... up to the diagonal, keeping per query row i a running max
 * m_i, a running sum l_i of exp(s_ij - m_i) and an unnormalised output row
 * o_i (accumulated directly in `out`, whose rows this task owns):
 *   S = Q_t K_j^T * scale               (causal entries only, j <= i)
 *   m' = max(m, rowmax S);  P = exp(S - m');  a = exp(m - m')
 *   l = a*l + rowsum P;  o = a*o + P V_j;  m = m'
 * and at the end o /= l, lse_i = m_i + log l_i. Only `out` and `lse` leave
 * the kernel; masked entries (j > i) are excluded from the max and get
 * P = 0 exactly, so a future token can never leak in, not even by rounding.
 *
 * Backward, per (b, h): D_i = dO_i . O_i (FlashAttention-2), then for each
 * key tile (outer) and each query tile at or below the diagonal (inner)
 * recompute P = exp(S - lse) from the stored lse and
 *   dV_j += P^T dO_t,   dP = dO_t V_j^T,   dS = P * (dP - D),
 *   dQ_t += dS K_j * scale,   dK_j += dS^T Q_t * scale.
 * dQ, dK and dV accumulate directly in dqkv (zeroed first). A (b, kv head)
 * pair is one OpenMP task and runs its query heads' tile loops serially, so
 * there are no races and no float atomics: results are bitwise
 * deterministic, and even independent of the thread count.
 *
 * Grouped-query attention (Llama, Mistral: NKV key/value heads shared by
 * NH/NKV query heads each) and a sliding window are the general case
 * (mf_flash_attention_gqa_*); GPT-2's entry points call it with NKV = NH and
 * no window, which runs the very same arithmetic as before it existed.
 *
 * Tile products go through cblas_sgemm on strided views of qkv/out/dqkv
 * (leading dimension 3C or C, no gather copies); OpenBLAS's OpenMP build runs
 * single-threaded inside the parallel region, and its runtime-dispatched
 * AVX2/FMA kernels beat what -march=x86-64-v2 (SSE4.2, no FMA) loops can do.
 * Build with -DMF_FLASH_NO_BLAS for plain vectorisable loops instead (the
 * same arithmetic; measured 2.4-3.6x slower on a 2-core EPYC, see
 * bench/attention_bench.c).
 *
 * On a CPU with AVX-512 the dispatch table (isa.h) runs fa_avx512.c instead,
 * for head sizes up to MF_FA512_MAX_HS: the same tasks and masks with
 * register-blocked AVX-512 tile products and a transposed softmax, which
 * agrees with these loops to round-off (tests/test_kernels_isa_agree.c) and
 * ran smollm2-135m's attention (B4 T256, 9 query / 3 KV heads) 1.57x faster
 * on a 2-core Zen 5 (bench/flash_isa_bench.c). These loops are what MEMFIT_ISA=portable runs.
 */
#include "memfit/kernels.h"
#include "isa.h"
#include "vmath.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <omp.h>
#include <string.h>

#ifndef MF_FLASH_NO_BLAS
#include <cblas.h>
#ifdef MF_FA_ONEDNN /* tiles through mf_sgemm (oneDNN): measured no faster here, see docs/performance.md */
#define MF_FA_SGEMM mf_sgemm
#else
#define MF_FA_SGEMM(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc) \
    cblas_sgemm(CblasRowMajor, (ta) ? CblasTrans : CblasNoTrans, (tb) ? CblasTrans : CblasNoTrans, M, N, K, al, A, \
                lda, B, ldb, be, C, ldc)
#endif
#endif

/* Tile sizes. A 64 x 64 fp32 score tile is 16 KiB (L1-sized); with hs up to
 * 128 the Q, K and V tiles add 32 KiB each, so one step's working set
 * (~112 KiB) stays in L2. Any T and hs work: the last tile is partial and hs
 * is only ever a loop bound / GEMM dimension. */
enum { MF_FA_BQ = 64, /* query rows per tile */
       MF_FA_BK = 64  /* key rows per tile */ };

static inline int imin(int a, int b) { return a < b ? a : b; }

/* ---- tile products: C (n x m, ldc) op= ... ------------------------------ */

/* S (n x m, lds) = alpha * A (n x k, lda) B (m x k, ldb)^T */
static inline void tile_abt(float *S, int lds, const float *A, int lda,
                            const float *Bm, int ldb, int n, int m, int k, float alpha) {
#ifndef MF_FLASH_NO_BLAS
    MF_FA_SGEMM(0, 1, n, m, k, alpha, A, lda, Bm, ldb, 0.0f, S, lds);
#else
    for (int i = 0; i < n; i++) {
        const float *a = A + (size_t)i * lda;
        for (int j = 0; j < m; j++) {
            const float *b = Bm + (size_t)j * ldb;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int e = 0; e < k; e++) d += a[e] * b[e];
            S[(size_t)i * lds + j] = alpha * d;
        }
    }
#endif
}

/* O (n x k, ldo) += alpha * P (n x m, ldp) V (m x k, ldv) */
static inline void tile_ab_acc(float *O, int ldo, const float *P, int ldp,
                               const float *V, int ldv, int n, int m, int k, float alpha) {
#ifndef MF_FLASH_NO_BLAS
    MF_FA_SGEMM(0, 0, n, k, m, alpha, P, ldp, V, ldv, 1.0f, O, ldo);
#else
    for (int i = 0; i < n; i++) {
        float *o = O + (size_t)i * ldo;
        for (int j = 0; j < m; j++) {
            const float p = alpha * P[(size_t)i * ldp + j];
            const float *v = V + (size_t)j * ldv;
#pragma omp simd
            for (int e = 0; e < k; e++) o[e] += p * v[e];
        }
    }
#endif
}

/* G (m x k, ldg) += alpha * P (n x m, ldp)^T X (n x k, ldx) */
static inline void tile_atb_acc(float *G, int ldg, const float *P, int ldp,
                                const float *X, int ldx, int n, int m, int k, float alpha) {
#ifndef MF_FLASH_NO_BLAS
    MF_FA_SGEMM(1, 0, m, k, n, alpha, P, ldp, X, ldx, 1.0f, G, ldg);
#else
    for (int j = 0; j < m; j++) {
        float *g = G + (size_t)j * ldg;
        for (int i = 0; i < n; i++) {
            const float p = alpha * P[(size_t)i * ldp + j];
            const float *x = X + (size_t)i * ldx;
#pragma omp simd
            for (int e = 0; e < k; e++) g[e] += p * x[e];
        }
    }
#endif
}

/* ---- forward ------------------------------------------------------------ */

/* Grouped-query layout (kernels.h): a qkv row (width QKV = (NH + 2*NKV) hs)
 * holds NH query heads, then NKV key heads, then NKV value heads; query head
 * h reads kv head h / (NH/NKV). GPT-2's (B,T,3C) c_attn row is the case
 * NKV = NH, hs = C/NH: key head h at C + h*hs, value head h at 2C + h*hs.
 *
 * Sliding window (window > 0): row i sees keys i - window < j <= i. In a key
 * tile starting at j0 that is tile columns [lo, nv) with
 *   lo = max(0, i - window + 1 - j0),   nv = min(nk, i - j0 + 1);
 * window 0 gives lo = 0 and the loops below run exactly as without windows
 * (same start, same length, same order), which keeps GPT-2 bit-identical. */
static inline int imax(int a, int b) { return a > b ? a : b; }

/* First visible column of row i in the key tile at j0 (0 without window). */
static inline int win_lo(int i, int j0, int window) {
    return window > 0 ? imax(0, i - window + 1 - j0) : 0;
}

/* Documents packed into one row (pos != NULL: pos[i] is row i's position
 * in its document, restarting at 0 at each document's first token): row i
 * also sees only keys j >= i - pos[i], its document's first token. */
static inline int doc_lo(int i, int j0, int window, const int32_t *pos) {
    return imax(win_lo(i, j0, window), i - pos[i] - j0);
}

/* One (b, h, query tile) task. Stack use: the BQ x BK score tile (16 KiB)
 * and two BQ-float row vectors; the output accumulator is `out` itself. */
static void fwd_tile(float *out, float *lse, const float *qkv, int b, int h, int qt, int T, int NH, int NKV,
                     int hs, int window, const int32_t *pos) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, kvh = h / (NH / NKV);
    const float scale = 1.0f / sqrtf((float)hs);
    const int i0 = qt * MF_FA_BQ, nq = imin(MF_FA_BQ, T - i0);
    const float *base = qkv + (size_t)b * T * QKV;
    const float *q = base + (size_t)i0 * QKV + (size_t)h * hs;
    const float *kbase = base + (size_t)(NH + kvh) * hs;       /* row 0 of key head kvh */
    const float *vbase = base + (size_t)(NH + NKV + kvh) * hs; /* row 0 of value head kvh */
    float *o = out + ((size_t)b * T + i0) * C + (size_t)h * hs;
    float *L = lse + ((size_t)b * NH + h) * T + i0;

    float S[MF_FA_BQ * MF_FA_BK];
    float m[MF_FA_BQ], l[MF_FA_BQ];
    for (int i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        memset(o + (size_t)i * C, 0, (size_t)hs * sizeof(float));
    }
    const int jend = i0 + nq; /* keys 0 .. jend-1 can be visible */
    /* with a window, the tile holding the first row's first visible key
     * (i0 - window + 1): every earlier tile is invisible to all nq rows and
     * is skipped, so a step costs O(window) rather than O(T) */
    int jbeg = window > 0 ? imax(0, i0 - window + 1) / MF_FA_BK * MF_FA_BK : 0;
    /* documents: the first row's document starts at i0 - pos[i0], and later
     * rows' documents start no earlier; tiles before it are skipped */
    const int32_t *P = pos ? pos + (size_t)b * T : NULL;
    if (P) jbeg = imax(jbeg, (i0 - P[i0]) / MF_FA_BK * MF_FA_BK);
    for (int j0 = jbeg; j0 < jend; j0 += MF_FA_BK) {
        const int nk = imin(MF_FA_BK, jend - j0);
        const float *k = kbase + (size_t)j0 * QKV;
        const float *v = vbase + (size_t)j0 * QKV;
        tile_abt(S, MF_FA_BK, q, QKV, k, QKV, nq, nk, hs, scale);
        for (int i = 0; i < nq; i++) {
            float *s = S + (size_t)i * MF_FA_BK;
            /* visible keys of row i in this tile: lo <= j < nv */
            const int lo = P ? doc_lo(i0 + i, j0, window, P) : win_lo(i0 + i, j0, window);
            const int nv = imin(nk, i0 + i - j0 + 1);
            if (nv <= lo) { /* no visible key here (BK < BQ, the window, or another document) */
                for (int j = 0; j < nk; j++) s[j] = 0.0f;
                continue;
            }
            float *sv = s + lo; /* the visible run, nvis entries */
            const int nvis = nv - lo;
            float mx = m[i];
            for (int j = 0; j < nvis; j++) mx = sv[j] > mx ? sv[j] : mx;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nvis; j++) {
                const float e = mf_vexpf(sv[j] - mx);
                sv[j] = e;
                sum += e;
            }
            for (int j = 0; j < lo; j++) s[j] = 0.0f;
            for (int j = nv; j < nk; j++) s[j] = 0.0f;
            /* m = -inf on the first visit: a ~ 1e-38 (clamped exp), times
             * l = 0 and o = 0, so no special case is needed */
            const float a = mf_vexpf(m[i] - mx);
            l[i] = a * l[i] + sum;
            m[i] = mx;
            if (a != 1.0f) {
                float *oi = o + (size_t)i * C;
#pragma omp simd
                for (int e = 0; e < hs; e++) oi[e] *= a;
            }
        }
        tile_ab_acc(o, C, S, MF_FA_BK, v, QKV, nq, nk, hs, 1.0f);
    }
    for (int i = 0; i < nq; i++) {
        const float inv = 1.0f / l[i];
        float *oi = o + (size_t)i * C;
#pragma omp simd
        for (int e = 0; e < hs; e++) oi[e] *= inv;
        L[i] = m[i] + logf(l[i]);
    }
}

/* A window of T or more hides nothing: the same as no window (and the
 * index arithmetic never sees a huge window). */
static int norm_window(int window, int T) { return window > 0 && window < T ? window : 0; }

static void check_heads(const char *fn, int NH, int NKV, int hs) {
    if (NKV <= 0 || NH % NKV != 0 || hs <= 0)
        mf_panic("%s: bad heads NH=%d NKV=%d hs=%d (NKV must divide NH)", fn, NH, NKV, hs);
}

void mf_flash_attention_gqa_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                    int hs, int window) {
    mf_flash_attention_doc_forward(out, lse, qkv, B, T, NH, NKV, hs, window, NULL);
}

/* MEMFIT_ATTN_BF16=0 keeps the bf16 entry points on fp32 tiles (the
 * baseline bench/attn_bf16.sh compares against); read once */
static int g_bf16_tiles = -1;
static pthread_once_t g_bf16_once = PTHREAD_ONCE_INIT;
static void pick_bf16(void) {
    const char *e = getenv("MEMFIT_ATTN_BF16");
    g_bf16_tiles = mf_kernels_isa_bf16dot_ok() && !(e && strcmp(e, "0") == 0);
}

int mf_flash_attention_bf16_tiles(void) {
    pthread_once(&g_bf16_once, pick_bf16);
    return g_bf16_tiles;
}

void mf_flash_attention_bf16_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                     int hs, int window, const int32_t *pos) {
#ifdef MF_HAVE_AVX512_TABLE
    if (B > 0 && T > 0 && NH > 0 && hs <= MF_FA512_MAX_HS && mf_flash_attention_bf16_tiles()) {
        check_heads("mf_flash_attention_bf16_forward", NH, NKV, hs);
        mf_flash_forward_avx512bf16(out, lse, qkv, B, T, NH, NKV, hs, norm_window(window, T), pos);
        return;
    }
#endif
    mf_flash_attention_doc_forward(out, lse, qkv, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_attention_bf16_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                      const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                      int window, const int32_t *pos) {
#ifdef MF_HAVE_AVX512_TABLE
    if (B > 0 && T > 0 && NH > 0 && hs <= MF_FA512_MAX_HS && mf_flash_attention_bf16_tiles()) {
        check_heads("mf_flash_attention_bf16_backward", NH, NKV, hs);
        mf_flash_backward_avx512bf16(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, norm_window(window, T),
                                     pos);
        return;
    }
#endif
    mf_flash_attention_doc_backward(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_attention_doc_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                    int hs, int window, const int32_t *pos) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_heads("mf_flash_attention_gqa_forward", NH, NKV, hs);
    window = norm_window(window, T);
    const mf_kernel_isa *isa = mf_kernels_isa_get();
    if (isa->flash_forward && hs <= MF_FA512_MAX_HS)
        isa->flash_forward(out, lse, qkv, B, T, NH, NKV, hs, window, pos);
    else
        mf_flash_forward_tiles(out, lse, qkv, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_forward_tiles(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                            int window, const int32_t *pos) {
    const int nqt = (T + MF_FA_BQ - 1) / MF_FA_BQ;
    const int ntask = B * NH * nqt;
    /* tasks ordered longest first (the last query tile of each head visits
     * the most key tiles; with a window all visit about the same); each
     * task writes disjoint out rows and lse entries, so dynamic scheduling
     * does not affect the results */
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
        const int qt = nqt - 1 - t / (B * NH);
        const int bh = t % (B * NH);
        fwd_tile(out, lse, qkv, bh / NH, bh % NH, qt, T, NH, NKV, hs, window, pos);
    }
}

/* GPT-2: NKV = NH, no window; the same tasks and arithmetic as before the
 * GQA generalisation, so results are bit-identical. */
void mf_flash_attention_forward(float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    mf_flash_attention_gqa_forward(out, lse, qkv, B, T, NH, NH, C / NH, 0);
}

/* ---- backward ----------------------------------------------------------- */

/* Scratch layout, per thread (thread i uses floats [i*per, (i+1)*per)):
 *   P  : tq x tk  recomputed probabilities, then dS in place
 *   dP : tq x tk  dO V^T
 *   D  : T        D_i = dO_i . O_i for the query head being processed
 * with tq = min(BQ, T), tk = min(BK, T) (tiles never exceed T); the tile
 * leading dimension is tk. A GQA task walks its query heads one after the
 * other, so D is still one head's T floats and the size does not depend
 * on NH/NKV. hs is part of the signature so a later layout (e.g. gathered
 * tiles) can grow with it; this one does not need it. */
size_t mf_flash_attention_scratch_floats(int T, int hs, int nthreads) {
    (void)hs;
    if (T <= 0 || nthreads <= 0) return 0;
    const size_t tq = (size_t)imin(MF_FA_BQ, T), tk = (size_t)imin(MF_FA_BK, T);
    return (size_t)nthreads * (2 * tq * tk + (size_t)T);
}

/* Scratch contract as for mf_attention_backward: sized with
 * mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()) and called
 * with the same OpenMP settings. dqkv needs no zeroing by the caller: every
 * task zeroes its own q, k and v columns of all T rows, then accumulates.
 *
 * One OpenMP task per (b, kv head): it owns dK and dV of that head and dQ
 * of the G = NH/NKV query heads that read it, and runs them serially (head
 * by head, then key tile, then query tile). dK/dV of a shared head thus sum
 * the query heads' contributions in a fixed order, with no races and no
 * atomics: bitwise deterministic and independent of the thread count. For
 * NKV == NH a task is the former per-(b, h) task, unchanged. */
void mf_flash_attention_gqa_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                     const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                     int window) {
    mf_flash_attention_doc_backward(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, NULL);
}

void mf_flash_attention_doc_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                                     const float *qkv, const float *lse, int B, int T, int NH, int NKV, int hs,
                                     int window, const int32_t *pos) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    check_heads("mf_flash_attention_gqa_backward", NH, NKV, hs);
    window = norm_window(window, T);
    const mf_kernel_isa *isa = mf_kernels_isa_get();
    if (isa->flash_backward && hs <= MF_FA512_MAX_HS)
        isa->flash_backward(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
    else
        mf_flash_backward_tiles(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, window, pos);
}

void mf_flash_backward_tiles(float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                             const float *lse, int B, int T, int NH, int NKV, int hs, int window,
                             const int32_t *pos) {
    const int QKV = (NH + 2 * NKV) * hs, C = NH * hs, G = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hs);
    const int tq = imin(MF_FA_BQ, T), tk = imin(MF_FA_BK, T);
    const size_t per = 2 * (size_t)tq * tk + (size_t)T;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bk = 0; bk < B * NKV; bk++) {
        const int b = bk / NKV, kvh = bk % NKV;
        const size_t boff = (size_t)b * T * QKV;
        const size_t koff = boff + (size_t)(NH + kvh) * hs, voff = boff + (size_t)(NH + NKV + kvh) * hs;
        const float *k = qkv + koff, *v = qkv + voff;
        float *dk = dqkv + koff, *dv = dqkv + voff;
        const int32_t *Pd = pos ? pos + (size_t)b * T : NULL;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *dP = P + (size_t)tq * tk;
        float *D = dP + (size_t)tq * tk;

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
                const float *a = dO + (size_t)t * C, *o = O + (size_t)t * C;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int e = 0; e < hs; e++) d += a[e] * o[e];
                D[t] = d;
                memset(dq + (size_t)t * QKV, 0, (size_t)hs * sizeof(float));
            }

            for (int j0 = 0; j0 < T; j0 += tk) {
                const int nk = imin(tk, T - j0);
                const float *kj = k + (size_t)j0 * QKV, *vj = v + (size_t)j0 * QKV;
                float *dkj = dk + (size_t)j0 * QKV, *dvj = dv + (size_t)j0 * QKV;
                /* query rows that can see a key of this tile: j0 <= i and
                 * (window) i < j0 + nk - 1 + window; query tiles wholly past
                 * the window are skipped */
                int iend = window > 0 ? imin(T, j0 + nk - 1 + window) : T;
                /* documents: rows past the end of the document holding the
                 * tile's last key see none of it (documents are contiguous) */
                if (Pd) {
                    int e = j0 + nk;
                    while (e < iend && Pd[e] != 0) e++;
                    iend = e;
                }
                /* first query tile with a row i >= j0 */
                for (int i0 = (j0 / tq) * tq; i0 < iend; i0 += tq) {
                    const int nq = imin(tq, T - i0);
                    const float *qi = q + (size_t)i0 * QKV;
                    const float *dOi = dO + (size_t)i0 * C;
                    float *dqi = dq + (size_t)i0 * QKV;
                    tile_abt(P, tk, qi, QKV, kj, QKV, nq, nk, hs, scale);
                    for (int i = 0; i < nq; i++) {
                        float *p = P + (size_t)i * tk;
                        const int lo = Pd ? doc_lo(i0 + i, j0, window, Pd) : win_lo(i0 + i, j0, window);
                        const int nv = imin(nk, i0 + i - j0 + 1);
                        const float li = L[i0 + i];
                        int j = 0;
                        if (nv > lo) {
                            float *pv = p + lo;
                            const int nvis = nv - lo;
#pragma omp simd
                            for (j = 0; j < nvis; j++) pv[j] = mf_vexpf(pv[j] - li);
                            for (j = 0; j < lo; j++) p[j] = 0.0f;
                            j = nv;
                        }
                        for (; j < nk; j++) p[j] = 0.0f;
                    }
                    /* dV_j += P^T dO_i */
                    tile_atb_acc(dvj, QKV, P, tk, dOi, C, nq, nk, hs, 1.0f);
                    /* dP = dO_i V_j^T */
                    tile_abt(dP, tk, dOi, C, vj, QKV, nq, nk, hs, 1.0f);
                    /* dS = P * (dP - D), in place over P; P = 0 where masked */
                    for (int i = 0; i < nq; i++) {
                        float *p = P + (size_t)i * tk;
                        const float *dp = dP + (size_t)i * tk;
                        const float di = D[i0 + i];
#pragma omp simd
                        for (int jj = 0; jj < nk; jj++) p[jj] = p[jj] * (dp[jj] - di);
                    }
                    /* dQ_i += dS K_j * scale;  dK_j += dS^T Q_i * scale */
                    tile_ab_acc(dqi, QKV, P, tk, kj, QKV, nq, nk, hs, scale);
                    tile_atb_acc(dkj, QKV, P, tk, qi, QKV, nq, nk, hs, scale);
                }
            }
        }
    }
}

/* GPT-2: NKV = NH, no window; bit-identical to before (see the forward). */
void mf_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                 const float *out, const float *qkv, const float *lse,
                                 int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    mf_flash_attention_gqa_backward(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NH, C / NH, 0);
}
