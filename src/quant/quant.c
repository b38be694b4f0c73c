/* Frozen-base storage formats and their GEMMs (see quant/quant.h for the
 * byte layouts). Pack runs once when the base is loaded; unpack runs inside
 * every GEMM, a tile of rows at a time, so it is the part written for speed. */
#include "quant/quant.h"
#include "memfit/core.h"
#include "kernels/half.h"
#include "memfit/optim.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN 32768 /* values below which unpack stays on one thread */
#define I8B MF_QUANT_INT8_BLOCK
#define NB MF_QUANT_NF4_BLOCK
#define NB2 MF_QUANT_NF4_BLOCK2
#define I8_STRIDE (4 + I8B)              /* bytes of a full int8 block */
#define NF4_BSTRIDE (1 + NB / 2)         /* bytes of a full NF4 block: qabs + codes */
#define NF4_GSTRIDE (4 + NB2 * NF4_BSTRIDE) /* bytes of a full group of 256 blocks */

/* NormalFloat4: bitsandbytes csrc/kernels.cu (dDequantizeNF4), the values of
 * QLoRA appendix E (Dettmers et al. 2023). */
const float mf_quant_nf4_table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

/* Tables built once: bitsandbytes' signed dynamic map (the 8-bit code of
 * the absmax constants), the midpoints between NF4 values, and NF4 value
 * pairs by code byte: pair[byte] = {NF4[byte >> 4], NF4[byte & 15]}. */
static float g_dmap[256];
static uint8_t g_dmap_zero; /* index of 0.0 in g_dmap */
static float g_mid[15];
static float g_pair[256][2];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void tables_init(void) {
    mf_q8_map_dynamic(g_dmap, 1);
    for (int i = 0; i < 256; i++)
        if (g_dmap[i] == 0.0f) g_dmap_zero = (uint8_t)i;
    for (int i = 0; i < 15; i++) g_mid[i] = 0.5f * (mf_quant_nf4_table[i] + mf_quant_nf4_table[i + 1]);
    for (int b = 0; b < 256; b++) {
        g_pair[b][0] = mf_quant_nf4_table[b >> 4];
        g_pair[b][1] = mf_quant_nf4_table[b & 15];
    }
}
static void tables(void) { pthread_once(&g_once, tables_init); }

int mf_quant_parse(const char *s, int *kind) {
    if (!s) return mf_fail("base dtype: missing value (expected fp32, bf16, int8 or nf4)");
    if (!strcmp(s, "fp32")) *kind = MF_QUANT_F32;
    else if (!strcmp(s, "bf16")) *kind = MF_QUANT_BF16;
    else if (!strcmp(s, "int8")) *kind = MF_QUANT_INT8;
    else if (!strcmp(s, "nf4")) *kind = MF_QUANT_NF4;
    else return mf_fail("base dtype '%s' unknown (expected fp32, bf16, int8 or nf4)", s);
    return 0;
}

const char *mf_quant_name(mf_quant_kind k) {
    switch (k) {
    case MF_QUANT_F32: return "fp32";
    case MF_QUANT_BF16: return "bf16";
    case MF_QUANT_INT8: return "int8";
    case MF_QUANT_NF4: return "nf4";
    }
    return "?";
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t mf_quant_bytes(mf_quant_kind k, int64_t n) {
    if (n < 0) mf_panic("mf_quant_bytes: negative count %lld", (long long)n);
    int64_t nb;
    switch (k) {
    case MF_QUANT_F32: return (size_t)n * 4;
    case MF_QUANT_BF16: return (size_t)n * 2;
    case MF_QUANT_INT8: return (size_t)(n + 4 * cdiv(n, I8B));
    case MF_QUANT_NF4:
        nb = cdiv(n, NB);
        return (size_t)(4 + 4 * cdiv(nb, NB2) + nb + cdiv(n, 2));
    }
    mf_panic("mf_quant_bytes: unknown kind %d", (int)k);
}

static float ld_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static void st_f32(uint8_t *p, float f) { memcpy(p, &f, 4); }

static float block_absmax(const float *x, int64_t len) {
    float a = 0.0f;
    for (int64_t i = 0; i < len; i++) {
        float v = fabsf(x[i]);
        a = v > a ? v : a;
    }
    return a;
}

/* ---- INT8 ------------------------------------------------------------ */

/* Packs values [lo, lo+n) (lo a multiple of the block); src points at value lo. */
static void pack_int8_part(uint8_t *dst, const float *src, int64_t lo, int64_t n) {
    int64_t nb = cdiv(n, I8B), bfirst = lo / I8B;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * I8B, len = n - i0 < I8B ? n - i0 : I8B;
        uint8_t *blk = dst + (bfirst + b) * I8_STRIDE;
        float amax = block_absmax(src + i0, len);
        st_f32(blk, amax);
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int64_t i = 0; i < len; i++) {
            float q = roundf(src[i0 + i] * inv);
            q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
            blk[4 + i] = (uint8_t)(int8_t)q;
        }
    }
}

