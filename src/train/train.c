/* The training driver: set-up (data, plan, budget, arena, weights), the
 * step, validation and sampling. */
#include "memfit/train.h"
#include "dist/dist.h"
#include "memfit/distill.h"
#include "kernels/half.h"
#include "memfit/kernels.h"
#include "memfit/optim.h"
#include "quant/quant.h"

#include <cblas.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int mf_threads_setup(int threads) {
    int n = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    /* start the thread pool now, before any large mapping: under an
     * address-space limit, a run too big for it then fails where the arena
     * is mapped, with the plan in the message, not in libgomp */
    int started = 0;
#pragma omp parallel reduction(+ : started)
    started += 1;
    (void)started;
    return n;
}

/* The GEMM libraries keep memory the plan does not list: JIT-generated
 * kernels (oneDNN), per-thread packing buffers (OpenBLAS; oneDNN's sgemm
 * backend), mallocs freed after each call. Running every GEMM shape of a
 * step once, at its real size, with glibc's thresholds fixed (so freed
 * chunks stay in the heap instead of being unmapped or trimmed), puts those
 * pages in the baseline the plan is checked against; the step then reuses
 * them. The operands and the matmul backend's scratch (a plan row during
 * the step) are mapped directly here, so they do go back. */
static void sgemm_warmup(const mf_dims *d, int rows, unsigned shapes) {
    const int C = d->C, Vp = d->Vp, hr = rows < 256 ? rows : 256;
    const int sh[][6] = {/* M, N, K, ta, tb, beta (-1: both 0 and 1, as the forward uses) */
        {rows, 3 * C, C, 0, 0, -1}, {rows, C, C, 0, 0, -1}, {rows, 4 * C, C, 0, 0, -1}, {rows, C, 4 * C, 0, 0, -1},
        {C, 3 * C, rows, 1, 0, 1}, {C, C, rows, 1, 0, 1}, {C, 4 * C, rows, 1, 0, 1}, {4 * C, C, rows, 1, 0, 1},
        {rows, C, 3 * C, 0, 1, 0}, {rows, C, C, 0, 1, 0}, {rows, C, 4 * C, 0, 1, 0}, {rows, 4 * C, C, 0, 1, 0},
        {hr, Vp, C, 0, 1, 0}, {hr, C, Vp, 0, 0, 0}, {Vp, C, hr, 1, 0, 1}};
    const unsigned cls[] = {MF_WARM_LAYER, MF_WARM_LAYER, MF_WARM_LAYER, MF_WARM_LAYER,
                            MF_WARM_LAYER_DW, MF_WARM_LAYER_DW, MF_WARM_LAYER_DW, MF_WARM_LAYER_DW,
                            MF_WARM_LAYER, MF_WARM_LAYER, MF_WARM_LAYER, MF_WARM_LAYER,
                            MF_WARM_HEAD, MF_WARM_HEAD, MF_WARM_HEAD_DW};
    const int ns = (int)(sizeof sh / sizeof sh[0]);
    _Static_assert(sizeof cls / sizeof cls[0] == sizeof sh / sizeof sh[0], "one class per shape");
    size_t na = 0, nb = 0, ns_ = 0;
    for (int i = 0; i < ns; i++) {
        if (!(cls[i] & shapes) || rows < 1) continue;
        size_t mk = (size_t)sh[i][0] * sh[i][2], kn = (size_t)sh[i][2] * sh[i][1], mn = (size_t)sh[i][0] * sh[i][1];
        if (mk > na) na = mk;
        if (kn > nb) nb = kn;
        if (mn > nb) nb = mn; /* C shares B's mapping: the values do not matter */
        for (int beta = 0; beta < 2; beta++) {
            if (sh[i][5] >= 0 && sh[i][5] != beta) continue;
            size_t sc = mf_sgemm_scratch_bytes(sh[i][3], sh[i][4], sh[i][0], sh[i][1], sh[i][2], (float)beta);
            if (sc != SIZE_MAX && sc > ns_) ns_ = sc;
        }
    }
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    if (rows < 1 || na == 0 || nb == 0) return;
    na *= sizeof(float), nb *= sizeof(float);
    float *a = mmap(NULL, na, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *b = mmap(NULL, nb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *scr = ns_ ? mmap(NULL, ns_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    if (a != MAP_FAILED && b != MAP_FAILED && scr != MAP_FAILED) {
        mf_sgemm_scratch(scr, ns_);
        for (int i = 0; i < ns; i++) {
            if (!(cls[i] & shapes)) continue;
            const int M = sh[i][0], N = sh[i][1], K = sh[i][2], ta = sh[i][3], tb = sh[i][4];
            for (int beta = 0; beta < 2; beta++)
                if (sh[i][5] < 0 || sh[i][5] == beta)
                    mf_sgemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, (float)beta, b, N);
        }
        mf_sgemm_scratch(NULL, 0);
    }
    if (a != MAP_FAILED) munmap(a, na);
    if (b != MAP_FAILED) munmap(b, nb);
    if (scr && scr != MAP_FAILED) munmap(scr, ns_);
}

unsigned mf_blas_warm_shapes(const mf_config *cfg) {
    /* big products through OpenBLAS directly: fp16 GEMMs, LoRA's adapters,
     * a quantised base's tiles, or OpenBLAS as the fp32 backend */
    unsigned ob = strcmp(cfg->precision, "fp16") == 0 || cfg->lora[0] || strcmp(mf_sgemm_name(), "openblas") == 0
                      ? MF_WARM_OPENBLAS : 0;
    if (strcmp(cfg->precision, "fp32") != 0) return ob;
    /* LoRA on an fp32 base skips the weight-gradient GEMMs, but warming
     * them anyway measured closer (gpt2-124m B4 T256 r=8, recompute full:
     * peak 0.08% over the prediction with them, 1.55% without): their
     * packing buffers are the largest, and the freed chunks they leave are
     * what the step's other calls reuse */
    if (!cfg->lora[0] || strcmp(cfg->base_dtype, "fp32") == 0) return ob | MF_WARM_ALL;
    return ob | MF_WARM_HEAD;
}

void mf_blas_warmup(const mf_dims *d, int rows, unsigned shapes) {
    int cols = d->Vp > 4 * d->C ? d->Vp : 4 * d->C, inner = d->C;
    /* OpenBLAS maps a packing buffer per calling thread lazily and touches
     * as much of it as the largest blocking it has used. Kernels call GEMM
     * both from the main thread and from inside OpenMP regions (one GEMM
     * per attention tile), so GEMMs at least as large as the blocks bring
     * every buffer to its working size before the baseline is read. When
     * only the attention tiles call OpenBLAS, tiles of their size do. */
    int big = (shapes & MF_WARM_OPENBLAS) != 0;
    int M = rows < 256 ? rows : 256, K = inner < 256 ? inner : 256, N = cols < 65536 ? cols : 65536;
    if (!big) M = M < 64 ? M : 64, K = K < 64 ? K : 64, N = N < 64 ? N : 64;
    if (M < 1 || K < 1 || N < 1) return;
    float *a = calloc((size_t)M * K, sizeof *a), *b = calloc((size_t)(K > M ? K : M) * N, sizeof *b), *c = b;
    if (a && b) {
        /* the shapes of a tied output head: x @ W^T, dlogits @ W, dlogits^T @ x */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, c, N, b, K, 0.0f, a, K);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, c, N, a, K, 1.0f, b, K);
    }
    free(a);
    free(b);
    sgemm_warmup(d, rows, shapes);
}

