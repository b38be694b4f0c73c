/* The MPI session and the ring collectives (see memfit/dist.h).
 *
 * Rings, as in Patarasuk & Yuan 2009 ("Bandwidth optimal all-reduce
 * algorithms for clusters of workstations") and NCCL: each of world-1
 * steps sends one shard to the next rank and receives one from the
 * previous, so every rank moves 2(world-1)/world of the buffer for an
 * all-reduce. The messages go through MPI_Sendrecv; received pieces land in
 * the planned scratch (reduce-scatter) or straight in place (all-gather). */
#include "memfit/dist.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_init, g_active, g_world = 1, g_rank = 0, g_thread_ok;
static double g_timeout = 300;
/* ZeRO 3's prefetch thread and its work (see mf_dist_gather_start) */
#define GATHER_MAX 64
static float *g_gx[GATHER_MAX];
static int64_t g_gn[GATHER_MAX];
static int g_ng, g_grun, g_grc;
static pthread_t g_gthr;

static int launched(void) {
    /* Open MPI's mpirun, PMIx and Hydra/Slurm PMI set these */
    const char *v[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (getenv(v[i])) return 1;
    return 0;
}

static int mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return mf_fail("rank %d: %s failed: %s (another rank probably died or cannot be reached)", g_rank, what, msg);
}

/* mpirun stops the surviving ranks with SIGTERM when one dies: say so */
static void on_term(int sig) {
    static const char msg[] = "memfit: error: stopped by the MPI launcher (another rank failed or was killed)\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(128 + sig);
}

int mf_dist_init(void) {
    if (g_init) return 0;
    g_init = 1;
    if (!launched()) return 0;
    int provided, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mf_fail("MPI_Init failed (code %d)", rc);
    g_thread_ok = provided >= MPI_THREAD_SERIALIZED;
    g_active = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    signal(SIGTERM, on_term);
    if (g_rank > 0 && !freopen("/dev/null", "w", stdout)) return mf_fail("rank %d: cannot silence stdout", g_rank);
    /* one message to each neighbour now, so the transport's buffers exist
     * before the trainer reads its baseline RSS */
    float x[2] = {0, 0};
    if (g_world > 1 && mf_dist_allgather(x, 2)) return -1;
    return 0;
}

int mf_dist_active(void) { return g_active; }
int mf_dist_world(void) { return g_world; }
int mf_dist_rank(void) { return g_rank; }

