/* The one table of config keys: name, type, where it lives, default, limits
 * and help. Defaults, parsing, --help and YAML output all read it. */
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/model.h"
#include "memfit/monitor.h"
#include "memfit/lora.h"
#include "memfit/distill.h"
#include "quant/quant.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

typedef enum { T_INT, T_FLOAT, T_STR, T_SIZE, T_U64, T_BOOL } ktype;

typedef struct {
    const char *key;
    ktype type;
    size_t off;
    size_t len;          /* for strings: capacity */
    const char *def;
    double lo, hi;       /* accepted range for numbers */
    const char *help;
} key_row;

#define F(field) offsetof(mf_config, field)
#define S(field) offsetof(mf_config, field), sizeof(((mf_config *)0)->field)
#define BIG 1e18

static const key_row keys[] = {
    {"model", T_STR, S(model), "gpt2-10m", 0, 0, "model preset: gpt2-1m, gpt2-10m, gpt2-124m, gpt2-350m, llama-tiny, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, tinyllama-1.1b, mistral-7b, moe-tiny, qwen2-moe-tiny, moe-small, mixtral-8x7b (memfit estimate --help lists them); --init DIR takes the shape from DIR/config.json instead"},
    {"n_layer", T_INT, F(n_layer), 0, "0", 0, 1024, "transformer blocks (0 = preset's)"},
    {"share_layers", T_INT, F(share_layers), 0, "0", 0, 1024, "cross-layer parameter sharing (ALBERT): the n_layer blocks use N distinct weight sets repeated in order, block i uses set i % N; N must divide n_layer; params, grads and optimizer state shrink by n_layer/N, activations do not (0 = no sharing; docs/sharing.md)"},
    {"n_embd", T_INT, F(n_embd), 0, "0", 0, 65536, "embedding width C (0 = preset's)"},
    {"n_head", T_INT, F(n_head), 0, "0", 0, 1024, "attention heads; must divide n_embd (0 = preset's)"},
    {"n_kv_head", T_INT, F(n_kv_head), 0, "0", 0, 1024, "Llama family: key/value heads, must divide n_head (0 = preset's)"},
    {"intermediate_size", T_INT, F(intermediate_size), 0, "0", 0, 1 << 20, "Llama family: SwiGLU MLP width (0 = preset's)"},
    {"num_local_experts", T_INT, F(num_local_experts), 0, "0", 0, 1 << 16, "mixture of experts: experts per layer E (0 = preset's or config.json's; a dense model stays dense)"},
    {"num_experts_per_tok", T_INT, F(num_experts_per_tok), 0, "0", 0, 1 << 16, "mixture of experts: experts each token is routed to, k <= E (0 = preset's)"},
    {"router_aux_loss_coef", T_FLOAT, F(router_aux_loss_coef), 0, "0", 0, 1e6, "mixture of experts: weight of the load-balancing loss (mean over layers) in the training loss (unset = preset's or config.json's)"},
    {"router_z_loss_coef", T_FLOAT, F(router_z_loss_coef), 0, "0", 0, 1e6, "mixture of experts: weight of the router z-loss (mean over layers) in the training loss (unset = preset's)"},
    {"capacity_factor", T_FLOAT, F(capacity_factor), 0, "0", 0, 1e6, "mixture of experts: each expert takes at most ceil(F * tokens * k / E) token-slots, the overflow skips the MLP and is counted (unset = dropless; must be > 0 when given)"},
    {"block_size", T_INT, F(block_size), 0, "0", 0, 1 << 20, "maximum sequence length, rows of wpe (0 = preset's)"},
    {"vocab_size", T_INT, F(vocab_size), 0, "0", 0, 1 << 24, "vocabulary, the embedding's rows; at least the tokenizer's (0 = the preset's or config.json's; a GPT-2 preset given --tokenizer takes the tokenizer's)"},
    {"tokenizer", T_STR, S(tokenizer), "", 0, 0, "gpt2, bytes, or PATH/tokenizer.json (a Hugging Face BPE tokenizer: Llama 3, Qwen, Llama 2, ...); any architecture takes any of them (empty = with --init DIR, DIR/tokenizer.json if present, else the preset's)"},
    {"batch", T_INT, F(batch), 0, "8", 1, 1 << 20, "micro-batch size B (sequences per forward/backward; under mpirun the global micro-batch, split evenly over the ranks)"},
    {"seq", T_INT, F(seq), 0, "0", 0, 1 << 20, "sequence length T (0 = block_size)"},
    {"grad_accum", T_INT, F(grad_accum), 0, "1", 1, 1 << 20, "micro-batches per optimizer step (effective batch = batch x grad_accum)"},
    {"seq_warmup", T_INT, F(seq_warmup), 0, "0", 0, 1 << 30, "sequence-length warm-up: over the first N steps T grows from seq_warmup_start to seq (multiples of 8) with the step's tokens kept, the batch split at run time into micro-batches that fit the plan (0 = off)"},
    {"seq_warmup_start", T_INT, F(seq_warmup_start), 0, "64", 8, 1 << 20, "first sequence length of seq_warmup"},
    {"steps", T_INT, F(steps), 0, "300", 0, 1 << 30, "optimizer steps to train"},
    {"lr", T_FLOAT, F(lr), 0, "1e-3", 0, 10, "peak learning rate"},
    {"min_lr_frac", T_FLOAT, F(min_lr_frac), 0, "0.1", 0, 1, "cosine decay ends at lr x min_lr_frac"},
    {"warmup", T_INT, F(warmup), 0, "20", 0, 1 << 30, "linear warm-up steps"},
    {"weight_decay", T_FLOAT, F(weight_decay), 0, "0.1", 0, 10, "weight decay: decoupled for adamw, adamw8bit and adafactor; added to the gradient for sgd (as torch does)"},
    {"decay_on", T_STR, S(decay_on), "2d", 0, 0, "tensors that decay: 2d (matrices and embeddings), all, none"},
    {"beta1", T_FLOAT, F(beta1), 0, "0.9", 0, 0.999999, "AdamW and 8-bit AdamW beta1"},
    {"beta2", T_FLOAT, F(beta2), 0, "0.95", 0, 0.99999999, "AdamW and 8-bit AdamW beta2"},
    {"eps", T_FLOAT, F(eps), 0, "1e-8", 1e-30, 1, "AdamW and 8-bit AdamW epsilon"},
    {"optimizer", T_STR, S(optimizer), "adamw", 0, 0, "adamw, adamw8bit (block-wise 8-bit moments), adafactor (factored second moments), sgd"},
    {"optim_block", T_INT, F(optim_block), 0, "2048", 16, 4096, "adamw8bit: elements per quantisation block (one fp32 absmax each)"},
    {"momentum", T_FLOAT, F(momentum), 0, "0", 0, 0.999999, "sgd momentum, adafactor first-moment decay (0 = none)"},
    {"relative_step", T_BOOL, F(relative_step), 0, "0", 0, 1, "adafactor: step size min(1e-2, 1/sqrt(t)) x RMS(param) instead of lr"},
    {"update_in_backward", T_BOOL, F(update_in_backward), 0, "0", 0, 1, "apply each tensor's update as soon as its gradient is complete and drop the gradient (needs grad_accum 1, grad_clip 0)"},
    {"precision", T_STR, S(precision), "fp32", 0, 0, "fp32, bf16 or fp16: bf16/fp16 keep GEMM weights and GEMM-input activations in 16 bits (fp32 master weights, optimizer state, gradients and every reduction stay fp32; fp16 adds dynamic loss scaling). Training only; with --lora: bf16 only (the frozen base and activations bf16, the adapters fp32; docs/lora.md); see docs/precision.md"},
    {"master_weights", T_BOOL, F(master_weights), 0, "1", 0, 1, "with precision bf16: 0 drops the fp32 master copy and updates the bf16 weights with stochastic rounding (as llm.c does)"},
    {"pure_bf16", T_BOOL, F(pure_bf16), 0, "0", 0, 1, "with precision bf16, master_weights 0 and optimizer adamw: AdamW's moments of the 16-bit weights in bf16 too, rounded stochastically (the least memory). See docs/precision.md"},
    {"grad_dtype", T_STR, S(grad_dtype), "fp32", 0, 0, "fp32 or bf16: dtype of the 16-bit weights' gradient rows (bf16 needs precision bf16: the weight-gradient GEMMs accumulate in fp32 and round once to nearest-even, micro-batches accumulate in bf16; the norm, clip and optimizer widen them to fp32; biases, norms and wpe keep fp32 gradients). See docs/precision.md"},
    {"loss_scale", T_FLOAT, F(loss_scale), 0, "65536", 1, 1e30, "precision fp16: initial dynamic loss scale (GradScaler's 2^16); halved and the step skipped on inf/NaN gradients"},
    {"loss_scale_interval", T_INT, F(loss_scale_interval), 0, "2000", 1, 1 << 30, "precision fp16: clean steps in a row after which the loss scale doubles (GradScaler's growth_interval)"},
    {"offload", T_STR, S(offload), "", 0, 0, "optimizer=disk:PATH keeps optimizer state in the file PATH, streamed through two windows at the optimizer step (adamw, adamw8bit, sgd); under mpirun each rank writes its own file PATH.rank<r> holding the state it keeps (its shard at zero 1-3)"},
    {"offload_window", T_SIZE, F(offload_window), 0, "16MiB", 0, 0, "bytes of each of the two offload windows"},
    {"grad_clip", T_FLOAT, F(grad_clip), 0, "1.0", 0, BIG, "global gradient-norm clip (0 = off)"},
    {"seed", T_U64, F(seed), 0, "1337", 0, 0, "seed for weights, dropout-free sampling and data order"},
    {"data", T_STR, S(data), "", 0, 0, "training token file (memfit tokenize), or a corpus in the cache by name: moby-dick (the default, when empty) or sotu (scripts/fetch_data.sh --sotu)"},
    {"chat_template", T_STR, S(chat_template), "", 0, 0, "chat data (--data FILE.jsonl): llama3, chatml, llama2 or smollm2 (empty = detected from the tokenizer.json folder's tokenizer_config.json; required with the gpt2 and bytes tokenizers)"},
    {"train_on", T_STR, S(train_on), "completion", 0, 0, "chat data: completion (the loss covers assistant turns only) or prompt_too (every token)"},
    {"packing", T_STR, S(packing), "on", 0, 0, "chat data: on (examples concatenated into rows of seq tokens, attention and positions restart at each example) or off (one example per row, padded; longer ones split into rows)"},
    {"skip_bad_lines", T_BOOL, F(skip_bad_lines), 0, "0", 0, 1, "chat data: count and skip malformed lines, unknown roles, empty assistant turns and (packing on) examples longer than seq + 1 tokens instead of stopping at the first"},
    {"val_data", T_STR, S(val_data), "", 0, 0, "validation token file or corpus name (empty = the last val_fraction of data)"},
    {"val_fraction", T_FLOAT, F(val_fraction), 0, "0.1", 0, 0.9, "share of data held out for validation when val_data is empty"},
    {"val_every", T_INT, F(val_every), 0, "50", 0, 1 << 30, "validate every N steps (0 = only at the end)"},
    {"val_batches", T_INT, F(val_batches), 0, "8", 1, 1 << 20, "micro-batches per validation"},
    {"tokenizer_dir", T_STR, S(tokenizer_dir), "", 0, 0, "folder with encoder.json and vocab.bpe (empty = $MEMFIT_CACHE/gpt2)"},
    {"sample_every", T_INT, F(sample_every), 0, "0", 0, 1 << 30, "print a sample every N steps (0 = only at the end)"},
    {"sample_tokens", T_INT, F(sample_tokens), 0, "64", 0, 1 << 20, "tokens per sample (0 = no samples)"},
    {"temperature", T_FLOAT, F(temperature), 0, "0.8", 0, 100, "sampling temperature (0 = greedy)"},
    {"top_k", T_INT, F(top_k), 0, "40", 0, 1 << 24, "sample from the k most likely tokens (0 = all)"},
    {"prompt", T_STR, S(prompt), "", 0, 0, "text samples start from (empty = end-of-text / newline)"},
    {"init", T_STR, S(init), "", 0, 0, "start from these weights: a Hugging Face model folder (config.json + model.safetensors or shards; Llama, Qwen2, Mistral) or a safetensors file (memfit's own, or Hugging Face GPT-2 names)"},
    {"out_dir", T_STR, S(out_dir), "", 0, 0, "folder for checkpoints and the final model (empty = none written)"},
    {"ckpt_every", T_INT, F(ckpt_every), 0, "0", 0, 1 << 30, "write a checkpoint every N steps (0 = only at the end, if out_dir)"},
    {"resume", T_STR, S(resume), "", 0, 0, "resume from this checkpoint file; auto = from --out_dir's checkpoint if there is one, else start fresh"},
    {"metrics", T_STR, S(metrics), "", 0, 0, "write one JSON object per step to this .jsonl file"},
    {"trace", T_STR, S(trace), "", 0, 0, "write a Chrome trace-event JSON file (Perfetto, chrome://tracing): phases, steps and memory by category"},
    {"report", T_STR, S(report), "", 0, 0, "write a self-contained HTML report (loss, tokens/s, memory by category, plan vs measured) into this folder"},
    {"budget", T_SIZE, F(budget), 0, "0", 0, 0, "memory budget for the whole process, e.g. 2GiB (0 = none)"},
    {"plan", T_STR, S(plan), "auto", 0, 0, "with --budget: auto (train with the fastest setting that fits: recompute, micro-batch x grad_accum, update_in_backward, optimizer offload; keys you set are kept) or off (refuse a plan over budget)"},
    {"allow", T_STR, S(allow), "", 0, 0, "lossy: the planner may also choose settings that change the maths (adamw8bit, adafactor for adamw; bf16; LoRA when --init is given and no full fine-tuning setting fits); empty = keep the maths"},
    {"effective_batch", T_INT, F(effective_batch), 0, "0", 0, 1 << 20, "sequences per optimizer step the planner keeps fixed, split as batch x grad_accum (0 = batch x grad_accum)"},
    {"health_levels", T_STR, S(health_levels), "0.90,0.92,0.95,0.97", 0, 0, "memory health levels target,warning,critical,emergency as fractions of --budget (log, metrics, report)"},
    {"threads", T_INT, F(threads), 0, "0", 0, 4096, "threads (0 = all cores)"},
    {"blas_coretype", T_STR, S(blas_coretype), "auto", 0, 0, "OpenBLAS kernels: auto (fastest for this CPU), env (keep OPENBLAS_CORETYPE), or a core name"},
    {"omp_wait", T_STR, S(omp_wait), "auto", 0, 0, "how idle OpenMP threads wait: auto (passive when the load average and the other runnable tasks are both at or above the core count at start, else the OpenMP default), active (spin), passive (sleep), env (keep OMP_WAIT_POLICY)"},
    {"recompute", T_STR, S(recompute), "none", 0, 0, "activation checkpointing: none (keep all), selective (rebuild LayerNorm/GELU outputs in backward), full (keep each block's input, recompute the block in backward), every:N (keep every N-th block's input, recompute segments of N), sqrt (segments of ceil(sqrt(n_layer))), auto (recompute the fewest blocks that fit --budget)"},
    {"loss_chunk", T_INT, F(loss_chunk), 0, "256", 0, 1 << 30, "rows of logits the loss computes at a time; B*T*vocab logits never exist (0 = all rows at once)"},
    {"zero", T_INT, F(zero), 0, "0", 0, 3, "data parallel under mpirun: 0 = gradients all-reduced, 1 = optimizer state sharded over the ranks, 2 = gradients sharded too, 3 = parameters sharded too (each layer's gathered for its phases)"},
    {"world_size", T_INT, F(world_size), 0, "1", 1, 1 << 20, "ranks to plan for (memfit estimate and memfit plan, per rank; memfit train under mpirun takes the launcher's)"},
    {"zero_group", T_INT, F(zero_group), 0, "0", 0, 1 << 20, "hybrid sharding (FSDP's hybrid shard): ZeRO shards within groups of this many consecutive ranks and replicates across the groups (must divide the ranks; 0 = one group of all ranks)"},
    {"expert_parallel", T_INT, F(expert_parallel), 0, "1", 1, 1 << 20, "mixture of experts under mpirun: groups of N consecutive ranks each hold E / N whole experts (params, grads, optimizer state) and exchange tokens with MPI_Alltoallv; the rest stays data parallel (N divides the ranks and the experts; zero 0, fp32, LoRA over an fp32 base only; 1 = off)"},
    {"dist_timeout", T_FLOAT, F(dist_timeout), 0, "300", 0, 1e9, "data parallel: seconds a collective waits for another rank before the job stops with a message (0 = forever)"},
    {"net_gbps", T_FLOAT, F(net_gbps), 0, "0", 0, 1e9, "memfit plan --world_size N: each rank's network bandwidth in Gbit/s, to predict the step time with its communication (0 = compute only)"},
    {"log_every", T_INT, F(log_every), 0, "1", 1, 1 << 30, "print a log line every N steps"},
    {"progress", T_INT, F(progress), 0, "-1", -1, 1, "progress bar: -1 when stdout is a terminal, 0 off, 1 on"},
    {"lora", T_STR, S(lora), "", 0, 0, "LoRA adapters on a frozen base: r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj (GPT-2 names; Llama family: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; Mixtral experts: w1,w2,w3; Qwen2-MoE: gate_proj,up_proj,down_proj are its shared expert's) (empty = full fine-tuning); adapters, their gradients and state stay fp32 under --precision bf16"},
    {"base_dtype", T_STR, S(base_dtype), "fp32", 0, 0, "with lora: how the frozen base's block weights are stored: fp32, bf16, int8 (absmax blocks of 64) or nf4 (QLoRA NF4, double-quantised constants); dequantised a tile at a time inside the GEMM"},
    {"adapter", T_STR, S(adapter), "", 0, 0, "with lora: start from the adapter in this folder (adapter_model.safetensors, PEFT layout)"},
    {"teacher", T_STR, S(teacher), "", 0, 0, "distillation: the frozen teacher to distill from (a memfit weights file or checkpoint, or a Hugging Face folder), forward only; it must share the student's tokenizer and vocabulary (docs/distillation.md)"},
    {"distill", T_STR, S(distill), "alpha=0.5,temperature=2.0", 0, 0, "with teacher: loss = alpha * T^2 * KL(softmax(teacher/T) || softmax(student/T)) + (1 - alpha) * cross-entropy; alpha in [0, 1], temperature > 0"},
    {"teacher_dtype", T_STR, S(teacher_dtype), "fp32", 0, 0, "with teacher: how its block weights are stored: fp32, bf16, int8 or nf4 (as base_dtype; dequantised a tile at a time inside the GEMM); the planner may choose one under --allow lossy"},
    {"save_adapter", T_STR, S(save_adapter), "", 0, 0, "with lora: write adapter_model.safetensors and adapter_config.json (PEFT layout) into this folder at the end"},
};
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