static int file_exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

mf_tokenizer *mf_tokenizer_open(const char *kind, const char *dir) {
    if (strcmp(kind, "bytes") == 0) return mf_tokenizer_bytes();
    if (mf_tokenizer_spec_is_json(kind)) return mf_tokenizer_hf(kind);
    char d[MF_PATH_MAX], enc[MF_PATH_MAX + 32], bpe[MF_PATH_MAX + 32], cache[MF_PATH_MAX];
    if (dir && dir[0]) snprintf(d, sizeof d, "%s", dir);
    else snprintf(d, sizeof d, "%s/gpt2", mf_cache_dir(cache, sizeof cache));
    snprintf(enc, sizeof enc, "%s/encoder.json", d);
    snprintf(bpe, sizeof bpe, "%s/vocab.bpe", d);
    if (!file_exists(enc) || !file_exists(bpe)) {
        mf_fail("GPT-2 tokenizer files not found in %s (run scripts/fetch_data.sh, or set tokenizer_dir)", d);
        return NULL;
    }
    return mf_tokenizer_gpt2(enc, bpe);
}

static int load_tokenizer(mf_trainer *t) {
    t->tok = mf_tokenizer_open(t->d.tokenizer, t->cfg.tokenizer_dir);
    return t->tok ? 0 : -1;
}

typedef struct { uint32_t *ids; uint64_t n, cap; int err; } idvec;
static void push_id(int32_t id, void *ctx) {
    idvec *v = ctx;
    if (v->err) return;
    if (v->n == v->cap) {
        uint64_t cap = v->cap ? 2 * v->cap : 1 << 16;
        uint32_t *ni = realloc(v->ids, cap * sizeof *ni);
        if (!ni) { v->err = 1; return; }
        v->ids = ni;
        v->cap = cap;
    }
    v->ids[v->n++] = (uint32_t)id;
}

int mf_tokenize_file(const mf_tokenizer *tok, const char *text_path, const char *out_path) {
    FILE *f = fopen(text_path, "rb");
    if (!f) return mf_fail("cannot open %s: %s", text_path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fclose(f);
        free(buf);
        return mf_fail("cannot read %s", text_path);
    }
    fclose(f);
    idvec v = {0};
    int rc = mf_tokenizer_encode(tok, buf, (size_t)n, push_id, &v);
    free(buf);
    if (rc == 0 && v.err) rc = mf_fail("out of memory tokenizing %s", text_path);
    if (rc == 0)
        rc = mf_tokfile_write32(out_path, mf_tokenizer_kind(tok), (uint32_t)mf_tokenizer_vocab(tok),
                                mf_tokenizer_hash(tok), v.ids, v.n);
    free(v.ids);
    return rc;
}

/* A corpus named instead of a path ("" = moby-dick, or sotu): its text in
 * the cache (scripts/fetch_data.sh), tokenized once into NAME.<tokenizer>.tok
 * beside it. Returns NULL (not a name) or the token file's path. */
static int named_corpus(mf_trainer *t, const char *name, char *path, size_t n) {
    char cache[MF_PATH_MAX], txt[MF_PATH_MAX + 32], tag[32];
    const char *fetch = strcmp(name, "sotu") == 0 ? "scripts/fetch_data.sh --sotu" : "scripts/fetch_data.sh";
    mf_cache_dir(cache, sizeof cache);
    snprintf(txt, sizeof txt, "%s/%s.txt", cache, name);
    /* a tokenizer.json's files are named by its hash: NAME.tokjson-<hash>.tok */
    if (mf_tokenizer_spec_is_json(t->d.tokenizer))
        snprintf(tag, sizeof tag, "tokjson-%016llx", (unsigned long long)t->tok_hash);
    else snprintf(tag, sizeof tag, "%s", t->d.tokenizer);
    snprintf(path, n, "%s/%s.%s.tok", cache, name, tag);
    if (file_exists(path)) return 0;
    if (!file_exists(txt)) return mf_fail("no training data: %s is missing (run %s, or give --data FILE.tok)", txt, fetch);
    if (!t->tok && !(t->tok = mf_tokenizer_open(t->d.tokenizer, t->cfg.tokenizer_dir))) return -1;
    return mf_tokenize_file(t->tok, txt, path);
}

/* A token file must come from the run's tokenizer (the hash it records:
 * constants for bytes and gpt2, the file's FNV-1a for a tokenizer.json) and
 * its ids must fit the model's embedding. mf_tokfile_open has checked every
 * id against the file's vocab. */
static int check_tokfile(const mf_trainer *t, const mf_tokfile *f, const char *path) {
    if (f->tok_hash != t->tok_hash || (f->kind == MF_TOK_HF) != mf_tokenizer_spec_is_json(t->d.tokenizer)) {
        char a[64], b[48] = "";
        mf_tokenizer_describe(f->kind, f->tok_hash, a, sizeof a);
        if (mf_tokenizer_spec_is_json(t->d.tokenizer))
            snprintf(b, sizeof b, " (hash 0x%016llx)", (unsigned long long)t->tok_hash);
        return mf_fail("token file %s was made with %s, but this run's tokenizer is %s%s: give the file's tokenizer "
                       "with --tokenizer, or tokenize the text again (memfit tokenize --tokenizer %s)", path, a,
                       t->d.tokenizer, b, t->d.tokenizer);
    }
    if (f->vocab > (uint32_t)t->d.V)
        return mf_fail("token file %s has vocabulary %u, larger than the model's %d", path, f->vocab, t->d.V);
    return 0;
}

static int is_corpus_name(const char *s) { return !s[0] || strcmp(s, "moby-dick") == 0 || strcmp(s, "sotu") == 0; }

/* The chat template: --chat_template, else the tokenizer.json folder's
 * tokenizer_config.json; the gpt2 and bytes tokenizers have none. */
