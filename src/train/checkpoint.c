/* Weights and checkpoints as safetensors.
 *
 * Weights use Hugging Face GPT-2 names and shapes (wte has V rows; the
 * padding rows memfit adds are zero and are not written). A checkpoint is
 * the weights plus every optimizer state row under its plan name
 * ("adam.m.<name>", "adam8.m_absmax.<name>", "adafactor.row.<name>", ...,
 * whole rows in their plan dtype and shape) and metadata (format, dims,
 * optimizer, step, data position, RNG state, config), written atomically,
 * so a crash mid-write leaves the previous checkpoint intact. */
#include "memfit/io.h"
#include "memfit/train.h"

#include <inttypes.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_FORMAT "memfit-checkpoint-2"

typedef struct { mf_trainer *t; int tensor, id; } row_reader;
static int read_row(void *ctx, uint64_t off, void *buf, size_t len) {
    row_reader *r = ctx;
    return mf_offstate_row_io(r->t, r->tensor, r->id, off, buf, len, 0);
}

static int add_entries(const mf_trainer *t, mf_st_entry *e, row_reader *rd, char (*names)[64], int with_optim) {
    const mf_model *m = &t->model;
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const mf_tensor *x = &m->tensors[i];
        snprintf(names[n], 64, "%s", x->name);
        e[n].name = names[n];
        e[n].dtype = MF_DTYPE_F32;
        e[n].ndim = x->ndim;
        e[n].shape[0] = x->rows_file;
        e[n].shape[1] = x->shape[1];
        e[n].data = mf_arena_ptr(&t->arena, x->p);
        e[n].nbytes = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1)) * sizeof(float);
        n++;
    }
    for (int i = 0; with_optim && i < m->n_tensors; i++) {
        for (int k = 0; k < MF_OPTIM_STATES; k++) {
            int id = m->tensors[i].st[k];
            if (id < 0) continue;
            const mf_buf *b = &t->plan.bufs[id];
            snprintf(names[n], 64, "%s", b->name);
            e[n].name = names[n];
            e[n].dtype = b->dtype;
            e[n].ndim = b->ndim;
            for (int d = 0; d < b->ndim; d++) e[n].shape[d] = b->shape[d];
            e[n].nbytes = (size_t)b->numel * mf_dtype_size(b->dtype);
            if (b->disk) {
                /* offloaded: streamed from the file a piece at a time */
                rd[n] = (row_reader){(mf_trainer *)t, i, id};
                e[n].read = read_row;
                e[n].read_ctx = &rd[n];
            } else e[n].data = mf_arena_ptr(&t->arena, id);
            n++;
        }
    }
    return n;
}

static int save(const mf_trainer *t, const char *path, int with_optim) {
    int nt = t->model.n_tensors * (with_optim ? 1 + MF_OPTIM_STATES : 1);
    mf_st_entry *e = calloc((size_t)nt, sizeof *e);
    char (*names)[64] = calloc((size_t)nt, sizeof *names);
    row_reader *rd = calloc((size_t)nt, sizeof *rd);
    char *cfg = malloc(1 << 16);
    if (!e || !names || !cfg || !rd) {
        free(e); free(names); free(cfg); free(rd);
        return mf_fail("out of memory writing %s", path);
    }
    int n = add_entries(t, e, rd, names, with_optim);
    char dims[128], step[32], pos[32], rng[32];
    snprintf(dims, sizeof dims, "%d,%d,%d,%d,%d", t->d.L, t->d.C, t->d.NH, t->d.maxT, t->d.V);
    snprintf(step, sizeof step, "%d", t->step);
    snprintf(pos, sizeof pos, "%" PRIu64, t->data_pos);
    snprintf(rng, sizeof rng, "%" PRIu64, t->rng.s);
    int rc = mf_config_to_yaml(&t->cfg, cfg, 1 << 16);
    const char *keys[] = {"format", "dims", "tokenizer", "step", "data_pos", "rng", "optimizer", "config"};
    const char *vals[] = {with_optim ? CKPT_FORMAT : "memfit-weights-1", dims, t->d.tokenizer, step, pos, rng,
                          mf_optim_name(t->model.opt.kind), cfg};
    if (rc == 0) rc = mf_st_write(path, e, n, keys, vals, with_optim ? 8 : 3);
    free(e);
    free(names);
    free(cfg);
    free(rd);
    return rc;
}

