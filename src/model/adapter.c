/* LoRA adapters on disk in PEFT's layout (what PeftModel.save_pretrained
 * writes): adapter_model.safetensors with the names
 *   GPT-2: base_model.model.transformer.h.{i}.<target>.lora_A.weight
 *   Llama: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
 *   Mixtral's experts: base_model.model.model.layers.{i}.block_sparse_moe.experts.{e}.w1.lora_A.weight
 *     (memfit stacks the E experts' adapters in one tensor; the file has one per expert)
 * (r, in) and ...lora_B.weight (out, r), fp32, and adapter_config.json
 * (fan_in_fan_out true for GPT-2's Conv1D, false for nn.Linear).
 * Under expert parallelism (docs/moe.md) a rank holds its experts'
 * adapters: --adapter gives each rank its own experts' tensors, and
 * --save_adapter has rank 0 write the one file, the other ranks of the
 * first expert group sending theirs one tensor at a time. */
#include "dist/dist.h"
#include "io/io.h"
#include "memfit/lora.h"
#include "memfit/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the PEFT prefix before memfit's tensor name (which is the HF name
 * inside the model: GPT-2's drop "transformer.") */
static const char *peft_prefix(const mf_model *m) {
    return m->d.arch == MF_ARCH_LLAMA ? "base_model.model." : "base_model.model.transformer.";
}

/* An expert's adapter tensor another rank of the expert group holds
 * (expert parallel): received whole into `stage` when the writer asks for
 * its first piece, then handed out piece by piece */
typedef struct {
    int from;      /* the owner's rank in the expert group */
    int got;       /* received */
    float *stage;  /* one expert tensor's bytes, or more */
    size_t nbytes;
} remote_tensor;

static int read_remote(void *ctx, uint64_t off, void *buf, size_t len) {
    remote_tensor *r = ctx;
    if (off == 0) {
        if (mf_dist_ep_recv(r->stage, r->nbytes, r->from)) return -1;
        r->got = 1;
    }
    memcpy(buf, (const char *)r->stage + off, len);
    return 0;
}

/* expert parallel: the group's size (1 without) */
static int ep_n(const mf_model *m) { return m->d.ep > 1 && mf_dist_world() > 1 ? m->d.ep : 1; }

/* The adapter's tensors as the file holds them: one entry per adapter
 * matrix, an expert target's stack (E*r, in) / (E*out, r) split into PEFT's
 * per-expert ...experts.{e}.w1.lora_A.weight (r, in) etc.; data points into
 * the arena row's slice. Under expert parallelism a rank's stacks hold its
 * E/N experts (group rank g: experts g*E/N ..): the others' entries are
 * listed too, with data NULL and owner[j] their group rank (owner[j] is
 * this rank's for its own). NULL (message) when out of memory. */
static mf_st_entry *adapter_entries(const mf_model *m, const mf_arena *a, char (**names)[160], int **owner, int *count) {
    int n = 0, nt = m->n_tensors - m->lora_first, P = ep_n(m), g = P > 1 ? mf_dist_ep_rank() : 0;
    for (int i = 0; i < nt; i++) n += strstr(m->tensors[m->lora_first + i].name, ".experts.") ? m->d.n_experts : 1;
    mf_st_entry *e = calloc((size_t)n, sizeof *e);
    *names = calloc((size_t)n, sizeof **names);
    *owner = calloc((size_t)n, sizeof **owner);
    if (!e || !*names || !*owner) {
        free(e); free(*names); free(*owner);
        *names = NULL, *owner = NULL;
        mf_fail("out of memory for the adapter's tensors");
        return NULL;
    }
    int j = 0;
    for (int i = 0; i < nt; i++) {
        const mf_tensor *t = &m->tensors[m->lora_first + i];
        const char *ex = strstr(t->name, ".experts.");
        int ne = ex ? m->d.n_experts : 1, El = ex ? ne / P : 1;
        int64_t rows = t->shape[0] / El;
        for (int x = 0; x < ne; x++, j++) {
            if (ex) snprintf((*names)[j], sizeof (*names)[j], "%s%.*s.experts.%d.%s", peft_prefix(m), (int)(ex - t->name),
                             t->name, x, ex + 9);
            else snprintf((*names)[j], sizeof (*names)[j], "%s%s", peft_prefix(m), t->name);
            (*owner)[j] = ex ? x / El : g;
            int64_t xl = ex ? x - (int64_t)g * El : 0;  /* its place in this rank's stack */
            e[j] = (mf_st_entry){.name = (*names)[j], .dtype = MF_DTYPE_F32, .ndim = 2, .shape = {rows, t->shape[1]},
                                 .data = (*owner)[j] == g ? (float *)mf_arena_ptr(a, t->p) + (size_t)xl * rows * t->shape[1]
                                                          : NULL,
                                 .nbytes = (size_t)(rows * t->shape[1]) * sizeof(float)};
        }
    }
    *count = n;
    return e;
}