int mf_dist_finish(int rc) {
    if (!g_active) return rc;
    g_active = 0;
    if (rc == 0 && mf_dist_gather_wait()) rc = -1;
    if (rc != 0 && g_world > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    MPI_Finalize();
    return rc;
}

void mf_dist_shard(int64_t n, int world, int rank, int64_t *lo, int64_t *hi) {
    *lo = n * rank / world;
    *hi = n * (rank + 1) / world;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

void mf_dist_set_timeout(double seconds) { g_timeout = seconds; }

/* MPI_Sendrecv that gives up after g_timeout seconds without completing:
 * a peer that hangs or whose host is unreachable stops the job with a
 * message instead of holding every rank in the collective forever. */
static int sendrecv(const void *sbuf, int scnt, int dest, void *rbuf, int rcnt, int src, MPI_Datatype dt,
                    int tag, const char *what) {
    if (g_grun && !pthread_equal(pthread_self(), g_gthr) && mf_dist_gather_wait()) return -1;
    MPI_Request req[2];
    int rc = MPI_Irecv(rbuf, rcnt, dt, src, tag, MPI_COMM_WORLD, &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(sbuf, scnt, dt, dest, tag, MPI_COMM_WORLD, &req[1]);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
    double t0 = mf_time_now();
    for (long spin = 0;; spin++) {
        int done = 0;
        rc = MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
        if (done) return 0;
        if (spin % 1024 == 1023) {
            double dt_s = mf_time_now() - t0;
            if (g_timeout > 0 && dt_s > g_timeout) {
                char who[48];
                if (src == dest) snprintf(who, sizeof who, "rank %d", src);
                else snprintf(who, sizeof who, "ranks %d and %d", src, dest);
                return mf_fail("rank %d: %s: no progress with %s for %.0f s (dist_timeout): a rank died, hangs or "
                               "cannot be reached; stopping the job", g_rank, what, who, dt_s);
            }
            if (dt_s > 0.01) usleep(dt_s > 1 ? 1000 : 50);  /* a long wait (a slow peer): stop spinning */
        }
    }
}

int mf_dist_reduce_scatter(float *x, int64_t n, float *scratch, int64_t scratch_n) {
    int W = g_world, r = g_rank;
    if (W == 1) return 0;
    int next = mod(r + 1, W), prev = mod(r - 1, W);
    /* step s sends shard r-s-1 (partly summed) and receives shard r-s-2,
     * so after W-1 steps the last shard received, r, holds every rank's sum */
    for (int s = 0; s < W - 1; s++) {
        int cs = mod(r - s - 1, W), cr = mod(r - s - 2, W);
        int64_t slo, shi, rlo, rhi;
        mf_dist_shard(n, W, cs, &slo, &shi);
        mf_dist_shard(n, W, cr, &rlo, &rhi);
        int64_t ns = shi - slo, nr = rhi - rlo, most = ns > nr ? ns : nr;
        for (int64_t o = 0; o < most || o == 0; o += scratch_n) {
            int cnt_s = (int)(ns - o < scratch_n ? (ns - o > 0 ? ns - o : 0) : scratch_n);
            int cnt_r = (int)(nr - o < scratch_n ? (nr - o > 0 ? nr - o : 0) : scratch_n);
            if (sendrecv(x + slo + (o < ns ? o : 0), cnt_s, next, scratch, cnt_r, prev, MPI_FLOAT, 71, "reduce-scatter"))
                return -1;
            float *dst = x + rlo + o;
            for (int i = 0; i < cnt_r; i++) dst[i] = scratch[i] + dst[i];
            if (most == 0) break;
        }
    }
    return 0;
}

int mf_dist_allgather(float *x, int64_t n) {
    int W = g_world, r = g_rank;
    if (W == 1) return 0;
    int next = mod(r + 1, W), prev = mod(r - 1, W);
    const int64_t piece = 1 << 28;  /* MPI counts are int */
    for (int s = 0; s < W - 1; s++) {
        int cs = mod(r - s, W), cr = mod(r - s - 1, W);
        int64_t slo, shi, rlo, rhi;
        mf_dist_shard(n, W, cs, &slo, &shi);
        mf_dist_shard(n, W, cr, &rlo, &rhi);
        int64_t ns = shi - slo, nr = rhi - rlo, most = ns > nr ? ns : nr;
        for (int64_t o = 0; o < most || o == 0; o += piece) {
            int cnt_s = (int)(ns - o < piece ? (ns - o > 0 ? ns - o : 0) : piece);
            int cnt_r = (int)(nr - o < piece ? (nr - o > 0 ? nr - o : 0) : piece);
            if (sendrecv(x + slo + (o < ns ? o : 0), cnt_s, next, x + rlo + (o < nr ? o : 0), cnt_r, prev, MPI_FLOAT, 72,
                         "all-gather"))
                return -1;
            if (most == 0) break;
        }
    }
    return 0;
}

/* ZeRO 3's prefetch: a thread runs the ring all-gathers of the next
 * block's tensors while the main thread computes this block. The transport
 * moves data only while some thread is inside MPI, so non-blocking requests
 * tested between kernels left most of the transfer to the wait (measured
 * 0.6x of gathering at use on this machine); a thread that blocks in the
 * ring keeps it moving. MPI runs in THREAD_SERIALIZED mode: every MPI call
 * of the main thread (sendrecv) first joins the thread. */

static void *gather_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < g_ng && !g_grc; i++)
        if (mf_dist_allgather(g_gx[i], g_gn[i])) g_grc = -1;
    return NULL;
}

int mf_dist_gather_wait(void) {
    if (!g_grun) return 0;
    pthread_join(g_gthr, NULL);
    g_grun = 0;
    g_ng = 0;
    int rc = g_grc;
    g_grc = 0;
    return rc;
}

int mf_dist_gather_start(float *const *x, const int64_t *n, int k) {
    if (g_world == 1) return 0;
    if (mf_dist_gather_wait()) return -1;
    if (k > GATHER_MAX) return mf_fail("rank %d: %d tensors in one prefetch (at most %d)", g_rank, k, GATHER_MAX);
    for (int i = 0; i < k; i++) g_gx[i] = x[i], g_gn[i] = n[i];
    g_ng = k;
    g_grc = 0;
    if (g_thread_ok && pthread_create(&g_gthr, NULL, gather_thread, NULL) == 0) {
        g_grun = 1;
        return 0;
    }
    /* no thread (or MPI without THREAD_SERIALIZED): gather now */
    gather_thread(NULL);
    g_ng = 0;
    return g_grc;
}

int mf_dist_allreduce(float *x, int64_t n, float *scratch, int64_t scratch_n) {
    if (mf_dist_reduce_scatter(x, n, scratch, scratch_n)) return -1;
    return mf_dist_allgather(x, n);
}

int mf_dist_sum_doubles(double *x, int n) {
    if (!g_active || g_world == 1) return 0;
    /* gathered and summed in rank order, so every rank gets bitwise the
     * same sum (a clip scale that differed in its last bit would let the
     * replicas drift apart) */
    static double all[4096];
    if ((int64_t)n * g_world > (int64_t)(sizeof all / sizeof all[0]))
        return mf_fail("sum of %d values over %d ranks exceeds the %zu-value buffer", n, g_world, sizeof all / sizeof all[0]);
    /* a ring all-gather of each rank's n values */
    memcpy(all + (size_t)g_rank * n, x, (size_t)n * sizeof *x);
    for (int s = 0; s < g_world - 1; s++) {
        int cs = mod(g_rank - s, g_world), cr = mod(g_rank - s - 1, g_world);
        if (sendrecv(all + (size_t)cs * n, n, mod(g_rank + 1, g_world), all + (size_t)cr * n, n, mod(g_rank - 1, g_world),
                     MPI_DOUBLE, 73, "sum of scalars"))
            return -1;
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < g_world; k++) s += all[(size_t)k * n + i];
        x[i] = s;
    }
    return 0;
}