static void unpack_int8(float *dst, const uint8_t *src, int64_t lo, int64_t n) {
    int64_t i = lo, end = lo + n;
    while (i < end) {
        int64_t b = i / I8B, e = (b + 1) * I8B < end ? (b + 1) * I8B : end;
        const uint8_t *blk = src + b * I8_STRIDE;
        float scale = ld_f32(blk) / 127.0f;
        const int8_t *q = (const int8_t *)(blk + 4);
        for (int64_t j = i; j < e; j++) dst[j - lo] = (float)q[j - b * I8B] * scale;
        i = e;
    }
}

/* ---- NF4 with double quantisation ------------------------------------- */

/* Index of the NF4 value nearest to x (|x| <= 1): the number of midpoints
 * between neighbouring values that x exceeds (ties go to the lower index, as
 * the comparisons in bitsandbytes' dQuantizeNF4), by a 4-step search. */
static uint8_t nf4_code(float x) {
    int c = x > g_mid[7] ? 8 : 0;
    c += x > g_mid[c + 3] ? 4 : 0;
    c += x > g_mid[c + 1] ? 2 : 0;
    c += x > g_mid[c] ? 1 : 0;
    return (uint8_t)c;
}

/* Index of the dynamic-map entry nearest to x (ties to the lower entry). */
static uint8_t dmap_code(const float *map, float x) {
    int lo = 0, hi = 255; /* binary search for the last entry <= x */
    if (x <= map[0]) return 0;
    if (x >= map[255]) return 255;
    while (hi - lo > 1) {
        int m = (lo + hi) / 2;
        if (map[m] <= x) lo = m;
        else hi = m;
    }
    return x - map[lo] <= map[hi] - x ? (uint8_t)lo : (uint8_t)hi;
}

/* The offset is the mean of all block absmax: each group's sum (in double,
 * rounded to float), added in group order in double, divided by the block
 * count. Fixing that order makes the result independent of the thread count
 * and of how the tensor is split into parts. */
#define STATS_BATCH 64 /* groups summed in parallel before their in-order add */
void mf_quant_nf4_stats_add(mf_quant_nf4_stats *st, const float *src, int64_t n) {
    if (n < 0 || st->values % MF_QUANT_PART_ALIGN != 0)
        mf_panic("mf_quant_nf4_stats_add: part at value %lld (must follow parts that are multiples of %d), n=%lld",
                 (long long)st->values, MF_QUANT_PART_ALIGN, (long long)n);
    int64_t nb = cdiv(n, NB), ng = cdiv(nb, NB2);
    for (int64_t g0 = 0; g0 < ng; g0 += STATS_BATCH) {
        float gs[STATS_BATCH];
        int64_t gn = ng - g0 < STATS_BATCH ? ng - g0 : STATS_BATCH;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (int64_t j = 0; j < gn; j++) {
            int64_t g = g0 + j;
            double sum = 0.0;
            for (int64_t b = g * NB2; b < nb && b < (g + 1) * NB2; b++) {
                int64_t i0 = b * NB, len = n - i0 < NB ? n - i0 : NB;
                sum += block_absmax(src + i0, len);
            }
            gs[j] = (float)sum;
        }
        for (int64_t j = 0; j < gn; j++) st->sum += gs[j];
    }
    st->blocks += nb;
    st->values += n;
}

float mf_quant_nf4_offset(const mf_quant_nf4_stats *st) {
    return st->blocks > 0 ? (float)(st->sum / (double)st->blocks) : 0.0f;
}

