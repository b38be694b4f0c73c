/* The MPI session and the collectives (see dist/dist.h).
 *
 * The collectives are Open MPI's own, non-blocking and polled (wait_req) so
 * a dead or hung peer still stops the job after dist_timeout. The rings
 * they replaced (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
 * algorithms for clusters of workstations": each of world-1 steps sends
 * one shard to the next rank over MPI_Sendrecv) stay behind
 * MEMFIT_DIST_RING=1 for the comparison in docs/dist.md. */
#include "dist/dist.h"

#include <mpi.h>
#include <pthread.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int g_init, g_active, g_world = 1, g_rank = 0, g_thread_ok;
static double g_timeout = 300;
/* the background collectives' queue (see "Background collectives" below) */
static long g_jpushed;              /* jobs queued so far (a job's ticket is its number, from 1) */
static pthread_mutex_t g_jmu = PTHREAD_MUTEX_INITIALIZER;  /* the queue's state and g_t_bg, g_t_wait */
static _Thread_local int t_in_job;  /* set in the background thread */
/* seconds in collectives the main thread ran itself, in background jobs,
 * and the main thread's waits for background jobs (mf_dist_comm_times);
 * the bytes the collectives moved (mf_dist_comm_bytes) */
static double g_t_sync, g_t_bg, g_t_wait, g_comm_bytes;

static int use_ring(void);
/* MEMFIT_DIST_RS=block: MPI_Ireduce_scatter_block instead of per-owner
 * reduces; read once (collectives run per bucket in the step) */
static int rs_block(void) {
    static int v = -1;
    if (v < 0) {
        const char *rs = getenv("MEMFIT_DIST_RS");
        v = rs && strcmp(rs, "block") == 0;
    }
    return v;
}
static int wait_req(MPI_Request *req, int nreq, const char *what);
static void jobs_stop(void);
static void trace_open(void);
static FILE *g_trace;

/* A communicator and this rank's place in it. Without hybrid sharding
 * the group is the world and there is no cross communicator; with
 * zero_group N (mf_dist_set_group) a group is N consecutive ranks (rank / N)
 * and the cross communicator joins the ranks that hold the same shard in
 * every group (rank % N). */
typedef struct { MPI_Comm comm; int size, rank; } comm_t;
static comm_t g_wc = {MPI_COMM_NULL, 1, 0}, g_gc = {MPI_COMM_NULL, 1, 0}, g_xc = {MPI_COMM_NULL, 1, 0};
static int g_hybrid;

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

/* SIGTERM reaches a rank from mpirun both when the job is signalled
 * (mpirun turns SIGINT and SIGTERM into SIGTERM to every rank, then SIGKILL
 * odls_base_sigkill_timeout seconds later) and when another rank died. The
 * first asks the ranks to stop after the step in progress: at each step
 * boundary they agree on it (mf_dist_stop_agree), rank 0 checkpoints and
 * all exit 0. A rank whose peer died never reaches that agreement: a timer
 * started with the signal (80% of the launcher's grace, before its SIGKILL)
 * then stops it with the launcher message, as does a second signal. */
static volatile sig_atomic_t g_stop_sig;
static int g_stop_agreed;  /* the ranks agreed to stop on a signal */
static struct itimerval g_grace;

static void launcher_exit(int sig) {
    static const char msg[] = "memfit: error: stopped by the MPI launcher (another rank failed or was killed, or the "
                              "job was signalled and this rank could not finish its step in odls_base_sigkill_timeout)\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(128 + sig);
}

static void on_grace(int sig) { (void)sig; launcher_exit(SIGTERM); }

static void on_term(int sig) {
    if (g_stop_sig) launcher_exit(sig);
    g_stop_sig = sig;
    setitimer(ITIMER_REAL, &g_grace, NULL);
}

static void stop_install(void) {
    const char *e = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    double grace = 0.8 * (e && atof(e) > 0 ? atof(e) : 1.0);
    g_grace.it_value.tv_sec = (time_t)grace;
    g_grace.it_value.tv_usec = (suseconds_t)((grace - (double)(time_t)grace) * 1e6);
    /* on a stack of its own, as the single-process handler (cli/main.c):
     * a frame pushed on the interrupted stack can corrupt oneDNN's sgemm */
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    int onstack = sigaltstack(&ss, NULL) == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (onstack ? SA_ONSTACK : 0);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_grace;
    sigaction(SIGALRM, &sa, NULL);
}

static int64_t g_bucket = MF_DIST_BUCKET;
static size_t g_scratch[MF_DIST_COLL_COUNT];
static int g_measured;                                /* mf_dist_measure_scratch ran */
static mf_dist_scratch_src g_scratch_src = MF_DIST_SCRATCH_DEFAULT;  /* of the last mf_dist_scratch_plan */

/* Each collective once on a full bucket, after the trainer read its
 * baseline RSS (the first plan asks for it, before the arena is mapped):
 * the memory the MPI library keeps for it (its algorithms' temporaries, the
 * transport's fragments and registration caches) is resident from then on,
 * measured here as the RSS each first call adds beyond the caller's own
 * buffer. These are the plan's comm.mpi.* rows. The messages of the step
 * are never larger than this bucket. */
