/* oneDNN matmul (dnnl_mm.h), and the bf16 GEMM on it (see kernels/half.h). */
#include "memfit/core.h"
#include "kernels/half.h"
#include "dnnl_mm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static int setup(void) {
    if (stream) return 0;
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return mf_fail("oneDNN: cannot create a CPU engine");
    if (dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(engine);
        engine = NULL;
        return mf_fail("oneDNN: cannot create a stream");
    }
    return 0;
}

static const char *tname(dnnl_data_type_t t) { return t == dnnl_bf16 ? "bf16" : "fp32"; }

/* Builds the primitive descriptor for one call; NULL with mf_error set on
 * failure. */
static dnnl_primitive_desc_t describe(const mf_mm *s) {
    if (setup()) return NULL;
    if (s->M <= 0 || s->N <= 0 || s->K <= 0) {
        mf_fail("%s GEMM: bad shape %dx%dx%d", tname(s->ab), s->M, s->N, s->K);
        return NULL;
    }
    dnnl_memory_desc_t a, b, c, bi;
    /* row-major with leading dimensions: op(A) (M,K) is A (M,K) with strides
     * (lda, 1), or A^T of a (K,M) A with strides (1, lda); likewise B */
    dnnl_dims_t da = {s->M, s->K}, db = {s->K, s->N}, dc = {s->M, s->N}, dbias = {1, s->N};
    dnnl_dims_t sa = {s->ta ? 1 : s->lda, s->ta ? s->lda : 1}, sb = {s->tb ? 1 : s->ldb, s->tb ? s->ldb : 1};
    dnnl_dims_t sc = {s->ldc, 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    if (dnnl_memory_desc_init_by_strides(&a, 2, da, s->ab, sa) ||
        dnnl_memory_desc_init_by_strides(&b, 2, db, s->ab, sb) ||
        dnnl_memory_desc_init_by_strides(&c, 2, dc, s->c, sc) ||
        dnnl_memory_desc_init_by_tag(&bi, 2, dbias, dnnl_f32, dnnl_ab) ||
        dnnl_matmul_desc_init(&md, &a, &b, s->bias ? &bi : NULL, &c) || dnnl_primitive_attr_create(&attr) ||
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) {
        mf_fail("oneDNN: cannot describe a %dx%dx%d %s matmul", s->M, s->N, s->K, tname(s->ab));
        goto out;
    }
    if (s->alpha != 1.0f && dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s->alpha)) {
        mf_fail("oneDNN: cannot scale a matmul by %g", s->alpha);
        goto out;
    }
    if (s->beta != 0.0f) {
        if (dnnl_post_ops_create(&ops) || dnnl_post_ops_append_sum(ops, s->beta) ||
            dnnl_primitive_attr_set_post_ops(attr, ops)) {
            mf_fail("oneDNN: cannot add the accumulate post-op");
            goto out;
        }
    }
    if (dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) != dnnl_success) {
        mf_fail("oneDNN: no %s matmul implementation for %dx%dx%d", tname(s->ab), s->M, s->N, s->K);
        pd = NULL;
    }
out:
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return pd;
}

static size_t scratch_of(dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return smd ? dnnl_memory_desc_get_size(smd) : 0;
}

static size_t scratch_one(const mf_mm *s) {
    dnnl_primitive_desc_t pd = describe(s);
    if (!pd) return SIZE_MAX;
    size_t n = scratch_of(pd);
    dnnl_primitive_desc_destroy(pd);
    return n;
}

