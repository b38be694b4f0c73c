/* adapter_config.json reading, and memfit merge: folding an adapter into
 * (or out of) a model file's weights, as PEFT's merge_and_unload does for
 * GPT-2's Conv1D (fan_in_fan_out): W (in, out) += (alpha/r) * (B @ A)^T;
 * a Llama's nn.Linear: W (out, in) += (alpha/r) * B @ A; a Mixtral expert's
 * w1/w2/w3 likewise, under HF's per-expert names (experts.{e}.w1.weight). */
#include "io/io.h"
#include "memfit/lora.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PEFT_PREFIX "base_model.model.transformer."

static char *slurp(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) { mf_fail("%s: cannot open: %s", path, strerror(errno)); return NULL; }
    char *s = malloc(max + 1);
    size_t n = s ? fread(s, 1, max, f) : 0;
    int big = s && n == max && fgetc(f) != EOF;
    fclose(f);
    if (!s) { mf_fail("out of memory reading %s", path); return NULL; }
    if (big) { free(s); mf_fail("%s: larger than %zu bytes, not an adapter config", path, max); return NULL; }
    s[n] = 0;
    return s;
}

int mf_lora_read_config(const char *dir, mf_lora_cfg *out, int *fan_in_fan_out) {
    char path[1100];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    memset(out, 0, sizeof *out);
    char *s = slurp(path, 1 << 20);
    if (!s) return -1;
    cJSON *j = cJSON_Parse(s);
    free(s);
    if (!j) return mf_fail("%s: not valid JSON", path);
    int rc = 0;
    const cJSON *pt = cJSON_GetObjectItem(j, "peft_type"), *r = cJSON_GetObjectItem(j, "r"),
                *al = cJSON_GetObjectItem(j, "lora_alpha"), *dr = cJSON_GetObjectItem(j, "lora_dropout"),
                *tm = cJSON_GetObjectItem(j, "target_modules"), *ff = cJSON_GetObjectItem(j, "fan_in_fan_out"),
                *rs = cJSON_GetObjectItem(j, "use_rslora");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0) rc = mf_fail("%s: peft_type is not \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 4096 || r->valuedouble != (int)r->valuedouble)
        rc = mf_fail("%s: r is not a whole number in [1, 4096]", path);
    else if (!cJSON_IsNumber(al) || !(al->valuedouble > 0)) rc = mf_fail("%s: lora_alpha is not a number > 0", path);
    else if (cJSON_IsTrue(rs)) rc = mf_fail("%s: use_rslora (alpha/sqrt(r) scaling) is not supported", path);
    else if (!cJSON_IsArray(tm) || cJSON_GetArraySize(tm) < 1) rc = mf_fail("%s: target_modules is not a list of names", path);
    else {
        out->r = (int)r->valuedouble;
        out->alpha = (float)al->valuedouble;
        out->dropout = cJSON_IsNumber(dr) ? (float)dr->valuedouble : 0.0f;
        if (out->dropout < 0 || out->dropout >= 1) out->dropout = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, tm) {
            int k = -1;
            for (int q = 0; cJSON_IsString(it) && q < MF_LORA_TARGETS; q++)
                if (strcmp(it->valuestring, mf_lora_target_name(q)) == 0) k = q;
            if (k < 0) { rc = mf_fail("%s: target module '%s' is not one memfit knows (GPT-2's attn.c_attn, attn.c_proj, "
                                      "mlp.c_fc, mlp.c_proj; Llama's q/k/v/o_proj, gate/up/down_proj; Mixtral's w1, w2, w3)",
                                      path, cJSON_IsString(it) ? it->valuestring : "?"); break; }
            out->targets |= 1u << k, out->targets_given = 1;
        }
        if (fan_in_fan_out) *fan_in_fan_out = cJSON_IsTrue(ff);
    }
    cJSON_Delete(j);
    return rc;
}

/* "h.3.attn.c_attn.weight" (optionally "transformer."-prefixed; GPT-2) or
 * "model.layers.3.self_attn.q_proj.weight" (the Llama family): the adapter
 * names of its lora_A and lora_B into a, b; returns 1 for a GPT-2 Conv1D
 * target, 2 for a Llama nn.Linear one, 0 if the name is not a target */
static int adapter_names(const char *name, char *a, char *b, size_t n) {
    if (strncmp(name, "transformer.", 12) == 0) name += 12;
    int l, end = 0, llama = 0;
    char rest[96];
    if (sscanf(name, "h.%d.%95s%n", &l, rest, &end) != 2) {
        if (sscanf(name, "model.layers.%d.%95s%n", &l, rest, &end) != 2) return 0;
        llama = 1;
    }
    size_t rl = strlen(rest);
    if (rl < 8 || strcmp(rest + rl - 7, ".weight") != 0) return 0;
    rest[rl - 7] = 0;
    /* a Mixtral expert's w1/w2/w3 (HF's per-expert names; PEFT's adapter
     * names are the module's) */
    int ex, w, ee = 0;
    if (llama && sscanf(rest, "block_sparse_moe.experts.%d.w%d%n", &ex, &w, &ee) == 2 && rest[ee] == 0 && ex >= 0 &&
        w >= 1 && w <= 3) {
        snprintf(a, n, "base_model.model.model.layers.%d.%s.lora_A.weight", l, rest);
        snprintf(b, n, "base_model.model.model.layers.%d.%s.lora_B.weight", l, rest);
        return 2;
    }
    for (int k = 0; k < MF_LORA_TARGETS; k++)
        if (strcmp(rest, mf_lora_target_path(k)) == 0 && (k >= MF_LORA_Q_PROJ) == llama) {
            const char *pre = llama ? "base_model.model.model.layers" : PEFT_PREFIX "h";
            snprintf(a, n, "%s.%d.%s.lora_A.weight", pre, l, rest);
            snprintf(b, n, "%s.%d.%s.lora_B.weight", pre, l, rest);
            return llama ? 2 : 1;
        }
    return 0;
}

