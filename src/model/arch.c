/* Model families as data: the preset table, the shape a run gets from its
 * config (preset, Hugging Face config.json, overrides), and the counts that
 * follow from a shape (parameters as HF counts them, GEMM weights per block,
 * attention FLOPs). One place for each formula: the planner's time model,
 * the profile and the report read them from here. */
#include "internal.h"
#include "memfit/data.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define GPT2(L_, C_, H_, T_, V_) \
    {.arch = MF_ARCH_GPT2, .L = L_, .C = C_, .NH = H_, .maxT = T_, .V = V_, .NKV = H_, .hd = C_ / H_, .ffn = 4 * C_, \
     .tied = 1, .eps = 1e-5f, .hf_arch = "GPT2LMHeadModel"}
/* Llama-family shapes from the models' config.json files (HF hub) */
#define LLAMA(arch_, L_, C_, H_, KV_, hd_, I_, V_, T_, tied_, bias_, win_, eps_, theta_) \
    {.arch = MF_ARCH_LLAMA, .L = L_, .C = C_, .NH = H_, .NKV = KV_, .hd = hd_, .ffn = I_, .V = V_, .maxT = T_, \
     .tied = tied_, .qkv_bias = bias_, .window = win_, .eps = eps_, .rope_theta = theta_, .hf_arch = arch_}
/* Mixtral: untied, rope_theta 1e6, renormalised top-k, aux coef 0.02 (HF's
 * MixtralConfig defaults) */
#define MOE(L_, C_, H_, KV_, hd_, I_, V_, T_, E_, k_) \
    {.arch = MF_ARCH_LLAMA, .L = L_, .C = C_, .NH = H_, .NKV = KV_, .hd = hd_, .ffn = I_, .V = V_, .maxT = T_, \
     .tied = 0, .eps = 1e-5f, .rope_theta = 1e6, .hf_arch = "MixtralForCausalLM", .n_experts = E_, .top_k = k_, \
     .norm_topk_prob = 1, .aux_coef = 0.02f}
/* Qwen2-MoE (Qwen2MoeConfig): q/k/v biases, untied, eps 1e-6, theta 1e6,
 * top-k weights not renormalised (norm_topk_prob false), aux coef 0.001,
 * routed experts of width I_ (moe_intermediate_size) and a shared expert of
 * width S_ (shared_expert_intermediate_size) */
#define QMOE(L_, C_, H_, KV_, hd_, I_, S_, V_, T_, E_, k_) \
    {.arch = MF_ARCH_LLAMA, .L = L_, .C = C_, .NH = H_, .NKV = KV_, .hd = hd_, .ffn = I_, .V = V_, .maxT = T_, \
     .tied = 0, .qkv_bias = 1, .eps = 1e-6f, .rope_theta = 1e6, .hf_arch = "Qwen2MoeForCausalLM", .n_experts = E_, \
     .top_k = k_, .norm_topk_prob = 0, .aux_coef = 0.001f, .shared_ffn = S_}
#define LLAMA3_SCALING(f) {.type = MF_ROPE_LLAMA3, .factor = f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, \
                           .original_max_position_embeddings = 8192}