_Static_assert(sizeof keys / sizeof keys[0] <= sizeof(((mf_config *)0)->set_by_user),
               "set_by_user too small for the key table");

static const key_row *find_key(const char *k, int *idx) {
    for (int i = 0; i < NKEYS; i++) {
        /* accept dashes for underscores: --grad-accum == --grad_accum */
        const char *a = keys[i].key, *b = k;
        while (*a && (*a == *b || (*a == '_' && *b == '-'))) a++, b++;
        if (!*a && !*b) { if (idx) *idx = i; return &keys[i]; }
    }
    return NULL;
}

/* One spelling rule for switches, wherever the value comes from (flag,
 * --flag=V, --flag V, YAML): 1 if v is on, 0 if off, -1 if neither. */
static int bool_word(const char *v) {
    static const char *const on[] = {"1", "true", "on", "yes"}, *const off[] = {"0", "false", "off", "no"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, on[i]) == 0) return 1;
        if (strcasecmp(v, off[i]) == 0) return 0;
    }
    return -1;
}

static int apply(mf_config *c, const key_row *r, const char *v) {
    char *base = (char *)c + r->off;
    char *end = NULL;
    errno = 0;
    switch (r->type) {
    case T_BOOL: {
        int x = bool_word(v);
        if (x < 0)
            return mf_fail("config key '%s' is a switch: expected 1, 0, true, false, on, off, yes or no, got '%s' "
                           "(on the command line: --%s, --%s=0 or --no-%s)", r->key, v, r->key, r->key, r->key);
        *(int *)base = x;
        return 0;
    }
    case T_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < r->lo || x > r->hi)
            return mf_fail("config key '%s': expected an integer in [%.0f, %.0f], got '%s'", r->key, r->lo, r->hi, v);
        *(int *)base = (int)x;
        return 0;
    }
    case T_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < r->lo || x > r->hi)
            return mf_fail("config key '%s': expected a number in [%g, %g], got '%s'", r->key, r->lo, r->hi, v);
        *(double *)base = x;
        return 0;
    }
    case T_U64: {
        if (*v == '-') return mf_fail("config key '%s': expected a non-negative integer, got '%s'", r->key, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno) return mf_fail("config key '%s': expected a non-negative integer, got '%s'", r->key, v);
        *(uint64_t *)base = (uint64_t)x;
        return 0;
    }
    case T_SIZE: {
        size_t x;
        if (mf_size_parse(v, &x)) return mf_fail("config key '%s': %s", r->key, mf_error());
        *(size_t *)base = x;
        return 0;
    }
    case T_STR:
        if (strlen(v) >= r->len) return mf_fail("config key '%s': value longer than %zu characters", r->key, r->len - 1);
        memcpy(base, v, strlen(v) + 1);
        return 0;
    }
    return mf_fail("config key '%s': unknown type", r->key);
}

