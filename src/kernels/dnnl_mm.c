/* bf16 GEMM through oneDNN's matmul primitive (see memfit/half.h).
 *
 * A primitive is described and created per call; oneDNN's own primitive
 * cache makes repeats cheap (microseconds against milliseconds of GEMM).
 * The scratchpad is user-managed, so every byte the GEMM touches beyond its
 * operands is a plan row. */
#include "memfit/core.h"
#include "memfit/half.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>

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

/* Builds the primitive descriptor for one call's shape; NULL with mf_error
 * set on failure. */
static dnnl_primitive_desc_t describe(int M, int N, int K, int tA, int tB, int accumulate, int c_bf16, int bias) {
    if (setup()) return NULL;
    if (M <= 0 || N <= 0 || K <= 0) { mf_fail("bf16 GEMM: bad shape %dx%dx%d", M, N, K); return NULL; }
    dnnl_memory_desc_t a, b, c, bi;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N}, dbias = {1, N};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    if (dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, tA ? dnnl_ba : dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, tB ? dnnl_ba : dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&c, 2, dc, c_bf16 ? dnnl_bf16 : dnnl_f32, dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&bi, 2, dbias, dnnl_f32, dnnl_ab) ||
        dnnl_matmul_desc_init(&md, &a, &b, bias ? &bi : NULL, &c) || dnnl_primitive_attr_create(&attr) ||
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) {
        mf_fail("oneDNN: cannot describe a %dx%dx%d bf16 matmul", M, N, K);
        goto out;
    }
    if (accumulate) {
        if (dnnl_post_ops_create(&ops) || dnnl_post_ops_append_sum(ops, 1.0f) ||
            dnnl_primitive_attr_set_post_ops(attr, ops)) {
            mf_fail("oneDNN: cannot add the accumulate post-op");
            goto out;
        }
    }
    if (dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) != dnnl_success) {
        mf_fail("oneDNN: no bf16 matmul implementation for %dx%dx%d", M, N, K);
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

size_t mf_gemm_bf16_scratch_bytes(int M, int N, int K, int tA, int tB, int accumulate, int c_bf16, int bias) {
    dnnl_primitive_desc_t pd = describe(M, N, K, tA, tB, accumulate, c_bf16, bias);
    if (!pd) return SIZE_MAX;
    size_t n = scratch_of(pd);
    dnnl_primitive_desc_destroy(pd);
    return n;
}

int mf_gemm_bf16(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                 int tA, int tB, int accumulate, int c_bf16, void *scratch) {
    return mf_gemm_bf16_sized(C, A, B, bias, M, N, K, tA, tB, accumulate, c_bf16, scratch, SIZE_MAX);
}

int mf_gemm_bf16_sized(void *C, const mf_bf16 *A, const mf_bf16 *B, const float *bias, int M, int N, int K,
                       int tA, int tB, int accumulate, int c_bf16, void *scratch, size_t scratch_bytes) {
    dnnl_primitive_desc_t pd = describe(M, N, K, tA, tB, accumulate, c_bf16, bias != NULL);
    if (!pd) return -1;
    int rc = -1;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[5] = {0};
    const dnnl_memory_desc_t *mds[5] = {
        dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0),
        bias ? dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1) : NULL,
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
    };
    void *ptr[5] = {(void *)A, (void *)B, C, (void *)bias, scratch};
    int arg[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    size_t need = scratch_of(pd);
    if (need && !scratch) { mf_fail("bf16 GEMM: %zu bytes of scratch needed, none given", need); goto out; }
    if (need > scratch_bytes) { mf_fail("bf16 GEMM: %zu bytes of scratch needed, %zu given", need, scratch_bytes); goto out; }
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
        mf_fail("oneDNN: the %dx%dx%d bf16 matmul failed", M, N, K);
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

const char *mf_gemm_bf16_impl(void) {
    static char name[64];
    dnnl_primitive_desc_t pd = describe(256, 768, 768, 0, 0, 0, 0, 0);
    if (!pd) return "";
    const char *s = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) == dnnl_success && s)
        snprintf(name, sizeof name, "%s", s);
    dnnl_primitive_desc_destroy(pd);
    return name;
}
