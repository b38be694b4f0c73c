/* grad_dtype bf16 under data parallel (see dist/dist.h, mf_grad16_*).
 *
 * MPI has no bf16 sum, and a sum of bf16 values rounded at every addition
 * would lose the bits the ranks' partial gradients add. So a bf16 gradient
 * row is never summed in bf16: a piece of it at a time is widened (exact)
 * into the fp32 comm.bucket row (the plan's, the one the reduce-scatter
 * packs into), all-reduced in fp32 with the same MPI_Iallreduce as an fp32
 * gradient, and rounded to nearest-even back into the row: the summed
 * gradient is rounded once, bitwise the same on every rank (the all-reduce
 * ends with the same bits everywhere), and the norm, clip and optimizer
 * widen it as they do in one process.
 *
 * Chosen over a reduce-scatter of fp32 slices followed by an all-gather of
 * the rounded bf16 shards (3/4 of the bytes on the wire): that needs a
 * 16-bit all-gather beside the float collectives, and ZeRO 0 needs every
 * element on every rank anyway; the all-reduce reuses the planned bucket,
 * the measured comm.mpi.allreduce scratch and the comm-volume count as
 * they are. ZeRO 1-3 are refused before this runs (16-bit weights are not
 * sharded yet). */
#include "dist/dist.h"
#include "kernels/half.h"
#include "memfit/kernels.h"

#include <string.h>

int mf_grad16_allreduce(uint16_t *g, int64_t n, float *bucket, int64_t bucket_n) {
    if (mf_dist_world() == 1) return 0;
    /* the bucket's first half holds the widened piece, the second half is
     * the collective's scratch (MEMFIT_DIST_RING=1's rings need one) */
    int64_t piece = bucket_n / 2, scr_n = bucket_n - piece;
    if (piece < 1 || !bucket)
        return mf_fail("rank %d: a bf16 gradient all-reduce needs a bucket of 2 floats or more (got %lld)", mf_dist_rank(),
                       (long long)bucket_n);
    float *scr = bucket + piece;
    for (int64_t o = 0; o < n; o += piece) {
        int64_t c = n - o < piece ? n - o : piece;
        mf_f32_from_bf16(bucket, g + o, (size_t)c);
        if (mf_dist_allreduce(bucket, c, scr, scr_n)) return -1;
        mf_bf16_from_f32(g + o, bucket, (size_t)c);
    }
    return 0;
}

double mf_grad16_sumsq(const uint16_t *g, int64_t n) {
    double s = 0;
    for (int64_t k = 0; k < n; k++) {
        double v = mf_bf16_to_f32(g[k]);
        s += v * v;
    }
    return s;
}

/* ZeRO 0's overlap: one block's gradients all-reduced by dist.c's
 * background thread (mf_dist_job_start), bf16 rows through the bucket as
 * above, fp32 rows in place. One job runs at a time, so one context. */
static struct {
    void *g[MF_LAYER_TENSORS];
    int64_t n[MF_LAYER_TENSORS];
    int g16[MF_LAYER_TENSORS], k;
    float *bucket;
    int64_t bucket_n;
} g_job;

static int job_run(void *ctx) {
    (void)ctx;
    for (int i = 0; i < g_job.k; i++) {
        int rc = g_job.g16[i] ? mf_grad16_allreduce(g_job.g[i], g_job.n[i], g_job.bucket, g_job.bucket_n)
                              : mf_dist_allreduce(g_job.g[i], g_job.n[i], g_job.bucket, g_job.bucket_n);
        if (rc) return -1;
    }
    return 0;
}

int mf_grad16_allreduce_start(void *const *g, const int64_t *n, const int *g16, int k, float *bucket, int64_t bucket_n) {
    if (mf_dist_world() == 1) return 0;
    if (k > MF_LAYER_TENSORS) return mf_fail("%d tensors in one gradient reduction (a block has %d)", k, MF_LAYER_TENSORS);
    /* the job before may still read g_job (and the bucket): join it first */
    if (mf_dist_gather_wait()) return -1;
    for (int i = 0; i < k; i++) g_job.g[i] = g[i], g_job.n[i] = n[i], g_job.g16[i] = g16[i];
    g_job.k = k, g_job.bucket = bucket, g_job.bucket_n = bucket_n;
    return mf_dist_job_start(job_run, NULL);
}
