/* Weights and checkpoints as safetensors.
 *
 * Weights use Hugging Face GPT-2 names and shapes (wte has V rows; the
 * padding rows memfit adds are zero and are not written). A checkpoint is
 * the weights plus every optimizer state row under its plan name
 * ("adam.m.<name>", "adam8.m_absmax.<name>", "adafactor.row.<name>", ...,
 * whole rows in their plan dtype and shape) and metadata (format, dims,
 * optimizer, step, data position, RNG state, config), written atomically,
 * so a crash mid-write leaves the previous checkpoint intact.
 *
 * Data parallel (dist/): with ZeRO >= 1 each rank writes its own file,
 * PATH with ".rank<r>-of-<N>" before ".safetensors", holding its shards of
 * the optimizer state (and under ZeRO 3 its parameter shards,
 * "param_shard.<name>") and resumes from it on the same number of ranks;
 * `memfit convert` joins them into one single-process checkpoint. Without
 * sharding, rank 0 writes the one file. Weights are always one file, from
 * rank 0 (ZeRO 3 gathers each tensor from the ranks as it is written). */
#include "dist/dist.h"
#include "io/io.h"
#include "quant/quant.h"
#include "memfit/train.h"
#include "kernels/half.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_FORMAT "memfit-checkpoint-2"

/* ZeRO >= 1 on more than one rank: one checkpoint file per rank */
static int sharded(const mf_trainer *t) { return t->world > 1 && t->model.opt.zero >= 1; }
static int zero3(const mf_trainer *t) { return t->world > 1 && t->model.opt.zero >= 3; }
/* Expert parallel (--expert_parallel N, docs/moe.md): the group's size and
 * this rank's place in it; rank r holds the experts of group rank r % N */
static int ep_n(const mf_trainer *t) { return t->world > 1 && t->model.d.ep > 1 ? t->model.d.ep : 1; }
static int ep_g(const mf_trainer *t) { return t->rank % ep_n(t); }
/* the file of group rank g's experts beside checkpoint PATH:
 * PATH with ".experts<g>-of-<N>" before ".safetensors" (g > 0; rank 0's
 * experts are in PATH itself) */
static void ep_path(const char *path, int g, int n, char *out, size_t cap) {
    size_t len = strlen(path), ext = strlen(".safetensors");
    int has = len > ext && strcmp(path + len - ext, ".safetensors") == 0;
    snprintf(out, cap, "%.*s.experts%d-of-%d%s", (int)(has ? len - ext : len), path, g, n, has ? ".safetensors" : "");
}

void mf_trainer_shard_path(const char *path, int rank, int world, char *out, size_t n) {
    size_t len = strlen(path), ext = strlen(".safetensors");
    int has = len > ext && strcmp(path + len - ext, ".safetensors") == 0;
    snprintf(out, n, "%.*s.rank%d-of-%d%s", (int)(has ? len - ext : len), path, rank, world, has ? ".safetensors" : "");
}

/* ZeRO 3: gathers tensor i from the ranks' shards into its forward row
 * (outside the step every non-persistent row is free) */
static int gather_tensor(mf_trainer *t, int i) {
    mf_tensor *x = &t->model.tensors[i];
    float *full = mf_arena_ptr(&t->arena, x->p);
    memcpy(full + x->lo, mf_arena_ptr(&t->arena, x->ps), (size_t)(x->hi - x->lo) * sizeof(float));
    return mf_dist_allgather(full, x->numel);
}
typedef struct { mf_trainer *t; int tensor; } param_reader;
static int read_param(void *ctx, uint64_t off, void *buf, size_t len) {
    param_reader *r = ctx;
    if (off == 0 && gather_tensor(r->t, r->tensor)) return -1;  /* pieces come in order */
    memcpy(buf, (const char *)mf_arena_ptr(&r->t->arena, r->t->model.tensors[r->tensor].p) + off, len);
    return 0;
}

/* A quantised frozen weight written as F32 (weights files): dequantised a
 * piece at a time into the writer's buffer */
static int read_dequant(void *ctx, uint64_t off, void *buf, size_t len) {
    param_reader *r = ctx;
    const mf_tensor *x = &r->t->model.tensors[r->tensor];
    if (off % sizeof(float) || len % sizeof(float)) return mf_fail("%s: unaligned piece of a dequantised tensor", x->name);
    mf_quant_unpack((mf_quant_kind)x->qkind, buf, mf_arena_ptr(&r->t->arena, x->p), (int64_t)(off / 4), (int64_t)(len / 4));
    return 0;
}

typedef struct { mf_trainer *t; int tensor, id; } row_reader;
static int read_row(void *ctx, uint64_t off, void *buf, size_t len) {
    row_reader *r = ctx;
    return mf_offstate_row_io(r->t, r->tensor, r->id, off, buf, len, 0);
}

/* Mixtral's experts: the model stacks each layer's w1/w3/w2 expert after
 * expert (model.layers.{i}.block_sparse_moe.experts.w1.weight), HF folders
 * hold experts.{e}.w1.weight. The position of ".w1.weight" in a stacked
 * name, or -1; the HF name of expert e. */
static int moe_expert_slot(const char *name) {
    const char *p = strstr(name, ".block_sparse_moe.experts.w");
    if (p && strlen(p) == strlen(".block_sparse_moe.experts.w1.weight")) return (int)(p - name) + (int)strlen(".block_sparse_moe.experts");
    /* Qwen2-MoE: mlp.experts.gate_proj.weight -> mlp.experts.{e}.gate_proj.weight */
    static const char *const q[3] = {".mlp.experts.gate_proj.weight", ".mlp.experts.up_proj.weight",
                                     ".mlp.experts.down_proj.weight"};
    for (int k = 0; k < 3; k++)
        if ((p = strstr(name, q[k])) && strlen(p) == strlen(q[k])) return (int)(p - name) + (int)strlen(".mlp.experts");
    return -1;
}
static void moe_expert_name(char *out, const char *stacked, int e) {
    int at = moe_expert_slot(stacked);
    snprintf(out, 96, "%.*s.%d%s", at, stacked, e, stacked + at);
}