void mf_config_defaults(mf_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NKEYS; i++)
        if (apply(c, &keys[i], keys[i].def)) mf_panic("bad default for %s: %s", keys[i].key, mf_error());
}

static int check_enum(const char *key, const char *v, const char *const *allowed) {
    for (int i = 0; allowed[i]; i++) if (strcmp(v, allowed[i]) == 0) return 0;
    char list[128] = "";
    for (int i = 0; allowed[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, *allowed[i] ? allowed[i] : "\"\"", sizeof list - strlen(list) - 1);
    }
    return mf_fail("config key '%s': '%s' is not one of %s", key, v, list);
}

int mf_config_set(mf_config *c, const char *key, const char *value) {
    int idx;
    const key_row *r = find_key(key, &idx);
    if (!r) return mf_fail("unknown config key '%s' (memfit train --help lists them)", key);
    if (apply(c, r, value)) return -1;
    static const char *const decay[] = {"2d", "all", "none", NULL};
    static const char *const opt[] = {"adamw", "adamw8bit", "adafactor", "sgd", NULL};
    if (strcmp(r->key, "recompute") == 0) {
        /* the model module owns the policy names */
        mf_recompute rc;
        if (mf_recompute_parse(value, &rc)) return mf_fail("config key 'recompute': %s", mf_error());
    }
    if (strcmp(r->key, "tokenizer") == 0 && value[0] && strcmp(value, "gpt2") != 0 && strcmp(value, "bytes") != 0) {
        size_t n = strlen(value);
        if (n < 5 || strcmp(value + n - 5, ".json") != 0)
            return mf_fail("config key 'tokenizer': '%s' is not gpt2, bytes or a path to a tokenizer.json", value);
    }
    if (strcmp(r->key, "decay_on") == 0 && check_enum(r->key, value, decay)) return -1;
    static const char *const chat[] = {"", "llama3", "chatml", "llama2", "smollm2", NULL};
    static const char *const on[] = {"completion", "prompt_too", NULL}, *const pk[] = {"on", "off", NULL};
    if (strcmp(r->key, "chat_template") == 0 && check_enum(r->key, value, chat)) return -1;
    if (strcmp(r->key, "train_on") == 0 && check_enum(r->key, value, on)) return -1;
    if (strcmp(r->key, "packing") == 0 && check_enum(r->key, value, pk)) return -1;
    if (strcmp(r->key, "optimizer") == 0 && check_enum(r->key, value, opt)) return -1;
    static const char *const prec[] = {"fp32", "bf16", "fp16", NULL}, *const gdt[] = {"fp32", "bf16", NULL};
    if (strcmp(r->key, "precision") == 0 && check_enum(r->key, value, prec)) return -1;
    if (strcmp(r->key, "grad_dtype") == 0 && check_enum(r->key, value, gdt)) return -1;
    static const char *const plan[] = {"auto", "off", NULL}, *const allow[] = {"", "lossy", NULL};
    if (strcmp(r->key, "plan") == 0 && check_enum(r->key, value, plan)) return -1;
    if (strcmp(r->key, "allow") == 0 && check_enum(r->key, value, allow)) return -1;
    static const char *const wait[] = {"auto", "active", "passive", "env", NULL};
    if (strcmp(r->key, "omp_wait") == 0 && check_enum(r->key, value, wait)) return -1;
    if (strcmp(r->key, "health_levels") == 0 && mf_health_parse(value, NULL)) return -1;
    if (strcmp(r->key, "lora") == 0) {
        mf_lora_cfg lc;
        if (mf_lora_parse(value, &lc)) return mf_fail("config key 'lora': %s", mf_error());
    }
    if (strcmp(r->key, "base_dtype") == 0) {
        int k;
        if (mf_quant_parse(value, &k)) return mf_fail("config key 'base_dtype': %s", mf_error());
    }
    if (strcmp(r->key, "teacher_dtype") == 0) {
        int k;
        if (mf_quant_parse(value, &k)) return mf_fail("config key 'teacher_dtype': %s", mf_error());
    }
    if (strcmp(r->key, "distill") == 0 && mf_distill_parse(value, NULL)) return mf_fail("config key 'distill': %s", mf_error());
    c->set_by_user[idx] = 1;
    return 0;
}