static int chat_template(const mf_trainer *t, mf_chat_template *tpl) {
    if (t->cfg.chat_template[0]) return mf_chat_template_by_name(t->cfg.chat_template, tpl);
    if (!mf_tokenizer_spec_is_json(t->d.tokenizer))
        return mf_fail("chat data %s with the %s tokenizer needs --chat_template (llama3, chatml, llama2 or smollm2)",
                       t->cfg.data, t->d.tokenizer);
    char cfgp[MF_PATH_MAX + 32];
    snprintf(cfgp, sizeof cfgp, "%s", t->d.tokenizer);
    char *slash = strrchr(cfgp, '/');
    if (slash) snprintf(slash + 1, sizeof cfgp - (size_t)(slash + 1 - cfgp), "tokenizer_config.json");
    else snprintf(cfgp, sizeof cfgp, "tokenizer_config.json");
    if (mf_chat_template_from_config(cfgp, tpl)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mf_error());
        return mf_fail("%s (or give --chat_template)", msg);
    }
    return 0;
}

/* Chat data: the whole file tokenized into the heap store before the
 * baseline is read (so the prediction includes it); its size is printed. */
static int open_chat(mf_trainer *t) {
    mf_chat_template tpl;
    if (chat_template(t, &tpl)) return -1;
    if (!t->tok && load_tokenizer(t)) return -1;
    if (t->cfg.val_data[0]) return mf_fail("val_data is not supported with chat data yet (leave it empty)");
    if (t->cfg.seq_warmup > 0) return mf_fail("seq_warmup is not supported with chat data (its rows are seq long)");
    mf_sft_opts o = {t->T, strcmp(t->cfg.train_on, "prompt_too") == 0, mf_config_packs(&t->cfg), t->cfg.skip_bad_lines};
    if (mf_sft_load(&t->sft, t->cfg.data, t->tok, tpl, &o, t->d.V)) return -1;
    t->chat = 1;
    /* one example per row and no --seq: plan for the longest example the
     * data holds (a multiple of 8), not for block_size */
    if (!o.packing && !mf_config_was_set(&t->cfg, "seq")) {
        int longest = mf_sft_longest(&t->sft), T = (longest + 7) / 8 * 8;
        if (T < t->T) {
            if (mf_sft_relayout(&t->sft, T)) return -1;
            t->T = T;
            t->cfg.seq = T;
        }
    }
    const mf_sft_data *d = &t->sft;
    if (t->rank == 0)
        printf("chat data: %s (%s template, packing %s, loss on %s): %lld examples from %lld lines (%lld skipped, "
               "%lld of them too long; %lld extra pieces of split examples), %lld rows of %d: %lld targets in the loss, "
               "%lld padding positions (%.1f%%); store %.2f MiB (heap, in the baseline)\n", t->cfg.data,
               mf_chat_template_name(tpl), o.packing ? "on" : "off", o.prompt_too ? "every token" : "assistant turns",
               (long long)d->n_conv, (long long)d->lines, (long long)d->skipped, (long long)d->skipped_long,
               (long long)d->split, (long long)d->n_rows, t->T,
               (long long)d->targets, (long long)d->pad, 100.0 * (double)d->pad / (double)d->positions,
               (double)d->bytes / (1 << 20));
    t->n_val_batches = 0;
    return 0;
}

static int open_data(mf_trainer *t) {
    char path[MF_PATH_MAX + 64], vpath[MF_PATH_MAX + 64];
    const char *data = t->cfg.data;
    if (mf_config_is_chat(&t->cfg)) return open_chat(t);
    /* the default corpus (moby-dick) or a named one, tokenized once into the cache;
     * a file of that name in the working folder wins */
    if (is_corpus_name(data) && !(data[0] && file_exists(data))) {
        if (named_corpus(t, data[0] ? data : "moby-dick", path, sizeof path)) return -1;
        data = path;
    }
    if (t->cfg.val_data[0] && is_corpus_name(t->cfg.val_data) && !file_exists(t->cfg.val_data)) {
        if (named_corpus(t, t->cfg.val_data, vpath, sizeof vpath)) return -1;
        snprintf(t->cfg.val_data, sizeof t->cfg.val_data, "%s", vpath);
    }
    if (mf_tokfile_open(&t->train_file, data) || check_tokfile(t, &t->train_file, data)) return -1;
    uint64_t need = (uint64_t)t->B * t->world * t->T + 1;
    if (t->cfg.val_data[0]) {
        if (mf_tokfile_open(&t->val_file, t->cfg.val_data)) return -1;
        t->own_val_file = 1;
        if (check_tokfile(t, &t->val_file, t->cfg.val_data)) return -1;
        t->train_lo = 0;
        t->train_hi = t->train_file.n;
        t->val_lo = 0;
        t->val_hi = t->val_file.n;
    } else {
        uint64_t nval = (uint64_t)((double)t->train_file.n * t->cfg.val_fraction);
        t->train_lo = 0;
        t->train_hi = t->train_file.n - nval;
        t->val_lo = t->train_hi;
        t->val_hi = t->train_file.n;
    }
    if (t->train_hi - t->train_lo < need)
        return mf_fail("training data has %llu tokens, fewer than one batch needs (batch %d x seq %d + 1)",
                       (unsigned long long)(t->train_hi - t->train_lo), t->B * t->world, t->T);
    uint64_t nv = (t->val_hi - t->val_lo) >= 1 ? (t->val_hi - t->val_lo - 1) / ((uint64_t)t->B * t->world * t->T) : 0;
    t->n_val_batches = (int)(nv < (uint64_t)t->cfg.val_batches ? nv : (uint64_t)t->cfg.val_batches);
    return 0;
}

static const mf_tokfile *val_file(const mf_trainer *t) { return t->own_val_file ? &t->val_file : &t->train_file; }

/* n tokens from the mapped file's ids[start] (u16 or u32) as inputs, the
 * next ones as targets */
static void load_window(mf_trainer *t, const mf_tokfile *f, uint64_t start, size_t n) {
    int32_t *in = mf_arena_get(&t->arena, t->model.inputs), *tg = mf_arena_get(&t->arena, t->model.targets);
    if (f->ids) {
        const uint16_t *ids = f->ids + start;
        for (size_t i = 0; i < n; i++) in[i] = ids[i], tg[i] = ids[i + 1];
    } else {
        const uint32_t *ids = f->ids32 + start;
        for (size_t i = 0; i < n; i++) in[i] = (int32_t)ids[i], tg[i] = (int32_t)ids[i + 1];
    }
}

/* chat data: rows [data_pos, + rows x world) of the store (modulo its
 * rows), this rank's slice; returns the targets that count */