/* Packs values [lo, lo+n) (lo a multiple of the group size) with the given
 * offset; src points at value lo. */
static void pack_nf4_part(uint8_t *dst, const float *src, int64_t lo, int64_t n, float offset) {
    tables();
    const float *map = g_dmap;
    int64_t nb = cdiv(n, NB), ng = cdiv(nb, NB2), gfirst = lo / MF_QUANT_PART_ALIGN;
    st_f32(dst, offset);
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t g = 0; g < ng; g++) {
        float amax[NB2];
        int64_t b0 = g * NB2, nbg = nb - b0 < NB2 ? nb - b0 : NB2;
        float amax2 = 0.0f;
        for (int64_t j = 0; j < nbg; j++) {
            int64_t i0 = (b0 + j) * NB, len = n - i0 < NB ? n - i0 : NB;
            amax[j] = block_absmax(src + i0, len);
            float c = fabsf(amax[j] - offset);
            amax2 = c > amax2 ? c : amax2;
        }
        uint8_t *grp = dst + 4 + (gfirst + g) * NF4_GSTRIDE;
        st_f32(grp, amax2);
        float inv2 = amax2 > 0.0f ? 1.0f / amax2 : 0.0f;
        for (int64_t j = 0; j < nbg; j++) {
            int64_t i0 = (b0 + j) * NB, len = n - i0 < NB ? n - i0 : NB;
            uint8_t *blk = grp + 4 + j * NF4_BSTRIDE;
            blk[0] = amax2 > 0.0f ? dmap_code(map, (amax[j] - offset) * inv2) : g_dmap_zero;
            float inv = amax[j] > 0.0f ? 1.0f / amax[j] : 0.0f;
            for (int64_t i = 0; i < len; i += 2) {
                uint8_t hi = nf4_code(src[i0 + i] * inv);
                uint8_t lo4 = i + 1 < len ? nf4_code(src[i0 + i + 1] * inv) : 0;
                blk[1 + i / 2] = (uint8_t)(hi << 4 | lo4);
            }
        }
    }
}

static void unpack_nf4(float *dst, const uint8_t *src, int64_t lo, int64_t n) {
    tables();
    const float *map = g_dmap;
    float offset = ld_f32(src);
    int64_t i = lo, end = lo + n;
    while (i < end) {
        int64_t b = i / NB, g = b / NB2, e = (b + 1) * NB < end ? (b + 1) * NB : end;
        const uint8_t *grp = src + 4 + g * NF4_GSTRIDE;
        const uint8_t *blk = grp + 4 + (b - g * NB2) * NF4_BSTRIDE;
        float a = map[blk[0]] * ld_f32(grp) + offset;
        const uint8_t *codes = blk + 1;
        int64_t r = i - b * NB, re = e - b * NB; /* offsets within the block */
        float *o = dst + (i - lo);               /* o[0] is value b*NB + r */
        if (r & 1) {
            *o++ = g_pair[codes[r >> 1]][1] * a;
            r++;
        }
        for (; r + 1 < re; r += 2, o += 2) {
            const float *p = g_pair[codes[r >> 1]];
            o[0] = p[0] * a;
            o[1] = p[1] * a;
        }
        if (r < re) *o = g_pair[codes[r >> 1]][0] * a;
        i = e;
    }
}

/* ---- pack / unpack ----------------------------------------------------- */

void mf_quant_pack_part(mf_quant_kind k, void *dst, const float *src, int64_t lo, int64_t n, float nf4_offset) {
    if (lo < 0 || n < 0 || lo % MF_QUANT_PART_ALIGN != 0)
        mf_panic("mf_quant_pack_part: part [%lld, +%lld) must start on a multiple of %d", (long long)lo,
                 (long long)n, MF_QUANT_PART_ALIGN);
    switch (k) {
    case MF_QUANT_F32: memcpy((float *)dst + lo, src, (size_t)n * 4); return;
    case MF_QUANT_BF16: mf_bf16_from_f32((mf_bf16 *)dst + lo, src, (size_t)n); return;
    case MF_QUANT_INT8: pack_int8_part((uint8_t *)dst, src, lo, n); return;
    case MF_QUANT_NF4: pack_nf4_part((uint8_t *)dst, src, lo, n, nf4_offset); return;
    }
    mf_panic("mf_quant_pack_part: unknown kind %d", (int)k);
}