int mf_config_was_set(const mf_config *c, const char *key) {
    int idx;
    return find_key(key, &idx) ? c->set_by_user[idx] : 0;
}

int mf_config_load_yaml(mf_config *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return mf_fail("cannot open config file %s: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&p)) { fclose(f); return mf_fail("cannot initialise the YAML parser"); }
    yaml_parser_set_input_file(&p, f);
    int depth = 0, rc = 0, done = 0;
    char key[128] = "";
    int have_key = 0;
    while (!done) {
        if (!yaml_parser_parse(&p, &ev)) {
            rc = mf_fail("config file %s: YAML error at line %zu: %s", path,
                         p.problem_mark.line + 1, p.problem ? p.problem : "unknown");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1) rc = mf_fail("config file %s: line %zu: nested mappings are not supported (use flat keys)",
                                          path, ev.start_mark.line + 1);
            break;
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_SEQUENCE_START_EVENT:
            rc = mf_fail("config file %s: line %zu: lists are not supported", path, ev.start_mark.line + 1);
            break;
        case YAML_SCALAR_EVENT:
            if (depth != 1) { rc = mf_fail("config file %s: expected a mapping of key: value", path); break; }
            if (!have_key) {
                snprintf(key, sizeof key, "%s", (const char *)ev.data.scalar.value);
                have_key = 1;
            } else {
                if (mf_config_set(c, key, (const char *)ev.data.scalar.value))
                    rc = mf_fail("config file %s: line %zu: %s", path, ev.start_mark.line + 1, mf_error());
                have_key = 0;
            }
            break;
        default: break;
        }
        yaml_event_delete(&ev);
        if (rc) break;
    }
    yaml_parser_delete(&p);
    fclose(f);
    return rc;
}