static int load_chat_rows(mf_trainer *t, int rows, int T) {
    int32_t *in = mf_arena_get(&t->arena, t->model.inputs), *tg = mf_arena_get(&t->arena, t->model.targets);
    int32_t *pos = t->model.pos >= 0 ? mf_arena_get(&t->arena, t->model.pos) : NULL;
    int counted = 0;
    if (T != t->sft.o.T) mf_panic("chat rows are %d positions, not %d", t->sft.o.T, T);
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * T;
        counted += mf_sft_fill_row(&t->sft, (int64_t)(t->data_pos + (uint64_t)rows * t->rank + r), in + o, tg + o,
                                   pos ? pos + o : NULL);
    }
    t->data_pos += (uint64_t)rows * t->world;
    return counted;
}

/* the global window is world x rows sequences of T; this rank reads its slice */
static void load_rows(mf_trainer *t, int rows, int T) {
    if (t->chat) { load_chat_rows(t, rows, T); return; }
    uint64_t n = (uint64_t)rows * T, gn = n * t->world;
    if (t->train_lo + t->data_pos + gn + 1 > t->train_hi) t->data_pos = 0;
    load_window(t, &t->train_file, t->train_lo + t->data_pos + n * t->rank, (size_t)n);
    t->data_pos += gn;
}

void mf_trainer_load_batch(mf_trainer *t) { load_rows(t, t->B, t->T); }

int mf_trainer_init(mf_trainer *t, const mf_config *cfg, mf_mode mode) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->mode = mode;
    t->nthreads = mf_threads_setup(cfg->threads);
    if (mf_model_dims(cfg, &t->d)) return -1;
    if (mf_dist_init()) return -1;
    mf_dist_set_timeout(cfg->dist_timeout);
    t->world = mf_dist_world();
    t->rank = mf_dist_rank();
    if (mf_config_was_set(cfg, "world_size") && cfg->world_size != t->world)
        return mf_fail("world_size %d, but this process is one of %d ranks (train takes the ranks from mpirun -np)",
                       cfg->world_size, t->world);
    if (mf_zero_check(cfg, t->world) || mf_dist_set_group(cfg->zero_group)) return -1;
    if (mode == MF_MODE_TRAIN && (mf_dist_ep_check(cfg, t->world, 1) || mf_dist_ep_init(cfg->expert_parallel))) return -1;
    if (mode == MF_MODE_TRAIN && t->world > 1 && cfg->lora[0] && (cfg->out_dir[0] || cfg->resume[0]))
        return mf_fail("lora under mpirun: --%s is not supported yet; keep the adapter with --save_adapter (rank 0 "
                       "writes it)", cfg->out_dir[0] ? "out_dir" : "resume");
    t->B = cfg->batch / t->world;
    t->T = cfg->seq ? cfg->seq : t->d.maxT;
    if (t->T > t->d.maxT) return mf_fail("seq %d exceeds the model's block_size %d", t->T, t->d.maxT);
    mf_rng_seed(&t->rng, cfg->seed ^ 0x5EED5A3Dull);
    t->use_scaler = mode == MF_MODE_TRAIN && strcmp(cfg->precision, "fp16") == 0;
    mf_scaler_init(&t->scaler, (float)cfg->loss_scale, cfg->loss_scale_interval);
    /* the run's tokenizer hash, which its token files must record */
    if (mf_tokenizer_spec_info(t->d.tokenizer, NULL, &t->tok_hash)) goto fail;
    int need_tok = cfg->sample_tokens > 0 || !cfg->data[0];
    if (need_tok && load_tokenizer(t)) goto fail;
    if (open_data(t)) goto fail;
    t->sample_ctx = malloc((size_t)t->T * sizeof *t->sample_ctx);
    t->sample_probs = malloc((size_t)t->d.V * sizeof *t->sample_probs);
    t->sample_idx = malloc((size_t)(cfg->top_k > 0 ? cfg->top_k : 1) * sizeof *t->sample_idx);
    if (!t->sample_ctx || !t->sample_probs || !t->sample_idx) { mf_fail("out of memory"); goto fail; }

    /* the planner's rates are read (or calibrated, once per machine) before
     * the baseline, so the calibration's buffers are not in it */
    /* the planner searches single-process settings; under mpirun the
     * budget is checked per rank against the settings given */
    int search = mode == MF_MODE_TRAIN && cfg->budget && strcmp(cfg->plan, "auto") == 0 && t->world == 1;
    if (search && mf_planner_rates(&t->rates, t->nthreads, 0, NULL)) goto fail;
    /* everything outside the arena exists now: measure the baseline */
    mf_blas_warmup(&t->d, t->B * t->T, mf_blas_warm_shapes(cfg));
    if (mode == MF_MODE_TRAIN) {
        mf_optim o;
        if (mf_optim_init(&o, cfg)) goto fail;
        /* the planner may choose bf16 under --allow lossy: its GEMM library
         * is then in the baseline either way */
        mf_dtype wd = search && strcmp(cfg->allow, "lossy") == 0 && o.compute == MF_DTYPE_F32 ? MF_DTYPE_BF16 : o.compute;
        int lossy = search && strcmp(cfg->allow, "lossy") == 0;
        mf_model_gemm16_warmup(&t->d, wd, t->B, t->T, cfg->loss_chunk, 1, o.grad16 || lossy);
    }
    mf_ledger_init(&t->ledger);
    t->ledger.rss_baseline = mf_rss_current();

    if (mode == MF_MODE_TRAIN && mf_trainer_choose(t, search)) goto fail;
    cfg = &t->cfg;  /* the settings the run uses (the planner's when it chose) */
    if (mf_model_build_plan(cfg, mode, t->nthreads, t->ledger.rss_baseline, &t->d, &t->plan, &t->model)) goto fail;
    if (mf_plan_check_budget(&t->plan, t->ledger.rss_baseline, cfg->budget)) {
        if (mode == MF_MODE_TRAIN) mf_trainer_hint(t, cfg->budget);
        goto fail;
    }
    /* which tensors decay is decided once here, not in every step */
    for (int i = 0; i < t->model.n_tensors; i++) {
        mf_tensor *x = &t->model.tensors[i];
        x->decay = strcmp(cfg->decay_on, "all") == 0 || (strcmp(cfg->decay_on, "2d") == 0 && x->decay);
    }
    if (mf_arena_init(&t->arena, &t->plan, &t->ledger)) {
        if (mode == MF_MODE_TRAIN) mf_trainer_hint(t, 0);
        goto fail;
    }
    mf_model_init_weights(&t->model, &t->arena, cfg->seed);
    if (mode == MF_MODE_TRAIN && t->model.opt.offload_path[0] && (mf_offstate_open(t) || mf_offstate_zero(t))) goto fail;
    if (cfg->init[0] && mf_trainer_load_weights(t, cfg->init)) goto fail;
    if (mf_trainer_load_teacher(t)) goto fail;
    if (cfg->adapter[0] && mf_lora_load_adapter(&t->model, &t->arena, cfg->adapter)) goto fail;
    if (cfg->resume[0] && mf_trainer_load_checkpoint(t, cfg->resume)) goto fail;
    return 0;
