/* memfit config: every run setting, its default and its help, in one table.
 *
 * Owns: mf_config values (plain struct, no heap). Promises: defaults come
 * only from the table in src/config/config.c; a value is applied through the
 * same parser whether it comes from the table, a YAML file or a --key=value
 * flag; an unknown key or a value out of range is an error naming the key.
 * Resolution order: defaults, then the YAML file, then command-line flags.
 */
#ifndef MEMFIT_CONFIG_H
#define MEMFIT_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MF_PATH_MAX 1024

typedef struct {
    /* model */
    char model[32];           /* preset name */
    int n_layer, n_embd, n_head, block_size, vocab_size; /* 0 = from preset */
    int n_kv_head, intermediate_size; /* Llama family: KV heads, MLP width (0 = preset's) */
    int share_layers;         /* cross-layer sharing: N distinct block weight sets, block i uses set i % N (0 = none) */
    int num_local_experts, num_experts_per_tok; /* mixture of experts: E and k (0 = preset's) */
    double router_aux_loss_coef, router_z_loss_coef; /* used when set (file or flag), else the preset's */
    double capacity_factor;   /* mixture of experts: tokens per expert bound (0 = dropless) */
    char tokenizer[MF_PATH_MAX]; /* gpt2 | bytes | PATH/tokenizer.json | "" (preset's, or --init DIR's tokenizer.json) */
    /* batch */
    int batch, seq, grad_accum, steps;
    int seq_warmup, seq_warmup_start; /* sequence-length warm-up steps (0 = off) and its first length */
    /* optimizer */
    double lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    int warmup;
    char decay_on[8];         /* 2d | all | none */
    char optimizer[16];       /* adamw | adamw8bit | adafactor | sgd */
    int optim_block;          /* adamw8bit quantisation block */
    double momentum;          /* sgd momentum, adafactor beta1 (0 = none) */
    int relative_step;        /* adafactor: lr from the step count */
    int update_in_backward;   /* apply each update as its gradient completes */
    char precision[8];        /* fp32 | bf16 | fp16: dtype of GEMM weights and GEMM-input activations */
    int master_weights;
    char grad_dtype[8];       /* fp32 | bf16: dtype of the 16-bit weights' gradients (bf16: precision bf16 only) */
    int pure_bf16;            /* bf16 AdamW moments for the 16-bit weights (needs master_weights 0) */
    double loss_scale;        /* fp16: initial dynamic loss scale */
    int loss_scale_interval;  /* fp16: clean steps before the scale doubles */       /* 16-bit precision: keep fp32 master weights (off: bf16 only, stochastic rounding) */
    char offload[MF_PATH_MAX + 32]; /* "" or optimizer=disk:PATH */
    size_t offload_window;    /* bytes per window (two are planned) */
    uint64_t seed;
    /* data */
    char data[MF_PATH_MAX], val_data[MF_PATH_MAX], tokenizer_dir[MF_PATH_MAX];
    double val_fraction;
    int val_every, val_batches;
    char chat_template[16];   /* chat data: llama3 | chatml | llama2 | smollm2 | "" (detected) */
    char train_on[16];        /* completion | prompt_too */
    char packing[8];          /* on | off */
    int skip_bad_lines;
    /* sampling */
    int sample_every, sample_tokens, top_k;
    double temperature;
    char prompt[256];
    /* files */
    char init[MF_PATH_MAX], out_dir[MF_PATH_MAX], resume[MF_PATH_MAX], metrics[MF_PATH_MAX];
    char trace[MF_PATH_MAX], report[MF_PATH_MAX];
    int ckpt_every;
    /* memory and machine */
    size_t budget;
    char plan[8];             /* auto | off: train --budget searches the settings */
    char allow[16];           /* "" | lossy: settings that change the maths may be chosen */
    int effective_batch;      /* sequences per optimizer step the planner keeps (0 = batch x grad_accum) */
    char health_levels[64];   /* fractions of the budget: target,warning,critical,emergency */
    int threads;
    char blas_coretype[16];
    char omp_wait[16];        /* auto | active | passive | env: OMP_WAIT_POLICY (cli/main.c) */
    int loss_chunk;           /* logits rows computed at a time (0 = all) */
    char recompute[16];       /* none | full */
    int log_every;
    int zero;                 /* ZeRO stage over the data-parallel ranks (dist/) */
    int world_size;           /* ranks the plan is for (memfit estimate; train takes mpirun's) */
    int zero_group;           /* ZeRO hybrid shard: ranks per shard group (0 = all ranks, one group) */
    int expert_parallel;      /* mixture of experts: ranks per expert group, each holding E / N experts (1 = off) */
    double dist_timeout;      /* seconds a collective waits for a peer (0 = forever) */
    double net_gbps;          /* memfit plan: bandwidth per rank (Gbit/s) for the communication time (0 = none) */
    int progress;             /* -1 auto (terminal), 0 off, 1 on */
    /* parameter-efficient fine-tuning (lora.h) */
    char lora[256];           /* "" or r=8,alpha=16,dropout=0.05,targets=... */
    char base_dtype[8];       /* frozen base storage under LoRA: fp32 (bf16|int8|nf4 with quant/) */
    char adapter[MF_PATH_MAX];      /* load adapter_model.safetensors from this folder */
    char save_adapter[MF_PATH_MAX]; /* write the adapter (PEFT layout) into this folder */
    /* distillation (distill.h) */
    char teacher[MF_PATH_MAX];  /* "" or the teacher: memfit weights file, checkpoint, or HF folder */
    char distill[64];           /* alpha=0.5,temperature=2.0 */
    char teacher_dtype[8];      /* fp32 | bf16 | int8 | nf4: how the teacher's block weights are stored */
    unsigned char set_by_user[128]; /* per table row: 1 if file or flag set it */
} mf_config;

/* Fills every field with the table's defaults. */
void mf_config_defaults(mf_config *c);
/* Sets one key from text. -1 with "unknown config key 'x'" or
 * "config key 'batch': expected an integer >= 1, got 'x'" style messages. */
int mf_config_set(mf_config *c, const char *key, const char *value);
/* Applies a YAML file: a mapping of key: scalar (comments allowed). */
int mf_config_load_yaml(mf_config *c, const char *path);
/* Parses argv: "--config FILE", "--key=value", "--key value" (and
 * "--flag" for keys whose type is boolean). Non-option words are returned
 * through positional (up to max_pos). Returns the number of positionals, or
 * -1 on error. The YAML file (if any) is applied before the flags. */
int mf_config_parse_args(mf_config *c, int argc, char **argv,
                         char **positional, int max_pos);
/* Prints every key with type, default and help. */
void mf_config_print_help(FILE *f);
/* Row i of the key table, for help printers (memfit help --markdown,
 * --bash-completion): name, type ("int", "float", "text", "size",
 * "bool"), default text ("" = empty) and help. Returns 1, or 0 when i is
 * past the last row (the pointers are then untouched). Static strings. */
int mf_config_key_info(int i, const char **key, const char **type, const char **def, const char **help);
/* Writes the current values as YAML (for checkpoints and logs). */
int mf_config_to_yaml(const mf_config *c, char *buf, size_t n);
/* True when the user set the key explicitly (file or flag). */
int mf_config_was_set(const mf_config *c, const char *key);
/* 1 when the training data is chat / instruction data (data names a
 * .jsonl file: src/data/sft.c), and with it whether packing is on. */
int mf_config_is_chat(const mf_config *c);
int mf_config_packs(const mf_config *c);

#ifdef __cplusplus
}
#endif
#endif
