/* memfit dist: data parallelism over Open MPI, and ZeRO sharding (Rajbhandari
 * et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
 * Parameter Models", arXiv:1910.02054).
 *
 * Owns: the MPI session (one per process, started only when a launcher such
 * as mpirun started the process; otherwise the world is one rank and no MPI
 * call is made), the split of every tensor into per-rank shards, and the
 * collectives on float buffers. Promises: collectives are Open MPI's own
 * (MPI_Iallreduce, MPI_Ireduce to each shard's owner or with
 * MEMFIT_DIST_RS=block MPI_Ireduce_scatter_block, MPI_Iallgatherv, in place),
 * cut into messages of at most MF_DIST_BUCKET floats; memfit's scratch for
 * them is the planned comm.bucket row, and the library's own scratch for a
 * bucket is measured once and planned as the comm.mpi.* rows, outside the
 * arena (MEMFIT_DIST_RING=1
 * runs memfit's former rings of MPI_Sendrecv instead); every rank ends
 * a collective with bitwise the same values; results do not depend on the
 * number of ranks beyond float summation order. A failed MPI call returns -1
 * with a message; a rank that dies makes the launcher stop the others, and
 * a collective that waits longer than dist_timeout fails with a message.
 */
#ifndef MEMFIT_DIST_H
#define MEMFIT_DIST_H

#include <stdint.h>
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/model.h"