int mf_lora_merge_file(const char *model_path, const char *adapter_dir, const char *out_path, int unmerge) {
    mf_lora_cfg cfg;
    int fifo = 0;
    if (mf_lora_read_config(adapter_dir, &cfg, &fifo)) return -1;
    /* GPT-2's Conv1D weights are (in, out): fan_in_fan_out; a Llama's nn.Linear (out, in): not */
    int want_fifo = !(cfg.targets & (MF_LORA_LLAMA_TARGETS | MF_LORA_MOE_TARGETS));
    if (fifo != want_fifo)
        return mf_fail("%s/adapter_config.json: fan_in_fan_out is %s, but its targets are %s modules (%s)", adapter_dir,
                       fifo ? "true" : "false", want_fifo ? "GPT-2" : "Llama-family",
                       want_fifo ? "Conv1D, (in, out)" : "nn.Linear, (out, in)");
    char apath[1100];
    snprintf(apath, sizeof apath, "%s/adapter_model.safetensors", adapter_dir);
    mf_st_file mf, af;
    if (mf_st_open(&mf, model_path)) return -1;
    if (mf_st_open(&af, apath)) { mf_st_close(&mf); return -1; }
    /* checksums and finite values of both inputs before anything is written */
    if (mf_st_verify_all(&mf) || mf_st_verify_all(&af)) { mf_st_close(&af); mf_st_close(&mf); return -1; }
    int rc = 0, used = 0;
    mf_st_entry *e = calloc((size_t)mf.n, sizeof *e);
    float **bufs = calloc((size_t)mf.n, sizeof *bufs);
    if (!e || !bufs) rc = mf_fail("out of memory merging %s", model_path);
    float s = (unmerge ? -1.0f : 1.0f) * mf_lora_scale(&cfg);
    for (int i = 0; !rc && i < mf.n; i++) {
        const mf_st_tensor *t = &mf.tensors[i];
        e[i] = (mf_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data, .nbytes = t->nbytes};
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        char an[160], bn[160];
        int kind = adapter_names(t->name, an, bn, sizeof an);
        if (!kind) continue;
        const mf_st_tensor *A = mf_st_find(&af, an), *B = mf_st_find(&af, bn);
        if (!A && !B) continue;  /* a layer or target without an adapter */
        if (!A || !B) { rc = mf_fail("%s: has only one of %s and %s", apath, an, bn); break; }
        if (t->dtype != MF_DTYPE_F32 || t->ndim != 2) { rc = mf_fail("%s: '%s' is not a 2-D F32 weight", model_path, t->name); break; }
        int64_t in = kind == 2 ? t->shape[1] : t->shape[0], out = kind == 2 ? t->shape[0] : t->shape[1];
        if (A->dtype != MF_DTYPE_F32 || B->dtype != MF_DTYPE_F32 || A->ndim != 2 || B->ndim != 2 || A->shape[0] != cfg.r ||
            A->shape[1] != in || B->shape[0] != out || B->shape[1] != cfg.r) {
            rc = mf_fail("%s: %s / lora_B do not fit '%s' [%lld, %lld] with r %d (lora_A must be [r, in], lora_B [out, r], F32)",
                         apath, an, t->name, (long long)in, (long long)out, cfg.r);
            break;
        }
        bufs[i] = malloc(t->nbytes);
        if (!bufs[i]) { rc = mf_fail("out of memory merging %s", t->name); break; }
        memcpy(bufs[i], t->data, t->nbytes);
        if (kind == 2) /* W (out,in) += s * B (out,r) @ A (r,in) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)out, (int)in, cfg.r, s, B->data, cfg.r, A->data,
                        (int)in, 1.0f, bufs[i], (int)in);
        else /* W (in,out) += s * A^T (in,r) @ B^T (r,out) = s * (B @ A)^T */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, (int)in, (int)out, cfg.r, s, A->data, (int)in, B->data,
                        cfg.r, 1.0f, bufs[i], (int)out);
        e[i].data = bufs[i];
        used += 2;
    }
    if (!rc && used != af.n)
        rc = mf_fail("%s: %d of its %d tensors match no weight of %s (another model's adapter?)", apath, af.n - used, af.n,
                     model_path);
    if (!rc && used == 0) rc = mf_fail("%s: no adapter tensors", apath);
    if (!rc) {
        const char **mk = calloc((size_t)mf.n_meta + 1, sizeof *mk), **mv = calloc((size_t)mf.n_meta + 1, sizeof *mv);
        if (!mk || !mv) rc = mf_fail("out of memory");
        for (int i = 0; !rc && i < mf.n_meta; i++) mk[i] = mf.meta_keys[i], mv[i] = mf.meta_vals[i];
        if (!rc) rc = mf_st_write(out_path, e, mf.n, mk, mv, mf.n_meta);
        free(mk);
        free(mv);
    }
    for (int i = 0; bufs && i < mf.n; i++) free(bufs[i]);
    free(bufs);
    free(e);
    mf_st_close(&af);
    mf_st_close(&mf);
    return rc;
}