fail:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mf_error());
        mf_trainer_free(t);
        return mf_fail("%s", msg);
    }
}

void mf_trainer_free(mf_trainer *t) {
    if (t->off || t->off_chunks) mf_offstate_close(t);
    mf_arena_free(&t->arena);
    mf_model_free(&t->model);
    mf_plan_free(&t->plan);
    mf_sft_free(&t->sft);
    mf_tokfile_close(&t->train_file);
    if (t->own_val_file) mf_tokfile_close(&t->val_file);
    if (t->tok) mf_tokenizer_free(t->tok);
    free(t->sample_ctx);
    free(t->sample_probs);
    free(t->sample_idx);
    memset(t, 0, sizeof *t);
}

void mf_trainer_update16(mf_trainer *t, int i, void *const st[MF_OPTIM_STATES], int64_t e0, int64_t n, const void *g,
                         int g16, float gscale) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    const mf_tensor *x = &m->tensors[i];
    const mf_optim *o = &m->opt;
    /* master_weights 0: widen a slice of the bf16 weights (exact) into
     * work.update_f32, update it in fp32, round it back stochastically
     * (llm.c) with element-wise bits from a counter-based stream of (seed,
     * step, tensor, element), so runs and resumes repeat and the slicing
     * (whole tensor, update_in_backward, offload chunks) changes nothing */
    float *w32 = mf_arena_get(a, m->upd32);
    mf_bf16 *w16 = (mf_bf16 *)mf_arena_get(a, x->p) + e0;
    uint64_t seed = t->cfg.seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(t->step + 1) << 16) ^ (uint64_t)i;
    float wd = x->decay ? (float)t->cfg.weight_decay : 0.0f;
    int64_t S = mf_optim_slice(o, &x->os);
    int half = mf_optim_half(o, &x->os);
    float *g32 = w32 + (half ? 3 : 1) * S;  /* grad_dtype bf16: the gradient's slot (plan.c) */
    for (int64_t off = 0; off < n; off += S) {
        int64_t len = n - off < S ? n - off : S;
        void *sst[MF_OPTIM_STATES];
        if (o->kind == MF_OPTIM_ADAFACTOR) memcpy(sst, st, sizeof sst);
        else mf_optim_state_at(o, &x->os, st, off, sst);
        mf_f32_from_bf16(w32, w16 + off, (size_t)len);
        const float *gs = (const float *)g + off;
        if (g16) mf_f32_from_bf16(g32, (const mf_bf16 *)g + off, (size_t)len), gs = g32;
        if (half) {
            /* pure_bf16: m and v widened beside the weights, rounded back
             * stochastically from streams of their own */
            mf_bf16 *m16 = sst[0], *v16 = sst[1];
            sst[0] = w32 + S, sst[1] = w32 + 2 * S;
            mf_f32_from_bf16(sst[0], m16, (size_t)len);
            mf_f32_from_bf16(sst[1], v16, (size_t)len);
            mf_optim_update_range(o, sst, w32, gs, &x->os, len, (float)t->lr, wd, t->step + 1, gscale);
            mf_bf16_from_f32_sr(m16, sst[0], (size_t)len, seed ^ 0x6D6D6D6D00000000ull, (uint64_t)(e0 + off));
            mf_bf16_from_f32_sr(v16, sst[1], (size_t)len, seed ^ 0x7676767600000000ull, (uint64_t)(e0 + off));
        } else
            mf_optim_update_range(o, sst, w32, gs, &x->os, len, (float)t->lr, wd, t->step + 1, gscale);
        mf_bf16_from_f32_sr(w16 + off, w32, (size_t)len, seed, (uint64_t)(e0 + off));
    }
}

/* grad_dtype bf16 with fp32 master weights: elements [e0, e0+n) of tensor
 * i (st[] at element e0's state) a slice at a time, each slice of the bf16
 * gradient widened (exact) into work.update_f32, the fp32 master updated
 * and rounded to nearest-even into the compute copy, as the whole-tensor
 * update does. */
static void update_master16(mf_trainer *t, int i, void *const st[MF_OPTIM_STATES], int64_t e0, int64_t n,
                            const mf_bf16 *g, float gscale) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    const mf_tensor *x = &m->tensors[i];
    const mf_optim *o = &m->opt;
    float *g32 = mf_arena_get(a, m->upd32), *p = (float *)mf_arena_get(a, x->mw) + e0;
    uint16_t *p16 = (uint16_t *)mf_arena_get(a, x->p) + e0;
    float wd = x->decay ? (float)t->cfg.weight_decay : 0.0f;
    int64_t S = mf_optim_slice(o, &x->os);
    for (int64_t off = 0; off < n; off += S) {
        int64_t len = n - off < S ? n - off : S;
        void *sst[MF_OPTIM_STATES];
        mf_optim_state_at(o, &x->os, st, off, sst);
        mf_f32_from_bf16(g32, g + off, (size_t)len);
        mf_optim_update_range(o, sst, p + off, g32, &x->os, len, (float)t->lr, wd, t->step + 1, gscale);
        mf_half_from_f32(m->cdt, p16 + off, p + off, (size_t)len);
    }
}

/* Sum of squares of a gradient row of n elements (bf16 widened), in double. */
static double grad_row_sumsq(const void *g, int g16, size_t n) {
    if (!g16) return mf_sumsq(g, n);
    const mf_bf16 *h = g;
    double s = 0;
    for (size_t k = 0; k < n; k++) {
        double v = mf_bf16_to_f32(h[k]);
        s += v * v;
    }
    return s;
}

