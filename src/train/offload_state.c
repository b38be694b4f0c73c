/* Optimizer state in the offload file (offload optimizer=disk:PATH).
 *
 * Layout: each tensor's state is cut into chunks of whole quantisation
 * blocks that fit one window; a chunk is one contiguous region of the file
 * holding, in state-row order, that chunk's slice of every state row (m
 * then v for AdamW; codes, codes, absmax, absmax for 8-bit AdamW). The
 * optimizer step streams the regions through the two planned windows
 * (mf_offload_stream overlaps reading the next chunk and writing back the
 * previous one with the update of this one), so resident state is the
 * windows only. The plan's state rows keep their logical shapes and names:
 * checkpoints read and write them through the chunk map, so a checkpoint
 * holds the same tensors with or without offload. The file is scratch: a
 * crash mid-step leaves it half-updated, and resuming refills it from the
 * last checkpoint. */
#include "optim/offload.h"
#include "memfit/optim.h"
#include "memfit/train.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct mf_offchunk {
    int tensor;
    int64_t e0, n;                  /* elements [e0, e0+n) */
    uint64_t off;                   /* the region */
    size_t len;
    size_t part[MF_OPTIM_STATES];   /* bytes of each state row's slice */
};

/* The elements whose state this rank keeps: the whole tensor, or under
 * ZeRO >= 1 its shard [lo, hi) (the state rows are planned on the shard,
 * and each rank streams only its shard's state through its own file). */
static int64_t state_n(const mf_tensor *x) { return x->hi - x->lo; }
/* State row k of a tensor: bytes per unit, and units for elements [e0, e0+n)
 * of the shard: a row as long as the shard has a unit per element, else
 * (absmax) per block. */
static size_t unit_bytes(const mf_trainer *t, int id) { return mf_dtype_size(t->plan.bufs[id].dtype); }
static int per_block(const mf_trainer *t, const mf_tensor *x, int id) { return t->plan.bufs[id].numel != state_n(x); }
static int64_t units(const mf_trainer *t, const mf_tensor *x, int id, int64_t e0, int64_t n, int block) {
    if (!per_block(t, x, id)) return n;
    return (e0 + n + block - 1) / block - e0 / block;
}

int mf_offstate_open(mf_trainer *t) {
    mf_model *m = &t->model;
    const mf_optim *o = &m->opt;
    size_t win = o->offload_window;
    int cap = 0, n = 0;
    uint64_t off = 0;
    struct mf_offchunk *ch = NULL;
    for (int i = 0; i < m->n_tensors; i++) {
        const mf_tensor *x = &m->tensors[i];
        if (x->st[0] < 0) continue;  /* sgd without momentum keeps no state */
        int block = mf_optim_block(o, &x->os);
        /* bytes of one block's worth of every state row */
        size_t per = 0;
        for (int k = 0; k < MF_OPTIM_STATES; k++)
            if (x->st[k] >= 0) per += unit_bytes(t, x->st[k]) * (per_block(t, x, x->st[k]) ? 1 : (size_t)block);
        int64_t E = (int64_t)(win / per) * block;
        for (int64_t e0 = 0; e0 < state_n(x); e0 += E) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                struct mf_offchunk *nc = realloc(ch, (size_t)cap * sizeof *nc);
                if (!nc) { free(ch); return mf_fail("out of memory for the offload chunk map"); }
                ch = nc;
            }
            struct mf_offchunk *c = &ch[n++];
            memset(c, 0, sizeof *c);
            c->tensor = i;
            c->e0 = e0;
            c->n = state_n(x) - e0 < E ? state_n(x) - e0 : E;
            c->off = off;
            for (int k = 0; k < MF_OPTIM_STATES; k++)
                if (x->st[k] >= 0) c->part[k] = (size_t)units(t, x, x->st[k], c->e0, c->n, block) * unit_bytes(t, x->st[k]);
            for (int k = 0; k < MF_OPTIM_STATES; k++) c->len += c->part[k];
            off += c->len;
        }
    }
    t->off_chunks = ch;
    t->off_n = n;
    t->off_bytes = off;
    if (mf_offload_open(&t->off, o->offload_path, off)) return -1;
    if (mf_offload_in_ram(t->off))
        fprintf(stderr, "memfit: warning: offload file %s is on a RAM file system; its bytes are still RAM\n",
                o->offload_path);
    return 0;
}

void mf_offstate_close(mf_trainer *t) {
    mf_offload_close(t->off, 1);
    free(t->off_chunks);
    t->off = NULL;
    t->off_chunks = NULL;
}

typedef struct { mf_trainer *t; int zero; float gscale; } stream_ctx;