void mf_quant_pack(mf_quant_kind k, void *dst, const float *src, int64_t n) {
    if (n < 0) mf_panic("mf_quant_pack: negative count %lld", (long long)n);
    float offset = 0.0f;
    if (k == MF_QUANT_NF4) {
        mf_quant_nf4_stats st = {0};
        mf_quant_nf4_stats_add(&st, src, n);
        offset = mf_quant_nf4_offset(&st);
    }
    mf_quant_pack_part(k, dst, src, 0, n, offset);
}

static void unpack_serial(mf_quant_kind k, float *dst, const void *src, int64_t lo, int64_t n) {
    switch (k) {
    case MF_QUANT_F32: memcpy(dst, (const float *)src + lo, (size_t)n * 4); return;
    case MF_QUANT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = mf_bf16_to_f32(((const mf_bf16 *)src)[lo + i]);
        return;
    case MF_QUANT_INT8: unpack_int8(dst, (const uint8_t *)src, lo, n); return;
    case MF_QUANT_NF4: unpack_nf4(dst, (const uint8_t *)src, lo, n); return;
    }
    mf_panic("mf_quant_unpack: unknown kind %d", (int)k);
}

void mf_quant_unpack(mf_quant_kind k, float *dst, const void *src, int64_t lo, int64_t n) {
    if (lo < 0 || n < 0) mf_panic("mf_quant_unpack: bad range lo=%lld n=%lld", (long long)lo, (long long)n);
    if (n < PAR_MIN || omp_in_parallel()) {
        unpack_serial(k, dst, src, lo, n);
        return;
    }
#pragma omp parallel
    {
        /* chunk edges on multiples of the block size (in absolute index)
         * keep each block on one thread */
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t a = t == 0 ? lo : (lo + n * t / nt) / NB * NB;
        int64_t b = t + 1 == nt ? lo + n : (lo + n * (t + 1) / nt) / NB * NB;
        a = a < lo ? lo : a;
        b = b < lo ? lo : b;
        if (b > a) unpack_serial(k, dst + (a - lo), src, a, b - a);
    }
}

/* ---- frozen-base GEMMs ------------------------------------------------- */

static int tile_rows(int K) { return K < MF_QUANT_TILE_ROWS ? K : MF_QUANT_TILE_ROWS; }

size_t mf_quant_matmul_scratch_bytes(mf_quant_kind k, int M, int K, int N) {
    (void)M;
    if (k == MF_QUANT_F32 || K <= 0 || N <= 0) return 0;
    return (size_t)tile_rows(K) * (size_t)N * sizeof(float);
}

/* Both GEMMs run as one OpenMP region in which each thread dequantises its
 * own part of W and calls sgemm on it (OpenBLAS's OpenMP build runs
 * single-threaded inside a parallel region: num_cpu_avail() in its
 * common_thread.h returns 1 when omp_in_parallel()), so a call has one fork/join
 * instead of one per tile, and the threads never wait for each other
 * between tiles. The scratch (tile_rows(K) x N floats) is split between the
 * threads: in forward by columns (thread t owns out[:, n0:n1) and a
 * tile_rows x (n1 - n0) strip of W per step), in backward by rows (thread t
 * owns dinp[:, k0:k1) and tiles of tile_rows / threads full rows of W). */
static int gemm_threads(int limit) {
    int t = omp_in_parallel() ? 1 : omp_get_max_threads();
    return t > limit ? limit : (t < 1 ? 1 : t);
}

void mf_quant_matmul_forward(float *out, const float *inp, const void *wq, const float *bias, int M, int K, int N,
                             mf_quant_kind k, void *scratch) {
    if (M <= 0 || N <= 0) return;
    if (bias) {
#pragma omp parallel for schedule(static) if ((int64_t)M * N >= PAR_MIN)
        for (int m = 0; m < M; m++) memcpy(out + (size_t)m * N, bias, (size_t)N * sizeof(float));
    } else if (K <= 0) {
        memset(out, 0, (size_t)M * N * sizeof(float));
    }
    if (K <= 0) return;
    float beta0 = bias ? 1.0f : 0.0f;
    if (k == MF_QUANT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, inp, K, (const float *)wq, N, beta0,
                    out, N);
        return;
    }
    int tr = tile_rows(K);