static void scratch_cache_save(void);

int mf_dist_measure_scratch(void) {
    if (g_measured || !g_active || g_world == 1) return 0;
    g_measured = 1;
    int64_t b = g_bucket;
    /* the packed reduce-scatter and the rings need a bucket of scratch beside it */
    int64_t nb = use_ring() || rs_block() ? 2 * b : b;
    /* mapped and unmapped here, not malloc'd: a freed heap block can stay
     * resident and would then be bytes no row holds */
    size_t len = (size_t)nb * sizeof(float);
    void *mp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *buf = mp == MAP_FAILED ? NULL : mp;
    if (!buf) return mf_fail("rank %d: out of memory for the collectives' warm-up (%lld floats)", g_rank, (long long)nb);
    for (int64_t i = 0; i < nb; i++) buf[i] = 0;  /* resident before the first reading */
    size_t r = mf_rss_current();
    double bytes = g_comm_bytes, ts = g_t_sync;
    for (int c = 0; c < MF_DIST_COLL_COUNT; c++) {
        int rc = c == MF_DIST_ALLREDUCE ? mf_dist_allreduce(buf, b, nb > b ? buf + b : NULL, nb > b ? b : 0)
               : c == MF_DIST_REDUCE_SCATTER ? mf_dist_reduce_scatter(buf, b, nb > b ? buf + b : NULL, nb > b ? b : 0)
               : mf_dist_allgather(buf, b);
        if (rc) { munmap(buf, len); return -1; }
        size_t now = mf_rss_current();
        g_scratch[c] = now > r ? now - r : 0;
        r = now > r ? now : r;
    }
    munmap(buf, len);
    g_comm_bytes = bytes, g_t_sync = ts;  /* the step's volume and times only */
    if (g_rank == 0) scratch_cache_save();
    return 0;
}

size_t mf_dist_mpi_scratch(mf_dist_coll c) { return c >= 0 && c < MF_DIST_COLL_COUNT ? g_scratch[c] : 0; }
int64_t mf_dist_bucket(void) { return g_bucket; }

/* The transport the measurement belongs to: Open MPI's byte-transfer
 * layers as mpirun --mca btl (or the environment) names them */
static void transport_name(char *buf, size_t n) {
    const char *e = getenv("OMPI_MCA_btl");
    snprintf(buf, n, "%s", e && *e ? e : "default");
    for (char *p = buf; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-')) *p = '_';
}

/* $MEMFIT_CACHE/mpi-scratch-v1-HOST-bBUCKET-wWORLD-TRANSPORT.txt, or with
 * transport "*" the glob of every transport's file */
static void cache_path(char *buf, size_t n, int world, const char *transport) {
    char dir[MF_PATH_MAX], host[128] = "host";
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++) if (*p == '/') *p = '_';
    snprintf(buf, n, "%s/mpi-scratch-v1-%s-b%lld-w%d-%s.txt", mf_cache_dir(dir, sizeof dir), host, (long long)g_bucket,
             world, transport);
}

static int cache_load(const char *path, size_t out[MF_DIST_COLL_COUNT]) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    unsigned long long v[MF_DIST_COLL_COUNT];
    int ok = fscanf(f, "memfit-mpi-scratch 1\nallreduce %llu\nreduce_scatter %llu\nallgather %llu\n", &v[0], &v[1],
                    &v[2]) == 3;
    fclose(f);
    for (int c = 0; ok && c < MF_DIST_COLL_COUNT; c++) out[c] = (size_t)v[c];
    return ok ? 0 : -1;
}