/* Updates tensors [first, first+n) from their gradients (times gscale). */
static void update_tensors(mf_trainer *t, int first, int n, float gscale) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    const mf_config *c = &t->cfg;
    for (int i = first; i < first + n; i++) {
        mf_tensor *x = &m->tensors[i];
        if (x->frozen || x->gx) continue;  /* LoRA's base; expert stacks updated expert by expert (gx) */
        void *st[MF_OPTIM_STATES];
        for (int k = 0; k < MF_OPTIM_STATES; k++) st[k] = x->st[k] >= 0 ? mf_arena_get(a, x->st[k]) : NULL;
        /* ZeRO >= 1: this rank's shard (lo, hi) of the tensor; stage 2 keeps the gradient's shard apart */
        /* 16-bit precision: the fp32 master row is updated, then rounded
         * into the compute copy */
        const float *g = x->gs >= 0 ? (const float *)mf_arena_get(a, x->gs) : (const float *)mf_arena_get(a, x->g) + x->lo;
        if (x->mw < 0 && mf_tensor_is16(m, x)) {
            mf_trainer_update16(t, i, st, 0, x->numel, g, x->g16, gscale);
            continue;
        }
        if (x->g16) {  /* grad_dtype bf16 (no ZeRO shard: refused by the plan) */
            update_master16(t, i, st, 0, x->numel, (const mf_bf16 *)g, gscale);
            continue;
        }
        float *p = x->ps >= 0 ? (float *)mf_arena_get(a, x->ps) : (float *)mf_arena_get(a, mf_tensor_weights_row(x)) + x->lo;
        const float wd = x->decay ? (float)c->weight_decay : 0.0f;
        /* bf16 with fp32 masters, the whole tensor here (no ZeRO shard):
         * the optimizer can round the new weights into the compute copy in
         * its own pass */
        if (x->mw >= 0 && m->cdt == MF_DTYPE_BF16 && x->ps < 0 && x->lo == 0 && x->os.rows * x->os.cols == x->numel &&
            mf_optim_update_bf16(&m->opt, st, p, mf_arena_get(a, x->p), g, &x->os, (float)t->lr, wd, t->step + 1, gscale))
            continue;
        mf_optim_update(&m->opt, st, p, g, &x->os, (float)t->lr, wd, t->step + 1, gscale);
        mf_model_sync_params(m, a, i, 1);
    }
}

/* Rows [r0, r0+nr) of tensor i (the tied embedding under emb_split) from
 * their gradient g, as update_tensors would update them within the whole
 * tensor: element-wise optimizers, 8-bit blocks of whole rows, the same
 * rounding bits (model.h, emb_split). */
static void update_rows(mf_trainer *t, int i, int64_t r0, int64_t nr, const void *g, int g16) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    mf_tensor *x = &m->tensors[i];
    int64_t C = x->shape[1], e0 = r0 * C, n = nr * C;
    void *st[MF_OPTIM_STATES], *sst[MF_OPTIM_STATES];
    for (int k = 0; k < MF_OPTIM_STATES; k++) st[k] = x->st[k] >= 0 ? mf_arena_get(a, x->st[k]) : NULL;
    mf_optim_state_at(&m->opt, &x->os, st, e0, sst);
    if (x->mw < 0 && mf_tensor_is16(m, x)) {
        mf_trainer_update16(t, i, sst, e0, n, g, g16, 1.0f);
        return;
    }
    if (g16) {
        update_master16(t, i, sst, e0, n, g, 1.0f);
        return;
    }
    float *p = (float *)mf_arena_get(a, mf_tensor_weights_row(x)) + e0;
    mf_optim_update_range(&m->opt, sst, p, g, &x->os, n, (float)t->lr, x->decay ? (float)t->cfg.weight_decay : 0.0f,
                          t->step + 1, 1.0f);
    if (x->mw >= 0) mf_half_from_f32(m->cdt, (uint16_t *)mf_arena_get(a, x->p) + e0, p, (size_t)n);
}

/* emb_split: stage 1 (head) updates the rows no input token touched, from
 * the full gradient (the touched rows were moved out and zeroed); stage 2
 * (embedding backward) the touched rows from emb_rows. Returns the squared
 * norm of the rows it saw. */
static double update_emb_split(mf_trainer *t) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    const mf_tensor *x = &m->tensors[m->t_emb];
    int64_t V = x->shape[0], C = x->shape[1];
    if (m->emb_stage == 1) {
        const void *g = mf_arena_get(a, x->g);
        const int32_t *map = mf_arena_get(a, m->emb_map);
        size_t es = x->g16 ? 2 : sizeof(float);
        double ss = grad_row_sumsq(g, x->g16, (size_t)x->numel);
        if (!isfinite(ss)) return ss;
        for (int64_t r = 0; r < V;) {
            if (map[r] >= 0) { r++; continue; }
            int64_t r1 = r;
            while (r1 < V && map[r1] < 0) r1++;
            update_rows(t, m->t_emb, r, r1 - r, (const char *)g + (size_t)(r * C) * es, x->g16);
            r = r1;
        }
        return ss;
    }
    const float *rows = mf_arena_get(a, m->emb_rows);
    const int32_t *uniq = (const int32_t *)mf_arena_get(a, m->emb_index) + (int64_t)m->B * m->T;
    double ss = mf_sumsq(rows, (size_t)m->emb_nuniq * (size_t)C);
    if (!isfinite(ss)) return ss;
    for (int s = 0; s < m->emb_nuniq; s++) update_rows(t, m->t_emb, uniq[s], 1, rows + (int64_t)s * C, 0);
    return ss;
}

static double grad_sumsq(mf_trainer *t, int first, int n) {
    double ss = 0;
    for (int i = first; i < first + n; i++)
        if (!t->model.tensors[i].frozen && !t->model.tensors[i].gx)  /* gx: summed expert by expert */
            ss += grad_row_sumsq(mf_arena_get(&t->arena, t->model.tensors[i].g), t->model.tensors[i].g16,
                                 (size_t)t->model.tensors[i].numel);
    return ss;
}

/* update_in_backward: the model hands over tensors whose gradient is
 * complete; a non-finite gradient stops further updates and fails the step */
static void grads_ready(void *ctx, int first, int n) {
    mf_trainer *t = ctx;
    if (!t->model.opt.in_backward) {  /* ZeRO 0-2: reduce as each layer's gradient completes */
        if (!t->uib_bad && mf_zero_grads_ready(&t->model, &t->arena, first, n)) t->uib_bad = 2;
        return;
    }
    if (t->model.emb_split && first == t->model.t_emb) {
        /* the tied embedding's rows (model.h, emb_split), then the rest */
        if (!t->uib_bad) {
            double se = update_emb_split(t);
            t->uib_sumsq += se;
            if (!isfinite(se)) t->uib_bad = 1;
        }
        first++, n--;
        if (n == 0) return;
    }
    double ss = grad_sumsq(t, first, n);
    t->uib_sumsq += ss;
    if (!isfinite(ss)) t->uib_bad = 1;
    if (!t->uib_bad) update_tensors(t, first, n, 1.0f);
}

/* update_in_backward on a mixture's expert stacks (mf_tensor.gx): one
 * expert's rows [r0, r0+nr) of tensor i, their gradient g complete, updated
 * now (as update_tensors would within the whole tensor: update_rows) */
static void grads_rows_ready(void *ctx, int i, int64_t r0, int64_t nr, const float *g) {
    mf_trainer *t = ctx;
    double ss = mf_sumsq(g, (size_t)(nr * t->model.tensors[i].shape[1]));
    t->uib_sumsq += ss;
    if (!isfinite(ss)) t->uib_bad = 1;
    if (!t->uib_bad) update_rows(t, i, r0, nr, g, 0);
}