/* Expert parallel, a rank of the first group but rank 0: its experts'
 * adapter tensors to rank 0, in the file's order */
static int send_experts(const mf_st_entry *e, const int *owner, int n, int g) {
    for (int j = 0; j < n; j++)
        if (owner[j] == g && g > 0 && strstr(e[j].name, ".experts.") && mf_dist_ep_send(e[j].data, e[j].nbytes, 0))
            return -1;
    return 0;
}

/* Rank 0 under expert parallelism: the other ranks' experts come through
 * read_remote, staged one tensor at a time in a plan row free after
 * training (or the heap); then every one not received is drained, so the
 * senders finish whatever happened to the file */
static int write_gathered(const mf_model *m, const mf_arena *a, const char *path, mf_st_entry *e, const int *owner,
                          int n, int wrc, const char *const *mk, const char *const *mv) {
    int nr = 0;
    size_t most = 0;
    for (int j = 0; j < n; j++)
        if (owner[j] != 0) nr++, most = e[j].nbytes > most ? e[j].nbytes : most;
    remote_tensor *r = calloc((size_t)(nr ? nr : 1), sizeof *r);
    float *heap = NULL, *stage = nr ? mf_model_stage(m, a, (int64_t)(most / sizeof(float))) : NULL;
    if (nr && !stage) stage = heap = malloc(most);
    int rc = wrc;
    if (!r || (nr && !stage)) rc = mf_fail("out of memory staging the experts' adapters");
    for (int j = 0, k = 0; r && stage && j < n; j++)
        if (owner[j] != 0) {
            r[k] = (remote_tensor){owner[j], 0, stage, e[j].nbytes};
            e[j].read = read_remote, e[j].read_ctx = &r[k++];
        }
    if (!rc) rc = mf_st_write(path, e, n, mk, mv, 1);
    for (int k = 0; r && stage && k < nr; k++)
        if (!r[k].got && mf_dist_ep_recv(stage, r[k].nbytes, r[k].from)) break;
    free(heap);
    free(r);
    return rc;
}