#pragma omp parallel num_threads(gemm_threads(N))
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int n0 = (int)((int64_t)N * t / nt), n1 = (int)((int64_t)N * (t + 1) / nt), w = n1 - n0;
        float *s = (float *)scratch + (size_t)tr * n0; /* this thread's tr x w strip */
        for (int k0 = 0; k0 < K && w > 0; k0 += tr) {
            int kt = K - k0 < tr ? K - k0 : tr;
            for (int r = 0; r < kt; r++) unpack_serial(k, s + (size_t)r * w, wq, (int64_t)(k0 + r) * N + n0, w);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, w, kt, 1.0f, inp + k0, K, s, w,
                        k0 == 0 ? beta0 : 1.0f, out + n0, N);
        }
    }
}

void mf_quant_matmul_backward_input(float *dinp, const float *dout, const void *wq, int M, int K, int N,
                                    mf_quant_kind k, void *scratch) {
    if (M <= 0 || K <= 0 || N <= 0) return;
    if (k == MF_QUANT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, N, 1.0f, dout, N, (const float *)wq, N, 1.0f,
                    dinp, K);
        return;
    }
    int tr = tile_rows(K);
#pragma omp parallel num_threads(gemm_threads(tr))
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads(), h = tr / nt;
        int ka = (int)((int64_t)K * t / nt), kb = (int)((int64_t)K * (t + 1) / nt);
        float *s = (float *)scratch + (size_t)t * h * N; /* this thread's h x N tile */
        for (int k0 = ka; k0 < kb; k0 += h) {
            int kt = kb - k0 < h ? kb - k0 : h;
            unpack_serial(k, s, wq, (int64_t)k0 * N, (int64_t)kt * N);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, kt, N, 1.0f, dout, N, s, N, 1.0f, dinp + k0, K);
        }
    }
}

/* ---- nn.Linear layout: W (N,K), row n = output n's K weights ---------- */

/* The Conv1D kernels above, mirrored: W's rows are now outputs, so the
 * forward (out = inp @ W^T) dequantises whole rows of W, the way the Conv1D
 * backward does, and the backward (dinp += dout @ W) dequantises column
 * strips of W's rows, the way the Conv1D forward does. Scratch is one tile
 * of tr = min(N, MF_QUANT_TILE_ROWS) rows of K floats in both:
 *  - forward: thread t owns out[:, n0:n1) (W's rows n0..n1) and steps
 *    through them h = tr / threads rows at a time; h full rows are h*K
 *    consecutive packed values, one unpack_serial, into its h x K slice of
 *    scratch at t*h*K, then sgemm(NoTrans, Trans) on it;
 *  - backward: thread t owns dinp[:, ka:kb) and steps through W's rows tr
 *    at a time, dequantising the pieces [ka, kb) of each row (one
 *    unpack_serial per row) into its tr x (kb - ka) strip of scratch at
 *    tr*ka, then sgemm(NoTrans, NoTrans) on it.
 * No two threads write the same element of out or dinp, and each element's
 * sum runs over the same tiles on any thread count. */

size_t mf_quant_linear_scratch_bytes(mf_quant_kind k, int M, int K, int N) {
    (void)M;
    if (k == MF_QUANT_F32 || K <= 0 || N <= 0) return 0;
    return (size_t)tile_rows(N) * (size_t)K * sizeof(float);
}

/* out[:, n0:n1) = beta * out + bias (bias NULL: + 0), over M rows of ldo;
 * beta 0 writes without reading (out may hold NaN). The forward's first
 * write when there is a bias, or no product (K = 0). */
static void linear_prep(float *out, int ldo, const float *bias, float beta, int M, int n0, int n1) {
    for (int m = 0; m < M; m++) {
        float *o = out + (size_t)m * ldo;
        if (beta == 0.0f) {
            if (bias) memcpy(o + n0, bias + n0, (size_t)(n1 - n0) * sizeof(float));
            else memset(o + n0, 0, (size_t)(n1 - n0) * sizeof(float));
        } else if (bias) {
            for (int n = n0; n < n1; n++) o[n] = beta * o[n] + bias[n];
        } else if (beta != 1.0f) {
            for (int n = n0; n < n1; n++) o[n] *= beta;
        }
    }
}

