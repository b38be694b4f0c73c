/* Hugging Face model folders: config.json in and out, and the weight files
 * a folder holds (model.safetensors, or the shards model.safetensors.index.json
 * names). Keys as transformers writes them for LlamaForCausalLM,
 * Qwen2ForCausalLM and MistralForCausalLM; rope parameters under
 * `rope_scaling` (v4) or `rope_parameters` (v5). */
#include "memfit/model.h"

#include "io/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) { mf_fail("%s: %s", path, strerror(errno)); return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || (size_t)n > max) { fclose(f); mf_fail("%s: not a config file (%ld bytes)", path, n); return NULL; }
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    fclose(f);
    if (!s) { mf_fail("%s: read failed", path); return NULL; }
    s[n] = 0;
    return s;
}

/* A number key: 0 when present and valid, 1 when absent (*v untouched), -1
 * (message) when present but not a number in [lo, hi] */
static int num(const cJSON *o, const char *key, double lo, double hi, double *v, const char *path) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return 1;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi))
        return mf_fail("%s: '%s' must be a number in [%g, %g]", path, key, lo, hi);
    *v = x->valuedouble;
    return 0;
}

static int need_int(const cJSON *o, const char *key, int lo, int hi, int *v, const char *path) {
    double x = 0;
    int rc = num(o, key, lo, hi, &x, path);
    if (rc < 0) return -1;
    if (rc) return mf_fail("%s: key '%s' is missing", path, key);
    if (x != floor(x)) return mf_fail("%s: '%s' must be a whole number", path, key);
    *v = (int)x;
    return 0;
}

