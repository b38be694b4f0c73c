/* memfit core: errors, dtypes, memory categories, the buffer table (plan),
 * its arena layout, and the ledger.
 *
 * Owns: the one table of every buffer a run uses (mf_plan), the one arena
 * those buffers live in (mf_arena), and the byte counts per category
 * (mf_ledger). Promises: sizes are bytes; every buffer offset is 64-byte
 * aligned; the arena is the only allocation the training step touches.
 * Errors are values: functions that can fail return 0 on success and -1 on
 * failure, with a one-line message readable through mf_error().
 */
#ifndef MEMFIT_CORE_H
#define MEMFIT_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------- */

/* Sets the thread's last error message (printf-style) and returns -1, so
 * `return mf_fail("bad %s", x);` reads as one statement. */
int mf_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message set by mf_fail on this thread ("" if none). */
const char *mf_error(void);
/* Internal invariant broken (a memfit bug, never user input): print and abort. */
void mf_panic(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* ---- dtypes ---------------------------------------------------------- */

typedef enum {
    MF_DTYPE_F32,
    MF_DTYPE_BF16,
    MF_DTYPE_F16,
    MF_DTYPE_I32,
    MF_DTYPE_U16,
    MF_DTYPE_U8,
    MF_DTYPE_I64,
    MF_DTYPE_COUNT
} mf_dtype;

size_t mf_dtype_size(mf_dtype t);
/* safetensors spelling: "F32", "BF16", "F16", "I32", "U16", "U8", "I64". */
const char *mf_dtype_name(mf_dtype t);
/* Parses a safetensors dtype name; returns -1 if unknown. */
int mf_dtype_parse(const char *s, mf_dtype *out);

/* ---- memory categories (DESIGN.md "Memory categories") --------------- */

typedef enum {
    MF_CAT_PARAMS,  /* compute copies of weights */
    MF_CAT_MASTER,  /* fp32 master weights when compute weights are 16-bit */
    MF_CAT_GRADS,
    MF_CAT_OPTIM,   /* optimizer state */
    MF_CAT_ACTS,    /* activations kept for backward */
    MF_CAT_WORK,    /* scratch freed within a layer */
    MF_CAT_DATA,    /* loader buffers */
    MF_CAT_ADAPTER,
    MF_CAT_QUANT,
    MF_CAT_COMM,
    MF_CAT_OFFLOAD, /* windows that stream disk-resident state */
    MF_CAT_TEACHER, /* distillation: the frozen teacher's weights and forward buffers */
    MF_CAT_COUNT
} mf_cat;

const char *mf_cat_name(mf_cat c);

/* ---- sizes ----------------------------------------------------------- */

/* Parses "123", "512MiB", "2GiB", "1.5GB", "64k" into bytes (binary units for
 * KiB/MiB/GiB/TiB and k/K/M/G; decimal for kB/MB/GB). -1 on bad input. */
int mf_size_parse(const char *s, size_t *out);
/* Formats bytes as "1.23 GiB" into buf; returns buf. */
char *mf_size_format(size_t bytes, char *buf, size_t n);

/* ---- the buffer table ------------------------------------------------ */

#define MF_MAX_DIMS 4
#define MF_ALIGN 64

/* A lifetime is an inclusive range of phases of one micro-step. A buffer
 * whose lifetime is [0, n_phases-1] is persistent: it outlives the step
 * (weights, gradients, optimizer state, loader buffers). */
typedef struct {
    char name[96];
    mf_cat cat;
    mf_dtype dtype;
    int ndim;
    int64_t shape[MF_MAX_DIMS];
    int64_t numel;
    size_t bytes;   /* numel * dtype size, rounded up to MF_ALIGN */
    int first, last;
    int layer;      /* transformer layer this buffer belongs to, or -1 */
    int disk;       /* lives in the offload file, not the arena (offset is its file offset) */
    int outside;    /* memory the process holds outside the arena and the ledger: the MPI library's
                     * scratch for the collectives (comm.mpi.*, sized from a measurement); no offset */
    size_t offset;  /* set by mf_plan_layout (arena rows) or the offload planner (disk rows) */
} mf_buf;

typedef struct {
    mf_buf *bufs;
    int n, cap;
    int n_phases;
    const char **phase_names; /* optional, n_phases entries, not owned */
    /* filled by mf_plan_layout: */
    size_t arena_bytes;              /* bytes the arena reserves */
    size_t peak_bytes;               /* max over phases of live bytes */
    int peak_phase;
    size_t peak_cat[MF_CAT_COUNT];   /* live bytes per category at peak_phase */
    size_t max_cat[MF_CAT_COUNT];    /* each category's own max over phases */
    size_t total_cat[MF_CAT_COUNT];  /* sum of all arena rows per category */
    size_t disk_bytes;               /* sum of disk rows (not in the arena) */
    size_t outside_bytes;            /* sum of outside rows: resident, but not in the arena or the ledger */
} mf_plan;

int mf_plan_init(mf_plan *p, int n_phases);
void mf_plan_free(mf_plan *p);
/* Adds a row; returns its id (>= 0) or -1 (message via mf_error). */
int mf_plan_add(mf_plan *p, const char *name, mf_cat cat, mf_dtype dtype,
                int ndim, const int64_t *shape, int first, int last, int layer);
int mf_plan_find(const mf_plan *p, const char *name);
/* Assigns offsets (buffers whose lifetimes do not overlap may share bytes)
 * and fills the summary fields. */
void mf_plan_layout(mf_plan *p);
/* Live bytes per category at phase `ph` (out has MF_CAT_COUNT entries). */
void mf_plan_live_at(const mf_plan *p, int ph, size_t *out);
/* Refuses a plan whose arena plus its outside rows plus `overhead` (runtime
 * bytes outside the arena) exceeds `budget`: returns -1 with a message naming the categories,
 * the total, the budget and by how much it exceeds. budget 0 = no limit. */
int mf_plan_check_budget(const mf_plan *p, size_t overhead, size_t budget);

/* ---- ledger ---------------------------------------------------------- */

typedef struct {
    size_t cur[MF_CAT_COUNT];
    size_t peak[MF_CAT_COUNT];        /* each category's own high-water mark */
    size_t cur_total, peak_total;
    size_t at_peak[MF_CAT_COUNT];     /* breakdown when peak_total was reached */
    size_t rss_baseline;              /* VmRSS before the arena was mapped */
} mf_ledger;

void mf_ledger_init(mf_ledger *l);
void mf_ledger_add(mf_ledger *l, mf_cat c, size_t bytes);
void mf_ledger_sub(mf_ledger *l, mf_cat c, size_t bytes);

/* Process memory from /proc/self/status, bytes (0 if unavailable). */
size_t mf_rss_current(void);
size_t mf_rss_peak(void);

/* ---- arena ----------------------------------------------------------- */

/* Phase hook: called as the arena leaves phase `from` for phase `to`,
 * before the buffers whose lifetime ended are released. Buffers are counted
 * when a phase first asks for them and released only at phase changes, so
 * at the call the ledger holds the high-water mark of phase `from`.
 * mf_arena_phase calls it when the phase number changes; mf_arena_step
 * calls it every time (a micro-step starts at phase 0, also from phase 0).
 * It must not call back into the arena. NULL (the default) costs one test
 * per phase change. */
typedef void (*mf_arena_phase_fn)(void *ctx, int from, int to);

/* One mapping of plan->arena_bytes, pre-faulted so the process's RSS is the
 * plan from the start. Persistent buffers are counted in the ledger from
 * mf_arena_init on; every other buffer is counted when the step first asks
 * for it through mf_arena_get (which checks the caller is inside the
 * buffer's lifetime) and uncounted when its lifetime ends. */
typedef struct {
    const mf_plan *plan;
    mf_ledger *ledger;
    uint8_t *base;
    size_t size;
    int phase;
    unsigned char *live;  /* per buffer: counted in the ledger now */
    int poison;           /* fill buffers with NaN when their lifetime ends */
    mf_arena_phase_fn on_phase;  /* optional phase hook (see above), NULL after init */
    void *on_phase_ctx;
} mf_arena;

int mf_arena_init(mf_arena *a, const mf_plan *plan, mf_ledger *ledger);
void mf_arena_free(mf_arena *a);
/* Moves to phase `ph`: buffers whose lifetime ended are released. */
void mf_arena_phase(mf_arena *a, int ph);
/* Starts a micro-step: every non-persistent buffer is released, phase 0. */
void mf_arena_step(mf_arena *a);
void *mf_arena_get(mf_arena *a, int id);
/* Pointer without lifetime check or ledger effect: for set-up and I/O of
 * persistent buffers outside the step (loading weights, checkpoints). */
void *mf_arena_ptr(const mf_arena *a, int id);
/* Installs (or with fn NULL removes) the phase hook. */
void mf_arena_set_phase_hook(mf_arena *a, mf_arena_phase_fn fn, void *ctx);
/* Scans row `id` when it is live now (counted in the ledger, so its bytes
 * are its own) and F32, BF16 or F16: mf_arena_row_nonfinite finds its first
 * NaN or infinity, mf_arena_row_maxabs its finite element of largest
 * magnitude; each returns 1 with *idx and *val set, else 0. For messages
 * after a step went non-finite: they read the whole row, so they stay off
 * the normal path. */
int mf_arena_row_nonfinite(const mf_arena *a, int id, int64_t *idx, float *val);
int mf_arena_row_maxabs(const mf_arena *a, int id, int64_t *idx, float *val);

/* ---- misc ------------------------------------------------------------ */

double mf_time_now(void); /* monotonic seconds */

/* Deterministic RNG (xorshift64*), state is one uint64 for checkpoints. */
typedef struct { uint64_t s; } mf_rng;
void mf_rng_seed(mf_rng *r, uint64_t seed);
uint32_t mf_rng_u32(mf_rng *r);
float mf_rng_uniform(mf_rng *r);       /* [0, 1) */
float mf_rng_normal(mf_rng *r);        /* N(0, 1), Box-Muller */

/* $MEMFIT_CACHE, or ~/.cache/memfit: where fetched data and cached rates live. */
const char *mf_cache_dir(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