static mf_preset presets[] = {
    {"gpt2-1m", GPT2(5, 128, 4, 128, 256), "bytes", "1.0M params, byte-level vocabulary; quick tests and demos"},
    {"gpt2-10m", GPT2(6, 160, 5, 256, 50257), "gpt2", "9.9M params, GPT-2 BPE; the default"},
    {"gpt2-124m", GPT2(12, 768, 12, 1024, 50257), "gpt2", "GPT-2 small (124,439,808 params)"},
    {"gpt2-350m", GPT2(24, 1024, 16, 1024, 50257), "gpt2", "GPT-2 medium (354,823,168 params)"},
    {"llama-tiny", LLAMA("LlamaForCausalLM", 2, 64, 8, 2, 8, 160, 256, 256, 0, 0, 0, 1e-5f, 10000.0), "bytes",
     "Llama block, 8 query / 2 KV heads, untied head, byte vocabulary; tests"},
    {"smollm2-135m", LLAMA("LlamaForCausalLM", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1, 0, 0, 1e-5f, 100000.0), "bytes",
     "SmolLM2-135M (134,515,008 params), tied"},
    {"qwen2.5-0.5b", LLAMA("Qwen2ForCausalLM", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1, 1, 0, 1e-6f, 1000000.0),
     "gpt2", "Qwen2.5-0.5B (494,032,768 params), q/k/v biases, tied"},
    {"llama-3.2-1b", LLAMA("LlamaForCausalLM", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 1, 0, 0, 1e-5f, 500000.0),
     "gpt2", "Llama 3.2 1B (1,235,814,400 params), llama3 rope scaling, tied"},
    {"tinyllama-1.1b", LLAMA("LlamaForCausalLM", 22, 2048, 32, 4, 64, 5632, 32000, 2048, 0, 0, 0, 1e-5f, 10000.0),
     "bytes", "TinyLlama 1.1B (1,100,048,384 params), untied"},
    {"moe-tiny", MOE(2, 64, 8, 2, 8, 64, 256, 256, 4, 2), "bytes",
     "Mixtral block (152,384 params, 103,232 active), 4 experts top-2, byte vocabulary; tests"},
    {"qwen2-moe-tiny", QMOE(2, 64, 8, 2, 8, 32, 64, 256, 256, 4, 2), "bytes",
     "Qwen2-MoE block (128,128 params, 103,552 active), 4 experts top-2 plus a shared expert, q/k/v biases, byte vocabulary; tests"},
    {"moe-small", MOE(8, 512, 8, 2, 64, 1024, 256, 1024, 8, 2), "bytes",
     "Mixtral block, 8 experts top-2 (106,209,792 params, 30,712,320 active), byte vocabulary; CPU-trainable"},
    {"mixtral-8x7b", MOE(32, 4096, 32, 8, 128, 14336, 32000, 32768, 8, 2), "bytes",
     "Mixtral 8x7B v0.1 (46,702,792,704 params, 12,879,925,248 active per token); estimate and planning"},
    {"mistral-7b", LLAMA("MistralForCausalLM", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 0, 0, 4096, 1e-5f, 10000.0),
     "bytes", "Mistral 7B v0.1 (7,241,732,096 params), sliding window 4096; estimate and planning"},
};

const mf_preset *mf_model_presets(int *n) {
    static int scaled;
    if (!scaled) {  /* designated initialisers cannot nest a struct in the macro above */
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
            if (strcmp(presets[i].name, "llama-3.2-1b") == 0) presets[i].d.rope = (mf_rope_scaling)LLAMA3_SCALING(32.0f);
        scaled = 1;
    }
    *n = (int)(sizeof presets / sizeof presets[0]);
    return presets;
}

