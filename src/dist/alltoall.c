/* Expert parallelism's communicators and collectives (see dist/dist.h and
 * docs/moe.md, "Expert parallel").
 *
 * With expert_parallel N the world is cut into expert groups of N
 * consecutive ranks (rank / N): the ranks of a group hold disjoint slices
 * of every layer's experts and exchange tokens among themselves with
 * MPI_Alltoallv. The ranks that hold the same slice in every group (rank %
 * N, the W / N replicas) sum those experts' gradients among themselves;
 * everything else stays plain data parallel over the world (dist.c).
 * Every call here is Open MPI's own non-blocking collective, completed by
 * dist.c's polled wait (so dist_timeout holds), after joining any
 * background collective (MPI runs THREAD_SERIALIZED). */
#include "dist/dist.h"

#include <limits.h>
#include <mpi.h>
#include <string.h>

static MPI_Comm g_ep = MPI_COMM_NULL, g_rep = MPI_COMM_NULL;
static int g_ep_n = 1, g_ep_rank = 0, g_rep_n = 1;

static int mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return mf_fail("rank %d: %s failed: %s (another rank probably died or cannot be reached)", mf_dist_rank(), what, msg);
}

int mf_dist_ep_check(const mf_config *cfg, int world, int train) {
    int n = cfg->expert_parallel;
    if (n <= 1) return 0;
    if (train && !mf_dist_active())
        return mf_fail("expert_parallel %d needs MPI: run under mpirun -np W with W a multiple of %d (memfit estimate "
                       "--world_size W plans one rank)", n, n);
    if (world % n)
        return mf_fail("expert_parallel %d does not divide the %d ranks (groups of expert_parallel consecutive ranks "
                       "each hold every expert once)", n, world);
    if (cfg->zero != 0)
        return mf_fail("expert_parallel %d with zero %d is not supported: the experts are already split over the "
                       "group and the rest is replicated; use zero 0", n, cfg->zero);
    if (cfg->zero_group) return mf_fail("expert_parallel %d with zero_group %d is not supported; drop zero_group", n, cfg->zero_group);
    /* LoRA: each rank holds its experts' adapters (plan.c); a quantised
     * base is refused by the plan */
    if (strcmp(cfg->recompute, "none") != 0 && strcmp(cfg->recompute, "selective") != 0)
        return mf_fail("expert_parallel %d with recompute '%s' is not supported (a rebuilt block would exchange its "
                       "tokens again); use recompute none or selective", n, cfg->recompute);
    if (!train) return 0;
    /* --init, --out_dir and --resume: each rank loads and the first group
     * writes only its own experts (train/checkpoint.c) */
    /* --adapter / --save_adapter: each rank reads its experts' adapters,
     * rank 0 writes the one PEFT file (model/adapter.c) */
    if (cfg->lora[0] && (cfg->out_dir[0] || cfg->resume[0]))
        return mf_fail("expert_parallel %d with LoRA: --%s is not supported yet (a checkpoint of expert-split "
                       "adapters); keep the adapter with --save_adapter", n, cfg->out_dir[0] ? "out_dir" : "resume");
    return 0;
}

int mf_dist_ep_init(int n) {
    if (n <= 1 || !mf_dist_active()) return 0;
    if (g_ep != MPI_COMM_NULL) return 0;
    int W = mf_dist_world(), R = mf_dist_rank();
    if (W % n) return mf_fail("expert_parallel %d does not divide the %d ranks", n, W);
    if (mf_dist_gather_wait()) return -1;
    /* both splits are collective over the world: every rank calls this
     * once, at the same point of the trainer's start */
    int rc = MPI_Comm_split(MPI_COMM_WORLD, R / n, R, &g_ep);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split (expert group)");
    rc = MPI_Comm_split(MPI_COMM_WORLD, R % n, R, &g_rep);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split (expert replicas)");
    MPI_Comm_set_errhandler(g_ep, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(g_rep, MPI_ERRORS_RETURN);
    MPI_Comm_size(g_ep, &g_ep_n);
    MPI_Comm_rank(g_ep, &g_ep_rank);
    MPI_Comm_size(g_rep, &g_rep_n);
    return 0;
}

int mf_dist_ep_size(void) { return g_ep_n; }
int mf_dist_ep_rank(void) { return g_ep_rank; }

int mf_dist_ep_allgather_ints(const int32_t *mine, int32_t *all, int E) {
    if (g_ep_n == 1) { memcpy(all, mine, (size_t)E * sizeof *all); return 0; }
    if (mf_dist_gather_wait()) return -1;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, E, MPI_INT32_T, all, E, MPI_INT32_T, g_ep, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "expert counts all-gather");
    return mf_dist_wait(&req, 1, "expert counts all-gather");
}