static int add_entries(const mf_trainer *t, mf_st_entry *e, row_reader *rd, param_reader *pr, char (*names)[96],
                       int with_optim) {
    const mf_model *m = &t->model;
    int n = 0;
    /* expert parallel: group rank g > 0 writes only its experts (rank 0
     * the rest, which every rank holds alike) */
    const int epo = ep_n(t) > 1 && ep_g(t) > 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const mf_tensor *x = &m->tensors[i];
        if (x->lora && !with_optim) continue;  /* weights files hold the base; adapters go to --save-adapter */
        if (epo && x->ep_full <= 0) continue;
        if (x->qkind && with_optim) {
            /* a quantised base in a checkpoint: its packed bytes, under its plan row's name */
            const mf_buf *b = &t->plan.bufs[x->p];
            snprintf(names[n], 96, "%s", b->name);
            e[n] = (mf_st_entry){.name = names[n], .dtype = MF_DTYPE_U8, .ndim = 1, .shape = {b->numel},
                                 .data = mf_arena_ptr(&t->arena, x->p), .nbytes = (size_t)b->numel};
            n++;
            continue;
        }
        if (zero3(t) && with_optim) {
            /* this rank's parameter shard, under its plan name */
            const mf_buf *b = &t->plan.bufs[x->ps];
            snprintf(names[n], 96, "%s", b->name);
            e[n] = (mf_st_entry){.name = names[n], .dtype = MF_DTYPE_F32, .ndim = 1, .shape = {b->numel},
                                 .data = mf_arena_ptr(&t->arena, x->ps), .nbytes = (size_t)b->numel * sizeof(float)};
            n++;
            continue;
        }
        /* the fp32 master weights under 16-bit precision; bf16 weights as
         * they are with master_weights 0 */
        int wr = mf_tensor_weights_row(x);
        mf_dtype wdt = t->plan.bufs[wr].dtype;
        int E = m->d.n_experts;
        if (!with_optim && E > 0 && !x->qkind && !zero3(t) && moe_expert_slot(x->name) >= 0) {
            /* a weights file is an HF folder's: Mixtral's experts one
             * tensor each (experts.{e}.w1.weight), slices of the stack */
            /* (expert parallel: this rank's E / N experts from g * E / N) */
            int El = E / ep_n(t), e0 = ep_g(t) * El;
            int64_t rows = x->shape[0] / El;
            for (int ex = 0; ex < El; ex++, n++) {
                moe_expert_name(names[n], x->name, e0 + ex);
                e[n] = (mf_st_entry){.name = names[n], .dtype = wdt, .ndim = 2, .shape = {rows, x->shape[1]},
                                     .data = (char *)mf_arena_ptr(&t->arena, wr) +
                                             (size_t)(ex * rows * x->shape[1]) * mf_dtype_size(wdt),
                                     .nbytes = (size_t)(rows * x->shape[1]) * mf_dtype_size(wdt)};
            }
            continue;
        }
        snprintf(names[n], 96, "%s", x->name);
        e[n].name = names[n];
        e[n].dtype = wdt;
        e[n].ndim = x->ndim;
        e[n].shape[0] = x->rows_file;
        e[n].shape[1] = x->shape[1];
        e[n].data = mf_arena_ptr(&t->arena, wr);
        e[n].nbytes = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1)) * mf_dtype_size(wdt);
        if (x->qkind) {  /* weights file: F32, dequantised as the writer reaches it */
            pr[i] = (param_reader){(mf_trainer *)t, i};
            e[n].dtype = MF_DTYPE_F32;
            e[n].nbytes = (size_t)x->numel * sizeof(float);
            e[n].data = NULL;
            e[n].read = read_dequant;
            e[n].read_ctx = &pr[i];
        }
        if (zero3(t)) {  /* weights: gathered tensor by tensor as the writer reaches them */
            pr[i] = (param_reader){(mf_trainer *)t, i};
            e[n].data = NULL;
            e[n].read = read_param;
            e[n].read_ctx = &pr[i];
        }
        n++;
    }
    for (int i = 0; with_optim && i < m->n_tensors; i++) {
        if (epo && m->tensors[i].ep_full <= 0) continue;
        for (int k = 0; k < MF_OPTIM_STATES; k++) {
            int id = m->tensors[i].st[k];
            if (id < 0) continue;
            const mf_buf *b = &t->plan.bufs[id];
            snprintf(names[n], 96, "%s", b->name);
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

static int write_file(const mf_trainer *t, const char *path, int with_optim);
static int save_ep(const mf_trainer *t, const char *path_in, int with_optim);

static int save(const mf_trainer *t, const char *path_in, int with_optim) {
    if (ep_n(t) > 1) return save_ep(t, path_in, with_optim);
    char path[MF_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s", path_in);
    if (t->world > 1 && with_optim && sharded(t)) mf_trainer_shard_path(path_in, t->rank, t->world, path, sizeof path);
    else if (t->world > 1 && t->rank > 0) {
        /* one file from rank 0; under ZeRO 3 the others still send their shards */
        for (int i = 0; zero3(t) && i < t->model.n_tensors; i++)
            if (gather_tensor((mf_trainer *)t, i)) return -1;
        return 0;
    }
    return write_file(t, path, with_optim);
}

/* The weights' HF index (model.safetensors.index.json) of an expert-parallel
 * run: every tensor of the model by its HF name, expert e in the shard of
 * group rank e / (E / N), the rest in rank 0's */
static int write_ep_index(const mf_trainer *t, const char *dir, int N) {
    const mf_model *m = &t->model;
    const int E = m->d.n_experts, El = E / N;
    cJSON *o = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(o, "metadata"), *wm = cJSON_AddObjectToObject(o, "weight_map");
    double total = 0;
    char file[64], nm[96];
    for (int i = 0; i < m->n_tensors; i++) {
        const mf_tensor *x = &m->tensors[i];
        if (x->lora) continue;
        size_t es = mf_dtype_size(t->plan.bufs[mf_tensor_weights_row(x)].dtype);
        if (x->ep_full > 0 && moe_expert_slot(x->name) >= 0) {
            for (int ex = 0; ex < E; ex++) {
                moe_expert_name(nm, x->name, ex);
                snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", ex / El + 1, N);
                cJSON_AddStringToObject(wm, nm, file);
            }
            total += (double)x->numel * N * es;
            continue;
        }
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", 1, N);
        cJSON_AddStringToObject(wm, x->name, file);
        total += (double)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1)) * es;
    }
    cJSON_AddNumberToObject(md, "total_size", total);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    char path[MF_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!txt) return mf_fail("out of memory writing %s", path);
    mf_atomic_file af;
    int rc = mf_atomic_open(&af, path);
    if (!rc) {
        if (fputs(txt, af.fp) < 0 || fputc('\n', af.fp) < 0) { mf_atomic_abort(&af); rc = mf_fail("%s: write failed", path); }
        else rc = mf_atomic_commit(&af);
    }
    free(txt);
    return rc;
}

/* Expert parallel: the first expert group writes, each of its ranks its own
 * experts (their weights and optimizer state), rank 0 also everything else;
 * the other groups' ranks hold copies of the same and write nothing, so
 * every expert is written once and no rank holds another's experts (no
 * gather: nothing beyond the plan). A checkpoint PATH is rank 0's file plus
 * PATH.experts<g>-of-<N>.safetensors of group rank g > 0; a weights file
 * DIR/model.safetensors becomes the HF shards DIR/model-<g+1>-of-<N>.safetensors
 * and their index, which rank 0 writes once every shard is in place. Each
 * file is written atomically (a crash leaves the previous one); a resume
 * refuses files of different steps. */
static int save_ep(const mf_trainer *t, const char *path_in, int with_optim) {
    const int N = ep_n(t), g = ep_g(t);
    char path[MF_PATH_MAX + 64], dir[MF_PATH_MAX + 64];
    const char *sl = strrchr(path_in, '/');
    snprintf(dir, sizeof dir, "%.*s", sl ? (int)(sl - path_in) : 1, sl ? path_in : ".");
    if (!with_optim) snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, g + 1, N);
    else if (g) ep_path(path_in, g, N, path, sizeof path);
    else snprintf(path, sizeof path, "%s", path_in);
    int rc = t->rank < N ? write_file(t, path, with_optim) : 0;
    char msg[512] = "";
    if (rc) snprintf(msg, sizeof msg, "%s", mf_error());
    double bad = rc != 0;  /* every rank learns whether the group wrote */
    if (mf_dist_sum_doubles(&bad, 1)) return -1;
    if (rc) return mf_fail("%s", msg);
    if (bad > 0) return mf_fail("%s: a rank of the first expert group failed to write its experts", path_in);
    return !with_optim && t->rank == 0 ? write_ep_index(t, dir, N) : 0;
}