int mf_config_parse_args(mf_config *c, int argc, char **argv, char **positional, int max_pos) {
    int npos = 0;
    /* the config file first, so flags override it wherever they appear */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc) return mf_fail("--config needs a file");
            if (mf_config_load_yaml(c, argv[i + 1])) return -1;
        } else if (strncmp(a, "--config=", 9) == 0) {
            if (mf_config_load_yaml(c, a + 9)) return -1;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) { i++; continue; }
        if (strncmp(a, "--config=", 9) == 0) continue;
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            if (npos >= max_pos) return mf_fail("unexpected argument '%s'", a);
            positional[npos++] = argv[i];
            continue;
        }
        char key[128];
        const char *eq = strchr(a + 2, '=');
        const char *val;
        size_t klen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (klen >= sizeof key) return mf_fail("option too long: %s", a);
        memcpy(key, a + 2, klen);
        key[klen] = 0;
        const key_row *r = find_key(key, NULL);
        const key_row *neg = r || strncmp(key, "no-", 3) != 0 ? NULL : find_key(key + 3, NULL);
        if (neg && neg->type == T_BOOL) {
            /* --no-flag switches off; it takes no value */
            if (eq) return mf_fail("option --%s takes no value (use --%s=0 or --no-%s)", key, key + 3, key + 3);
            if (mf_config_set(c, key + 3, "0")) return -1;
            continue;
        }
        if (!r) return mf_fail("unknown option --%s (memfit train --help lists them)", key);
        if (eq) val = eq + 1;
        else if (r->type == T_BOOL) {
            /* --flag alone is on; --flag 0/1/true/false/on/off/yes/no takes the word */
            val = "1";
            if (i + 1 < argc && bool_word(argv[i + 1]) >= 0) val = argv[++i];
            else if (i + 1 < argc) {
                /* a number after a switch is a mistyped value, not a positional */
                char *end;
                const char *nx = argv[i + 1];
                errno = 0;
                (void)strtod(nx, &end);
                if (*nx && !*end) val = argv[++i];  /* apply() refuses it with the accepted spellings */
            }
        } else {
            if (i + 1 >= argc) return mf_fail("option --%s needs a value", key);
            val = argv[++i];
        }
        if (mf_config_set(c, key, val)) return -1;
    }
    return npos;
}