void mf_trainer_step_shape(const mf_trainer *t, int step, int *rows, int *T) {
    int accum = t->cfg.grad_accum, w = t->cfg.seq_warmup;
    *rows = t->B * accum;
    *T = t->T;
    if (w <= 0 || step >= w || t->T <= 8) return;
    /* sequence-length warm-up: T grows linearly from seq_warmup_start to the
     * planned T (multiples of 8); the step keeps its token count in rows */
    int t0 = t->cfg.seq_warmup_start < t->T ? t->cfg.seq_warmup_start : t->T;
    int ts = t0 + (int)((int64_t)(t->T - t0) * step / w);
    ts = ts / 8 * 8;
    if (ts < t0) ts = t0;
    if (ts >= t->T) return;
    *T = ts;
    *rows = (int)((int64_t)t->B * t->T * accum / ts);
}

/* a training micro-batch fits the student's plan and (distillation) the teacher's */
static int step_fits(const mf_model *m, int B, int T) {
    return mf_model_fits(m, B, T) && (!m->teacher || mf_model_fits(&m->teacher->model, B, T));
}

int mf_trainer_accumulate(mf_trainer *t, int rows, int T, float lscale, double *loss) {
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    if (rows < 1 || T < 1) return mf_fail("a batch of %d x %d tokens is empty", rows, T);
    if (T > t->d.maxT) return mf_fail("a batch of sequences of %d tokens: the model's block_size is %d", T, t->d.maxT);
    /* the run-time guard: the largest micro-batch of these rows that fits
     * the plan's buffers; the batch is run in as many as it takes */
    int64_t cap = (int64_t)t->B * t->T / T;
    int r = (int)(cap < rows ? cap : rows);
    while (r > 0 && !step_fits(m, r, T)) r--;
    if (r < 1)
        return mf_fail("a sequence of %d tokens does not fit the plan (batch %d x seq %d): plan for seq %d", T, t->B,
                       t->T, T);
    int micro = (rows + r - 1) / r;
    /* balanced micro-batches of rows / micro and one more row must fit too */
    while (micro < rows && !(step_fits(m, rows / micro, T) && step_fits(m, (rows + micro - 1) / micro, T)))
        micro++;
    if (!step_fits(m, (rows + micro - 1) / micro, T))
        return mf_fail("a batch of %d x %d tokens has no split that fits the plan (batch %d x seq %d)", rows, T, t->B, t->T);
    if (micro > 1 && m->opt.in_backward)
        return mf_fail("a batch of %d x %d tokens needs %d micro-batches of the plan's %d x %d, but update_in_backward "
                       "updates after one", rows, T, micro, t->B, t->T);
    /* every token's loss counts 1 / (all tokens of the step), in every micro-batch */
    float dscale = 1.0f / ((float)rows * (float)t->world * (float)T) * lscale;
    /* chat data: 1 / (the targets that count in the whole step, every rank's
     * rows), so any split into micro-batches gives the unsplit batch's mean */
    int64_t counted = 0;
    if (t->chat) {
        for (int64_t r = 0; r < (int64_t)rows * t->world; r++)
            counted += mf_sft_row_targets(&t->sft, (int64_t)t->data_pos + r);
        dscale = 1.0f / (float)(counted > 0 ? counted : 1) * lscale;
    }
    int accum = t->cfg.grad_accum, keyed = micro != accum;
    double loss_sum = 0;
    for (int k = 0; k < micro; k++) {
        int rk = rows / micro + (k < rows % micro);  /* balanced: no micro-batch of a few rows */
        mf_arena_step(a);
        if (k == 0) mf_model_zero_grads(m, a);
        m->grads_final = k == micro - 1;
        /* LoRA dropout's mask; a step split otherwise than in grad_accum
         * parts keys it by (step, micro-batch) */
        m->lora_micro = keyed ? (uint64_t)t->step << 20 | (uint64_t)k : (uint64_t)t->step * (uint64_t)accum + (uint64_t)k;
        if (t->chat) {
            int ck = load_chat_rows(t, rk, T);
            if (m->teacher) mf_teacher_forward(m, a, rk, T);  /* distillation: the teacher's hidden states */
            loss_sum += mf_model_forward(m, a, rk, T, 1, dscale) * ck;
            mf_model_backward(m, a, rk, T);
            continue;
        }
        load_rows(t, rk, T);
        if (m->teacher) mf_teacher_forward(m, a, rk, T);
        double lk = mf_model_forward(m, a, rk, T, 1, dscale);
        loss_sum += rows % micro ? lk * rk : lk;
        mf_model_backward(m, a, rk, T);
    }
    /* chat data: this rank's share of the step's mean (the ranks' shares sum to it) */
    if (t->chat) *loss = counted ? loss_sum / (double)counted * t->world : 0.0;
    else *loss = rows % micro ? loss_sum / rows : loss_sum / micro;
    return micro;
}

int mf_trainer_step(mf_trainer *t, mf_step_stats *st) {
    int rows, T;
    mf_trainer_step_shape(t, t->step, &rows, &T);
    return mf_trainer_step_rows(t, rows, T, st);
}