static int is_dir(const char *p) {
    struct stat st;
    return p[0] && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int mf_model_dims_check(mf_dims *d) {
    if (d->L < 1 || d->C < 1 || d->NH < 1 || d->maxT < 1 || d->V < 2)
        return mf_fail("model dimensions must be positive (n_layer %d, n_embd %d, n_head %d, block_size %d, vocab %d)",
                       d->L, d->C, d->NH, d->maxT, d->V);
    if (d->share < 0 || d->share > d->L || (d->share && d->L % d->share))
        return mf_fail("share_layers %d must divide n_layer %d (each of the N weight sets is used n_layer/N times)",
                       d->share, d->L);
    if (d->share == d->L) d->share = 0;  /* L sets for L blocks: no sharing */
    if (d->arch == MF_ARCH_GPT2) {
        if (d->C % d->NH) return mf_fail("n_head %d does not divide n_embd %d", d->NH, d->C);
        d->NKV = d->NH, d->hd = d->C / d->NH, d->ffn = 4 * d->C, d->tied = 1, d->qkv_bias = 0, d->window = 0;
    } else {
        if (d->NKV < 1 || d->hd < 1 || d->ffn < 1)
            return mf_fail("model dimensions must be positive (num_key_value_heads %d, head_dim %d, intermediate_size %d)",
                           d->NKV, d->hd, d->ffn);
        if (d->NH % d->NKV)
            return mf_fail("num_key_value_heads %d does not divide num_attention_heads %d (grouped-query attention)",
                           d->NKV, d->NH);
        if (d->hd % 2) return mf_fail("head_dim %d is odd: rotary embeddings rotate pairs of dimensions", d->hd);
        if (d->window < 0) return mf_fail("sliding_window %d is negative", d->window);
        if (d->n_experts < 0 || (d->n_experts > 0 && (d->top_k < 1 || d->top_k > d->n_experts)))
            return mf_fail("num_experts_per_tok %d must be between 1 and num_local_experts %d", d->top_k, d->n_experts);
        if (d->shared_ffn < 0 || (d->shared_ffn > 0 && d->n_experts <= 0))
            return mf_fail("shared_expert_intermediate_size %d needs a mixture of experts and must be >= 0",
                           d->shared_ffn);
        if (!(d->aux_coef >= 0) || !(d->z_coef >= 0))
            return mf_fail("router_aux_loss_coef and router_z_loss_coef must be >= 0");
        if (!(d->eps > 0) || !(d->rope_theta > 0)) return mf_fail("rms_norm_eps and rope_theta must be positive");
        if (d->rope.type == MF_ROPE_LLAMA3 &&
            (!(d->rope.factor > 0) || !(d->rope.high_freq_factor > d->rope.low_freq_factor) ||
             d->rope.original_max_position_embeddings < 1))
            return mf_fail("rope_scaling llama3 needs factor > 0, high_freq_factor > low_freq_factor and "
                           "original_max_position_embeddings >= 1");
    }
    d->Vp = (d->V + 63) / 64 * 64;
    return 0;
}

int mf_model_dims(const mf_config *cfg, mf_dims *d) {
    int np;
    const mf_preset *ps = mf_model_presets(&np), *p = NULL;
    memset(d, 0, sizeof *d);
    const char *tokdef = NULL;
    char hftok[MF_PATH_MAX + 16];
    if (is_dir(cfg->init)) {
        /* a Hugging Face folder: its config.json is the shape, its
         * tokenizer.json (when it has one) the tokenizer */
        if (mf_hf_read_config(cfg->init, d)) return -1;
        struct stat st;
        snprintf(hftok, sizeof hftok, "%s/tokenizer.json", cfg->init);
        if (stat(hftok, &st) == 0 && S_ISREG(st.st_mode)) tokdef = hftok;
        else tokdef = d->V >= 50257 ? "gpt2" : "bytes";
    } else {
        for (int i = 0; i < np; i++) if (strcmp(ps[i].name, cfg->model) == 0) p = &ps[i];
        if (!p) {
            char list[512] = "";
            for (int i = 0; i < np; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, ps[i].name, sizeof list - strlen(list) - 1);
            }
            return mf_fail("unknown model preset '%s' (presets: %s)", cfg->model, list);
        }
        *d = p->d;
        tokdef = p->tokenizer;
    }
    if (cfg->n_layer) d->L = cfg->n_layer;
    if (cfg->n_embd) d->C = cfg->n_embd;
    if (cfg->n_head) d->NH = cfg->n_head;
    if (cfg->n_kv_head) d->NKV = cfg->n_kv_head;
    if (cfg->intermediate_size) d->ffn = cfg->intermediate_size;
    /* a narrower or wider Llama takes C / heads as its head dimension */
    if (d->arch == MF_ARCH_LLAMA && (cfg->n_embd || cfg->n_head)) {
        if (d->C % d->NH) return mf_fail("n_head %d does not divide n_embd %d", d->NH, d->C);
        d->hd = d->C / d->NH;
    }
    if (cfg->num_local_experts || cfg->num_experts_per_tok) {
        if (d->arch != MF_ARCH_LLAMA) return mf_fail("num_local_experts: a mixture of experts needs a Llama-family model");
        if (cfg->num_local_experts) d->n_experts = cfg->num_local_experts;
        if (cfg->num_experts_per_tok) d->top_k = cfg->num_experts_per_tok;
        if (d->n_experts && !d->norm_topk_prob && !cfg->num_local_experts) d->norm_topk_prob = 1;
        if (!d->n_experts) return mf_fail("num_experts_per_tok %d needs num_local_experts", d->top_k);
        if (!d->top_k) d->top_k = d->n_experts < 2 ? d->n_experts : 2;
        if (cfg->num_local_experts && !strstr(d->hf_arch, "Mixtral") && !d->shared_ffn) {
            snprintf(d->hf_arch, sizeof d->hf_arch, "MixtralForCausalLM");
            d->norm_topk_prob = 1;
        }
    }
    if (mf_config_was_set(cfg, "router_aux_loss_coef")) d->aux_coef = (float)cfg->router_aux_loss_coef;
    if (mf_config_was_set(cfg, "router_z_loss_coef")) d->z_coef = (float)cfg->router_z_loss_coef;
    if (mf_config_was_set(cfg, "capacity_factor")) {
        if (!(cfg->capacity_factor > 0))
            return mf_fail("capacity_factor %g must be > 0 (leave it unset for dropless routing)", cfg->capacity_factor);
        if (d->n_experts <= 0) return mf_fail("capacity_factor needs a mixture-of-experts model (num_local_experts)");
        d->capacity_factor = cfg->capacity_factor;
    }
    d->ep = 1;
    if (cfg->expert_parallel > 1) {
        if (d->n_experts <= 0) return mf_fail("expert_parallel %d needs a mixture-of-experts model (num_local_experts)", cfg->expert_parallel);
        if (d->n_experts % cfg->expert_parallel)
            return mf_fail("expert_parallel %d does not divide the %d experts (each rank of a group holds E / N whole "
                           "experts)", cfg->expert_parallel, d->n_experts);
        d->ep = cfg->expert_parallel;
    }
    if (cfg->block_size) d->maxT = cfg->block_size;
    if (cfg->share_layers) d->share = cfg->share_layers;
    if (snprintf(d->tokenizer, sizeof d->tokenizer, "%s", cfg->tokenizer[0] ? cfg->tokenizer : tokdef) >=
        (int)sizeof d->tokenizer)
        return mf_fail("tokenizer path %s/tokenizer.json is too long", cfg->init);
    /* architecture and tokenizer are independent: any model takes any
     * tokenizer whose ids fit its embedding */
    int tokv;
    if (mf_tokenizer_spec_info(d->tokenizer, &tokv, NULL)) return -1;
    /* GPT-2: a tokenizer change without an explicit vocabulary takes the
     * tokenizer's; a Llama's vocabulary is its embedding's, whatever
     * tokenizer feeds it (it may have more rows than the tokenizer has
     * ids, as Qwen2.5's does) */
    if (cfg->vocab_size) d->V = cfg->vocab_size;
    else if (d->arch == MF_ARCH_GPT2 && cfg->tokenizer[0]) d->V = tokv;
    if (mf_model_dims_check(d)) return -1;
    if (d->V < tokv)
        return mf_fail("the model's vocabulary (%d rows%s) is smaller than the tokenizer's %d ids (%s): give "
                       "--vocab_size %d or more, or another tokenizer", d->V,
                       cfg->vocab_size ? ", vocab_size" : is_dir(cfg->init) ? ", config.json" : ", the preset's",
                       tokv, d->tokenizer, tokv);
    return 0;
}