int mf_hf_read_config(const char *dir, mf_dims *d) {
    char path[MF_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = slurp(path, 1 << 22);
    if (!txt) return -1;
    cJSON *o = cJSON_Parse(txt);
    free(txt);
    if (!o || !cJSON_IsObject(o)) { cJSON_Delete(o); return mf_fail("%s: not a JSON object", path); }
    int rc = -1;
    memset(d, 0, sizeof *d);
    d->arch = MF_ARCH_LLAMA;
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    const cJSON *a0 = cJSON_IsArray(ar) ? cJSON_GetArrayItem(ar, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    const char *an = cJSON_IsString(a0) ? a0->valuestring : NULL, *mn = cJSON_IsString(mt) ? mt->valuestring : NULL;
    static const char *known[][2] = {{"LlamaForCausalLM", "llama"}, {"Qwen2ForCausalLM", "qwen2"},
                                     {"MistralForCausalLM", "mistral"}, {"MixtralForCausalLM", "mixtral"},
                                     {"Qwen2MoeForCausalLM", "qwen2_moe"}};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if ((an && strcmp(an, known[i][0]) == 0) || (!an && mn && strcmp(mn, known[i][1]) == 0)) k = i;
    if (k < 0) {
        mf_fail("%s: architecture '%s' is not supported (memfit loads LlamaForCausalLM, Qwen2ForCausalLM, "
                "MistralForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM folders; GPT-2 weights load as a .safetensors file)", path, an ? an : mn ? mn : "?");
        goto out;
    }
    snprintf(d->hf_arch, sizeof d->hf_arch, "%s", known[k][0]);
    if (need_int(o, "hidden_size", 1, 1 << 20, &d->C, path) || need_int(o, "intermediate_size", 1, 1 << 22, &d->ffn, path) ||
        need_int(o, "num_hidden_layers", 1, 4096, &d->L, path) ||
        need_int(o, "num_attention_heads", 1, 4096, &d->NH, path) || need_int(o, "vocab_size", 2, 1 << 24, &d->V, path))
        goto out;
    double x = 0;
    int r;
    d->NKV = d->NH;
    if ((r = num(o, "num_key_value_heads", 1, 4096, &x, path)) < 0) goto out;
    if (!r) d->NKV = (int)x;
    if (d->C % d->NH && !cJSON_GetObjectItemCaseSensitive(o, "head_dim")) {
        mf_fail("%s: num_attention_heads %d does not divide hidden_size %d and there is no head_dim", path, d->NH, d->C);
        goto out;
    }
    d->hd = d->C / d->NH;
    if ((r = num(o, "head_dim", 1, 1 << 16, &x, path)) < 0) goto out;
    if (!r) d->hd = (int)x;
    d->eps = 1e-6f;
    if ((r = num(o, "rms_norm_eps", 0, 1, &x, path)) < 0) goto out;
    if (!r) d->eps = (float)x;
    d->maxT = 2048;
    if ((r = num(o, "max_position_embeddings", 1, 1 << 24, &x, path)) < 0) goto out;
    if (!r) d->maxT = (int)x;
    /* tie_word_embeddings: LlamaConfig, Qwen2Config and MistralConfig all
     * default it to false (PretrainedConfig's true is overridden) */
    const cJSON *tw = cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings");
    d->tied = cJSON_IsTrue(tw);
    if (tw && !cJSON_IsBool(tw)) { mf_fail("%s: 'tie_word_embeddings' must be true or false", path); goto out; }
    /* q/k/v biases: Qwen2 always; Llama when attention_bias (which would
     * also put one on o_proj: refused below) */
    int qwen = k == 1 || k == 4;  /* Qwen2, Qwen2-MoE */
    d->qkv_bias = qwen;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(o, "attention_bias");
    if (!qwen && cJSON_IsTrue(ab)) {
        mf_fail("%s: attention_bias true (biases on q, k, v and o_proj) is not supported; Qwen2's q/k/v biases are", path);
        goto out;
    }
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(o, "sliding_window");
    const cJSON *usw = cJSON_GetObjectItemCaseSensitive(o, "use_sliding_window");
    /* Qwen2 configs carry a sliding_window that is off unless
     * use_sliding_window, and then only from layer max_window_layers up:
     * per-layer windows are not supported, so that case is refused */
    if (qwen && cJSON_IsTrue(usw)) {
        mf_fail("%s: use_sliding_window true (Qwen2's per-layer sliding window) is not supported", path);
        goto out;
    }
    if (sw && !cJSON_IsNull(sw) && !qwen) {
        if (!cJSON_IsNumber(sw) || sw->valuedouble < 0 || sw->valuedouble > (1 << 24)) {
            mf_fail("%s: 'sliding_window' must be a whole number >= 0 or null", path);
            goto out;
        }
        d->window = (int)sw->valuedouble;
    }
    /* rope: v4 top-level rope_theta + rope_scaling, v5 rope_parameters */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    d->rope_theta = 10000.0;
    if ((r = num(o, "rope_theta", 1e-6, 1e30, &x, path)) < 0) goto out;
    if (!r) d->rope_theta = x;
    const cJSON *sc = cJSON_IsObject(rp) ? rp : cJSON_IsObject(rs) ? rs : NULL;
    if (sc) {
        if ((r = num(sc, "rope_theta", 1e-6, 1e30, &x, path)) < 0) goto out;
        if (!r) d->rope_theta = x;
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
        const char *tn = cJSON_IsString(ty) ? ty->valuestring : "default";
        if (strcmp(tn, "llama3") == 0) {
            d->rope.type = MF_ROPE_LLAMA3;
            double f = 0, lo = 0, hi = 0, om = 0;
            if (num(sc, "factor", 1e-6, 1e6, &f, path) || num(sc, "low_freq_factor", 0, 1e6, &lo, path) ||
                num(sc, "high_freq_factor", 0, 1e6, &hi, path) ||
                num(sc, "original_max_position_embeddings", 1, 1 << 24, &om, path)) {
                mf_fail("%s: rope_scaling llama3 needs factor, low_freq_factor, high_freq_factor and "
                        "original_max_position_embeddings", path);
                goto out;
            }
            d->rope.factor = (float)f, d->rope.low_freq_factor = (float)lo, d->rope.high_freq_factor = (float)hi;
            d->rope.original_max_position_embeddings = (int)om;
        } else if (strcmp(tn, "default") != 0) {
            mf_fail("%s: rope type '%s' is not supported (default and llama3 are)", path, tn);
            goto out;
        }
    }
    if (k == 3) {
        /* Mixtral (MixtralConfig): experts, experts per token, the aux
         * loss's coefficient (default 0.001); its top-k weights are always
         * renormalised */
        if (need_int(o, "num_local_experts", 1, 1 << 16, &d->n_experts, path) ||
            need_int(o, "num_experts_per_tok", 1, 1 << 16, &d->top_k, path))
            goto out;
        d->norm_topk_prob = 1;
        d->aux_coef = 0.001f;
        if ((r = num(o, "router_aux_loss_coef", 0, 1e6, &x, path)) < 0) goto out;
        if (!r) d->aux_coef = (float)x;
        if ((r = num(o, "router_z_loss_coef", 0, 1e6, &x, path)) < 0) goto out;
        if (!r) d->z_coef = (float)x;
    }
    if (k == 4) {
        /* Qwen2-MoE (Qwen2MoeConfig): num_experts routed experts of
         * moe_intermediate_size, a shared expert of
         * shared_expert_intermediate_size; top-k weights renormalised only
         * with norm_topk_prob (default false); aux coef default 0.001. Every
         * layer must be sparse (intermediate_size is then unused). */
        if (need_int(o, "num_experts", 1, 1 << 16, &d->n_experts, path) ||
            need_int(o, "num_experts_per_tok", 1, 1 << 16, &d->top_k, path) ||
            need_int(o, "moe_intermediate_size", 1, 1 << 22, &d->ffn, path) ||
            need_int(o, "shared_expert_intermediate_size", 1, 1 << 22, &d->shared_ffn, path))
            goto out;
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(o, "norm_topk_prob");
        if (nt && !cJSON_IsBool(nt)) { mf_fail("%s: 'norm_topk_prob' must be true or false", path); goto out; }
        d->norm_topk_prob = cJSON_IsTrue(nt);
        double step = 1;
        if ((r = num(o, "decoder_sparse_step", 0, 1 << 16, &step, path)) < 0) goto out;
        const cJSON *mo = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
        if (step != 1 || (mo && !cJSON_IsNull(mo) && (!cJSON_IsArray(mo) || cJSON_GetArraySize(mo) > 0))) {
            mf_fail("%s: decoder_sparse_step %g / mlp_only_layers: only models whose every layer is sparse load (dense "
                    "MLP layers between the mixtures are not supported)", path, step);
            goto out;
        }
        d->aux_coef = 0.001f;
        if ((r = num(o, "router_aux_loss_coef", 0, 1e6, &x, path)) < 0) goto out;
        if (!r) d->aux_coef = (float)x;
        if ((r = num(o, "router_z_loss_coef", 0, 1e6, &x, path)) < 0) goto out;
        if (!r) d->z_coef = (float)x;
    }
    snprintf(d->tokenizer, sizeof d->tokenizer, "gpt2");
    if (mf_model_dims_check(d)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mf_error());
        mf_fail("%s: %s", path, msg);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

int mf_hf_write_config(const char *path, const mf_dims *d) {
    if (d->arch != MF_ARCH_LLAMA) return mf_fail("config.json is written for Llama-family models only");
    cJSON *o = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(o, "architectures");
    int qm = d->n_experts > 0 && d->shared_ffn > 0;  /* Qwen2-MoE */
    cJSON_AddItemToArray(ar, cJSON_CreateString(qm ? "Qwen2MoeForCausalLM" : d->n_experts > 0 ? "MixtralForCausalLM"
                                                 : d->hf_arch[0] ? d->hf_arch : "LlamaForCausalLM"));
    const char *mt = qm                                              ? "qwen2_moe"
                     : d->n_experts > 0                              ? "mixtral"
                     : strcmp(d->hf_arch, "Qwen2ForCausalLM") == 0   ? "qwen2"
                     : strcmp(d->hf_arch, "MistralForCausalLM") == 0 ? "mistral"
                                                                      : "llama";
    if (d->n_experts > 0 && !qm && !d->norm_topk_prob)
        return mf_fail("config.json: MixtralForCausalLM always renormalises its top-k weights (norm_topk_prob 0 has no "
                       "Mixtral config key)");
    cJSON_AddStringToObject(o, "model_type", mt);
    cJSON_AddNumberToObject(o, "hidden_size", d->C);
    /* Qwen2-MoE: intermediate_size is a dense layer's width, unused when
     * every layer is sparse; written as the shared expert's */
    cJSON_AddNumberToObject(o, "intermediate_size", qm ? d->shared_ffn : d->ffn);
    cJSON_AddNumberToObject(o, "num_hidden_layers", d->L);
    cJSON_AddNumberToObject(o, "num_attention_heads", d->NH);
    cJSON_AddNumberToObject(o, "num_key_value_heads", d->NKV);
    cJSON_AddNumberToObject(o, "head_dim", d->hd);
    cJSON_AddNumberToObject(o, "vocab_size", d->V);
    cJSON_AddNumberToObject(o, "max_position_embeddings", d->maxT);
    cJSON_AddNumberToObject(o, "rms_norm_eps", d->eps);
    cJSON_AddNumberToObject(o, "rope_theta", d->rope_theta);
    if (d->rope.type == MF_ROPE_LLAMA3) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", "llama3");
        cJSON_AddNumberToObject(r, "factor", d->rope.factor);
        cJSON_AddNumberToObject(r, "low_freq_factor", d->rope.low_freq_factor);
        cJSON_AddNumberToObject(r, "high_freq_factor", d->rope.high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", d->rope.original_max_position_embeddings);
    } else cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", d->tied);
    if (strcmp(mt, "llama") == 0) cJSON_AddBoolToObject(o, "attention_bias", 0);
    if (strcmp(mt, "qwen2") == 0 || qm) cJSON_AddBoolToObject(o, "use_sliding_window", 0);
    if (d->window) cJSON_AddNumberToObject(o, "sliding_window", d->window);
    else if (strcmp(mt, "mistral") == 0 || strcmp(mt, "mixtral") == 0) cJSON_AddNullToObject(o, "sliding_window");
    if (qm) {
        cJSON_AddNumberToObject(o, "num_experts", d->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", d->top_k);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", d->ffn);
        cJSON_AddNumberToObject(o, "shared_expert_intermediate_size", d->shared_ffn);
        cJSON_AddBoolToObject(o, "norm_topk_prob", d->norm_topk_prob);
        cJSON_AddNumberToObject(o, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(o, "mlp_only_layers", cJSON_CreateArray());
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", d->aux_coef);
        if (d->z_coef > 0) cJSON_AddNumberToObject(o, "router_z_loss_coef", d->z_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", d->aux_coef > 0);
    } else if (d->n_experts > 0) {
        cJSON_AddNumberToObject(o, "num_local_experts", d->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", d->top_k);
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", d->aux_coef);
        if (d->z_coef > 0) cJSON_AddNumberToObject(o, "router_z_loss_coef", d->z_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", d->aux_coef > 0);
    }
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
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

int mf_hf_weight_files(const char *dir, char ***files, int *n) {
    *files = NULL;
    *n = 0;
    char path[MF_PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!(f = fopen(path, "rb")))
            return mf_fail("%s: no model.safetensors or model.safetensors.index.json in the folder", dir);
        fclose(f);
        *files = malloc(sizeof **files);
        if (!*files || !((*files)[0] = strdup(path))) { free(*files); *files = NULL; return mf_fail("out of memory"); }
        *n = 1;
        return 0;
    }
    fclose(f);
    char *txt = slurp(path, 1 << 26);
    if (!txt) return -1;
    cJSON *o = cJSON_Parse(txt);
    free(txt);
    const cJSON *wm = o ? cJSON_GetObjectItemCaseSensitive(o, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) { cJSON_Delete(o); return mf_fail("%s: no \"weight_map\" object", path); }
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
            rc = mf_fail("%s: weight_map entry '%s' is not a file name in the folder", path, e->string);
            break;
        }
        int dup = 0;
        for (int i = 0; i < *n && !dup; i++) {
            const char *base = strrchr((*files)[i], '/') + 1;
            dup = strcmp(base, e->valuestring) == 0;
        }
        if (dup) continue;
        char **nf = realloc(*files, (size_t)(*n + 1) * sizeof *nf);
        if (!nf) { rc = mf_fail("out of memory"); break; }
        *files = nf;
        char fp[MF_PATH_MAX + 300];
        snprintf(fp, sizeof fp, "%s/%s", dir, e->valuestring);
        FILE *t = fopen(fp, "rb");
        if (!t) { rc = mf_fail("%s: shard '%s' named for '%s' is missing", path, e->valuestring, e->string); break; }
        fclose(t);
        if (!((*files)[*n] = strdup(fp))) { rc = mf_fail("out of memory"); break; }
        (*n)++;
    }
    cJSON_Delete(o);
    if (!rc && *n == 0) rc = mf_fail("%s: the weight_map is empty", path);
    if (rc) { mf_hf_free_files(*files, *n); *files = NULL; *n = 0; }
    return rc;
}

void mf_hf_free_files(char **files, int n) {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}