static void scratch_cache_save(void) {
    char tr[128], path[MF_PATH_MAX + 400], tmp[MF_PATH_MAX + 480];
    transport_name(tr, sizeof tr);
    cache_path(path, sizeof path, g_world, tr);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;  /* no cache folder: estimate uses the default */
    fprintf(f, "memfit-mpi-scratch 1\nallreduce %zu\nreduce_scatter %zu\nallgather %zu\n", g_scratch[0], g_scratch[1],
            g_scratch[2]);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

mf_dist_scratch_src mf_dist_scratch_plan(int world, size_t *out) {
    memset(out, 0, MF_DIST_COLL_COUNT * sizeof *out);
    if (world <= 1) return g_scratch_src = MF_DIST_SCRATCH_NONE;
    if (g_active && g_world > 1 && g_measured && world == g_world) {
        memcpy(out, g_scratch, sizeof g_scratch);
        return g_scratch_src = MF_DIST_SCRATCH_MEASURED;
    }
    /* no MPI here (estimate, plan): this machine's measurement for this
     * transport, else the largest over the transports measured, else the
     * default */
    char tr[128], path[MF_PATH_MAX + 400];
    transport_name(tr, sizeof tr);
    cache_path(path, sizeof path, world, tr);
    if (cache_load(path, out) == 0) return g_scratch_src = MF_DIST_SCRATCH_CACHED;
    cache_path(path, sizeof path, world, "*");
    glob_t gl;
    int found = 0;
    if (glob(path, 0, NULL, &gl) == 0) {
        for (size_t i = 0; i < gl.gl_pathc; i++) {
            size_t v[MF_DIST_COLL_COUNT];
            if (cache_load(gl.gl_pathv[i], v)) continue;
            for (int c = 0; c < MF_DIST_COLL_COUNT; c++) out[c] = v[c] > out[c] ? v[c] : out[c];
            found = 1;
        }
        globfree(&gl);
    }
    if (found) return g_scratch_src = MF_DIST_SCRATCH_CACHED;
    /* measured here (Open MPI 4.1, 2-3 ranks, shared memory and TCP): the
     * all-reduce 1.00-1.15x the bucket's bytes, the reduce-scatter
     * 0.5-1.39x, the all-gather nothing; the default takes 1.5x for both */
    size_t bb = (size_t)g_bucket * sizeof(float);
    out[MF_DIST_ALLREDUCE] = out[MF_DIST_REDUCE_SCATTER] = bb + bb / 2;
    out[MF_DIST_ALLGATHER] = 0;
    return g_scratch_src = MF_DIST_SCRATCH_DEFAULT;
}

mf_dist_scratch_src mf_dist_scratch_source(void) { return g_scratch_src; }

const char *mf_dist_scratch_source_name(mf_dist_scratch_src s) {
    return s == MF_DIST_SCRATCH_MEASURED ? "measured at start"
         : s == MF_DIST_SCRATCH_CACHED ? "measured by an earlier run on this machine"
         : s == MF_DIST_SCRATCH_DEFAULT ? "default: never measured here, 1.5x the bucket for all-reduce and reduce-scatter"
         : "none";
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
    g_wc = g_gc = (comm_t){MPI_COMM_WORLD, g_world, g_rank};
    stop_install();
    trace_open();
    if (g_rank > 0 && !freopen("/dev/null", "w", stdout)) return mf_fail("rank %d: cannot silence stdout", g_rank);
    /* one message to each neighbour now, so the transport's buffers exist
     * before the trainer reads its baseline RSS */
    float x[2] = {0, 0};
    if (g_world > 1 && mf_dist_allgather(x, 2)) return -1;
    g_comm_bytes = g_t_sync = 0;  /* the step's volume and times only */
    return 0;
}

int mf_dist_active(void) { return g_active; }
int mf_dist_world(void) { return g_world; }
int mf_dist_rank(void) { return g_rank; }

int mf_dist_finish(int rc) {
    if (!g_active) return rc;
    g_active = 0;
    if (rc == 0 && mf_dist_gather_wait()) rc = -1;
    if (rc == 0) jobs_stop();
    if (g_trace) fclose(g_trace), g_trace = NULL;
    if (rc == 0 && g_stop_agreed) {
        /* stopped on the launcher's SIGTERM: mpirun is tearing the job down,
         * and MPI_Finalize's fence with it never completes (measured: the
         * ranks sat in it until the SIGKILL); the work is saved, so leave,
         * all at once: a rank that left first would make mpirun kill the
         * others, perhaps in the middle of writing their checkpoint */
        MPI_Request req;
        if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS || wait_req(&req, 1, "barrier before exit")) rc = -1;
        else {
            fflush(NULL);
            _exit(0);
        }
    }
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

/* Completes requests, giving up after g_timeout seconds without
 * completing: a peer that hangs or whose host is unreachable stops the job
 * with a message instead of holding every rank in the collective forever.
 * MPI_Testall also drives the library's progress (non-blocking collectives
 * move only while some thread is inside MPI). */
static int wait_req(MPI_Request *req, int nreq, const char *what) {
    double t0 = mf_time_now();
    for (long spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
        if (done) return 0;
        /* a background collective yields the core to the compute it hides behind */
        if (t_in_job) usleep(20);
        if (spin % 1024 == 1023) {
            double dt_s = mf_time_now() - t0;
            if (g_timeout > 0 && dt_s > g_timeout)
                return mf_fail("rank %d: %s: no progress for %.0f s (dist_timeout): a rank died, hangs or cannot be "
                               "reached; stopping the job", g_rank, what, dt_s);
            if (dt_s > 0.01) usleep(dt_s > 1 ? 1000 : 50);  /* a long wait (a slow peer): stop spinning */
        }
    }
}

int mf_dist_wait(void *req, int n, const char *what) { return wait_req((MPI_Request *)req, n, what); }

/* Any collective of the main thread first joins ZeRO 3's prefetch thread
 * (MPI runs THREAD_SERIALIZED). */
static int join_prefetch(void) {
    return g_jpushed && !t_in_job ? mf_dist_gather_wait() : 0;
}

/* MPI_Sendrecv with the same timeout, for the ring collectives. */
static int sendrecv(const void *sbuf, int scnt, int dest, void *rbuf, int rcnt, int src, MPI_Datatype dt,
                    int tag, const char *what) {
    if (join_prefetch()) return -1;
    MPI_Request req[2];
    int rc = MPI_Irecv(rbuf, rcnt, dt, src, tag, MPI_COMM_WORLD, &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(sbuf, scnt, dt, dest, tag, MPI_COMM_WORLD, &req[1]);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
    return wait_req(req, 2, what);
}

static int ring_reduce_scatter(float *x, int64_t n, float *scratch, int64_t scratch_n) {
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

static int ring_allgather(float *x, int64_t n) {
    int W = g_world, r = g_rank;
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

/* The collectives through MPI itself (the default): each message is one
 * bucket of at most g_bucket floats, so whatever scratch the library's
 * algorithms take stays bounded by the bucket (measured in mf_dist_init,
 * mf_dist_mpi_scratch). Non-blocking calls polled by wait_req keep the
 * dist_timeout check. Shards are uneven (n*r/W), so the all-gather is the
 * vector form on x itself; the reduce-scatter is one MPI_Ireduce per
 * shard owner (mpi_reduce_roots), or with MEMFIT_DIST_RS=block packs each
 * rank's piece of a bucket into the planned scratch as equal blocks for
 * MPI_Ireduce_scatter_block (equal counts; the last bucket's blocks differ
 * by at most one element, padded with zeros). */
static int g_ring = -1;  /* MEMFIT_DIST_RING=1: memfit's rings instead */

static int use_ring(void) {
    if (g_ring < 0) {
        const char *e = getenv("MEMFIT_DIST_RING");
        g_ring = e && strcmp(e, "1") == 0;
    }
    return g_ring;
}

static int mpi_reduce_scatter(const comm_t *cm, float *x, int64_t n, float *scratch, int64_t scratch_n) {
    int W = cm->size;
    int64_t b = scratch_n / W, most = (n + W - 1) / W;
    if (b < 1) return mf_fail("rank %d: reduce-scatter scratch of %lld floats for %d ranks", g_rank, (long long)scratch_n, W);
    int64_t lo, hi;
    mf_dist_shard(n, W, cm->rank, &lo, &hi);
    for (int64_t o = 0; o < most; o += b) {
        int64_t bc = most - o < b ? most - o : b;
        for (int r = 0; r < W; r++) {
            int64_t rl, rh;
            mf_dist_shard(n, W, r, &rl, &rh);
            int64_t c = rh - rl - o;
            c = c < 0 ? 0 : c > bc ? bc : c;
            memcpy(scratch + r * bc, x + rl + o, (size_t)c * sizeof *x);
            memset(scratch + r * bc + c, 0, (size_t)(bc - c) * sizeof *x);
        }
        MPI_Request req;
        int rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, scratch, (int)bc, MPI_FLOAT, MPI_SUM, cm->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "reduce-scatter");
        if (wait_req(&req, 1, "reduce-scatter")) return -1;
        int64_t c = hi - lo - o;
        c = c < 0 ? 0 : c > bc ? bc : c;
        memcpy(x + lo + o, scratch, (size_t)c * sizeof *x);
    }
    return 0;
}

/* The same sum as W reductions (MPI_Ireduce), one to each shard's owner,
 * all in flight at once: no packing, each shard reduced in place at its
 * owner, messages of at most a bucket. The default reduce-scatter. */
static int mpi_reduce_roots(const comm_t *cm, float *x, int64_t n) {
    int W = cm->size;
    MPI_Request req[W];
    int64_t most = (n + W - 1) / W, b = g_bucket / W > 0 ? g_bucket / W : 1;
    for (int64_t o = 0; o < most; o += b) {
        for (int r = 0; r < W; r++) {
            int64_t rl, rh;
            mf_dist_shard(n, W, r, &rl, &rh);
            int64_t c = rh - rl - o;
            c = c < 0 ? 0 : c > b ? b : c;
            int rc = r == cm->rank ? MPI_Ireduce(MPI_IN_PLACE, x + rl + o, (int)c, MPI_FLOAT, MPI_SUM, r, cm->comm, &req[r])
                                   : MPI_Ireduce(x + rl + o, NULL, (int)c, MPI_FLOAT, MPI_SUM, r, cm->comm, &req[r]);
            if (rc != MPI_SUCCESS) return mpi_fail(rc, "reduce-scatter");
        }
        if (wait_req(req, W, "reduce-scatter")) return -1;
    }
    return 0;
}

static int mpi_allgather(const comm_t *cm, float *x, int64_t n) {
    int W = cm->size;
    int cnt[W], disp[W];
    int64_t most = (n + W - 1) / W, b = g_bucket / W > 0 ? g_bucket / W : 1;
    for (int64_t o = 0; o < most; o += b) {
        /* the bucket: every rank's next b elements of its shard, where they lie in x */
        int64_t base = INT64_MAX;
        for (int r = 0; r < W; r++) {
            int64_t rl, rh;
            mf_dist_shard(n, W, r, &rl, &rh);
            if (rl + o < base) base = rl + o;
        }
        for (int r = 0; r < W; r++) {
            int64_t rl, rh;
            mf_dist_shard(n, W, r, &rl, &rh);
            int64_t c = rh - rl - o;
            cnt[r] = (int)(c < 0 ? 0 : c > b ? b : c);
            disp[r] = (int)(rl + o - base);
        }
        if (n - base > INT32_MAX)
            return mf_fail("rank %d: all-gather of a %lld-element tensor over %d ranks: displacements exceed MPI's int",
                           g_rank, (long long)n, W);
        MPI_Request req;
        int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x + base, cnt, disp, MPI_FLOAT, cm->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "all-gather");
        if (wait_req(&req, 1, "all-gather")) return -1;
    }
    return 0;
}

static int mpi_allreduce(const comm_t *cm, float *x, int64_t n) {
    for (int64_t o = 0; o < n; o += g_bucket) {
        int c = (int)(n - o < g_bucket ? n - o : g_bucket);
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, x + o, c, MPI_FLOAT, MPI_SUM, cm->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "all-reduce");
        if (wait_req(&req, 1, "all-reduce")) return -1;
    }
    return 0;
}

/* bytes this rank sends per collective with a bandwidth-optimal (ring)
 * algorithm: (W-1)/W of the buffer for a reduce-scatter or an all-gather,
 * twice that for an all-reduce (the volume the ZeRO paper counts) */
static void count(const comm_t *cm, int64_t n, int k) { g_comm_bytes += k * (double)n * sizeof(float) * (cm->size - 1) / cm->size; }
double mf_dist_comm_bytes(void) { return g_comm_bytes; }

static int timed(int rc, double t0) {
    if (!t_in_job) g_t_sync += mf_time_now() - t0;
    return rc;
}

int mf_dist_reduce_scatter(float *x, int64_t n, float *scratch, int64_t scratch_n) {
    if (g_world == 1) return 0;
    if (join_prefetch()) return -1;
    double t0 = mf_time_now();
    if (g_hybrid) {
        /* hybrid shard: reduce-scatter inside the group, then all-reduce the
         * shard across the groups (each group holds the same shards) */
        count(&g_gc, n, 1);
        int64_t lo, hi;
        mf_dist_shard(n, g_gc.size, g_gc.rank, &lo, &hi);
        count(&g_xc, hi - lo, 2);
        int rc = g_gc.size == 1 ? 0
               : rs_block() ? mpi_reduce_scatter(&g_gc, x, n, scratch, scratch_n)
               : mpi_reduce_roots(&g_gc, x, n);
        if (!rc) rc = mpi_allreduce(&g_xc, x + lo, hi - lo);
        return timed(rc, t0);
    }
    count(&g_wc, n, 1);
    /* the W owner reductions measured faster than MPI_Ireduce_scatter_block
     * here (Open MPI 4.1's libnbc reduces the whole buffer to one rank and
     * scatters it): gpt2-10m zero 2, np 2, 0.97x vs 0.91x the ring's tok/s,
     * docs/memory.md; MEMFIT_DIST_RS=block picks the block form */
    if (!use_ring() && !rs_block()) return timed(mpi_reduce_roots(&g_wc, x, n), t0);
    return timed(use_ring() ? ring_reduce_scatter(x, n, scratch, scratch_n) : mpi_reduce_scatter(&g_wc, x, n, scratch, scratch_n), t0);
}

int mf_dist_allgather(float *x, int64_t n) {
    if (g_world == 1) return 0;
    if (join_prefetch()) return -1;
    /* hybrid shard: the shards of a tensor are within the group */
    if (g_gc.size == 1) return 0;
    count(&g_gc, n, 1);
    double t0 = mf_time_now();
    return timed(use_ring() ? ring_allgather(x, n) : mpi_allgather(&g_gc, x, n), t0);
}

int mf_dist_allreduce(float *x, int64_t n, float *scratch, int64_t scratch_n) {
    if (g_world == 1) return 0;
    if (join_prefetch()) return -1;
    count(&g_wc, n, 2);
    double t0 = mf_time_now();
    if (!use_ring()) return timed(mpi_allreduce(&g_wc, x, n), t0);
    if (ring_reduce_scatter(x, n, scratch, scratch_n)) return -1;
    return timed(ring_allgather(x, n), t0);
}

void mf_dist_comm_times(double *sync_s, double *bg_s, double *wait_s) {
    pthread_mutex_lock(&g_jmu);  /* the worker adds to g_t_bg */
    *sync_s = g_t_sync;
    *bg_s = g_t_bg;
    *wait_s = g_t_wait;
    pthread_mutex_unlock(&g_jmu);
}

/* Background collectives: ZeRO 3's prefetch (the next block's tensors
 * all-gathered while the main thread computes this block) and the
 * overlapped gradient reduction of every stage (a block's gradients
 * all-reduced or reduce-scattered while the backward of the block before
 * it computes). The transport moves data only while some thread is inside
 * MPI, so non-blocking requests tested between kernels left most of the
 * transfer to the wait (measured 0.6x of gathering at use on this
 * machine); a thread that polls its request keeps it moving.
 *
 * The jobs form a FIFO run in order by one worker thread (started with the
 * first job, ended by mf_dist_finish): at stage 3 a layer's gradient
 * reduce-scatter queues behind the prefetch of the layer before it, and the
 * next prefetch behind that reduce-scatter, so the main thread waits only
 * for the prefetch it needs (mf_dist_prefetch_wait) while the reduction
 * keeps running. MPI runs in THREAD_SERIALIZED mode: the worker is the only
 * thread in MPI while jobs are queued, and every MPI call of the main
 * thread first waits for all of them (join_prefetch). */

#define JOB_TENSORS 64 /* tensors per job (a block has MF_LAYER_TENSORS) */
#define JOB_QUEUE 8    /* jobs queued at once (stage 3 has three: reduce, prefetch, reduce) */
typedef enum { JOB_GATHER, JOB_REDUCE, JOB_ALLREDUCE, JOB_FN } job_kind;
typedef struct {
    job_kind kind;
    int k;
    float *x[JOB_TENSORS], *acc[JOB_TENSORS]; /* acc NULL: the reduced shard stays in x */
    int64_t n[JOB_TENSORS];
    float *scr;                               /* the reduce-scatter's bucket scratch */
    int64_t scrn;
    double t_queued;
    int (*fn)(void *); /* JOB_FN: mf_dist_job_start's function and argument */
    void *ctx;
} job_t;
/* mf_dist_job_start's job (grad16.c): fn(ctx) runs on the worker in
 * queue order, as a gradient reduction */
static int (*g_fn_next)(void *);
static void *g_ctx_next;
static job_t g_jobs[JOB_QUEUE];             /* job t in slot (t - 1) % JOB_QUEUE */
static long g_jdone;                        /* jobs finished (the worker runs job g_jdone + 1 next) */
static long g_jgather;                      /* ticket of the last all-gather queued (the prefetch) */
static long g_jreduce;                      /* ticket of the last gradient reduction queued */
static int g_jrc;                           /* a job failed: the later ones are skipped */
static char g_jerr[1024];                   /* its message (mf_error is per thread) */
static int g_jthread, g_jstop;              /* the worker runs; asked to stop */
static pthread_t g_jthr;
static pthread_cond_t g_jcv_work = PTHREAD_COND_INITIALIZER, g_jcv_done = PTHREAD_COND_INITIALIZER;
/* MEMFIT_DIST_TRACE=PATH: one line per background job and per wait of
 * the main thread for one, in PATH.rank<r> (docs/distributed.md) */
static double g_trace_t0;

static const char *job_name(job_kind k) {
    return k == JOB_GATHER ? "allgather" : k == JOB_REDUCE ? "reduce_scatter" : k == JOB_FN ? "job" : "allreduce";
}

static void trace_open(void) {
    const char *e = getenv("MEMFIT_DIST_TRACE");
    if (!e || !*e || g_world == 1) return;
    char path[MF_PATH_MAX + 32];
    g_trace = fopen(mf_dist_rank_path(e, path, sizeof path), "w");
    if (!g_trace) fprintf(stderr, "memfit: warning: rank %d: cannot write the trace %s\n", g_rank, path);
    g_trace_t0 = mf_time_now();
}

/* One job's collectives, on the worker (or on the caller without a thread). */
static int job_run(const job_t *j) {
    if (j->kind == JOB_FN) return j->fn(j->ctx);
    for (int i = 0; i < j->k; i++) {
        if (j->kind == JOB_ALLREDUCE) {
            if (mf_dist_allreduce(j->x[i], j->n[i], j->scr, j->scrn)) return -1;
            continue;
        }
        if (j->kind == JOB_GATHER) {
            if (mf_dist_allgather(j->x[i], j->n[i])) return -1;
            continue;
        }
        if (mf_dist_reduce_scatter(j->x[i], j->n[i], j->scr, j->scrn)) return -1;
        if (!j->acc[i]) continue;  /* ZeRO 1: the shard stays in place */
        int64_t lo, hi;
        mf_dist_shard(j->n[i], g_gc.size, g_gc.rank, &lo, &hi);
        for (int64_t k = 0; k < hi - lo; k++) j->acc[i][k] += j->x[i][lo + k];
    }
    return 0;
}

/* Runs job g_jdone + 1 (g_jmu held on entry and on return). */
static void job_next(void) {
    long t = g_jdone + 1;
    const job_t *j = &g_jobs[(t - 1) % JOB_QUEUE];
    int skip = g_jrc;
    pthread_mutex_unlock(&g_jmu);
    double t0 = mf_time_now();
    int rc = skip ? 0 : job_run(j);
    double t1 = mf_time_now();
    pthread_mutex_lock(&g_jmu);
    g_t_bg += t1 - t0;
    if (rc && !g_jrc) {
        g_jrc = -1;
        snprintf(g_jerr, sizeof g_jerr, "%s", mf_error());
    }
    if (g_trace)
        fprintf(g_trace, "job %ld %s tensors %d queued %.6f start %.6f end %.6f\n", t, job_name(j->kind), j->k,
                j->t_queued - g_trace_t0, t0 - g_trace_t0, t1 - g_trace_t0);
    g_jdone = t;
    pthread_cond_broadcast(&g_jcv_done);
}

static void *job_worker(void *arg) {
    (void)arg;
    t_in_job = 1;
    pthread_mutex_lock(&g_jmu);
    for (;;) {
        while (g_jdone == g_jpushed && !g_jstop) pthread_cond_wait(&g_jcv_work, &g_jmu);
        if (g_jdone == g_jpushed) break;  /* asked to stop, nothing left */
        job_next();
    }
    pthread_mutex_unlock(&g_jmu);
    return NULL;
}

/* Waits until job `ticket` (and every job before it) is done; returns -1
 * with the first failed job's message once one failed. */
static int jobs_wait(long ticket) {
    if (ticket <= 0) return 0;
    double t0 = mf_time_now();
    pthread_mutex_lock(&g_jmu);
    int waited = g_jdone < ticket;
    while (g_jdone < ticket) pthread_cond_wait(&g_jcv_done, &g_jmu);
    int rc = g_jrc;
    char msg[sizeof g_jerr];
    snprintf(msg, sizeof msg, "%s", g_jerr[0] ? g_jerr : "a background collective failed");
    /* all done: the error is reported once */
    if (g_jdone == g_jpushed) g_jrc = 0, g_jerr[0] = 0;
    double t1 = mf_time_now();
    if (waited) g_t_wait += t1 - t0;
    if (g_trace && waited) fprintf(g_trace, "wait %ld start %.6f end %.6f\n", ticket, t0 - g_trace_t0, t1 - g_trace_t0);
    pthread_mutex_unlock(&g_jmu);
    /* the background thread's message, raised again in this thread */
    return rc ? mf_fail("%s", msg) : 0;
}

int mf_dist_gather_wait(void) { return g_jpushed ? jobs_wait(g_jpushed) : 0; }

int mf_dist_prefetch_wait(void) { return jobs_wait(g_jgather); }

static void jobs_stop(void) {
    if (!g_jthread) return;
    pthread_mutex_lock(&g_jmu);
    g_jstop = 1;
    pthread_cond_broadcast(&g_jcv_work);
    pthread_mutex_unlock(&g_jmu);
    pthread_join(g_jthr, NULL);
    g_jthread = 0;
}

static int job_start(job_kind kind, float *const *x, const int64_t *n, float *const *acc, int k, float *scratch,
                     int64_t scratch_n) {
    if (g_world == 1) return 0;
    if (k > JOB_TENSORS) return mf_fail("rank %d: %d tensors in one background collective (at most %d)", g_rank, k, JOB_TENSORS);
    /* a gradient reduction first waits for the one before it: the model
     * queues one as each backward phase ends, and the rows a reduction
     * reads live one phase past the phase that queued it (the plan; the
     * arena releases them as the phase after that starts), so it must be
     * done by the end of the next phase; a prefetch queued since keeps
     * running */
    if (kind != JOB_GATHER && jobs_wait(g_jreduce)) return -1;
    /* a full queue: wait for its oldest job, whose slot the new one takes */
    if (g_jpushed >= JOB_QUEUE && jobs_wait(g_jpushed - JOB_QUEUE + 1)) return -1;
    if (g_thread_ok && !g_jthread) {
        if (pthread_create(&g_jthr, NULL, job_worker, NULL) == 0) g_jthread = 1;
        else g_thread_ok = 0;
    }
    long t = g_jpushed + 1;
    job_t *j = &g_jobs[(t - 1) % JOB_QUEUE];  /* free: job t - JOB_QUEUE is done */
    j->kind = kind;
    j->k = k;
    j->fn = g_fn_next;
    j->ctx = g_ctx_next;
    for (int i = 0; i < k; i++) j->x[i] = x[i], j->n[i] = n[i], j->acc[i] = acc ? acc[i] : NULL;
    j->scr = scratch;
    j->scrn = scratch_n;
    j->t_queued = mf_time_now();
    pthread_mutex_lock(&g_jmu);
    g_jpushed = t;
    if (kind == JOB_GATHER) g_jgather = t;
    else g_jreduce = t;
    if (g_jthread) {
        pthread_cond_signal(&g_jcv_work);
        pthread_mutex_unlock(&g_jmu);
        return 0;
    }
    /* no thread (or MPI without THREAD_SERIALIZED): run it now, all of it waited for */
    double t0 = mf_time_now();
    t_in_job = 1;
    while (g_jdone < g_jpushed) job_next();
    t_in_job = 0;
    g_t_wait += mf_time_now() - t0;
    pthread_mutex_unlock(&g_jmu);
    return jobs_wait(t);
}

int mf_dist_job_start(int (*fn)(void *ctx), void *ctx) {
    if (g_world == 1) return 0;
    g_fn_next = fn, g_ctx_next = ctx;
    int rc = job_start(JOB_FN, NULL, NULL, NULL, 0, NULL, 0);
    g_fn_next = NULL, g_ctx_next = NULL;
    return rc;
}

int mf_dist_gather_start(float *const *x, const int64_t *n, int k) { return job_start(JOB_GATHER, x, n, NULL, k, NULL, 0); }

int mf_dist_reduce_start(float *const *x, const int64_t *n, float *const *acc, int k, float *scratch, int64_t scratch_n) {
    return job_start(JOB_REDUCE, x, n, acc, k, scratch, scratch_n);
}

int mf_dist_allreduce_start(float *const *x, const int64_t *n, int k, float *scratch, int64_t scratch_n) {
    return job_start(JOB_ALLREDUCE, x, n, NULL, k, scratch, scratch_n);
}

static int sum_doubles(const comm_t *cm, double *x, int n);

int mf_dist_sum_doubles(double *x, int n) { return sum_doubles(&g_wc, x, n); }
int mf_dist_sum_doubles_group(double *x, int n) { return sum_doubles(&g_gc, x, n); }

static int sum_doubles(const comm_t *cm, double *x, int n) {
    if (!g_active || cm->size == 1) return 0;
    int W = cm->size, R = cm->rank;
    /* gathered and summed in rank order, so every rank gets bitwise the
     * same sum (a clip scale that differed in its last bit would let the
     * replicas drift apart) */
    static double all[4096];
    if ((int64_t)n * W > (int64_t)(sizeof all / sizeof all[0]))
        return mf_fail("sum of %d values over %d ranks exceeds the %zu-value buffer", n, W, sizeof all / sizeof all[0]);
    memcpy(all + (size_t)R * n, x, (size_t)n * sizeof *x);
    if (join_prefetch()) return -1;
    if (use_ring()) {
        for (int s = 0; s < W - 1; s++) {
            int cs = mod(R - s, W), cr = mod(R - s - 1, W);
            if (sendrecv(all + (size_t)cs * n, n, mod(R + 1, W), all + (size_t)cr * n, n,
                         mod(R - 1, W), MPI_DOUBLE, 73, "sum of scalars"))
                return -1;
        }
    } else {
        MPI_Request req;
        int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, n, MPI_DOUBLE, cm->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "sum of scalars");
        if (wait_req(&req, 1, "sum of scalars")) return -1;
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < W; k++) s += all[(size_t)k * n + i];
        x[i] = s;
    }
    return 0;
}