/* A block's MLP weights: dense SwiGLU 3CF; a mixture of experts E (all)
 * or k (per token) experts of 3CF plus the router's E x C, plus a shared
 * expert's 3CS and its gate's C (Qwen2-MoE; every token runs it) */
static int64_t mlp_params(const mf_dims *d, int active) {
    int64_t C = d->C, F = d->ffn, S = d->shared_ffn;
    if (d->n_experts <= 0) return 3 * C * F;
    return (int64_t)(active ? d->top_k : d->n_experts) * 3 * C * F + (int64_t)d->n_experts * C +
           (S > 0 ? 3 * C * S + C : 0);
}

/* the block's matmul weights a token multiplies through (a mixture of
 * experts: its k experts and the router) */
int64_t mf_model_block_matmul_params(const mf_dims *d) {
    int64_t C = d->C, q = (int64_t)d->NH * d->hd, kv = (int64_t)d->NKV * d->hd;
    if (d->arch == MF_ARCH_GPT2) return 12 * C * C;
    return C * (q + 2 * kv) + q * C + mlp_params(d, 1);
}

double mf_model_attention_flops(const mf_dims *d, int B, int T) {
    /* causal: about T^2/2 scores per head; a window w < T keeps w per row
     * after the first w rows */
    double keys = d->window > 0 && d->window < T ? (double)d->window * T - (double)d->window * (d->window - 1) / 2
                                                 : (double)T * T / 2;
    return 2.0 * 2.0 * B * d->NH * keys * d->hd;
}