int mf_trainer_step_rows(mf_trainer *t, int rows, int T, mf_step_stats *st) {
    if (t->mode != MF_MODE_TRAIN) return mf_fail("this trainer was set up for inference");
    double t0 = mf_time_now();
    mf_model *m = &t->model;
    mf_arena *a = &t->arena;
    /* fp16: the backward runs on loss * scale (GradScaler), unscaled below */
    float lscale = t->use_scaler ? t->scaler.scale : 1.0f;
    t->lr = mf_lr_at(&t->cfg, t->step);
    t->uib_sumsq = 0;
    t->uib_bad = 0;
    m->grads_ready = grads_ready;
    m->grads_rows_ready = grads_rows_ready;
    m->grads_ctx = t;
    double loss = 0;
    int micro = mf_trainer_accumulate(t, rows, T, lscale, &loss);
    if (micro < 0) return -1;
    double tokens = (double)rows * t->world * T;
    mf_arena_phase(a, mf_phase_optim(m));
    int uib = m->opt.in_backward;
    double sumsq = 0;
    if (t->world > 1) {
        /* data parallel: the gradient summed over the ranks (dist/) */
        if (t->uib_bad == 2 || m->comm_err || mf_zero_sync_grads(m, a) || mf_zero_grad_sumsq(m, a, &sumsq)) return -1;
        double l = loss / t->world;
        if (mf_dist_sum_doubles(&l, 1)) return -1;
        loss = l;
    } else sumsq = uib ? t->uib_sumsq : grad_sumsq(t, 0, m->n_tensors);
    int skipped = 0;
    if (t->use_scaler) {
        /* gradients back to the unscaled loss; inf/NaN anywhere skips the
         * update (weights and optimizer state untouched) and halves the scale */
        if (t->inject_overflow) {
            ((float *)mf_arena_get(a, m->tensors[0].g))[0] = INFINITY;
            t->inject_overflow = 0;
        }
        int found_inf = 0;
        for (int i = 0; i < m->n_tensors; i++)
            found_inf |= mf_scaler_unscale(&t->scaler, mf_arena_get(a, m->tensors[i].g), (size_t)m->tensors[i].numel);
        skipped = mf_scaler_update(&t->scaler, found_inf);
        sumsq = skipped ? INFINITY : grad_sumsq(t, 0, m->n_tensors);
    }
    double norm = sqrt(sumsq);
    if (skipped) {
        /* the step counts (learning-rate schedule, AdamW's step number) but
         * nothing is updated */
        t->step++;
        if (st) *st = (mf_step_stats){loss, t->lr, norm, mf_time_now() - t0, 0, lscale, 1, rows, T, micro};
        if (st) st->tok_s = tokens / st->seconds;
        return 0;
    }
    if (!isfinite(loss) || !isfinite(norm)) return mf_trainer_fail_nonfinite(t, loss, norm);
    float gscale = mf_clip_scale(norm, t->cfg.grad_clip);
    if (t->off) {
        /* tensors without state (sgd, no momentum) update in place; the
         * rest stream their state through the windows */
        for (int i = 0; i < m->n_tensors; i++)
            if (m->tensors[i].st[0] < 0 && !m->tensors[i].frozen) update_tensors(t, i, 1, gscale);
        if (mf_offstate_step(t, gscale)) return -1;
        mf_model_sync_params(m, a, 0, m->n_tensors);  /* 16-bit copies of the streamed master rows */
    } else if (!uib) update_tensors(t, 0, m->n_tensors, gscale);
    if (mf_zero_gather_params(m, a)) return -1;
    t->step++;
    if (st) {
        st->loss = loss;
        st->lr = t->lr;
        st->grad_norm = norm;
        st->seconds = mf_time_now() - t0;
        st->tok_s = tokens / st->seconds;
        st->loss_scale = t->use_scaler ? lscale : 0.0;
        st->skipped = 0;
        st->rows = rows;
        st->seq = T;
        st->micro = micro;
    }
    return 0;
}

double mf_trainer_val_loss(mf_trainer *t) {
    if (t->n_val_batches < 1) return NAN;
    double sum = 0;
    size_t n = (size_t)t->B * t->T;
    for (int i = 0; i < t->n_val_batches; i++) {
        mf_arena_step(&t->arena);
        load_window(t, val_file(t), t->val_lo + ((uint64_t)i * t->world + t->rank) * n, n);
        sum += mf_model_forward(&t->model, &t->arena, t->B, t->T, 1, 0.0f);
    }
    sum /= t->world;
    if (mf_dist_sum_doubles(&sum, 1)) return NAN;
    return sum / t->n_val_batches;
}

typedef struct { mf_trainer *t; int n; } ctx_fill;
static void emit_ctx(int32_t id, void *p) {
    ctx_fill *c = p;
    int T = c->t->T;
    /* keep the last T ids of the prompt */
    if (c->n == T) {
        memmove(c->t->sample_ctx, c->t->sample_ctx + 1, (size_t)(T - 1) * sizeof *c->t->sample_ctx);
        c->n--;
    }
    c->t->sample_ctx[c->n++] = id;
}

static int sample_next(mf_trainer *t, const float *logits) {
    /* only ids the tokenizer has: a Llama's embedding may have more rows
     * (Qwen2.5's 151936 for 151665 ids) */
    int V = t->d.V < mf_tokenizer_vocab(t->tok) ? t->d.V : mf_tokenizer_vocab(t->tok);
    int k = t->cfg.top_k > 0 && t->cfg.top_k < V ? t->cfg.top_k : V;
    double temp = t->cfg.temperature;
    if (temp <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    /* top-k by insertion into a list of k ids sorted by logit */
    int *idx = t->sample_idx, nk = 0;
    if (k < V) {
        for (int i = 0; i < V; i++) {
            if (nk == k && logits[i] <= logits[idx[k - 1]]) continue;
            int j = nk < k ? nk++ : k - 1;
            while (j > 0 && logits[idx[j - 1]] < logits[i]) { idx[j] = idx[j - 1]; j--; }
            idx[j] = i;
        }
    }
    int n = k < V ? nk : V;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        int id = k < V ? idx[i] : i;
        float p = expf((float)((logits[id] - mx) / temp));
        t->sample_probs[i] = p;
        sum += p;
    }
    double r = mf_rng_uniform(&t->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += t->sample_probs[i];
        if (acc >= r) return k < V ? idx[i] : i;
    }
    return k < V ? idx[n - 1] : n - 1;
}

int mf_trainer_sample(mf_trainer *t, const char *prompt, int n, FILE *out) {
    if (!t->tok) return mf_fail("sampling needs the tokenizer");
    ctx_fill c = {t, 0};
    if (prompt && *prompt) {
        if (mf_tokenizer_encode(t->tok, prompt, strlen(prompt), emit_ctx, &c)) return -1;
        fputs(prompt, out);
    }
    /* no prompt: GPT-2's end-of-text, else the tokenizer's newline */
    if (c.n == 0 && mf_tokenizer_kind(t->tok) == MF_TOK_GPT2) emit_ctx(MF_GPT2_EOT, &c);
    if (c.n == 0 && mf_tokenizer_encode(t->tok, "\n", 1, emit_ctx, &c)) return -1;
    if (c.n == 0) return mf_fail("the tokenizer encodes a newline to no ids: give --prompt");
    int T = t->T, len = c.n;
    for (int s = 0; s < n; s++) {
        mf_arena_step(&t->arena);
        int32_t *in = mf_arena_get(&t->arena, t->model.inputs);
        memcpy(in, t->sample_ctx, (size_t)len * sizeof *in);
        if (t->model.pos >= 0) {  /* a packing plan: one document, positions 0.. */
            int32_t *pos = mf_arena_get(&t->arena, t->model.pos);
            for (int i = 0; i < len; i++) pos[i] = i;
        }
        mf_model_forward(&t->model, &t->arena, 1, len, 0, 0.0f);
        int id = sample_next(t, mf_model_logits(&t->model, &t->arena, len, 0, len - 1));
        const char *bytes;
        int nb = mf_tokenizer_decode(t->tok, id, &bytes);
        if (nb > 0) fwrite(bytes, 1, (size_t)nb, out);
        if (len < T) t->sample_ctx[len++] = id;
        else {
            memmove(t->sample_ctx, t->sample_ctx + 1, (size_t)(T - 1) * sizeof *t->sample_ctx);
            t->sample_ctx[T - 1] = id;
        }
    }
    fputc('\n', out);
    fflush(out);
    return 0;
}