int mf_dist_set_group(int n) {
    if (!g_active || g_world == 1 || n == 0 || n == g_world) return 0;
    if (n < 0 || n > g_world || g_world % n)
        return mf_fail("zero_group %d does not divide the %d ranks (groups of zero_group consecutive ranks each hold "
                       "every shard once)", n, g_world);
    if (use_ring()) return mf_fail("zero_group %d: hybrid sharding runs on MPI's collectives; unset MEMFIT_DIST_RING", n);
    if (g_hybrid) return 0;
    if (join_prefetch()) return -1;
    /* both splits are collective over the world: every rank calls this once,
     * at the same point of the trainer's start */
    MPI_Comm gc, xc;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, g_rank / n, g_rank, &gc);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split (shard group)");
    rc = MPI_Comm_split(MPI_COMM_WORLD, g_rank % n, g_rank, &xc);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split (across groups)");
    MPI_Comm_set_errhandler(gc, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(xc, MPI_ERRORS_RETURN);
    g_gc.comm = gc, g_xc.comm = xc;
    MPI_Comm_size(gc, &g_gc.size);
    MPI_Comm_rank(gc, &g_gc.rank);
    MPI_Comm_size(xc, &g_xc.size);
    MPI_Comm_rank(xc, &g_xc.rank);
    g_hybrid = 1;
    return 0;
}

