/* memfit lora: low-rank adapters on a frozen base (Hu et al. 2021, "LoRA:
 * Low-Rank Adaptation of Large Language Models", arXiv:2106.09685), with
 * PEFT's conventions.
 *
 * Owns: the parsed --lora setting, the adapter kernels (forward, the two
 * halves of backward, dropout), adapter_config.json and memfit merge. It
 * knows nothing of the model: the per-layer hooks around each targeted
 * matmul and the PEFT adapter files live with the model
 * (src/model/lora_hooks.c, adapter.c), which declares the rows (A, B, their
 * gradients and optimizer state in category `adapter`; the low-rank scratch
 * in `work`) in its plan. Dependencies run one way: model -> lora.
 *
 * Promises: for a targeted layer with input x (N,in) and output y (N,out),
 *   y += (alpha / r) * dropout(x) @ A^T @ B^T,  A (r, in), B (out, r)
 * exactly as PEFT's lora.Linear stores and applies them (lora_B(lora_A(
 * dropout(x))) * scaling). B starts at zero and A Kaiming-uniform with
 * a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), as PEFT's default init.
 * Dropout (inverted, keep-probability 1-p) is a pure function of
 * (seed, micro-step, layer, target, element), so a recomputed forward and the
 * backward see the same mask; it is on only in a training forward.
 */
#ifndef MEMFIT_LORA_H
#define MEMFIT_LORA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The matmuls an adapter can sit on (Hugging Face module names): GPT-2's
 * four, then the Llama family's seven (PEFT's target_modules names). */
typedef enum {
    MF_LORA_ATTN_C_ATTN,  /* attn.c_attn: (C -> 3C) */
    MF_LORA_ATTN_C_PROJ,  /* attn.c_proj: (C -> C) */
    MF_LORA_MLP_C_FC,     /* mlp.c_fc: (C -> 4C) */
    MF_LORA_MLP_C_PROJ,   /* mlp.c_proj: (4C -> C) */
    MF_LORA_Q_PROJ,       /* self_attn.q_proj: (C -> NH hd) */
    MF_LORA_K_PROJ,       /* self_attn.k_proj: (C -> NKV hd) */
    MF_LORA_V_PROJ,       /* self_attn.v_proj: (C -> NKV hd) */
    MF_LORA_O_PROJ,       /* self_attn.o_proj: (NH hd -> C) */
    MF_LORA_GATE_PROJ,    /* mlp.gate_proj: (C -> ffn) */
    MF_LORA_UP_PROJ,      /* mlp.up_proj: (C -> ffn) */
    MF_LORA_DOWN_PROJ,    /* mlp.down_proj: (ffn -> C) */
    MF_LORA_W1,           /* block_sparse_moe.experts.{e}.w1: (C -> ffn), each expert (Mixtral) */
    MF_LORA_W2,           /* block_sparse_moe.experts.{e}.w2: (ffn -> C) */
    MF_LORA_W3,           /* block_sparse_moe.experts.{e}.w3: (C -> ffn) */
    MF_LORA_TARGETS
} mf_lora_target;
#define MF_LORA_GPT2_TARGETS 0x00Fu   /* bits of GPT-2's targets */
#define MF_LORA_LLAMA_TARGETS 0x7F0u  /* bits of the Llama family's */
#define MF_LORA_ATTN_TARGETS 0x0F0u   /* the Llama family's attention projections */
#define MF_LORA_MOE_TARGETS 0x3800u   /* a mixture's experts (one adapter per expert, stacked in memfit) */

typedef struct {
    int r;             /* rank; 0 = LoRA off */
    float alpha;       /* scaling = alpha / r */
    float dropout;     /* probability an input element is dropped, [0, 1) */
    unsigned targets;  /* bit k set: target k has an adapter */
    int base;          /* storage of the frozen base's Conv1D weights: an mf_quant_kind (0 = fp32) */
    int targets_given; /* targets= was in the setting (else the model family's default) */
} mf_lora_cfg;

/* Parses "r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,..."
 * (keys in any order; words after targets= that are not key=value are more
 * targets). Defaults: alpha = r, dropout 0, targets attn.c_attn (PEFT's GPT-2
 * default). "" or "off" = LoRA off. -1 with a one-line message otherwise. */