static int chunk_fn(void *ctx, int k, void *buf, size_t len) {
    stream_ctx *s = ctx;
    mf_trainer *t = s->t;
    const struct mf_offchunk *c = &t->off_chunks[k];
    const mf_tensor *x = &t->model.tensors[c->tensor];
    void *st[MF_OPTIM_STATES];
    size_t at = 0;
    for (int j = 0; j < MF_OPTIM_STATES; j++) {
        st[j] = c->part[j] ? (char *)buf + at : NULL;
        at += c->part[j];
    }
    if (at != len) return mf_fail("offload chunk %d: %zu bytes, expected %zu", k, len, at);
    if (s->zero) {
        mf_optim_zero_range(&t->model.opt, st, x->st, &x->os, c->e0, c->n);
        return 0;
    }
    if (x->mw < 0 && mf_tensor_is16(&t->model, x)) {  /* master_weights 0: bf16 weights, sliced update */
        mf_trainer_update16(t, c->tensor, st, c->e0, c->n, (const float *)mf_arena_get(&t->arena, x->g) + c->e0,
                            0, s->gscale);
        return 0;
    }
    /* ZeRO >= 1: the chunk is of this rank's shard; stage 3 keeps the
     * parameters' shard apart (ps), stages 2-3 the gradient's (gs) */
    mf_arena *a = &t->arena;
    float *p = (x->ps >= 0 ? (float *)mf_arena_get(a, x->ps) : (float *)mf_arena_get(a, mf_tensor_weights_row(x)) + x->lo) + c->e0;
    const float *g = (x->gs >= 0 ? (const float *)mf_arena_get(a, x->gs) : (const float *)mf_arena_get(a, x->g) + x->lo) + c->e0;
    mf_optim_update_range(&t->model.opt, st, p, g, &x->os, c->n, (float)t->lr,
                          x->decay ? (float)t->cfg.weight_decay : 0.0f, t->step + 1, s->gscale);
    return 0;
}

static int stream(mf_trainer *t, int zero, float gscale, void *const bufs[2]) {
    mf_region *r = malloc((size_t)(t->off_n ? t->off_n : 1) * sizeof *r);
    if (!r) return mf_fail("out of memory for the offload regions");
    for (int k = 0; k < t->off_n; k++) r[k] = (mf_region){t->off_chunks[k].off, t->off_chunks[k].len};
    stream_ctx s = {t, zero, gscale};
    int rc = mf_offload_stream(t->off, r, t->off_n, bufs, t->model.opt.offload_window, 1, chunk_fn, &s);
    free(r);
    return rc;
}

int mf_offstate_zero(mf_trainer *t) {
    /* before the first step the windows' bytes are free (nothing else is live) */
    void *bufs[2] = {mf_arena_ptr(&t->arena, t->model.offload_win[0]), mf_arena_ptr(&t->arena, t->model.offload_win[1])};
    return stream(t, 1, 0.0f, bufs);
}

int mf_offstate_step(mf_trainer *t, float gscale) {
    void *bufs[2] = {mf_arena_get(&t->arena, t->model.offload_win[0]), mf_arena_get(&t->arena, t->model.offload_win[1])};
    return stream(t, 0, gscale, bufs);
}

/* Bytes [o, o+len) of state row `id` of tensor `ti`, read into buf or
 * written from it, through the chunk map. */
int mf_offstate_row_io(mf_trainer *t, int ti, int id, uint64_t o, void *buf, size_t len, int write) {
    const mf_tensor *x = &t->model.tensors[ti];
    int k = 0;
    while (k < MF_OPTIM_STATES && x->st[k] != id) k++;
    if (k == MF_OPTIM_STATES) return mf_fail("offload: row %d is not a state row of %s", id, x->name);
    int first = 0;
    while (first < t->off_n && t->off_chunks[first].tensor != ti) first++;
    size_t u = unit_bytes(t, id);
    int block = mf_optim_block(&t->model.opt, &x->os);
    /* every chunk but a tensor's last holds the same whole number of blocks */
    int64_t E = t->off_chunks[first].n;
    int64_t per_chunk = E == state_n(x) ? INT64_MAX : per_block(t, x, id) ? E / block : E;
    while (len > 0) {
        int64_t unit = (int64_t)(o / u), c = unit / per_chunk;
        const struct mf_offchunk *ch = &t->off_chunks[first + c];
        if (first + c >= t->off_n || ch->tensor != ti) return mf_fail("offload: %s byte %llu is outside its chunks", x->name, (unsigned long long)o);
        uint64_t in = o - (uint64_t)(c * per_chunk) * u, pos = ch->off;
        for (int j = 0; j < k; j++) pos += ch->part[j];
        size_t piece = ch->part[k] - in < len ? ch->part[k] - (size_t)in : len;
        int rc = write ? mf_offload_write(t->off, pos + in, buf, piece) : mf_offload_read(t->off, pos + in, buf, piece);
        if (rc) return -1;
        buf = (char *)buf + piece;
        o += piece;
        len -= piece;
    }
    return 0;
}
