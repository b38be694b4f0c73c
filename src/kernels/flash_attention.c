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
 * dQ, dK and dV accumulate directly in dqkv (zeroed first). A (b, h) pair is
 * one OpenMP task and runs its tile loops serially, so there are no races
 * and no float atomics: results are bitwise deterministic, and even
 * independent of the thread count.
 *
 * Tile products go through cblas_sgemm on strided views of qkv/out/dqkv
 * (leading dimension 3C or C, no gather copies); OpenBLAS's OpenMP build runs
 * single-threaded inside the parallel region, and its runtime-dispatched
 * AVX2/FMA kernels beat what -march=x86-64-v2 (SSE4.2, no FMA) loops can do.
 * Build with -DMF_FLASH_NO_BLAS for plain vectorisable loops instead (the
 * same arithmetic; measured 2.4-3.6x slower on a 2-core EPYC, see
 * bench/attention_bench.c).
 */
#include "memfit/kernels.h"
#include "vmath.h"

#include <math.h>
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

/* One (b, h, query tile) task. Stack use: the BQ x BK score tile (16 KiB)
 * and two BQ-float row vectors; the output accumulator is `out` itself. */
static void fwd_tile(float *out, float *lse, const float *qkv, int b, int h,
                     int qt, int T, int C, int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int i0 = qt * MF_FA_BQ, nq = imin(MF_FA_BQ, T - i0);
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
    const float *q = base + (size_t)i0 * C3;
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
    for (int j0 = 0; j0 < jend; j0 += MF_FA_BK) {
        const int nk = imin(MF_FA_BK, jend - j0);
        const float *k = base + C + (size_t)j0 * C3;
        const float *v = base + 2 * C + (size_t)j0 * C3;
        tile_abt(S, MF_FA_BK, q, C3, k, C3, nq, nk, hs, scale);
        for (int i = 0; i < nq; i++) {
            float *s = S + (size_t)i * MF_FA_BK;
            /* visible keys of row i in this tile: j < nv (j0 + j <= i0 + i) */
            const int nv = imin(nk, i0 + i - j0 + 1);
            if (nv <= 0) { /* no visible key here (only when BK < BQ) */
                for (int j = 0; j < nk; j++) s[j] = 0.0f;
                continue;
            }
            float mx = m[i];
            for (int j = 0; j < nv; j++) mx = s[j] > mx ? s[j] : mx;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nv; j++) {
                const float e = mf_vexpf(s[j] - mx);
                s[j] = e;
                sum += e;
            }
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
        tile_ab_acc(o, C, S, MF_FA_BK, v, C3, nq, nk, hs, 1.0f);
    }
    for (int i = 0; i < nq; i++) {
        const float inv = 1.0f / l[i];
        float *oi = o + (size_t)i * C;
#pragma omp simd
        for (int e = 0; e < hs; e++) oi[e] *= inv;
        L[i] = m[i] + logf(l[i]);
    }
}

void mf_flash_attention_forward(float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int nqt = (T + MF_FA_BQ - 1) / MF_FA_BQ;
    const int ntask = B * NH * nqt;
    /* tasks ordered longest first (the last query tile of each head visits
     * the most key tiles); each task writes disjoint out rows and lse
     * entries, so dynamic scheduling does not affect the results */
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < ntask; t++) {
        const int qt = nqt - 1 - t / (B * NH);
        const int bh = t % (B * NH);
        fwd_tile(out, lse, qkv, bh / NH, bh % NH, qt, T, C, NH);
    }
}

/* ---- backward ----------------------------------------------------------- */

/* Scratch layout, per thread (thread i uses floats [i*per, (i+1)*per)):
 *   P  : tq x tk  recomputed probabilities, then dS in place
 *   dP : tq x tk  dO V^T
 *   D  : T        D_i = dO_i . O_i for the (b, h) being processed
 * with tq = min(BQ, T), tk = min(BK, T) (tiles never exceed T); the tile
 * leading dimension is tk. hs is part of the signature so a later layout
 * (e.g. gathered tiles) can grow with it; this one does not need it. */