int mf_trainer_save_checkpoint(const mf_trainer *t, const char *path) { return save(t, path, 1); }
int mf_trainer_save_weights(const mf_trainer *t, const char *path) { return save(t, path, 0); }

static void shape_str(char *buf, size_t n, int ndim, const int64_t *s) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++) len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, i ? ", " : "", s[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

/* Copies from the file's read-only map a few MiB at a time and hands each
 * copied stretch's pages back to the kernel, so loading a checkpoint after
 * the arena exists adds at most one stretch to the process's peak RSS
 * instead of the whole file. */
static void copy_and_drop(void *dst, const void *src, size_t n) {
    const size_t step = 4u << 20;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < n; off += step) {
        size_t len = n - off < step ? n - off : step;
        memcpy((char *)dst + off, (const char *)src + off, len);
        uintptr_t lo = (uintptr_t)src + off, hi = lo + len;
        lo &= ~(page - 1);
        hi = (hi + page - 1) & ~(page - 1);
        madvise((void *)lo, hi - lo, MADV_DONTNEED);  /* file-backed: re-read if touched again */
    }
}

/* Copies tensor `name` (prefix + Hugging Face name) into buffer `id`. */
static int load_tensor(const mf_trainer *t, const mf_st_file *f, const char *path, const char *prefix,
                       const mf_tensor *x, int id) {
    char name[96];
    snprintf(name, sizeof name, "%s%s", prefix, x->name);
    const mf_st_tensor *s = mf_st_find(f, name);
    if (!s) {
        char alt[128];
        snprintf(alt, sizeof alt, "transformer.%s", name);  /* GPT2LMHeadModel state dicts */
        s = mf_st_find(f, alt);
    }
    if (!s) return mf_fail("%s: tensor '%s' is missing", path, name);
    int64_t want[2] = {x->rows_file, x->shape[1]};
    int ok = s->dtype == MF_DTYPE_F32 && s->ndim == x->ndim && s->shape[0] == want[0] &&
             (x->ndim == 1 || s->shape[1] == want[1]);
    if (!ok) {
        char a[64], b[64];
        shape_str(a, sizeof a, s->ndim, s->shape);
        shape_str(b, sizeof b, x->ndim, want);
        return mf_fail("%s: tensor '%s' is %s %s, the model needs F32 %s", path, name,
                       mf_dtype_name(s->dtype), a, b);
    }
    float *dst = mf_arena_ptr(&t->arena, id);
    copy_and_drop(dst, s->data, s->nbytes);
    /* padding rows (wte beyond V) stay zero */
    size_t rest = (size_t)(x->numel * (int64_t)sizeof(float)) - s->nbytes;
    if (rest) memset((char *)dst + s->nbytes, 0, rest);
    return 0;
}

static int has_state_row(const mf_tensor *x, int id) {
    for (int k = 0; k < MF_OPTIM_STATES; k++) if (x->st[k] == id) return 1;
    return 0;
}

/* Copies state row `id` from the tensor of the same name, which must have
 * the row's dtype and shape exactly. */
static int load_state_row(const mf_trainer *t, const mf_st_file *f, const char *path, int id) {
    const mf_buf *b = &t->plan.bufs[id];
    const mf_st_tensor *s = mf_st_find(f, b->name);
    if (!s) return mf_fail("%s: optimizer state '%s' is missing", path, b->name);
    int ok = s->dtype == b->dtype && s->ndim == b->ndim;
    for (int d = 0; ok && d < b->ndim; d++) ok = s->shape[d] == b->shape[d];
    if (!ok || s->nbytes != (size_t)b->numel * mf_dtype_size(b->dtype)) {
        char x[64], y[64];
        shape_str(x, sizeof x, s->ndim, s->shape);
        shape_str(y, sizeof y, b->ndim, b->shape);
        return mf_fail("%s: optimizer state '%s' is %s %s, the run needs %s %s", path, b->name,
                       mf_dtype_name(s->dtype), x, mf_dtype_name(b->dtype), y);
    }
    if (!b->disk) {
        copy_and_drop(mf_arena_ptr(&t->arena, id), s->data, s->nbytes);
        return 0;
    }
    /* offloaded: into the file through the chunk map, dropping the
     * checkpoint's pages as they are copied */
    int ti = 0;
    while (ti < t->model.n_tensors && !has_state_row(&t->model.tensors[ti], id)) ti++;
    const size_t step = 4u << 20;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < s->nbytes; off += step) {
        size_t len = s->nbytes - off < step ? s->nbytes - off : step;
        const char *src = (const char *)s->data + off;
        if (mf_offstate_row_io((mf_trainer *)t, ti, id, off, (void *)src, len, 1)) return -1;
        uintptr_t lo = (uintptr_t)src & ~(page - 1), hi = ((uintptr_t)src + len + page - 1) & ~(page - 1);
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    return 0;
}