static int run_one(const mf_mm *s, const void *A, const void *B, const float *bias, void *C, void *scratch,
                   size_t scratch_bytes) {
    dnnl_primitive_desc_t pd = describe(s);
    if (!pd) return -1;
    int rc = -1;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[5] = {0};
    const dnnl_memory_desc_t *mds[5] = {
        dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0),
        s->bias ? dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1) : NULL,
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
    };
    void *ptr[5] = {(void *)A, (void *)B, C, (void *)bias, scratch};
    int arg[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    size_t need = scratch_of(pd);
    if (need && !scratch) { mf_fail("%s GEMM: %zu bytes of scratch needed, none given", tname(s->ab), need); goto out; }
    if (need > scratch_bytes) {
        mf_fail("%s GEMM: %zu bytes of scratch needed, %zu given", tname(s->ab), need, scratch_bytes);
        goto out;
    }
    for (int i = 0; i < 5; i++) {
        if (!ptr[i] || !mds[i] || (i == 4 && !need)) continue;
        if (dnnl_memory_create(&mem[i], mds[i], engine, ptr[i]) != dnnl_success) {
            mf_fail("oneDNN: cannot wrap a matmul operand");
            goto out;
        }
        args[nargs++] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    if (dnnl_primitive_create(&prim, pd) != dnnl_success) { mf_fail("oneDNN: cannot create the matmul"); goto out; }
    if (dnnl_primitive_execute(prim, stream, nargs, args) != dnnl_success || dnnl_stream_wait(stream) != dnnl_success) {
        mf_fail("oneDNN: the %dx%dx%d %s matmul failed", s->M, s->N, s->K, tname(s->ab));
        goto out;
    }
    rc = 0;
out:
    if (prim) dnnl_primitive_destroy(prim);
    for (int i = 0; i < 5; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* oneDNN 2.6's matmul runs wide-N and long-K products well below its sgemm
 * on this project's machine (bench/gemm_paths.c: 0.6-0.75x at N = 3072 and
 * at K = 3072 or 50304) and at or above it for N, K <= 1024: a product goes
 * as column blocks of at most `nt` and K-blocks of at most `kt` (near-equal
 * sizes), each a matmul on strided views of the operands (no copies); the
 * K-blocks after the first accumulate (beta 1) and the bias goes with the
 * first. A bf16 result is not K-blocked (each block would round it again).
 * bf16 operands with a transposed B (the output head's x E^T; the input
 * gradients' dY W^T have N <= 1024 anyway) are not column-blocked either: on
 * a strided column block oneDNN picks its gemm-based matmul instead of
 * brgemm, 583 against 696 GFLOP/s for gpt2-124m's head (256 x 50304 x 768,
 * docs/performance.md), while for the plain and transposed-A bf16 forms the
 * blocks are as fast or faster (the weight gradients 702-741 against
 * 638-653 GFLOP/s).
 * MEMFIT_MM_NT / MEMFIT_MM_KT override the sizes (benches; NT then applies
 * to every product). */
static int g_nt = 1024, g_kt = 1024, g_nt_env;
static pthread_once_t g_tiles = PTHREAD_ONCE_INIT;
static void tiles_init(void) {
    const char *e;
    if ((e = getenv("MEMFIT_MM_NT")) && atoi(e) > 0) g_nt = atoi(e), g_nt_env = 1;
    if ((e = getenv("MEMFIT_MM_KT")) && atoi(e) > 0) g_kt = atoi(e);
}
static int nblocks(int n, int t) { return (n + t - 1) / t; }
static int ktile(const mf_mm *s) { return s->c == dnnl_bf16 ? s->K : g_kt; }
static int ntile(const mf_mm *s) { return s->ab == dnnl_bf16 && s->tb && !g_nt_env ? s->N : g_nt; }
/* block i's length when n is cut into nblocks(n, t) near-equal blocks */
static int block_len(int n, int t, int i) {
    int nb = nblocks(n, t), b = (n + nb - 1) / nb;
    return i < nb - 1 ? b : n - b * (nb - 1);
}
static mf_mm tile_of(const mf_mm *s, int nb, int kb, int k) {
    mf_mm t = *s;
    t.N = nb, t.K = kb;
    if (k) t.beta = 1.0f, t.bias = 0;
    return t;
}

/* bf16 operands, an fp32 result and no bias go through oneDNN's bf16 gemm
 * (its sgemm-like entry point: one call on the whole shape, packing
 * buffers from malloc like its sgemm's, warmed before the baseline by
 * mf_model_gemm16_warmup) instead of the matmul primitive: 1.06 against
 * 1.16 s for gpt2-124m B4 T256's GEMMs a step, faster on every shape but
 * the head's forward (equal), e.g. the head's weight gradient over 512
 * rows 716 against 560 GFLOP/s, the projections' weight gradients 671-745
 * against 605-670 (docs/performance.md). libdnnl 2.x exports it (its own
 * tests call it) without declaring it in its headers, so it is looked up
 * at run time (dlsym), not linked: a libdnnl without it, one where the
 * first call fails, or MEMFIT_GEMM16=matmul keeps the matmul for all. A
 * bias (the fused add) or a bf16 result (grad_dtype bf16: the sum post-op
 * rounds once) stays on the matmul. */
typedef dnnl_status_t (*gemm16_fn)(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, float alpha,
                                   const uint16_t *A, dnnl_dim_t lda, const uint16_t *B, dnnl_dim_t ldb, float beta,
                                   float *C, dnnl_dim_t ldc);
static gemm16_fn g_gemm16;  /* NULL: the matmul for every bf16 product */
static pthread_once_t g_direct_once = PTHREAD_ONCE_INIT;
static void direct_init(void) {
    const char *e = getenv("MEMFIT_GEMM16");
    if (e && strcmp(e, "matmul") == 0) return;
    gemm16_fn f;
    void *sym = dlsym(RTLD_DEFAULT, "dnnl_gemm_bf16bf16f32");
    if (!sym) return;
    memcpy(&f, &sym, sizeof f);  /* POSIX: a data pointer from dlsym holds the function's address */
    const uint16_t a[4] = {0x3f80, 0x4000, 0x4040, 0x4080}, b[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80}; /* 1 2 3 4 and ones */
    float c[4] = {0};
    if (f('N', 'N', 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) == dnnl_success && c[0] == 3.0f && c[3] == 7.0f) g_gemm16 = f;
}
static int direct(const mf_mm *s) {
    pthread_once(&g_direct_once, direct_init);
    return g_gemm16 && s->ab == dnnl_bf16 && s->c == dnnl_f32 && !s->bias && s->M > 0 && s->N > 0 && s->K > 0;
}

size_t mf_mm_scratch(const mf_mm *s) {
    pthread_once(&g_tiles, tiles_init);
    if (direct(s)) return 0;
    if (s->M <= 0 || s->N <= 0 || s->K <= 0) return scratch_one(s);
    const int kt = ktile(s), nt = ntile(s), nn = nblocks(s->N, nt), nk = nblocks(s->K, kt);
    size_t mx = 0;
    /* blocks differ only in the first and last lengths, and k > 0 */
    for (int j = 0; j < (nn > 1 ? 2 : 1); j++)
        for (int k = 0; k < (nk > 1 ? 2 : 1); k++)
            for (int first = 0; first < (nk > 2 && k ? 2 : 1); first++) {
                mf_mm t = tile_of(s, block_len(s->N, nt, j ? nn - 1 : 0),
                                  block_len(s->K, kt, k ? (first ? 1 : nk - 1) : 0), k);
                size_t n = scratch_one(&t);
                if (n == SIZE_MAX) return SIZE_MAX;
                if (n > mx) mx = n;
            }
    return mx;
}

int mf_mm_run(const mf_mm *s, const void *A, const void *B, const float *bias, void *C, void *scratch,
              size_t scratch_bytes) {
    pthread_once(&g_tiles, tiles_init);
    if (direct(s)) {
        if (g_gemm16(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, s->alpha, A, s->lda, B, s->ldb,
                                  s->beta, C, s->ldc) != dnnl_success)
            return mf_fail("oneDNN: the %dx%dx%d bf16 gemm failed", s->M, s->N, s->K);
        return 0;
    }
    if (s->M <= 0 || s->N <= 0 || s->K <= 0) return run_one(s, A, B, bias, C, scratch, scratch_bytes);
    const size_t ea = s->ab == dnnl_bf16 ? 2 : 4, ec = s->c == dnnl_bf16 ? 2 : 4;
    const int kt = ktile(s), nt = ntile(s), nn = nblocks(s->N, nt), nk = nblocks(s->K, kt);
    for (int j = 0, n0 = 0; j < nn; n0 += block_len(s->N, nt, j), j++)
        for (int k = 0, k0 = 0; k < nk; k0 += block_len(s->K, kt, k), k++) {
            mf_mm t = tile_of(s, block_len(s->N, nt, j), block_len(s->K, kt, k), k);
            /* op(A)[:, k0..] and op(B)[k0.., n0..] of the row-major operands */
            const char *a = (const char *)A + ea * (s->ta ? (size_t)k0 * s->lda : (size_t)k0);
            const char *b = (const char *)B + ea * (s->tb ? (size_t)n0 * s->ldb + k0 : (size_t)k0 * s->ldb + n0);
            if (run_one(&t, a, b, t.bias ? bias + n0 : NULL, (char *)C + ec * n0, scratch, scratch_bytes)) return -1;
        }
    return 0;
}

const char *mf_mm_impl(const mf_mm *s, char *buf, size_t n) {
    dnnl_primitive_desc_t pd = describe(s);
    if (!pd) return "";
    const char *str = NULL;
    buf[0] = 0;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &str) == dnnl_success && str)
        snprintf(buf, n, "%s", str);
    dnnl_primitive_desc_destroy(pd);
    return buf;
}