static const char *type_name(ktype t) {
    switch (t) {
    case T_INT: return "int";
    case T_FLOAT: return "float";
    case T_STR: return "text";
    case T_SIZE: return "size";
    case T_U64: return "int";
    case T_BOOL: return "bool";
    }
    return "?";
}

void mf_config_print_help(FILE *f) {
    fprintf(f, "Config keys (YAML file via --config FILE, or --key=value; flags override the file):\n");
    for (int i = 0; i < NKEYS; i++)
        fprintf(f, "  --%-14s %-5s default %-10s %s\n", keys[i].key, type_name(keys[i].type),
                *keys[i].def ? keys[i].def : "\"\"", keys[i].help);
    fprintf(f, "Sizes take units: 512MiB, 2GiB, 1.5GB.\n");
}

int mf_config_key_info(int i, const char **key, const char **type, const char **def, const char **help) {
    if (i < 0 || i >= NKEYS) return 0;
    *key = keys[i].key;
    *type = type_name(keys[i].type);
    *def = keys[i].def;
    *help = keys[i].help;
    return 1;
}

int mf_config_to_yaml(const mf_config *c, char *buf, size_t n) {
    size_t len = 0;
    for (int i = 0; i < NKEYS; i++) {
        const key_row *r = &keys[i];
        const char *base = (const char *)c + r->off;
        int w = 0;
        switch (r->type) {
        case T_INT: case T_BOOL: w = snprintf(buf + len, n - len, "%s: %d\n", r->key, *(const int *)base); break;
        case T_FLOAT: w = snprintf(buf + len, n - len, "%s: %.17g\n", r->key, *(const double *)base); break;
        case T_U64: w = snprintf(buf + len, n - len, "%s: %llu\n", r->key, (unsigned long long)*(const uint64_t *)base); break;
        case T_SIZE: w = snprintf(buf + len, n - len, "%s: %zu\n", r->key, *(const size_t *)base); break;
        case T_STR: {
            /* YAML double-quoted scalar: escape backslashes and quotes */
            char esc[2 * MF_PATH_MAX + 2];
            size_t k = 0;
            for (const char *q = base; *q && k + 2 < sizeof esc; q++) {
                if (*q == '"' || *q == '\\') esc[k++] = '\\';
                esc[k++] = *q;
            }
            esc[k] = 0;
            w = snprintf(buf + len, n - len, "%s: \"%s\"\n", r->key, esc);
            break;
        }
        }
        if (w < 0 || (size_t)w >= n - len) return mf_fail("config does not fit in %zu bytes", n);
        len += (size_t)w;
    }
    return 0;
}

int mf_config_is_chat(const mf_config *c) {
    size_t n = strlen(c->data);
    return n > 6 && strcmp(c->data + n - 6, ".jsonl") == 0;
}

int mf_config_packs(const mf_config *c) { return mf_config_is_chat(c) && strcmp(c->packing, "on") == 0; }