int64_t mf_model_n_params(const mf_dims *d) {
    int64_t C = d->C, sets = mf_model_weight_sets(d);
    if (d->arch == MF_ARCH_GPT2)
        return (int64_t)d->V * C + (int64_t)d->maxT * C + sets * (12 * C * C + 13 * C) + 2 * C;
    int64_t blk = mf_model_block_matmul_params(d) - mlp_params(d, 1) + mlp_params(d, 0) + 2 * C +
                  (d->qkv_bias ? (int64_t)(d->NH + 2 * d->NKV) * d->hd : 0);
    return (int64_t)d->V * C * (d->tied ? 1 : 2) + sets * blk + C;
}

int64_t mf_model_n_active(const mf_dims *d) {
    if (d->arch == MF_ARCH_GPT2 || d->n_experts <= 0) return mf_model_n_params(d);
    return mf_model_n_params(d) - (int64_t)mf_model_weight_sets(d) * (mlp_params(d, 0) - mlp_params(d, 1));
}

static int dims_str_base(const mf_dims *d, char *buf, size_t n) {
    /* GPT-2 keeps the form its checkpoints have always had */
    if (d->arch == MF_ARCH_GPT2) return snprintf(buf, n, "%d,%d,%d,%d,%d", d->L, d->C, d->NH, d->maxT, d->V);
    /* a mixture of experts appends ",moe:E,k,norm,aux,z" (dense shapes keep their old string) */
    char moe[128] = "";
    if (d->n_experts > 0) {
        int k = snprintf(moe, sizeof moe, ",moe:%d,%d,%d,%.9g,%.9g", d->n_experts, d->top_k, d->norm_topk_prob,
                         (double)d->aux_coef, (double)d->z_coef);
        /* a shared expert (Qwen2-MoE) appends ",shared:S" */
        if (d->shared_ffn > 0 && k > 0 && (size_t)k < sizeof moe)
            snprintf(moe + k, sizeof moe - (size_t)k, ",shared:%d", d->shared_ffn);
    }
    return snprintf(buf, n, "llama:%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.9g,%.17g,%d,%.9g,%.9g,%.9g,%d,%s%s", d->L, d->C,
                    d->NH, d->NKV, d->hd, d->ffn, d->maxT, d->V, d->tied, d->qkv_bias, d->window, (double)d->eps,
                    d->rope_theta, (int)d->rope.type, (double)d->rope.factor, (double)d->rope.low_freq_factor,
                    (double)d->rope.high_freq_factor, d->rope.original_max_position_embeddings,
                    d->hf_arch[0] ? d->hf_arch : "LlamaForCausalLM", moe);
}

/* A shared model's shape ends in ";share=N" (N weight sets for the L
 * blocks), so a file that holds N sets of block tensors says so, and an
 * unshared model's string is what it always was. */
int mf_model_dims_str(const mf_dims *d, char *buf, size_t n) {
    int k = dims_str_base(d, buf, n);
    if (!d->share || k < 0 || (size_t)k >= n) return k;
    return k + snprintf(buf + k, n - (size_t)k, ";share=%d", d->share);
}