#ifdef __cplusplus
extern "C" {
#endif


/* Starts MPI when a launcher started this process (idempotent). Ranks other
 * than 0 send stdout to /dev/null (rank 0 logs for the job). */
int mf_dist_init(void);
/* 1 when MPI is running (under a launcher). */
int mf_dist_active(void);
int mf_dist_world(void);  /* 1 without a launcher */
int mf_dist_rank(void);   /* 0 without a launcher */
/* Ends the MPI session with the process's exit status: MPI_Finalize when
 * rc == 0, else MPI_Abort so the other ranks stop instead of waiting in a
 * collective. Returns rc. Without MPI it only returns rc. */
int mf_dist_finish(int rc);

/* At a step boundary, every rank calls it: *sig is this rank's stop signal
 * (0 = none; a SIGTERM or SIGINT that reached the rank under a launcher
 * counts too); on return it is the largest over the ranks, so every rank
 * stops after the same step. Under mpirun a SIGTERM that does not lead to
 * this agreement within 80% of odls_base_sigkill_timeout (1 s by default;
 * raise it with --mca odls_base_sigkill_timeout S for long steps) stops the
 * rank with "stopped by the MPI launcher". */
int mf_dist_stop_agree(int *sig);

/* Seconds a collective may wait for a peer before it fails (0 = forever;
 * default 300): the config key dist_timeout. */
void mf_dist_set_timeout(double seconds);

/* Floats in one message of a collective at most (4 MiB): longer tensors
 * go as several messages, so the MPI library's scratch stays bounded. */
#define MF_DIST_BUCKET (1 << 20)
int64_t mf_dist_bucket(void);
typedef enum { MF_DIST_ALLREDUCE, MF_DIST_REDUCE_SCATTER, MF_DIST_ALLGATHER, MF_DIST_COLL_COUNT } mf_dist_coll;
/* Measures, once, the resident bytes the MPI library adds for each
 * collective's first call on a full bucket (collective: every rank calls
 * it, at the same point). The first training plan calls it (mf_zero_plan),
 * after the trainer read its baseline RSS and before the arena is mapped,
 * so the baseline holds none of it and the plan's comm.mpi.* rows hold it.
 * Rank 0 caches the result per host, bucket, world size and transport
 * (OMPI_MCA_btl) in $MEMFIT_CACHE for estimate and plan. No-op without MPI
 * or on one rank. */
int mf_dist_measure_scratch(void);
/* This run's measurement (0 before it, without MPI or on one rank). */
size_t mf_dist_mpi_scratch(mf_dist_coll c);
/* Where the comm.mpi.* rows' sizes came from. */
typedef enum {
    MF_DIST_SCRATCH_NONE,     /* one rank: no rows */
    MF_DIST_SCRATCH_DEFAULT,  /* never measured on this machine: 1.5 x the bucket's bytes for the all-reduce and the
                               * reduce-scatter, 0 for the all-gather */
    MF_DIST_SCRATCH_CACHED,   /* an earlier run's measurement on this machine (same bucket and world size; this
                               * transport's, else the largest over the transports measured) */
    MF_DIST_SCRATCH_MEASURED  /* this run's (mf_dist_measure_scratch) */
} mf_dist_scratch_src;
/* The bytes per collective to plan for `world` ranks (out has
 * MF_DIST_COLL_COUNT entries) and where they came from. */
mf_dist_scratch_src mf_dist_scratch_plan(int world, size_t *out);
/* The source of the last mf_dist_scratch_plan, and its description. */
mf_dist_scratch_src mf_dist_scratch_source(void);
const char *mf_dist_scratch_source_name(mf_dist_scratch_src s);

/* Rank r's shard of n elements: [lo, hi) with lo = n*r/world (floor). */
void mf_dist_shard(int64_t n, int world, int rank, int64_t *lo, int64_t *hi);
/* Reduce-scatter of x[n] summed over the ranks, in place: on return
 * this rank's shard of x holds the sum; the rest of x is garbage. scratch
 * holds scratch_n floats (at least the number of ranks; messages are cut
 * to it: each carries scratch_n / ranks floats of every rank's shard). */
int mf_dist_reduce_scatter(float *x, int64_t n, float *scratch, int64_t scratch_n);
/* All-gather in place: each rank's shard of x[n] is copied to all. */
int mf_dist_allgather(float *x, int64_t n);
/* Background collectives: jobs queued in order and run one after another
 * by one thread while the caller computes. x, acc and scratch must stay
 * untouched until the job is done. Any other collective the caller starts
 * first waits for every queued job (MPI runs THREAD_SERIALIZED).
 * Background all-gather in place (ZeRO 3's prefetch): mf_dist_allgather on
 * x[0..k) (n[i] elements each). */
int mf_dist_gather_start(float *const *x, const int64_t *n, int k);
/* Waits for every queued job and returns the first failure's result. */
int mf_dist_gather_wait(void);
/* Waits for the last all-gather queued (the prefetch) and the jobs queued
 * before it only: a gradient reduction queued after it keeps running (ZeRO
 * 3's overlap: a layer's reduce-scatter queues behind the prefetch of the
 * layer before it). */
int mf_dist_prefetch_wait(void);
/* Background reduce-scatter (ZeRO 2-3's overlap): reduce-scatters x[0..k)
 * (n[i] elements each, scratch as mf_dist_reduce_scatter) and adds this
 * rank's shard of each into acc[i]; completed by mf_dist_gather_wait or by
 * the caller's next collective. */
int mf_dist_reduce_start(float *const *x, const int64_t *n, float *const *acc, int k, float *scratch, int64_t scratch_n);
/* acc == NULL: the reduced shard stays in x (ZeRO 1's overlap). The same
 * for an all-reduce of x[0..k) in place (ZeRO 0's overlap). */
int mf_dist_allreduce_start(float *const *x, const int64_t *n, int k, float *scratch, int64_t scratch_n);
/* Background job of the caller's own: a thread runs fn(ctx) (which makes
 * collectives of this file) as it runs the jobs above, joined by
 * mf_dist_gather_wait or the caller's next collective; fn's -1 fails the
 * join with fn's message. For grad16.c. */
int mf_dist_job_start(int (*fn)(void *ctx), void *ctx);
/* Seconds so far in collectives the main thread ran itself (sync), in
 * background collectives (bg), and that the main thread waited for
 * background ones to finish (wait): bg - wait of the communication was
 * hidden behind compute. */
void mf_dist_comm_times(double *sync_s, double *bg_s, double *wait_s);
/* Bytes this rank's collectives moved so far at a bandwidth-optimal
 * algorithm's volume ((W-1)/W of each reduce-scatter's or all-gather's
 * buffer, twice that for an all-reduce; the ZeRO paper's count): the
 * measured side of memfit plan's communication volume. */
double mf_dist_comm_bytes(void);
/* Sum of x[n] over the ranks on every rank (MPI_Iallreduce by buckets;
 * the rings use scratch for a reduce-scatter + all-gather). */
int mf_dist_allreduce(float *x, int64_t n, float *scratch, int64_t scratch_n);
/* Sums n doubles over the ranks, in place (small: loss, norms). */
int mf_dist_sum_doubles(double *x, int n);
/* The same over this rank's shard group only (the ranks that together hold
 * every shard once; the world without zero_group). */
int mf_dist_sum_doubles_group(double *x, int n);

/* Hybrid sharding (FSDP's hybrid shard; config zero_group): groups of n
 * consecutive ranks each shard the state, and the groups replicate one
 * another. Splits the communicators (collective: every rank calls it once,
 * at the trainer's start); n == 0 or n == world keeps one group. Refuses an
 * n that does not divide the world. From then on mf_dist_reduce_scatter
 * reduce-scatters inside the group and all-reduces the shard across the
 * groups, and mf_dist_allgather gathers inside the group. */
int mf_dist_set_group(int n);
/* Ranks in this rank's shard group (the world without zero_group). */
int mf_dist_group(void);

/* Completes n MPI requests (MPI_Request *req) as every collective here
 * does: polled, failing after dist_timeout without progress. For
 * alltoall.c; `what` names the collective in the message. */
int mf_dist_wait(void *req, int n, const char *what);

/* ---- expert parallel (alltoall.c) --------------------------------------- */

/* Refuses what expert_parallel (cfg) cannot do on `world` ranks: N not
 * dividing the ranks, ZeRO 1-3, zero_group, recompute that rebuilds whole
 * blocks; train (1) also: no MPI launcher, and LoRA with a checkpoint
 * (out_dir, resume). 0 when N <= 1. */
int mf_dist_ep_check(const mf_config *cfg, int world, int train);
/* Splits the world into expert groups of n consecutive ranks (rank / n)
 * and the replica sets of the ranks holding the same experts (rank % n);
 * collective, once at the trainer's start. n <= 1: nothing. */
int mf_dist_ep_init(int n);
/* Ranks in this rank's expert group, and this rank's place in it (1, 0
 * before mf_dist_ep_init or without expert parallelism). */
int mf_dist_ep_size(void);
int mf_dist_ep_rank(void);
/* MPI_Allgather of E ints per rank within the expert group, in group rank
 * order: all[p*E + e] = rank p's mine[e]. */
int mf_dist_ep_allgather_ints(const int32_t *mine, int32_t *all, int E);
/* MPI_Alltoallv of floats within the expert group: scnt[p] floats from
 * send + sdisp[p] go to group rank p, rcnt[p] floats from p land at
 * recv + rdisp[p] (counts and displacements in floats, each below 2^31). */
int mf_dist_ep_alltoallv(const float *send, const int64_t *scnt, const int64_t *sdisp, float *recv,
                         const int64_t *rcnt, const int64_t *rdisp);
/* Sum of x[n] over the ranks that hold the same experts (the W / N
 * replicas), in place, by buckets: the experts' gradients. */
int mf_dist_ep_allreduce(float *x, int64_t n);
/* Sums n doubles over the expert group, in rank order (the same bits on
 * every rank of the group). */
int mf_dist_ep_sum_doubles(double *x, int n);
/* bytes to / from group rank `to` / `from` of this rank's expert group (one
 * message each, matched in the order sent; rank 0 gathering the experts'
 * adapters for its file) */
int mf_dist_ep_send(const void *buf, size_t bytes, int to);
int mf_dist_ep_recv(void *buf, size_t bytes, int from);

/* A file path of this rank's own: `path` on one rank, else
 * "path.rank<r>" (offload files under mpirun). Returns buf. */
const char *mf_dist_rank_path(const char *path, char *buf, size_t n);
/* Collective: refuses (-1, one line naming both paths) when the open file
 * fd is the same file (host, device, inode) as another rank's, as when a
 * rank's path is a link to another's. 0 on one rank. */
int mf_dist_file_private(int fd, const char *path);

/* ---- bf16 gradients (grad16.c) ----------------------------------------- */

/* grad_dtype bf16 over the ranks: the bf16 row g[n] summed in fp32, a
 * piece at a time widened into bucket[bucket_n] (the comm.bucket row),
 * all-reduced (mf_dist_allreduce) and rounded to nearest-even back into g:
 * one rounding of the sum, the same bits on every rank. */
int mf_grad16_allreduce(uint16_t *g, int64_t n, float *bucket, int64_t bucket_n);
/* The same for k gradient rows (g16[i]: row i is bf16, else fp32 and
 * all-reduced in place) in a background job (ZeRO 0's overlap); the bucket
 * and the rows stay untouched until mf_dist_gather_wait. */
int mf_grad16_allreduce_start(void *const *g, const int64_t *n, const int *g16, int k, float *bucket, int64_t bucket_n);
/* Sum of squares of a bf16 row, widened, in double. */
double mf_grad16_sumsq(const uint16_t *g, int64_t n);

/* ---- ZeRO ------------------------------------------------------------- */

/* Refuses settings ZeRO cannot honour on `world` ranks (a batch not
 * divisible by the ranks, stage 3 with block recompute, an optimizer whose state is not
 * element-wise under sharding, update_in_backward). */
int mf_zero_check(const mf_config *cfg, int world);
/* The plan rows data parallelism adds to a training plan whose model was
 * planned with m->opt.zero/world/rank: the reduce-scatter's bucket scratch
 * (comm.bucket, in the arena), alive only while collectives run, and the
 * MPI library's own scratch per collective (comm.mpi.allreduce,
 * comm.mpi.reduce_scatter, comm.mpi.allgather: persistent rows outside the
 * arena, sized by mf_dist_scratch_plan; under MPI the first call measures
 * them). None on one rank. */
int mf_zero_plan(mf_plan *plan, const mf_model *m);
/* Ranks one tensor is sharded over: zero_group, or the world when 0. */
int mf_zero_shards(const mf_optim *o);
/* Bytes each rank's collectives move per optimizer step for psi fp32
 * parameters at stage zero on world ranks in shard groups of `group`
 * (0 = world), with bandwidth-optimal collectives ((W-1)/W of a buffer per
 * reduce-scatter or all-gather, twice that per all-reduce): the ZeRO
 * paper's 2 Psi (stages 0-2) and 3 Psi (stage 3), section 7; with hybrid
 * groups of N among G = W/N, the reduce-scatter and gathers move (N-1)/N
 * and the shard's all-reduce across the groups 2 (G-1)/G of Psi/N. */
double mf_zero_comm_volume(int zero, int world, int group, double psi);
/* Elements of the bucket scratch (the comm.bucket row). */
int64_t mf_zero_ring_numel(const mf_model *m);

/* Bytes of the rows that live through the whole step (the model states
 * the ZeRO paper counts: parameters, gradients, optimizer state), per
 * category; out has MF_CAT_COUNT entries. */
void mf_zero_model_states(const mf_plan *p, size_t *out);

/* After the step's last backward, in the optimizer phase: stage 0
 * all-reduces every gradient, stage 1 reduce-scatters them (each rank's
 * shard is summed), stage 2 has done so already during backward. */
int mf_zero_sync_grads(mf_model *m, mf_arena *a);
/* Stage 2, from the model's grads_ready: tensors [first, first+n) hold
 * this micro-batch's full gradient; reduce-scatter them and add this rank's
 * shard into the persistent shard rows. */
int mf_zero_grads_ready(mf_model *m, mf_arena *a, int first, int n);
/* Sum of squares of the gradient elements this rank holds after the sync,
 * summed over the ranks when they hold different shards. */
int mf_zero_grad_sumsq(mf_model *m, mf_arena *a, double *out);
/* Stages 1 and 2, after each rank updated its shard: all-gathers the
 * parameters. */
int mf_zero_gather_params(mf_model *m, mf_arena *a);
/* Stage 3, as a phase that reads tensors [first, first+n) starts: gathers
 * each from the ranks' shards into the row this phase reads (the model
 * calls it). */
int mf_zero_params_needed(mf_model *m, mf_arena *a, int first, int n);
/* Stage 3, one phase ahead: starts gathering tensors [first, first+n) into
 * the rows the next phase reads (alive from this phase on); the model
 * completes it with mf_dist_gather_wait when that phase starts. */
int mf_zero_params_prefetch(mf_model *m, mf_arena *a, int first, int n);

#ifdef __cplusplus
}
#endif
#endif