void mf_quant_linear_forward(float *out, int ldo, const float *inp, const void *wq, const float *bias, int M, int K,
                             int N, float beta, mf_quant_kind k, void *scratch) {
    if (M <= 0 || N <= 0) return;
    if (ldo < N) mf_panic("mf_quant_linear_forward: ldo %d < N %d", ldo, N);
    if (K <= 0 || (bias && k == MF_QUANT_F32)) {
        /* whole-matrix prep: nothing else runs (K = 0), or one sgemm follows */
#pragma omp parallel for schedule(static) if ((int64_t)M * N >= PAR_MIN)
        for (int m = 0; m < M; m++) linear_prep(out + (size_t)m * ldo, ldo, bias, beta, 1, 0, N);
        if (K <= 0) return;
    }
    float beta0 = bias ? 1.0f : beta; /* the first sgemm's beta: a bias is already in out */
    if (k == MF_QUANT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp, K, (const float *)wq, K, beta0, out,
                    ldo);
        return;
    }
    int tr = tile_rows(N);
#pragma omp parallel num_threads(gemm_threads(tr))
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads(), h = tr / nt;
        int n0 = (int)((int64_t)N * t / nt), n1 = (int)((int64_t)N * (t + 1) / nt);
        float *s = (float *)scratch + (size_t)t * h * K; /* this thread's h x K tile */
        if (bias && n1 > n0) linear_prep(out, ldo, bias, beta, M, n0, n1);
        for (int r0 = n0; r0 < n1; r0 += h) {
            int rt = n1 - r0 < h ? n1 - r0 : h;
            unpack_serial(k, s, wq, (int64_t)r0 * K, (int64_t)rt * K);
            /* each tile is its own columns' whole sum over K: beta0 every time */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, rt, K, 1.0f, inp, K, s, K, beta0, out + r0,
                        ldo);
        }
    }
}

void mf_quant_linear_backward_input(float *dinp, const float *dout, int ldd, const void *wq, int M, int K, int N,
                                    mf_quant_kind k, void *scratch) {
    if (M <= 0 || K <= 0 || N <= 0) return;
    if (ldd < N) mf_panic("mf_quant_linear_backward_input: ldd %d < N %d", ldd, N);
    if (k == MF_QUANT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, ldd, (const float *)wq, K, 1.0f,
                    dinp, K);
        return;
    }
    int tr = tile_rows(N);
#pragma omp parallel num_threads(gemm_threads(K))
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int ka = (int)((int64_t)K * t / nt), kb = (int)((int64_t)K * (t + 1) / nt), w = kb - ka;
        float *s = (float *)scratch + (size_t)tr * ka; /* this thread's tr x w strip */
        for (int o0 = 0; o0 < N && w > 0; o0 += tr) {
            int ot = N - o0 < tr ? N - o0 : tr;
            for (int r = 0; r < ot; r++) unpack_serial(k, s + (size_t)r * w, wq, (int64_t)(o0 + r) * K + ka, w);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, w, ot, 1.0f, dout + o0, ldd, s, w, 1.0f,
                        dinp + ka, K);
        }
    }
}

int mf_quant_pack_stream(mf_quant_kind k, void *dst, int64_t n, mf_quant_fill_fn fill, void *ctx) {
    if (n <= 0) return 0;
    const int64_t part = MF_QUANT_STREAM_PART;
    float *buf = malloc((size_t)(n < part ? n : part) * sizeof(float));
    if (!buf) return mf_fail("out of memory packing a quantised tensor (%lld floats)", (long long)(n < part ? n : part));
    float off = 0.0f;
    if (k == MF_QUANT_NF4) {  /* the mean of every block's absmax comes first */
        mf_quant_nf4_stats st = {0};
        for (int64_t lo = 0; lo < n; lo += part) {
            int64_t len = n - lo < part ? n - lo : part;
            fill(ctx, buf, lo, len);
            mf_quant_nf4_stats_add(&st, buf, len);
        }
        off = mf_quant_nf4_offset(&st);
    }
    for (int64_t lo = 0; lo < n; lo += part) {
        int64_t len = n - lo < part ? n - lo : part;
        fill(ctx, buf, lo, len);
        mf_quant_pack_part(k, dst, buf, lo, len, off);
    }
    free(buf);
    return 0;
}
