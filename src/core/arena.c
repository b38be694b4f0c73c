/* The arena and the ledger.
 *
 * The arena is one anonymous mapping, pre-faulted so that resident memory is
 * the plan from the first step (no page-fault surprises mid-run). The ledger
 * counts a buffer when the step first asks for its pointer and uncounts it
 * when its lifetime ends, so "ledger peak == planned peak" checks that the
 * code uses exactly the buffers the plan declares, when it declares them. */
#include "memfit/core.h"
#include "kernels/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void mf_ledger_init(mf_ledger *l) { memset(l, 0, sizeof *l); }

void mf_ledger_add(mf_ledger *l, mf_cat c, size_t bytes) {
    l->cur[c] += bytes;
    l->cur_total += bytes;
    if (l->cur[c] > l->peak[c]) l->peak[c] = l->cur[c];
    if (l->cur_total > l->peak_total) {
        l->peak_total = l->cur_total;
        memcpy(l->at_peak, l->cur, sizeof l->cur);
    }
}

void mf_ledger_sub(mf_ledger *l, mf_cat c, size_t bytes) {
    if (l->cur[c] < bytes) mf_panic("ledger: category %s goes negative", mf_cat_name(c));
    l->cur[c] -= bytes;
    l->cur_total -= bytes;
}