int mf_dist_ep_alltoallv(const float *send, const int64_t *scnt, const int64_t *sdisp, float *recv,
                         const int64_t *rcnt, const int64_t *rdisp) {
    int P = g_ep_n;
    if (P == 1) { memcpy(recv + rdisp[0], send + sdisp[0], (size_t)scnt[0] * sizeof *send); return 0; }
    int sc[P], sd[P], rcn[P], rd[P];
    for (int p = 0; p < P; p++) {
        if (scnt[p] + sdisp[p] > INT_MAX || rcnt[p] + rdisp[p] > INT_MAX)
            return mf_fail("rank %d: expert exchange of more than 2^31 floats (MPI counts are int); use a smaller batch",
                           mf_dist_rank());
        sc[p] = (int)scnt[p], sd[p] = (int)sdisp[p], rcn[p] = (int)rcnt[p], rd[p] = (int)rdisp[p];
    }
    if (mf_dist_gather_wait()) return -1;
    MPI_Request req;
    int rc = MPI_Ialltoallv(send, sc, sd, MPI_FLOAT, recv, rcn, rd, MPI_FLOAT, g_ep, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "expert all-to-all");
    return mf_dist_wait(&req, 1, "expert all-to-all");
}

int mf_dist_ep_allreduce(float *x, int64_t n) {
    if (g_rep_n == 1) return 0;
    if (mf_dist_gather_wait()) return -1;
    for (int64_t o = 0; o < n; o += MF_DIST_BUCKET) {
        int c = (int)(n - o < MF_DIST_BUCKET ? n - o : MF_DIST_BUCKET);
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, x + o, c, MPI_FLOAT, MPI_SUM, g_rep, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "expert gradient all-reduce");
        if (mf_dist_wait(&req, 1, "expert gradient all-reduce")) return -1;
    }
    return 0;
}

int mf_dist_ep_sum_doubles(double *x, int n) {
    int P = g_ep_n;
    if (P == 1) return 0;
    /* gathered and summed in rank order: bitwise the same on every rank */
    static double all[4096];
    if ((int64_t)n * P > (int64_t)(sizeof all / sizeof all[0]))
        return mf_fail("sum of %d values over %d ranks exceeds the %zu-value buffer", n, P, sizeof all / sizeof all[0]);
    if (mf_dist_gather_wait()) return -1;
    MPI_Request req;
    int rc = MPI_Iallgather(x, n, MPI_DOUBLE, all, n, MPI_DOUBLE, g_ep, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "expert group sum");
    if (mf_dist_wait(&req, 1, "expert group sum")) return -1;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int p = 0; p < P; p++) s += all[(size_t)p * n + i];
        x[i] = s;
    }
    return 0;
}

/* Point to point in the expert group, for rank 0's adapter file (the
 * owners send their experts' adapter tensors one at a time, in the file's
 * order; MPI keeps the order of messages between two ranks) */
static int ep_p2p(void *buf, size_t bytes, int peer, int send) {
    if (bytes > INT_MAX) return mf_fail("rank %d: a tensor of %zu bytes in one message (MPI counts are int)", mf_dist_rank(), bytes);
    if (mf_dist_gather_wait()) return -1;
    MPI_Request req;
    int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, 21, g_ep, &req)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, 21, g_ep, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, send ? "expert tensor send" : "expert tensor receive");
    return mf_dist_wait(&req, 1, send ? "expert tensor send" : "expert tensor receive");
}

int mf_dist_ep_send(const void *buf, size_t bytes, int to) { return ep_p2p((void *)buf, bytes, to, 1); }
int mf_dist_ep_recv(void *buf, size_t bytes, int from) { return ep_p2p(buf, bytes, from, 0); }