int mf_lora_parse(const char *s, mf_lora_cfg *out);
/* "attn.c_attn", ..., "q_proj", ... (PEFT's target_modules names) */
const char *mf_lora_target_name(int k);
/* The module's path inside a block: "attn.c_attn", "self_attn.q_proj", "mlp.gate_proj". */
const char *mf_lora_target_path(int k);
/* Input and output width of GPT-2 target k in a model of width C (the
 * Llama family's: mf_model_lora_dims in model.h). */
void mf_lora_target_dims(int k, int C, int *in, int *out);
/* Targets set in cfg (bit count). */
int mf_lora_n_targets(const mf_lora_cfg *cfg);
/* Writes targets as a comma-separated list into buf. */
char *mf_lora_targets_str(const mf_lora_cfg *cfg, char *buf, size_t n);
static inline float mf_lora_scale(const mf_lora_cfg *c) { return c->alpha / (float)c->r; }

/* PEFT init: A (r,in) ~ U(-1/sqrt(in), 1/sqrt(in)) from a counter-based
 * stream of `seed`; B is zeroed by the caller. */
void mf_lora_init_a(float *A, int r, int in, uint64_t seed);
/* Elements [lo, lo+n) of that A (stacked experts' A under expert
 * parallelism: a rank's slice of the whole stack's values). */
void mf_lora_init_a_part(float *A, int64_t lo, int64_t n, int in, uint64_t seed);

/* The dropout mask's seed for (base seed, micro-step counter, layer, target). */
uint64_t mf_lora_dropout_seed(uint64_t seed, uint64_t micro_step, int layer, int target);
/* The seed whose mask element i is element first + i of dseed's mask: a
 * data-parallel rank whose rows start at global row R passes first = R x in,
 * so every rank draws the single process's mask for its rows, not rank 0's. */
uint64_t mf_lora_dropout_at(uint64_t dseed, uint64_t first);

/* Kernels (fp32, row-major, no allocation). p = dropout probability; with
 * p > 0, xd (N,in) is scratch that receives dropout(x); with p == 0 it may
 * be NULL and x is used directly.
 * Forward: u (N,r) = dropout(x) @ A^T; out (N,out) += scale * u @ B^T. */
void mf_lora_forward(float *out, float *u, float *xd, const float *x, const float *A, const float *B,
                     int N, int in, int outd, int r, float scale, float p, uint64_t dseed);
/* The same with out's rows ldo floats apart (an output in a column range). */
void mf_lora_forward_ld(float *out, int ldo, float *u, float *xd, const float *x, const float *A, const float *B,
                        int N, int in, int outd, int r, float scale, float p, uint64_t dseed);
/* Backward, first half (before the base matmul's backward overwrites its
 * input, which may share a buffer with x): recomputes u from x, then
 *   dB (out,r) += scale * dout^T @ u,  du (N,r) = scale * dout @ B,
 *   dA (r,in) += du^T @ dropout(x). */
void mf_lora_backward_params(float *du, float *dA, float *dB, float *u, float *xd, const float *dout,
                             const float *x, const float *A, const float *B, int N, int in, int outd, int r,
                             float scale, float p, uint64_t dseed);
/* The same with dout's rows ldd floats apart. */
void mf_lora_backward_params_ld(float *du, float *dA, float *dB, float *u, float *xd, const float *dout, int ldd,
                                const float *x, const float *A, const float *B, int N, int in, int outd, int r,
                                float scale, float p, uint64_t dseed);
/* Backward, second half: dx (N,in) += dropout'(du @ A) (the same mask).
 * With p > 0, xd (N,in) is scratch. */
void mf_lora_backward_input(float *dx, float *xd, const float *du, const float *A, int N, int in, int r,
                            float p, uint64_t dseed);

/* Reads DIR/adapter_config.json (PEFT's LoraConfig): r, lora_alpha,
 * lora_dropout, target_modules into out; *fan_in_fan_out (may be NULL)
 * gets that flag. -1 with a message naming the file and the problem. */
int mf_lora_read_config(const char *dir, mf_lora_cfg *out, int *fan_in_fan_out);
/* memfit merge: writes model_path's tensors to out_path with the adapter in
 * adapter_dir folded in, W (in,out) += (alpha/r) * (B @ A)^T for every
 * adapted Conv1D weight (unmerge: -=), as PEFT's merge for fan_in_fan_out.
 * Every adapter tensor must fit a weight; other tensors are copied. */
int mf_lora_merge_file(const char *model_path, const char *adapter_dir, const char *out_path, int unmerge);

#ifdef __cplusplus
}
#endif
#endif
