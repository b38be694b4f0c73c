/* The buffer table, its layout in one arena, and the budget check.
 *
 * Layout is interval packing, as a compiler lays out stack slots: each
 * buffer occupies [offset, offset+bytes) during phases [first, last]; two
 * buffers may share bytes only if their lifetimes are disjoint. Persistent
 * buffers go first in table order (so a component's tensors sit together),
 * the rest largest-first at the lowest offset that fits. */
#include "memfit/core.h"

#include <stdlib.h>
#include <string.h>

int mf_plan_init(mf_plan *p, int n_phases) {
    memset(p, 0, sizeof *p);
    if (n_phases < 1) return mf_fail("plan needs at least one phase");
    p->n_phases = n_phases;
    return 0;
}

void mf_plan_free(mf_plan *p) {
    free(p->bufs);
    memset(p, 0, sizeof *p);
}

int mf_plan_add(mf_plan *p, const char *name, mf_cat cat, mf_dtype dtype,
                int ndim, const int64_t *shape, int first, int last, int layer) {
    if (ndim < 0 || ndim > MF_MAX_DIMS) return mf_fail("buffer %s: %d dims (max %d)", name, ndim, MF_MAX_DIMS);
    if (first < 0 || last >= p->n_phases || first > last)
        return mf_fail("buffer %s: bad lifetime [%d, %d] of %d phases", name, first, last, p->n_phases);
    if (strlen(name) >= sizeof p->bufs[0].name) return mf_fail("buffer name too long: %s", name);
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        mf_buf *nb = realloc(p->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return mf_fail("out of memory growing the plan table");
        p->bufs = nb;
        p->cap = cap;
    }
    mf_buf *b = &p->bufs[p->n];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->cat = cat;
    b->dtype = dtype;
    b->ndim = ndim;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return mf_fail("buffer %s: negative dimension", name);
        b->shape[i] = shape[i];
        if (shape[i] && numel > INT64_MAX / shape[i]) return mf_fail("buffer %s: size overflows", name);
        numel *= shape[i];
    }
    b->numel = numel;
    size_t raw = (size_t)numel * mf_dtype_size(dtype);
    b->bytes = (raw + MF_ALIGN - 1) / MF_ALIGN * MF_ALIGN;
    b->first = first;
    b->last = last;
    b->layer = layer;
    return p->n++;
}

int mf_plan_find(const mf_plan *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->bufs[i].name, name) == 0) return i;
    return -1;
}

static int overlaps(const mf_buf *a, const mf_buf *b) {
    return a->first <= b->last && b->first <= a->last;
}

static int is_persistent(const mf_plan *p, const mf_buf *b) {
    return b->first == 0 && b->last == p->n_phases - 1;
}

static int in_arena(const mf_buf *b) { return !b->disk && !b->outside; }

static const mf_plan *sort_plan;
static int by_size_desc(const void *x, const void *y) {
    const mf_buf *a = &sort_plan->bufs[*(const int *)x], *b = &sort_plan->bufs[*(const int *)y];
    if (a->bytes != b->bytes) return a->bytes < b->bytes ? 1 : -1;
    return *(const int *)x - *(const int *)y;
}

typedef struct { size_t lo, hi; } span;
static int by_lo(const void *x, const void *y) {
    const span *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

void mf_plan_layout(mf_plan *p) {
    int n = p->n;
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int *placed = malloc((size_t)(n ? n : 1) * sizeof *placed);
    span *busy = malloc((size_t)(n ? n : 1) * sizeof *busy);
    if (!order || !placed || !busy) mf_panic("out of memory laying out %d buffers", n);
    int no = 0;
    for (int i = 0; i < n; i++) if (in_arena(&p->bufs[i]) && is_persistent(p, &p->bufs[i])) order[no++] = i;
    int np = no;
    for (int i = 0; i < n; i++) if (in_arena(&p->bufs[i]) && !is_persistent(p, &p->bufs[i])) order[no++] = i;
    n = no;  /* disk and outside rows take no arena bytes */
    sort_plan = p;  /* layout runs once at start-up on one thread */
    qsort(order + np, (size_t)(n - np), sizeof *order, by_size_desc);

    size_t arena = 0;
    int nplaced = 0;
    for (int k = 0; k < n; k++) {
        mf_buf *b = &p->bufs[order[k]];
        int nb = 0;
        for (int j = 0; j < nplaced; j++) {
            const mf_buf *o = &p->bufs[placed[j]];
            if (overlaps(b, o) && o->bytes) busy[nb++] = (span){o->offset, o->offset + o->bytes};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_lo);
        size_t off = 0;
        for (int j = 0; j < nb; j++) {
            if (busy[j].lo >= off + b->bytes) break;  /* the gap before it fits */
            if (busy[j].hi > off) off = busy[j].hi;
        }
        b->offset = off;
        if (off + b->bytes > arena) arena = off + b->bytes;
        placed[nplaced++] = order[k];
    }
    free(order);
    free(placed);
    free(busy);

    p->arena_bytes = arena;
    p->peak_bytes = 0;
    p->peak_phase = 0;
    memset(p->total_cat, 0, sizeof p->total_cat);
    memset(p->max_cat, 0, sizeof p->max_cat);
    p->disk_bytes = p->outside_bytes = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->bufs[i].disk) p->disk_bytes += p->bufs[i].bytes;
        else if (p->bufs[i].outside) p->outside_bytes += p->bufs[i].bytes;
        else p->total_cat[p->bufs[i].cat] += p->bufs[i].bytes;
    }
    size_t live[MF_CAT_COUNT];
    for (int ph = 0; ph < p->n_phases; ph++) {
        mf_plan_live_at(p, ph, live);
        size_t t = 0;
        for (int c = 0; c < MF_CAT_COUNT; c++) {
            t += live[c];
            if (live[c] > p->max_cat[c]) p->max_cat[c] = live[c];
        }
        if (t > p->peak_bytes) {
            p->peak_bytes = t;
            p->peak_phase = ph;
            memcpy(p->peak_cat, live, sizeof live);
        }
    }
}

void mf_plan_live_at(const mf_plan *p, int ph, size_t *out) {
    memset(out, 0, MF_CAT_COUNT * sizeof *out);
    for (int i = 0; i < p->n; i++) {
        const mf_buf *b = &p->bufs[i];
        if (in_arena(b) && b->first <= ph && ph <= b->last) out[b->cat] += b->bytes;
    }
}

int mf_plan_check_budget(const mf_plan *p, size_t overhead, size_t budget) {
    size_t need = p->arena_bytes + p->outside_bytes + overhead;
    if (budget == 0 || need <= budget) return 0;
    char list[768] = "", tmp[32], a[32], b[32], c[32];
    size_t len = 0;
    for (int i = 0; i < MF_CAT_COUNT; i++) {
        if (!p->peak_cat[i]) continue;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s %s", len ? ", " : "",
                                mf_cat_name((mf_cat)i), mf_size_format(p->peak_cat[i], tmp, sizeof tmp));
        if (len >= sizeof list) break;
    }
    if (p->outside_bytes && len < sizeof list)
        len += (size_t)snprintf(list + len, sizeof list - len, "%scomm outside the arena (MPI) %s", len ? ", " : "",
                                mf_size_format(p->outside_bytes, tmp, sizeof tmp));
    return mf_fail("plan needs %s (%s; runtime %s) but the budget is %s: over by %s",
                   mf_size_format(need, a, sizeof a), list, mf_size_format(overhead, tmp, sizeof tmp),
                   mf_size_format(budget, b, sizeof b), mf_size_format(need - budget, c, sizeof c));
}