int mf_dist_group(void) { return g_gc.size; }

const char *mf_dist_rank_path(const char *path, char *buf, size_t n) {
    if (g_world > 1) snprintf(buf, n, "%s.rank%d", path, g_rank);
    else snprintf(buf, n, "%s", path);
    return buf;
}

int mf_dist_file_private(int fd, const char *path) {
    if (!g_active || g_world == 1) return 0;
    /* (host, device, inode): two ranks on one host with the same file, or
     * a link; the host keeps equal inode numbers on two nodes' own disks apart */
    struct stat st;
    if (fstat(fd, &st) != 0) return mf_fail("rank %d: cannot stat %s", g_rank, path);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    uint64_t h = 1469598103934665603ull;  /* FNV-1a of the host name */
    for (const char *p = host; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    uint64_t mine[3] = {h, (uint64_t)st.st_dev, (uint64_t)st.st_ino};
    uint64_t *all = calloc((size_t)g_world * 3, sizeof *all);
    if (!all) return mf_fail("out of memory");
    if (join_prefetch()) { free(all); return -1; }
    MPI_Request req;
    int rc = MPI_Iallgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) { free(all); return mpi_fail(rc, "comparing the ranks' files"); }
    if (wait_req(&req, 1, "comparing the ranks' files")) { free(all); return -1; }
    int other = -1;
    for (int r = 0; r < g_world && other < 0; r++)
        if (r != g_rank && all[3 * r] == h && all[3 * r + 1] == mine[1] && all[3 * r + 2] == mine[2]) other = r;
    free(all);
    if (other >= 0)
        return mf_fail("rank %d: offload file %s is the same file as rank %d's (a link?); each rank needs a file of its "
                       "own: remove the link or give another --offload path", g_rank, path, other);
    return 0;
}

int mf_dist_stop_agree(int *sig) {
    int mine = *sig ? *sig : g_stop_sig;
    *sig = mine;
    if (!g_active || g_world == 1) return 0;
    if (join_prefetch()) return -1;
    int all = 0;
    MPI_Request req;
    int rc = MPI_Iallreduce(&mine, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "stop flag");
    if (wait_req(&req, 1, "stop flag")) return -1;
    *sig = all;
    if (all) {
        g_stop_agreed = 1;
        /* agreed: the ranks stop together, so no peer is dead; what is left
         * (checkpoint, report, MPI_Finalize) runs until the launcher's SIGKILL */
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
    }
    return 0;
}