int mf_model_dims_parse(const char *s0, mf_dims *d) {
    memset(d, 0, sizeof *d);
    if (!s0) return mf_fail("no dims");
    char s[512];
    int share = 0;
    if (snprintf(s, sizeof s, "%s", s0) >= (int)sizeof s) return mf_fail("dims '%.64s...' are too long", s0);
    char *sc = strchr(s, ';');
    if (sc) {
        int used = 0;
        if (sscanf(sc, ";share=%d%n", &share, &used) != 1 || sc[used] || share < 1)
            return mf_fail("dims '%s': '%s' is not ';share=N'", s0, sc);
        *sc = 0;
    }
    if (strncmp(s, "llama:", 6) == 0) {
        int rt = 0, used = 0;
        double eps = 0, f = 0, lo = 0, hi = 0;
        d->arch = MF_ARCH_LLAMA;
        if (sscanf(s + 6, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%lf,%lf,%d,%lf,%lf,%lf,%d,%31[A-Za-z0-9]%n", &d->L, &d->C,
                   &d->NH, &d->NKV, &d->hd, &d->ffn, &d->maxT, &d->V, &d->tied, &d->qkv_bias, &d->window, &eps,
                   &d->rope_theta, &rt, &f, &lo, &hi, &d->rope.original_max_position_embeddings, d->hf_arch,
                   &used) != 19 || (rt != MF_ROPE_NONE && rt != MF_ROPE_LLAMA3))
            return mf_fail("dims '%s' are not a Llama-family shape", s);
        const char *rest = s + 6 + used;
        if (strncmp(rest, ",moe:", 5) == 0) {
            double aux = 0, z = 0;
            int u2 = 0;
            if (sscanf(rest + 5, "%d,%d,%d,%lf,%lf%n", &d->n_experts, &d->top_k, &d->norm_topk_prob, &aux, &z, &u2) !=
                    5 || d->n_experts < 1)
                return mf_fail("dims '%s' are not a Llama-family shape", s);
            d->aux_coef = (float)aux, d->z_coef = (float)z;
            rest += 5 + u2;
            int u3 = 0;
            if (strncmp(rest, ",shared:", 8) == 0 &&
                (sscanf(rest + 8, "%d%n", &d->shared_ffn, &u3) != 1 || d->shared_ffn < 1))
                return mf_fail("dims '%s' are not a Llama-family shape", s);
            if (u3) rest += 8 + u3;
        }
        if (*rest)
            return mf_fail("dims '%s' are not a Llama-family shape", s);
        d->eps = (float)eps, d->rope.type = (mf_rope_type)rt, d->rope.factor = (float)f;
        d->rope.low_freq_factor = (float)lo, d->rope.high_freq_factor = (float)hi;
    } else if (sscanf(s, "%d,%d,%d,%d,%d", &d->L, &d->C, &d->NH, &d->maxT, &d->V) != 5)
        return mf_fail("dims '%s' are not a model shape", s);
    else d->arch = MF_ARCH_GPT2, d->eps = 1e-5f;
    d->share = share;
    return mf_model_dims_check(d);
}

void mf_model_lora_dims(const mf_dims *d, int k, int *in, int *out) {
    int AO = d->NH * d->hd, KV = d->NKV * d->hd;
    switch (k) {
    case MF_LORA_Q_PROJ: *in = d->C, *out = AO; break;
    case MF_LORA_K_PROJ:
    case MF_LORA_V_PROJ: *in = d->C, *out = KV; break;
    case MF_LORA_O_PROJ: *in = AO, *out = d->C; break;
    /* a mixture of experts' dense MLP is Qwen2-MoE's shared expert */
    case MF_LORA_GATE_PROJ:
    case MF_LORA_UP_PROJ: *in = d->C, *out = d->n_experts > 0 ? d->shared_ffn : d->ffn; break;
    case MF_LORA_DOWN_PROJ: *in = d->n_experts > 0 ? d->shared_ffn : d->ffn, *out = d->C; break;
    /* one expert's (the adapter tensors stack E of them) */
    case MF_LORA_W1:
    case MF_LORA_W3: *in = d->C, *out = d->ffn; break;
    case MF_LORA_W2: *in = d->ffn, *out = d->C; break;
    default: mf_lora_target_dims(k, d->C, in, out);
    }
}