/* ---- bf16 GEMM ---------------------------------------------------------- */

static mf_mm bf16_call(int M, int N, int K, int tA, int tB, int accumulate, int c_bf16, int bias) {
    return (mf_mm){M, N, K, tA, tB, tA ? M : K, tB ? K : N, N, dnnl_bf16, c_bf16 ? dnnl_bf16 : dnnl_f32,
                   1.0f, accumulate ? 1.0f : 0.0f, bias};
}

size_t mf_gemm_bf16_scratch_bytes(int M, int N, int K, int tA, int tB, int accumulate, int c_bf16, int bias) {
    mf_mm s = bf16_call(M, N, K, tA, tB, accumulate, c_bf16, bias);
    return mf_mm_scratch(&s);
}

int mf_gemm_bf16(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                 int tA, int tB, int accumulate, int c_bf16, void *scratch) {
    return mf_gemm_bf16_sized(C, A, B, bias, M, N, K, tA, tB, accumulate, c_bf16, scratch, SIZE_MAX);
}

int mf_gemm_bf16_sized(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                       int tA, int tB, int accumulate, int c_bf16, void *scratch, size_t scratch_bytes) {
    mf_mm s = bf16_call(M, N, K, tA, tB, accumulate, c_bf16, bias != NULL);
    return mf_mm_run(&s, A, B, bias, C, scratch, scratch_bytes);
}

int mf_gemm_bf16_ldc(float *C, int ldc, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                     int tA, int tB, int accumulate, void *scratch, size_t scratch_bytes) {
    mf_mm s = bf16_call(M, N, K, tA, tB, accumulate, 0, bias != NULL);
    s.ldc = ldc;
    return mf_mm_run(&s, A, B, bias, C, scratch, scratch_bytes);
}

const char *mf_gemm_bf16_impl(void) {
    static char name[96];
    mf_mm s = bf16_call(256, 768, 768, 0, 0, 0, 0, 1);  /* with a bias: the matmul */
    char m[64];
    mf_mm_impl(&s, m, sizeof m);
    s.bias = 0;
    snprintf(name, sizeof name, direct(&s) ? "gemm_bf16bf16f32, %s with a bias" : "%s", m);
    return name;
}