static int write_file(const mf_trainer *t, const char *path, int with_optim) {
    /* (a weights file writes each of E experts' slices of the 3 stacks as its own tensor) */
    int nt = t->model.n_tensors * (with_optim ? 1 + MF_OPTIM_STATES : 1) + 3 * t->d.L * t->model.d.n_experts;
    mf_st_entry *e = calloc((size_t)nt, sizeof *e);
    char (*names)[96] = calloc((size_t)nt, sizeof *names);
    row_reader *rd = calloc((size_t)nt, sizeof *rd);
    param_reader *pr = calloc((size_t)t->model.n_tensors, sizeof *pr);
    char *cfg = malloc(1 << 16);
    if (!e || !names || !cfg || !rd || !pr) {
        free(e); free(names); free(cfg); free(rd); free(pr);
        return mf_fail("out of memory writing %s", path);
    }
    int n = add_entries(t, e, rd, pr, names, with_optim);
    char dims[256], step[32], pos[32], rng[32], world[16], rank[16], zero[16], epn[16], epg[16];
    snprintf(epn, sizeof epn, "%d", ep_n(t));
    snprintf(epg, sizeof epg, "%d", ep_g(t));
    snprintf(world, sizeof world, "%d", sharded(t) ? t->world : 1);
    snprintf(rank, sizeof rank, "%d", sharded(t) ? t->rank : 0);
    snprintf(zero, sizeof zero, "%d", sharded(t) ? t->model.opt.zero : 0);
    mf_model_dims_str(&t->d, dims, sizeof dims);
    snprintf(step, sizeof step, "%d", t->step);
    snprintf(pos, sizeof pos, "%" PRIu64, t->data_pos);
    snprintf(rng, sizeof rng, "%" PRIu64, t->rng.s);
    /* fp16's loss scaler: scale, clean steps, skipped steps (resume repeats it) */
    char scaler[96];
    snprintf(scaler, sizeof scaler, "%.9g,%d,%lld", (double)t->scaler.scale, t->scaler.clean, (long long)t->scaler.skipped);
    int rc = mf_config_to_yaml(&t->cfg, cfg, 1 << 16);
    const char *keys[] = {"format", "dims", "tokenizer", "step", "data_pos", "rng", "optimizer", "config",
                          "world_size", "rank", "zero", "loss_scaler", "expert_parallel", "expert_rank"};
    const char *vals[] = {with_optim ? CKPT_FORMAT : "memfit-weights-1", dims, t->d.tokenizer, step, pos, rng,
                          mf_optim_name(t->model.opt.kind), cfg, world, rank, zero, scaler, epn, epg};
    if (rc == 0) rc = mf_st_write(path, e, n, keys, vals, with_optim ? 14 : 3);
    free(pr);
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

/* Sinks for mf_st_stream: the file's map arrives a few MiB at a time, each
 * piece verified (checksum, finite values) before it is handed here, and
 * its pages are dropped after, so loading after the arena exists adds at
 * most one piece to the process's peak RSS instead of the whole file.
 * `off` is the byte offset in the file's tensor. */
/* Drops the file pages behind [p, p+n) from the process (file-backed: re-read if touched again). */
static void drop_pages(const void *p, size_t n) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p & ~(page - 1);
    uintptr_t hi = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void sink_copy(void *dst, size_t off, const void *src, size_t len) { memcpy((char *)dst + off, src, len); }
static void sink_to_bf16(void *dst, size_t off, const void *src, size_t len) {
    mf_bf16_from_f32((mf_bf16 *)dst + off / 4, src, len / 4);
}
static void sink_bf16_to_f32(void *dst, size_t off, const void *src, size_t len) {
    mf_f32_from_bf16((float *)dst + off / 2, src, len / 2);
}
static void sink_fp16_to_f32(void *dst, size_t off, const void *src, size_t len) {
    mf_f32_from_fp16((float *)dst + off / 2, src, len / 2);
}

static int load_found(const mf_trainer *t, const mf_st_file *f, const mf_st_tensor *s, const char *path,
                      const char *name, const mf_tensor *x, int id, int64_t off);

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
    return load_found(t, f, s, path, name, x, id, 0);
}