size_t mf_flash_attention_scratch_floats(int T, int hs, int nthreads) {
    (void)hs;
    if (T <= 0 || nthreads <= 0) return 0;
    const size_t tq = (size_t)imin(MF_FA_BQ, T), tk = (size_t)imin(MF_FA_BK, T);
    return (size_t)nthreads * (2 * tq * tk + (size_t)T);
}

/* Scratch contract as for mf_attention_backward: sized with
 * mf_flash_attention_scratch_floats(T, hs, omp_get_max_threads()) and called
 * with the same OpenMP settings. dqkv needs no zeroing by the caller: every
 * (b, h) zeroes its own q, k and v columns of all T rows, then accumulates. */
void mf_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                 const float *out, const float *qkv, const float *lse,
                                 int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int tq = imin(MF_FA_BQ, T), tk = imin(MF_FA_BK, T);
    const size_t per = 2 * (size_t)tq * tk + (size_t)T;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const size_t off = (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
        const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
        const float *dO = dout + ooff, *O = out + ooff;
        const float *L = lse + (size_t)bh * T;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *dP = P + (size_t)tq * tk;
        float *D = dP + (size_t)tq * tk;

        for (int t = 0; t < T; t++) {
            const float *a = dO + (size_t)t * C, *o = O + (size_t)t * C;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int e = 0; e < hs; e++) d += a[e] * o[e];
            D[t] = d;
            memset(dq + (size_t)t * C3, 0, (size_t)hs * sizeof(float));
            memset(dk + (size_t)t * C3, 0, (size_t)hs * sizeof(float));
            memset(dv + (size_t)t * C3, 0, (size_t)hs * sizeof(float));
        }

        for (int j0 = 0; j0 < T; j0 += tk) {
            const int nk = imin(tk, T - j0);
            const float *kj = k + (size_t)j0 * C3, *vj = v + (size_t)j0 * C3;
            float *dkj = dk + (size_t)j0 * C3, *dvj = dv + (size_t)j0 * C3;
            /* first query tile with a row i >= j0 */
            for (int i0 = (j0 / tq) * tq; i0 < T; i0 += tq) {
                const int nq = imin(tq, T - i0);
                const float *qi = q + (size_t)i0 * C3;
                const float *dOi = dO + (size_t)i0 * C;
                float *dqi = dq + (size_t)i0 * C3;
                tile_abt(P, tk, qi, C3, kj, C3, nq, nk, hs, scale);
                for (int i = 0; i < nq; i++) {
                    float *p = P + (size_t)i * tk;
                    const int nv = imin(nk, i0 + i - j0 + 1);
                    const float li = L[i0 + i];
                    int j = 0;
                    if (nv > 0) {
#pragma omp simd
                        for (j = 0; j < nv; j++) p[j] = mf_vexpf(p[j] - li);
                        j = nv;
                    }
                    for (; j < nk; j++) p[j] = 0.0f;
                }
                /* dV_j += P^T dO_i */
                tile_atb_acc(dvj, C3, P, tk, dOi, C, nq, nk, hs, 1.0f);
                /* dP = dO_i V_j^T */
                tile_abt(dP, tk, dOi, C, vj, C3, nq, nk, hs, 1.0f);
                /* dS = P * (dP - D), in place over P; P = 0 where masked */
                for (int i = 0; i < nq; i++) {
                    float *p = P + (size_t)i * tk;
                    const float *dp = dP + (size_t)i * tk;
                    const float di = D[i0 + i];
#pragma omp simd
                    for (int jj = 0; jj < nk; jj++) p[jj] = p[jj] * (dp[jj] - di);
                }
                /* dQ_i += dS K_j * scale;  dK_j += dS^T Q_i * scale */
                tile_ab_acc(dqi, C3, P, tk, kj, C3, nq, nk, hs, scale);
                tile_atb_acc(dkj, C3, P, tk, qi, C3, nq, nk, hs, scale);
            }
        }
    }
}