int mf_lora_save_adapter(const mf_model *m, const mf_arena *a, const char *dir, const char *base_name) {
    if (m->lora.r <= 0) return mf_fail("save_adapter: this model has no LoRA adapters");
    /* expert parallel: rank 0 writes the one file, with every expert's
     * adapter once (the other ranks of the first group send theirs) */
    const int P = ep_n(m), rank = mf_dist_rank(), g = P > 1 ? mf_dist_ep_rank() : 0;
    int rc = 0;
    if (rank == 0 && mkdir(dir, 0755) && errno != EEXIST)
        rc = mf_fail("cannot create adapter folder %s: %s", dir, strerror(errno));
    int n;
    char (*names)[160];
    int *owner;
    mf_st_entry *e = adapter_entries(m, a, &names, &owner, &n);
    if (!e) return -1;  /* (before any message: every rank lists the same entries) */
    char path[MF_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    /* data parallel: every rank holds the same adapters; rank 0 writes */
    if (P == 1 && rank) rc = 0;
    else if (P == 1) rc = rc ? rc : mf_st_write(path, e, n, mk, mv, 1);
    else if (rank == 0) rc = write_gathered(m, a, path, e, owner, n, rc, mk, mv);
    else if (rank < P) rc = send_experts(e, owner, n, g);
    free(e);
    free(names);
    free(owner);
    if (P > 1) {
        /* every rank learns whether the file was written */
        char msg[512] = "";
        if (rc) snprintf(msg, sizeof msg, "%s", mf_error());
        double bad = rc != 0;
        if (mf_dist_sum_doubles(&bad, 1)) return -1;
        if (rc) return mf_fail("%s", msg);
        if (bad > 0) return mf_fail("%s: another rank failed writing the adapter", path);
        if (rank) return 0;
    }
    if (rank) return 0;
    if (rc) return -1;
    /* adapter_config.json: the keys PEFT's LoraConfig reads */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    mf_atomic_file af;
    if (mf_atomic_open(&af, path)) return -1;
    fprintf(af.fp, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n");
    fprintf(af.fp, "  \"base_model_name_or_path\": \"");
    for (const char *c = base_name ? base_name : ""; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', af.fp);
        if ((unsigned char)*c >= 0x20) fputc(*c, af.fp);
    }
    fprintf(af.fp, "\",\n  \"r\": %d,\n  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.9g,\n", m->lora.r,
            (double)m->lora.alpha, (double)m->lora.dropout);
    fprintf(af.fp, "  \"target_modules\": [");
    int first = 1;
    for (int k = 0; k < MF_LORA_TARGETS; k++)
        if (m->lora.targets >> k & 1) fprintf(af.fp, "%s\"%s\"", first ? "" : ", ", mf_lora_target_name(k)), first = 0;
    fprintf(af.fp, "],\n  \"fan_in_fan_out\": %s,\n  \"bias\": \"none\",", m->d.arch == MF_ARCH_LLAMA ? "false" : "true");
    fprintf(af.fp, "\n  \"inference_mode\": true,\n"
                   "  \"init_lora_weights\": true,\n  \"modules_to_save\": null,\n  \"use_rslora\": false,\n"
                   "  \"use_dora\": false\n}\n");
    return mf_atomic_commit(&af);
}

int mf_lora_load_adapter(mf_model *m, mf_arena *a, const char *dir) {
    if (m->lora.r <= 0) return mf_fail("adapter %s: this run has no --lora setting to load it into", dir);
    /* the adapter's own config must agree with this run's (alpha scales the output) */
    mf_lora_cfg fc;
    if (mf_lora_read_config(dir, &fc, NULL)) return -1;
    if (fc.r != m->lora.r || fc.alpha != m->lora.alpha || fc.targets != m->lora.targets) {
        char t1[128], t2[128];
        return mf_fail("adapter %s was made with r=%d,alpha=%g,targets=%s but this run has r=%d,alpha=%g,targets=%s "
                       "(drop --lora to take the adapter's)", dir, fc.r, (double)fc.alpha, mf_lora_targets_str(&fc, t1, sizeof t1),
                       m->lora.r, (double)m->lora.alpha, mf_lora_targets_str(&m->lora, t2, sizeof t2));
    }
    char path[MF_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    mf_st_file f;
    if (mf_st_open(&f, path)) return -1;
    int n, *owner;
    char (*names)[160];
    mf_st_entry *e = adapter_entries(m, a, &names, &owner, &n);
    if (!e) { mf_st_close(&f); return -1; }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *nm = e[i].name;
        if (!e[i].data) continue;  /* expert parallel: another rank's expert */
        const mf_st_tensor *s = mf_st_find(&f, nm);
        if (!s) {
            rc = mf_fail("%s: no tensor '%s' (the adapter's layers or targets differ from this --lora setting)", path, nm);
            break;
        }
        if (s->dtype != MF_DTYPE_F32) rc = mf_fail("%s: '%s' is %s, expected F32", path, nm, mf_dtype_name(s->dtype));
        else if (s->ndim != 2 || s->shape[0] != e[i].shape[0] || s->shape[1] != e[i].shape[1])
            rc = mf_fail("%s: '%s' has shape [%lld, %lld], this run expects [%lld, %lld] (r %d)", path, nm,
                         (long long)s->shape[0], (long long)(s->ndim > 1 ? s->shape[1] : 0), (long long)e[i].shape[0],
                         (long long)e[i].shape[1], m->lora.r);
        else if (!(rc = mf_st_stream(&f, s, NULL, NULL)))  /* checksum, finite values */
            memcpy((void *)e[i].data, s->data, s->nbytes);
    }
    /* anything else in the file is an adapter this model would silently ignore */
    for (int j = 0; j < f.n && !rc; j++) {
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(e[i].name, f.tensors[j].name) == 0;
        if (!known) rc = mf_fail("%s: unexpected tensor '%s' (not an adapter of this --lora setting)", path, f.tensors[j].name);
    }
    free(e);
    free(names);
    free(owner);
    mf_st_close(&f);
    return rc;
}