/* Copies file tensor s (tensor `name` of file `path`) into buffer `id` of
 * model tensor x: F32 as it is; BF16 and F16 files widened into fp32 rows
 * (HF folders are mostly 16-bit); F32 rounded into a bf16 row. */
static int load_found(const mf_trainer *t, const mf_st_file *f, const mf_st_tensor *s, const char *path,
                      const char *name, const mf_tensor *x, int id, int64_t off) {
    int64_t want[2] = {x->rows_file, x->shape[1]};
    if (s->dtype == MF_DTYPE_U8) {
        /* a quantised model's block matrix (memfit quantize): its packed
         * bytes as the plan row holds them, verified and copied */
        size_t nb = x->qkind && id == x->p ? mf_quant_bytes((mf_quant_kind)x->qkind, x->numel) : 0;
        if (!nb || s->ndim != 1 || s->nbytes != nb)
            return mf_fail("%s: tensor '%s' is packed U8 (%zu bytes); the model needs %s %s", path, name, s->nbytes,
                           x->qkind ? mf_quant_name((mf_quant_kind)x->qkind) : "F32",
                           x->qkind ? "bytes of another size (the file was quantised to another dtype)" : "values");
        return mf_st_stream(f, s, sink_copy, mf_arena_ptr(&t->arena, id));
    }
    /* the row's dtype (fp32, or bf16 weights without a master copy, which
     * also take fp32 files rounded to nearest-even) */
    mf_dtype rdt = x->qkind && id == x->p ? MF_DTYPE_F32 : t->plan.bufs[id].dtype;  /* quantised: packed from F32 */
    int to16 = rdt == MF_DTYPE_BF16 && s->dtype == MF_DTYPE_F32, to32 = rdt == MF_DTYPE_F32 && s->dtype == MF_DTYPE_BF16;
    int h32 = rdt == MF_DTYPE_F32 && s->dtype == MF_DTYPE_F16;
    int ok = (s->dtype == rdt || to16 || to32 || h32) && s->ndim == x->ndim && s->shape[0] == want[0] &&
             (x->ndim == 1 || s->shape[1] == want[1]);
    if (!ok) {
        char a[64], b[64];
        shape_str(a, sizeof a, s->ndim, s->shape);
        shape_str(b, sizeof b, x->ndim, want);
        return mf_fail("%s: tensor '%s' is %s %s, the model needs %s %s", path, name,
                       mf_dtype_name(s->dtype), a, mf_dtype_name(rdt), b);
    }
    if (x->qkind && id == x->p && s->dtype != MF_DTYPE_F32)
        return mf_fail("%s: tensor '%s' is %s; a quantised base is packed from F32 weights", path, name,
                       mf_dtype_name(s->dtype));
    if (x->qkind && id == x->p) {
        /* a frozen base stored quantised: verified, then packed straight
         * from the file's map, whose pages are then handed back */
        if (mf_st_stream(f, s, NULL, NULL)) return -1;
        mf_quant_pack((mf_quant_kind)x->qkind, mf_arena_ptr(&t->arena, id), s->data, x->numel);
        drop_pages(s->data, s->nbytes);
        return 0;
    }
    /* off: the first element of x in the row (one expert of a stack) */
    void *dst = (char *)mf_arena_ptr(&t->arena, id) + (size_t)off * mf_dtype_size(rdt);
    size_t have = s->nbytes;
    mf_st_sink_fn sink = sink_copy;
    if (to16) {
        sink = sink_to_bf16;
        have = s->nbytes / 2;
    } else if (to32) {  /* bf16 weights (master_weights 0, or a bf16 HF folder) widen exactly */
        sink = sink_bf16_to_f32;
        have = s->nbytes * 2;
    } else if (h32) {  /* fp16 files widen exactly */
        sink = sink_fp16_to_f32;
        have = s->nbytes * 2;
    }
    if (mf_st_stream(f, s, sink, dst)) return -1;
    /* padding rows (wte beyond V) stay zero */
    size_t rest = (size_t)(x->numel * (int64_t)mf_dtype_size(rdt)) - have;
    if (rest) memset((char *)dst + have, 0, rest);
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
    if (!b->disk) return mf_st_stream(f, s, sink_copy, mf_arena_ptr(&t->arena, id));
    if (mf_st_stream(f, s, NULL, NULL)) return -1;  /* verified first: the chunk map below writes as it goes */
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

/* A quantised frozen expert stack (QLoRA on Mixtral): experts.{e}.wN.weight
 * of every expert, each verified F32 of the slice's shape, packed as one
 * tensor, the values streamed from the files' maps in stack order */
typedef struct { const float *src[4096]; int64_t per; } expert_src;
static void expert_fill(void *ctx, float *buf, int64_t lo, int64_t len) {
    const expert_src *es = ctx;
    for (int64_t k = 0; k < len; k++) buf[k] = es->src[(lo + k) / es->per][(lo + k) % es->per];
}
static int load_experts_quant(mf_trainer *t, mf_st_file *f, int opened, char **files, const char *dir,
                              const mf_tensor *x) {
    int E = t->model.d.n_experts;
    if (E > 4096) return mf_fail("%s: %d experts (at most 4096 load into a quantised base)", dir, E);
    expert_src *es = malloc(sizeof *es);
    if (!es) return mf_fail("out of memory");
    int64_t rows = x->shape[0] / E;
    es->per = rows * x->shape[1];
    int rc = 0;
    for (int ex = 0; ex < E && !rc; ex++) {
        char nm[96];
        moe_expert_name(nm, x->name, ex);
        const mf_st_tensor *s = NULL;
        int k = 0;
        for (; k < opened && !s; k++) s = mf_st_find(&f[k], nm);
        if (!s) rc = mf_fail("%s: tensor '%s' is missing (config.json describes a model that has it)", dir, nm);
        else if (s->dtype != MF_DTYPE_F32 || s->ndim != 2 || s->shape[0] != rows || s->shape[1] != x->shape[1])
            rc = mf_fail("%s: tensor '%s' must be F32 [%lld, %lld] to be packed into a quantised base", files[k - 1], nm,
                         (long long)rows, (long long)x->shape[1]);
        else if (!(rc = mf_st_stream(&f[k - 1], s, NULL, NULL))) es->src[ex] = s->data;
    }
    if (!rc) rc = mf_quant_pack_stream((mf_quant_kind)x->qkind, mf_arena_ptr(&t->arena, x->p), x->numel, expert_fill, es);
    free(es);
    return rc;
}

/* A Hugging Face folder (model.safetensors or its shards): every tensor of
 * the model by its HF name, in whichever file holds it; a tensor the model
 * does not have is refused (a tied model ignores a stored lm_head, and
 * rotary inv_freq buffers are ignored). */
static int load_hf_folder(mf_trainer *t, const char *dir) {
    char **files;
    int nf;
    if (t->d.share)
        return mf_fail("%s: a Hugging Face folder has a weight set per layer; --share_layers %d cannot load it "
                       "(train the shared model from scratch, without --init)", dir, t->d.share);
    if (mf_hf_weight_files(dir, &files, &nf)) return -1;
    mf_st_file *f = calloc((size_t)nf, sizeof *f);
    int rc = f ? 0 : mf_fail("out of memory"), opened = 0;
    for (; !rc && opened < nf; opened++)
        if (mf_st_open(&f[opened], files[opened])) { rc = -1; break; }
    for (int i = 0; i < t->model.n_tensors && !rc; i++) {
        const mf_tensor *x = &t->model.tensors[i];
        if (x->lora) continue;
        const mf_st_tensor *s = NULL;
        int k = 0;
        if (t->model.d.n_experts > 0 && moe_expert_slot(x->name) >= 0) {
            /* Mixtral: expert e's tensor into its slice of the stack;
             * expert parallel: only this rank's E / N experts from
             * g * E / N are read (the others' tensors are not touched) */
            int E = t->model.d.n_experts, El = E / ep_n(t), e0 = ep_g(t) * El;
            mf_tensor xe = *x;
            xe.shape[0] = xe.rows_file = x->shape[0] / El;
            xe.numel = xe.shape[0] * x->shape[1];
            xe.qkind = 0;
            if (x->ps >= 0) { rc = mf_fail("%s: Mixtral experts do not load under ZeRO 3 yet", dir); break; }
            if (x->qkind) {  /* a quantised base: the E tensors packed as one stack */
                rc = load_experts_quant(t, f, opened, files, dir, x);
                continue;
            }
            for (int ex = 0; ex < El && !rc; ex++) {
                char nm[96];
                moe_expert_name(nm, x->name, e0 + ex);
                s = NULL;
                for (k = 0; k < opened && !s; k++) s = mf_st_find(&f[k], nm);
                if (!s) rc = mf_fail("%s: tensor '%s' is missing (config.json describes a model that has it)", dir, nm);
                else rc = load_found(t, &f[k - 1], s, files[k - 1], nm, &xe, mf_tensor_weights_row(x), ex * xe.numel);
            }
            if (!rc) mf_model_sync_params(&t->model, &t->arena, i, 1);
            continue;
        }
        for (; k < opened && !s; k++) s = mf_st_find(&f[k], x->name);
        if (!s) {
            rc = mf_fail("%s: tensor '%s' is missing (config.json describes a model that has it)", dir, x->name);
            break;
        }
        rc = load_found(t, &f[k - 1], s, files[k - 1], x->name, x, mf_tensor_weights_row(x), 0);
        if (!rc) mf_model_sync_params(&t->model, &t->arena, i, 1);
        if (!rc && x->ps >= 0)
            memcpy(mf_arena_ptr(&t->arena, x->ps), (float *)mf_arena_ptr(&t->arena, x->p) + x->lo,
                   (size_t)(x->hi - x->lo) * sizeof(float));
    }
    for (int k = 0; k < opened && !rc; k++)
        for (int i = 0; i < f[k].n && !rc; i++) {
            const char *nm = f[k].tensors[i].name;
            size_t n = strlen(nm);
            int known = (t->model.t_head < 0 && strcmp(nm, "lm_head.weight") == 0) ||
                        (n > 22 && strcmp(nm + n - 22, "rotary_emb.inv_freq") == 0);
            for (int j = 0; j < t->model.n_tensors && !known; j++) known = strcmp(nm, t->model.tensors[j].name) == 0;
            for (int j = 0; j < t->model.n_tensors && !known && t->model.d.n_experts > 0; j++)
                for (int ex = 0; moe_expert_slot(t->model.tensors[j].name) >= 0 && ex < t->model.d.n_experts && !known; ex++) {
                    char en[96];
                    moe_expert_name(en, t->model.tensors[j].name, ex);
                    known = strcmp(nm, en) == 0;
                }
            if (!known) rc = mf_fail("%s: unexpected tensor '%s' (config.json describes no such tensor)", files[k], nm);
        }
    for (int k = 0; k < opened; k++) mf_st_close(&f[k]);
    free(f);
    mf_hf_free_files(files, nf);
    return rc;
}

int mf_trainer_load_weights(mf_trainer *t, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return mf_fail("%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return load_hf_folder(t, path);
    if (t->d.arch == MF_ARCH_LLAMA)
        return mf_fail("%s: a Llama-family model loads from a Hugging Face folder (config.json + model.safetensors); "
                       "give the folder, or a memfit checkpoint with --resume", path);
    mf_st_file f;
    if (mf_st_open(&f, path)) return -1;
    int rc = 0;
    /* cross-layer sharing: a file of N shared sets loads only into a model
     * with the same sharing (memfit's files say so in their dims) */
    const char *fd = mf_st_meta(&f, "dims");
    mf_dims fdims;
    int fshare = fd && mf_model_dims_parse(fd, &fdims) == 0 ? fdims.share : 0;
    if (fshare != t->d.share)
        rc = fshare ? mf_fail("%s holds a shared model (%d weight sets for %d blocks, dims %s); load it with "
                              "--share_layers %d", path, fshare, fdims.L, fd, fshare)
                    : mf_fail("%s holds an unshared model (every block its own weights); this run has "
                              "--share_layers %d: drop it to load this file", path, t->d.share);
    for (int i = 0; i < t->model.n_tensors && !rc; i++) {
        const mf_tensor *x = &t->model.tensors[i];
        if (x->lora) continue;  /* the base only; adapters come from --adapter */
        rc = load_tensor(t, &f, path, "", x, mf_tensor_weights_row(x));
        if (!rc) mf_model_sync_params(&t->model, &t->arena, i, 1);
        /* ZeRO 3: keep this rank's shard (the full row is free outside the step) */
        if (!rc && x->ps >= 0)
            memcpy(mf_arena_ptr(&t->arena, x->ps), (float *)mf_arena_ptr(&t->arena, x->p) + x->lo,
                   (size_t)(x->hi - x->lo) * sizeof(float));
    }
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

int mf_trainer_load_checkpoint(mf_trainer *t, const char *path_in) {
    char path[MF_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s", path_in);
    if (sharded(t) && t->mode == MF_MODE_TRAIN) {
        mf_trainer_shard_path(path_in, t->rank, t->world, path, sizeof path);
        /* a single file where shards were expected: say so below */
        if (access(path, R_OK) != 0 && access(path_in, R_OK) == 0) snprintf(path, sizeof path, "%s", path_in);
    }
    mf_st_file f;
    if (mf_st_open(&f, path)) return -1;
    int rc = 0;
    const char *ws = mf_st_meta(&f, "world_size"), *zs = mf_st_meta(&f, "zero");
    int fw = ws ? atoi(ws) : 1, fz = zs ? atoi(zs) : 0;
    int want_w = sharded(t) && t->mode == MF_MODE_TRAIN ? t->world : 1, want_z = want_w > 1 ? t->model.opt.zero : 0;
    if (fw != want_w || fz != want_z) {
        mf_st_close(&f);
        if (fw > 1) return mf_fail("%s is one shard of a checkpoint over %d ranks with zero %d; resume with mpirun -np %d "
                                   "--zero %d, or join the shards with memfit convert", path, fw, fz, fw, fz);
        return mf_fail("%s is a single-file checkpoint; this run shards its state over %d ranks (zero %d): resume "
                       "with zero 0, or without mpirun", path, t->world, t->model.opt.zero);
    }
    const char *fmt = mf_st_meta(&f, "format"), *dims = mf_st_meta(&f, "dims"), *opt = mf_st_meta(&f, "optimizer");
    const char *step = mf_st_meta(&f, "step"), *pos = mf_st_meta(&f, "data_pos"), *rng = mf_st_meta(&f, "rng");
    /* expert parallel: rank 0's file and group rank g's experts beside it
     * (save_ep); a file of one layout is refused by a run of the other */
    const char *es = mf_st_meta(&f, "expert_parallel");
    int fep = es ? atoi(es) : 1, N = ep_n(t), g = ep_g(t);
    mf_st_file fx, *xf = &f;
    char xpath[MF_PATH_MAX + 96];
    snprintf(xpath, sizeof xpath, "%s", path);
    if (fep != N) {
        mf_st_close(&f);
        return fep > 1 ? mf_fail("%s holds the experts of an expert-parallel run (expert_parallel %d, one file per group "
                                 "rank); resume it under mpirun with --expert_parallel %d, or --init the out_dir's HF folder",
                                 path, fep, fep)
                       : mf_fail("%s is a checkpoint without expert parallelism; this run has expert_parallel %d: resume it "
                                 "without --expert_parallel, or --init the out_dir's HF folder", path, N);
    }
    if (N > 1 && g > 0) {
        ep_path(path, g, N, xpath, sizeof xpath);
        if (mf_st_open(&fx, xpath)) { mf_st_close(&f); return -1; }
        xf = &fx;
        const char *xs = mf_st_meta(&fx, "step"), *xg = mf_st_meta(&fx, "expert_rank");
        if (!xs || !step || strcmp(xs, step) != 0 || !xg || atoi(xg) != g)
            rc = mf_fail("%s is not group rank %d's experts of %s's step %s (step %s): the checkpoint was not written "
                         "whole; resume from an earlier one", xpath, g, path, step ? step : "?", xs ? xs : "?");
    }
    char want[256];
    mf_model_dims_str(&t->d, want, sizeof want);
    const mf_model *m = &t->model;
    int train = t->mode == MF_MODE_TRAIN;  /* inference needs no optimizer state */
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
        rc = mf_fail("%s is not a memfit checkpoint of this version (format '%s', expected %s)", path, fmt ? fmt : "none", CKPT_FORMAT);
    else if (!dims || strcmp(dims, want) != 0)
        rc = mf_fail("%s: checkpoint model (dims %s) does not match the configured %s", path, dims ? dims : "?", want);
    else if (!step || !pos || !rng || !opt) rc = mf_fail("%s: checkpoint metadata incomplete", path);
    else if (train && strcmp(opt, mf_optim_name(m->opt.kind)) != 0)
        rc = mf_fail("%s holds %s state but the run uses optimizer %s", path, opt, mf_optim_name(m->opt.kind));
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const mf_tensor *x = &m->tensors[i];
        const mf_st_file *xi = x->ep_full > 0 ? xf : &f;  /* (this rank's experts) */
        const char *pi = x->ep_full > 0 ? xpath : path;
        rc = x->ps >= 0 && train ? load_state_row(t, xi, pi, x->ps)
             : x->qkind ? load_state_row(t, xi, pi, x->p)  /* packed bytes: resume is bit-identical */
             : load_tensor(t, xi, pi, "", x, mf_tensor_weights_row(x));
        if (!rc) mf_model_sync_params(m, &t->arena, i, 1);
        for (int k = 0; train && k < MF_OPTIM_STATES && !rc; k++)
            if (x->st[k] >= 0) rc = load_state_row(t, xi, pi, x->st[k]);
    }
    if (!rc) {
        char *e1, *e2, *e3;
        long s = strtol(step, &e1, 10);
        unsigned long long p = strtoull(pos, &e2, 10), r = strtoull(rng, &e3, 10);
        const char *ls = mf_st_meta(&f, "loss_scaler");
        if (ls && t->use_scaler && train) {
            double sc;
            int cl;
            long long sk;
            if (sscanf(ls, "%lg,%d,%lld", &sc, &cl, &sk) == 3 && sc > 0) {
                t->scaler.scale = (float)sc;
                t->scaler.clean = cl;
                t->scaler.skipped = sk;
            }
        }
        if (*e1 || *e2 || *e3 || s < 0) rc = mf_fail("%s: bad checkpoint metadata", path);
        else {
            t->step = (int)s;
            t->data_pos = p;
            t->rng.s = r;
        }
    }
    if (xf != &f) mf_st_close(&fx);
    mf_st_close(&f);
    return rc;
}

/* ---- memfit convert: joining a ZeRO checkpoint's shards ------------------ */

typedef struct { mf_st_file *f; int world; char name[96]; size_t skip; } joined;
/* bytes [off, off+len) of the rows named j->name concatenated in rank
 * order (after skipping j->skip bytes: none so far) */
static int read_joined(void *ctx, uint64_t off, void *buf, size_t len) {
    joined *j = ctx;
    uint64_t base = 0;
    char *out = buf;
    for (int r = 0; r < j->world && len; r++) {
        const mf_st_tensor *s = mf_st_find(&j->f[r], j->name);
        if (!s) return mf_fail("shard %d lacks '%s'", r, j->name);
        if (off < base + s->nbytes) {
            size_t from = (size_t)(off - base), take = s->nbytes - from < len ? s->nbytes - from : len;
            memcpy(out, (const char *)s->data + from, take);
            out += take;
            off += take;
            len -= take;
        }
        base += s->nbytes;
    }
    return len ? mf_fail("shards of '%s' are shorter than the tensor", j->name) : 0;
}

int mf_checkpoint_consolidate(const char *path, const char *out_path) {
    char p0[MF_PATH_MAX + 64];
    int world = 0;
    /* find N from rank 0's file: PATH.rank0-of-N.safetensors */
    for (int n = 2; n <= 4096 && !world; n++) {
        mf_trainer_shard_path(path, 0, n, p0, sizeof p0);
        if (access(p0, R_OK) == 0) world = n;
    }
    if (!world) return mf_fail("no shard files for %s (expected %s.rank0-of-N.safetensors from a run with zero >= 1)",
                               path, path);
    mf_st_file *f = calloc((size_t)world, sizeof *f);
    if (!f) return mf_fail("out of memory");
    int rc = 0, opened = 0;
    for (int r = 0; r < world && !rc; r++) {
        mf_trainer_shard_path(path, r, world, p0, sizeof p0);
        if ((rc = mf_st_open(&f[r], p0))) break;
        opened++;
        if ((rc = mf_st_verify_all(&f[r]))) break;  /* checksums and finite values of every shard */
        const char *w = mf_st_meta(&f[r], "world_size"), *k = mf_st_meta(&f[r], "rank"), *fmt = mf_st_meta(&f[r], "format");
        if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || !w || atoi(w) != world || !k || atoi(k) != r)
            rc = mf_fail("%s is not rank %d of a %d-rank memfit checkpoint", p0, r, world);
        const char *keys[] = {"dims", "step", "optimizer", "zero"};
        for (int i = 0; i < 4 && !rc && r > 0; i++) {
            const char *a = mf_st_meta(&f[0], keys[i]), *b = mf_st_meta(&f[r], keys[i]);
            if (!a || !b || strcmp(a, b) != 0) rc = mf_fail("%s: '%s' differs from rank 0's (%s vs %s)", p0, keys[i], b ? b : "none", a ? a : "none");
        }
        /* hybrid sharding (dist/): the groups hold the same shards */
        const char *c = r == 0 && !rc ? mf_st_meta(&f[0], "config") : NULL, *g = c ? strstr(c, "zero_group: ") : NULL;
        if (g && atoi(g + 12) > 0 && atoi(g + 12) < world)
            rc = mf_fail("%s: a hybrid-sharded checkpoint (zero_group %d of %d ranks): each group repeats the shards, "
                         "which memfit convert cannot join yet; resume it under mpirun -np %d --zero_group %d",
                         p0, atoi(g + 12), world, world, atoi(g + 12));
    }
    /* the tensors' shapes come from the model the dims describe */
    mf_dims d = {0};
    mf_model m = {0};
    mf_plan plan = {0};
    const char *dims = rc ? NULL : mf_st_meta(&f[0], "dims");
    if (!rc && mf_model_dims_parse(dims, &d)) rc = mf_fail("%s: bad dims metadata", path);
    if (!rc) {
        snprintf(d.tokenizer, sizeof d.tokenizer, "%s", mf_st_meta(&f[0], "tokenizer") ? mf_st_meta(&f[0], "tokenizer") : "gpt2");
        mf_recompute none = {MF_RECOMPUTE_NONE, 0};
        if (mf_plan_init(&plan, mf_model_n_phases(&d, MF_MODE_INFER)) ||
            mf_model_plan(&m, &plan, &d, 1, 1, MF_MODE_INFER, 1, 0, none, NULL))
            rc = -1;
    }
    int cap = f[0].n + 1, n = 0;
    mf_st_entry *e = calloc((size_t)cap, sizeof *e);
    joined *j = calloc((size_t)cap, sizeof *j);
    if (!rc && (!e || !j)) rc = mf_fail("out of memory");
    for (int i = 0; !rc && i < f[0].n; i++) {
        const mf_st_tensor *s = &f[0].tensors[i];
        const char *tn = s->name;
        int state = is_state_name(tn), pshard = strncmp(tn, "param_shard.", 12) == 0;
        if (pshard) tn += 12;
        else if (state) tn = strchr(strchr(tn, '.') + 1, '.') + 1;  /* adam.m.<name>, sgd.momentum.<name> */
        if (state && strncmp(s->name, "adam8", 5) == 0) { rc = mf_fail("%s: 8-bit state is not sharded", s->name); break; }
        const mf_tensor *x = NULL;
        for (int k = 0; k < m.n_tensors; k++) if (strcmp(m.tensors[k].name, tn) == 0) x = &m.tensors[k];
        if (!x) { rc = mf_fail("%s: unexpected tensor '%s'", path, s->name); break; }
        if (!state && !pshard) { e[n++] = (mf_st_entry){.name = s->name, .dtype = s->dtype, .ndim = s->ndim,
                                                        .shape = {s->shape[0], s->shape[1]}, .data = s->data, .nbytes = s->nbytes};
            continue; }
        j[n].f = f;
        j[n].world = world;
        snprintf(j[n].name, sizeof j[n].name, "%s", s->name);
        /* parameters in their file shape (wte without padding rows, which
         * come last); state rows in their planned shape */
        int64_t rows = pshard ? x->rows_file : x->shape[0];
        e[n] = (mf_st_entry){.name = pshard ? x->name : s->name, .dtype = MF_DTYPE_F32, .ndim = x->ndim,
                             .shape = {rows, x->shape[1]}, .read = read_joined, .read_ctx = &j[n],
                             .nbytes = (size_t)(rows * (x->ndim > 1 ? x->shape[1] : 1)) * sizeof(float)};
        size_t total = 0;
        for (int r = 0; r < world; r++) {
            const mf_st_tensor *sr = mf_st_find(&f[r], s->name);
            total += sr ? sr->nbytes : 0;
        }
        if (total != (size_t)x->numel * sizeof(float)) rc = mf_fail("%s: shards of '%s' hold %zu bytes, the tensor %zu", path,
                                                                   s->name, total, (size_t)x->numel * sizeof(float));
        n++;
    }
    if (!rc) {
        /* the metadata of rank 0, now for one process */
        const char *keys[16], *vals[16];
        int nm = 0;
        for (int i = 0; i < f[0].n_meta && nm < 16; i++) {
            keys[nm] = f[0].meta_keys[i];
            const char *k = keys[nm];
            vals[nm++] = strcmp(k, "world_size") == 0 ? "1" : strcmp(k, "rank") == 0 || strcmp(k, "zero") == 0 ? "0" : f[0].meta_vals[i];
        }
        rc = mf_st_write(out_path, e, n, keys, vals, nm);
    }
    free(e);
    free(j);
    mf_model_free(&m);
    mf_plan_free(&plan);
    for (int r = 0; r < opened; r++) mf_st_close(&f[r]);
    free(f);
    return rc;
}