static size_t status_field(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            kb = strtoull(line + klen, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

size_t mf_rss_current(void) { return status_field("VmRSS:"); }
size_t mf_rss_peak(void) { return status_field("VmHWM:"); }

#ifdef MEMFIT_POISON
static const int poison_default = 1;
#else
static const int poison_default = 0;
#endif

int mf_arena_init(mf_arena *a, const mf_plan *plan, mf_ledger *ledger) {
    memset(a, 0, sizeof *a);
    a->plan = plan;
    a->ledger = ledger;
    a->poison = poison_default;
    a->size = plan->arena_bytes;
    a->live = calloc((size_t)(plan->n ? plan->n : 1), 1);
    if (!a->live) return mf_fail("out of memory for the arena's live table");
    if (a->size) {
        /* transparent huge pages where the kernel allows them (a hint; this
         * machine's THP mode is "madvise"): the arena is resident from the
         * start either way, so the RSS is the same, and 2 MiB pages spare
         * the TLB on the multi-100-MiB weight, gradient and optimizer rows
         * that the GEMMs and AdamW stream through. The hint has to come
         * before the pages are faulted in, so the mapping is populated
         * after it (MADV_POPULATE_WRITE, else MAP_POPULATE as before).
         * MEMFIT_HUGEPAGES=0 maps 4 KiB pages only. */
        const char *hp = getenv("MEMFIT_HUGEPAGES");
        int huge = !(hp && strcmp(hp, "0") == 0);
        void *m = mmap(NULL, a->size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | (huge ? 0 : MAP_POPULATE), -1, 0);
#if defined(MADV_HUGEPAGE) && defined(MADV_POPULATE_WRITE)
        if (m != MAP_FAILED && huge) {
            (void)madvise(m, a->size, MADV_HUGEPAGE);
            if (madvise(m, a->size, MADV_POPULATE_WRITE) != 0) {
                munmap(m, a->size);
                m = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            }
        }
#else
        if (m != MAP_FAILED && huge) {
            munmap(m, a->size);
            m = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        }
#endif
        if (m == MAP_FAILED) {
            free(a->live);
            a->live = NULL;
            char s[32];
            return mf_fail("cannot map the %s arena: out of memory", mf_size_format(a->size, s, sizeof s));
        }
        a->base = m;
        if (a->poison) memset(a->base, 0xFF, a->size);  /* NaN: reads before writes show up */
    }
    /* persistent buffers (weights, gradients, optimizer state, loader
     * buffers) hold their bytes from now on */
    for (int i = 0; i < plan->n; i++) {
        const mf_buf *b = &plan->bufs[i];
        if (!b->disk && !b->outside && b->first == 0 && b->last == plan->n_phases - 1) {
            a->live[i] = 1;
            mf_ledger_add(ledger, b->cat, b->bytes);
        }
    }
    return 0;
}

void mf_arena_free(mf_arena *a) {
    if (a->base) munmap(a->base, a->size);
    free(a->live);
    memset(a, 0, sizeof *a);
}

static void release(mf_arena *a, int i) {
    const mf_buf *b = &a->plan->bufs[i];
    a->live[i] = 0;
    mf_ledger_sub(a->ledger, b->cat, b->bytes);
    if (a->poison) memset(a->base + b->offset, 0xFF, b->bytes);
}

void mf_arena_set_phase_hook(mf_arena *a, mf_arena_phase_fn fn, void *ctx) {
    a->on_phase = fn;
    a->on_phase_ctx = ctx;
}

void mf_arena_phase(mf_arena *a, int ph) {
    if (ph < 0 || ph >= a->plan->n_phases) mf_panic("arena: phase %d out of range", ph);
    if (a->on_phase && ph != a->phase) a->on_phase(a->on_phase_ctx, a->phase, ph);
    for (int i = 0; i < a->plan->n; i++)
        if (a->live[i] && a->plan->bufs[i].last < ph) release(a, i);
    a->phase = ph;
}

void mf_arena_step(mf_arena *a) {
    int last = a->plan->n_phases - 1;
    if (a->on_phase) a->on_phase(a->on_phase_ctx, a->phase, 0);
    for (int i = 0; i < a->plan->n; i++) {
        const mf_buf *b = &a->plan->bufs[i];
        if (a->live[i] && !(b->first == 0 && b->last == last)) release(a, i);
    }
    a->phase = 0;
}

void *mf_arena_get(mf_arena *a, int id) {
    if (id < 0 || id >= a->plan->n) mf_panic("arena: no buffer %d", id);
    const mf_buf *b = &a->plan->bufs[id];
    if (b->disk) mf_panic("arena: buffer %s lives in the offload file", b->name);
    if (b->outside) mf_panic("arena: buffer %s is memory outside the arena (the MPI library's)", b->name);
    if (a->phase < b->first || a->phase > b->last)
        mf_panic("arena: buffer %s used in phase %d outside its lifetime [%d, %d]",
                 b->name, a->phase, b->first, b->last);
    if (!a->live[id]) {
        a->live[id] = 1;
        mf_ledger_add(a->ledger, b->cat, b->bytes);
    }
    return a->base + b->offset;
}

void *mf_arena_ptr(const mf_arena *a, int id) {
    if (id < 0 || id >= a->plan->n) mf_panic("arena: no buffer %d", id);
    if (a->plan->bufs[id].disk) mf_panic("arena: buffer %s lives in the offload file", a->plan->bufs[id].name);
    if (a->plan->bufs[id].outside) mf_panic("arena: buffer %s is memory outside the arena", a->plan->bufs[id].name);
    return a->base + a->plan->bufs[id].offset;
}

/* element j of a float row as float; 0 with *ok = 0 for other dtypes */
static float row_at(const mf_buf *b, const void *p, int64_t j, int *ok) {
    *ok = 1;
    if (b->dtype == MF_DTYPE_F32) return ((const float *)p)[j];
    if (b->dtype == MF_DTYPE_BF16) return mf_bf16_to_f32(((const mf_bf16 *)p)[j]);
    if (b->dtype == MF_DTYPE_F16) return mf_fp16_to_f32(((const mf_fp16 *)p)[j]);
    *ok = 0;
    return 0;
}

/* first non-finite element (maxabs 0) or largest |finite element| (maxabs 1) */
static int scan_row(const mf_arena *a, int id, int maxabs, int64_t *idx, float *val) {
    if (id < 0 || id >= a->plan->n) return 0;
    const mf_buf *b = &a->plan->bufs[id];
    if (b->disk || b->outside || !a->live[id]) return 0;
    const void *p = a->base + b->offset;
    int found = 0;
    float best = -1;
    for (int64_t j = 0; j < b->numel; j++) {
        int ok;
        float v = row_at(b, p, j, &ok);
        if (!ok) return 0;
        if (!maxabs && !isfinite(v)) {
            *idx = j;
            *val = v;
            return 1;
        }
        if (maxabs && isfinite(v) && fabsf(v) > best) {
            best = fabsf(v);
            found = 1;
            *idx = j;
            *val = v;
        }
    }
    return found;
}

int mf_arena_row_nonfinite(const mf_arena *a, int id, int64_t *idx, float *val) { return scan_row(a, id, 0, idx, val); }

int mf_arena_row_maxabs(const mf_arena *a, int id, int64_t *idx, float *val) { return scan_row(a, id, 1, idx, val); }