/* The two families as compositions of the block library's pieces
 * (blocks.c). GPT-2: LayerNorm, learned positions, MHA (one c_attn),
 * GELU, Conv1D weights, its fused fp32 epilogues; the Llama family:
 * RMSNorm, RoPE, GQA with optional q/k/v biases and sliding window (from
 * the dims), SwiGLU, nn.Linear weights. */
/* lora[]: in MF_LT_* order (LN1, Q, QB, K, KB, V, VB, O, LN2, GATE, UP, DOWN,
 * LN1B, OB, LN2B, GATEB, DOWNB) */
static const mf_block_desc gpt2_block = {
    .norm = MF_NORM_LAYERNORM, .learned_pos = 1, .rope = 0, .mlp = MF_MLP_GELU, .w_in_out = 1, .proj_bias = 1,
    .fused_fp32 = 1, .bf16_frozen_embed = 0,
    .lora = {-1, MF_LORA_ATTN_C_ATTN, -1, -1, -1, -1, -1, MF_LORA_ATTN_C_PROJ, -1, MF_LORA_MLP_C_FC, -1,
             MF_LORA_MLP_C_PROJ, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}};
static const mf_block_desc llama_block = {
    .norm = MF_NORM_RMSNORM, .learned_pos = 0, .rope = 1, .mlp = MF_MLP_SWIGLU, .w_in_out = 0, .proj_bias = 0,
    .fused_fp32 = 0, .bf16_frozen_embed = 1,
    .lora = {-1, MF_LORA_Q_PROJ, -1, MF_LORA_K_PROJ, -1, MF_LORA_V_PROJ, -1, MF_LORA_O_PROJ, -1, MF_LORA_GATE_PROJ,
             MF_LORA_UP_PROJ, MF_LORA_DOWN_PROJ, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}};
/* Mixtral: the Llama block with a routed mixture of SwiGLU experts as its
 * MLP (moe_block.c); adapters on the attention projections here, on the
 * experts (w1, w2, w3) through the experts' hooks (moe_lora.c) */
static const mf_block_desc moe_block = {
    .norm = MF_NORM_RMSNORM, .learned_pos = 0, .rope = 1, .mlp = MF_MLP_MOE, .w_in_out = 0, .proj_bias = 0,
    .fused_fp32 = 0, .bf16_frozen_embed = 1,
    .lora = {-1, MF_LORA_Q_PROJ, -1, MF_LORA_K_PROJ, -1, MF_LORA_V_PROJ, -1, MF_LORA_O_PROJ, -1, -1, -1, -1, -1, -1,
             -1, -1, -1, -1, -1, -1, -1, -1}};
/* Qwen2-MoE: Mixtral's block plus a shared expert, a SwiGLU on the block's
 * gate/up/down slots (width shared_ffn; mlp.shared_expert.*, so the dense
 * projection path, its LoRA hooks and quantised base apply) gated by
 * sigmoid(shared_expert_gate . x) (moe_shared.c) */
static const mf_block_desc qmoe_block = {
    .norm = MF_NORM_RMSNORM, .learned_pos = 0, .rope = 1, .mlp = MF_MLP_MOE, .w_in_out = 0, .proj_bias = 0,
    .fused_fp32 = 0, .bf16_frozen_embed = 1,
    .lora = {-1, MF_LORA_Q_PROJ, -1, MF_LORA_K_PROJ, -1, MF_LORA_V_PROJ, -1, MF_LORA_O_PROJ, -1, MF_LORA_GATE_PROJ,
             MF_LORA_UP_PROJ, MF_LORA_DOWN_PROJ, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}};
_Static_assert(MF_LT_COUNT == 22, "the lora[] tables above list every MF_LT_* slot");

const mf_block_desc *mf_model_block_desc(const mf_dims *d) {
    if (d->arch == MF_ARCH_LLAMA && d->n_experts > 0) return d->shared_ffn > 0 ? &qmoe_block : &moe_block;
    return d->arch == MF_ARCH_LLAMA ? &llama_block : &gpt2_block;
}