static int is_state_name(const char *name) {
    static const char *prefix[] = {"adam.", "adam8.", "adafactor.", "sgd."};
    for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++)
        if (strncmp(name, prefix[i], strlen(prefix[i])) == 0) return 1;
    return 0;
}

static int ignorable(const char *name) {
    size_t n = strlen(name);
    /* tied head and attention mask buffers some exporters include */
    return strcmp(name, "lm_head.weight") == 0 ||
           (n > 9 && strcmp(name + n - 9, ".attn.bias") == 0) ||
           (n > 16 && strcmp(name + n - 16, ".attn.masked_bias") == 0);
}

int mf_trainer_load_weights(mf_trainer *t, const char *path) {
    mf_st_file f;
    if (mf_st_open(&f, path)) return -1;
    int rc = 0;
    for (int i = 0; i < t->model.n_tensors && !rc; i++)
        rc = load_tensor(t, &f, path, "", &t->model.tensors[i], t->model.tensors[i].p);
    for (int i = 0; i < f.n && !rc; i++) {
        const char *nm = f.tensors[i].name;
        if (strncmp(nm, "transformer.", 12) == 0) nm += 12;
        int known = ignorable(nm) || is_state_name(nm);
        for (int k = 0; k < t->model.n_tensors && !known; k++) known = strcmp(nm, t->model.tensors[k].name) == 0;
        if (!known) rc = mf_fail("%s: unexpected tensor '%s' (not part of this GPT-2 model)", path, f.tensors[i].name);
    }
    mf_st_close(&f);
    return rc;
}

int mf_trainer_load_checkpoint(mf_trainer *t, const char *path) {
    mf_st_file f;
    if (mf_st_open(&f, path)) return -1;
    int rc = 0;
    const char *fmt = mf_st_meta(&f, "format"), *dims = mf_st_meta(&f, "dims"), *opt = mf_st_meta(&f, "optimizer");
    const char *step = mf_st_meta(&f, "step"), *pos = mf_st_meta(&f, "data_pos"), *rng = mf_st_meta(&f, "rng");
    char want[128];
    snprintf(want, sizeof want, "%d,%d,%d,%d,%d", t->d.L, t->d.C, t->d.NH, t->d.maxT, t->d.V);
    const mf_model *m = &t->model;
    int train = t->mode == MF_MODE_TRAIN;  /* inference needs no optimizer state */
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
        rc = mf_fail("%s is not a memfit checkpoint of this version (format '%s', expected %s)", path, fmt ? fmt : "none", CKPT_FORMAT);
    else if (!dims || strcmp(dims, want) != 0)
        rc = mf_fail("%s: checkpoint model (L,C,H,T,V) = %s does not match the configured %s", path, dims ? dims : "?", want);
    else if (!step || !pos || !rng || !opt) rc = mf_fail("%s: checkpoint metadata incomplete", path);
    else if (train && strcmp(opt, mf_optim_name(m->opt.kind)) != 0)
        rc = mf_fail("%s holds %s state but the run uses optimizer %s", path, opt, mf_optim_name(m->opt.kind));
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const mf_tensor *x = &m->tensors[i];
        rc = load_tensor(t, &f, path, "", x, x->p);
        for (int k = 0; train && k < MF_OPTIM_STATES && !rc; k++)
            if (x->st[k] >= 0) rc = load_state_row(t, &f, path, x->st[k]);
    }
    if (!rc) {
        char *e1, *e2, *e3;
        long s = strtol(step, &e1, 10);
        unsigned long long p = strtoull(pos, &e2, 10), r = strtoull(rng, &e3, 10);
        if (*e1 || *e2 || *e3 || s < 0) rc = mf_fail("%s: bad checkpoint metadata", path);
        else {
            t->step = (int)s;
            t->data_pos = p;
            t->rng.s = r;
        }
    }
    mf_st_close(&f);
    return rc;
}
