/* memfit model: decoder-only transformers of two families with an explicit
 * forward and backward per layer:
 *   GPT-2: learned positions, pre-LayerNorm, causal multi-head attention,
 *     GELU(tanh) MLP of 4C, tied embedding; fp32 or mixed precision (16-bit
 *     GEMM operands, docs/precision.md); Conv1D (in, out) weights.
 *   Llama family (Llama 2/3, Qwen2, Mistral, SmolLM2, TinyLlama): RMSNorm,
 *     grouped-query attention with rotary positions (rotate-half, optional
 *     Llama 3 scaling), optional q/k/v biases (Qwen2), optional sliding
 *     window (Mistral), SwiGLU MLP, tied or untied head; nn.Linear (out, in)
 *     weights under Hugging Face's names, so HF folders load without a copy
 *     (docs/models.md).
 *
 * Owns: the model's rows in the plan (weights, gradients, optimizer state,
 * activations, scratch, loader buffers) and the buffer ids that point at
 * them. Promises: every byte the model touches is a plan row, requested
 * through mf_arena_get in the phase its row declares; sizes are computed
 * only in mf_model_plan. The vocabulary is padded to a multiple of 64 rows
 * (Vp) and padding never enters the loss.
 */
#ifndef MEMFIT_MODEL_H
#define MEMFIT_MODEL_H

#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/kernels.h"
#include "memfit/lora.h"
#include "memfit/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MF_ARCH_GPT2 = 0, MF_ARCH_LLAMA = 1 } mf_arch;

/* A model's shape. GPT-2 uses L, C, NH, maxT, V (NKV = NH, hd = C/NH,
 * ffn = 4C); the Llama family uses all of it. */
typedef struct {
    mf_arch arch;
    int L, C, NH, maxT, V, Vp;
    int NKV;              /* key/value heads (grouped-query attention; divides NH) */
    int hd;               /* head dimension (HF head_dim; may differ from C/NH) */
    int ffn;              /* MLP hidden width (HF intermediate_size) */
    int tied;             /* the output head is the embedding matrix */
    int qkv_bias;         /* q/k/v projections have biases (Qwen2) */
    int window;           /* sliding-window attention span (Mistral), 0 = none */
    float eps;            /* RMSNorm epsilon (GPT-2's LayerNorm: 1e-5) */
    double rope_theta;
    mf_rope_scaling rope; /* rope_scaling (type MF_ROPE_NONE: none) */
    char hf_arch[32];     /* HF architectures[0] written into config.json */
    int share;            /* cross-layer sharing: the L blocks use `share` weight sets, block l uses set
                           * l % share (ALBERT); 0 = none (every block its own); divides L */
    /* mixture of experts (Mixtral; docs/moe.md): 0 experts = a dense MLP */
    int n_experts;        /* HF num_local_experts (E) */
    int top_k;            /* HF num_experts_per_tok (k <= E) */
    int norm_topk_prob;   /* renormalise the k routing weights to sum 1 (Mixtral: 1) */
    float aux_coef;       /* router_aux_loss_coef (load balancing) */
    float z_coef;         /* router_z_loss_coef */
    double capacity_factor; /* --capacity_factor: a run setting, not the shape (not in the dims string);
                             * <= 0 dropless */
    int shared_ffn;       /* Qwen2-MoE's shared expert: HF shared_expert_intermediate_size (a SwiGLU every
                           * token runs, its output times sigmoid(shared_expert_gate . x) added to the
                           * routed experts'); 0 = none (Mixtral). ffn is then moe_intermediate_size */
    int ep;               /* --expert_parallel: ranks per expert group (a run setting; <= 1 = off): each
                           * rank holds experts [g*E/ep, (g+1)*E/ep) of every layer, g = rank % ep */
    char tokenizer[MF_PATH_MAX]; /* the run's tokenizer: gpt2, bytes, or a tokenizer.json's path */
} mf_dims;

typedef struct {
    const char *name;
    mf_dims d;            /* tokenizer and Vp are filled by mf_model_dims */
    const char *tokenizer;  /* default tokenizer, "gpt2" or "bytes" (any model takes --tokenizer
                             * PATH/tokenizer.json; --init DIR takes DIR/tokenizer.json) */
    const char *note;
} mf_preset;

/* The preset table; *n receives its length. */
const mf_preset *mf_model_presets(int *n);

/* Preset named by cfg->model (or, when cfg->init is a directory, the
 * Hugging Face config.json in it: src/model/hf.c), then the explicit
 * n_layer/... overrides; validates (heads divide, seq <= block_size, ...). */
int mf_model_dims(const mf_config *cfg, mf_dims *d);
/* Finishes and validates d (Vp; head and width constraints); -1 with a message. */
int mf_model_dims_check(mf_dims *d);
/* The shape as one line for checkpoint metadata ("L,C,H,T,V" for GPT-2,
 * "llama:..." with every field for the Llama family), and back (validated). */
int mf_model_dims_str(const mf_dims *d, char *buf, size_t n);
int mf_model_dims_parse(const char *s, mf_dims *d);
/* Input and output width of LoRA target k (lora.h) in a model of shape d. */
void mf_model_lora_dims(const mf_dims *d, int k, int *in, int *out);
/* Hugging Face folders (hf.c). read_config: DIR/config.json into d (Llama,
 * Qwen2, Mistral), -1 naming the file and the problem; write_config: the
 * same keys back (atomically). weight_files: the safetensors files of DIR
 * (model.safetensors, or every shard the index names, each checked to
 * exist); free them with mf_hf_free_files. */
int mf_hf_read_config(const char *dir, mf_dims *d);
int mf_hf_write_config(const char *path, const mf_dims *d);
int mf_hf_weight_files(const char *dir, char ***files, int *n);
void mf_hf_free_files(char **files, int n);
/* Weights of one block's matrices (GEMM parameters per token, /2 = FLOPs/2). */
int64_t mf_model_block_matmul_params(const mf_dims *d);
/* Attention score FLOPs of one block's forward on B sequences of T tokens
 * (QK^T and PV; the sliding window's skipped part excluded). */
double mf_model_attention_flops(const mf_dims *d, int B, int T);
/* Expert parallel (--expert_parallel; moe_ep.c, docs/moe.md): the bounds
 * the plan sizes the exchange rows for, with N tokens per rank: rows this rank sends at most (send: N*k
 * dropless, min(N*k, E*cap) with a capacity), rows its experts receive at
 * most (recv: ep*N*min(k, E/ep), or min(that, E/ep*cap)), rows one expert
 * gets at most (group: ep*N or min(ep*N, cap)); cap = the capacity of the
 * group's ep*N tokens (0 dropless). */
int mf_moe_ep_bounds(const mf_dims *d, int N, int64_t *send, int64_t *recv, int64_t *group, int *cap);
/* Parameters as Hugging Face counts them (unpadded vocabulary; a shared
 * model counts its weight sets once). */
int64_t mf_model_n_params(const mf_dims *d);
/* Cross-layer sharing: the distinct block weight sets (d->share, or L
 * unshared) and the set block l reads and writes (l % share). */
static inline int mf_model_weight_sets(const mf_dims *d) { return d->share ? d->share : d->L; }
static inline int mf_model_weight_set(const mf_dims *d, int l) { return d->share ? l % d->share : l; }
/* Parameters one token uses (a mixture of experts runs k of E experts;
 * the embedding, head and router all count); == n_params for dense models. */
int64_t mf_model_n_active(const mf_dims *d);

typedef enum { MF_MODE_TRAIN, MF_MODE_INFER } mf_mode;

/* Activation checkpointing (Chen et al. 2016). NONE keeps every activation
 * the backward needs; SELECTIVE keeps the matmul outputs and rebuilds the
 * LayerNorm and GELU outputs in backward; FULL keeps only each block's input
 * and recomputes the block inside its backward. Rebuilt activations live in
 * one layer's worth of buffers shared by all layers. (Attention never keeps
 * its T x T scores: the FlashAttention kernel recomputes them.) */
typedef enum { MF_RECOMPUTE_NONE, MF_RECOMPUTE_SELECTIVE, MF_RECOMPUTE_EVERY, MF_RECOMPUTE_SQRT,
               MF_RECOMPUTE_AUTO } mf_recompute_policy;
/* EVERY keeps the input of every `every`-th block and recomputes segments
 * of that many blocks; "full" is every:1; SQRT uses segments of
 * ceil(sqrt(L)) blocks. AUTO recomputes the lowest `every` blocks in full
 * and keeps the rest; mf_model_build_plan picks the count from the budget. */
typedef struct { mf_recompute_policy policy; int every; } mf_recompute;
/* Parses "none" / "selective" / "full" / "every:N" / "sqrt"; -1 with a
 * message otherwise. */
int mf_recompute_parse(const char *s, mf_recompute *out);

#define MF_LAYER_TENSORS 17   /* the most tensors one block has (Qwen2-MoE's) */

/* What a tensor is to the model, beyond its name. */
typedef enum { MF_ROLE_LAYER = 0, MF_ROLE_EMB, MF_ROLE_POS, MF_ROLE_NORMF, MF_ROLE_HEAD } mf_role;

typedef struct {
    char name[64];      /* Hugging Face name: GPT-2's h.3.attn.c_attn.weight, Llama's
                         * model.layers.3.self_attn.q_proj.weight */
    mf_role role;
    int ndim;
    int64_t shape[2];   /* stored shape (wte: Vp rows) */
    int64_t rows_file;  /* rows in files (wte: V) */
    int64_t numel;
    int decay;          /* AdamW weight decay applies (2-D by default; the trainer applies decay_on) */
    int p, g;           /* plan ids: param, grad (-1 if none) */
    int g16;            /* grad_dtype bf16: g is a bf16 row (a 16-bit weight's gradient), else fp32 */
    int st[MF_OPTIM_STATES]; /* optimizer state rows (mf_optim_plan; -1 if none) */
    mf_optim_shape os;  /* the tensor as the optimizer sees it (ZeRO >= 1: this rank's shard, 1-D) */
    int64_t lo, hi;     /* this rank's shard of the elements (dist/; [0, numel) unless ZeRO >= 1 on > 1 rank) */
    int gs;             /* ZeRO 2 and 3: the persistent gradient shard row (hi - lo floats), else -1 */
    int mw;             /* 16-bit precision: the fp32 master weights row (category master), else -1;
                         * p is then the 16-bit compute copy, rounded from mw after every update */
    int ps, pb;         /* ZeRO 3: the persistent parameter shard row, and the full row backward
                         * gathers into (p is then the one forward gathers into); else -1 */
    int lora;           /* a LoRA adapter matrix (lora_A / lora_B; category adapter) */
    int frozen;         /* a base weight under LoRA: no gradient, no optimizer state (g = -1) */
    int qkind;          /* frozen Conv1D weight stored quantised (mf_quant_kind; 0 = fp32): row p is
                         * mf_quant_bytes(qkind, numel) U8 bytes, multiplied through quant.h's GEMMs */
    int64_t ep_lo, ep_full; /* expert parallel: this rank's experts are elements [ep_lo, ep_lo + numel)
                             * of the whole stack of ep_full elements; ep_full 0 for every other tensor */
    int gx;             /* update_in_backward on a mixture's expert stack (mf_model_expert_grads): row g
                         * holds one expert's gradient (shape[0] / n_experts rows), reused expert after
                         * expert, each expert updated as it completes (moe_block.c); 0: g is whole */
    int64_t gnumel;     /* elements of row g: numel, or one expert's numel / n_experts when gx */
} mf_tensor;

typedef struct {
    int ln1, ln1_mean, ln1_rstd;  /* (N,C) (N) (N) */
    int qkv;                      /* (N,3C) */
    int lse;                      /* (B,NH,T) attention rows' log-sum-exp */
    int atty;                     /* (N,C) attention output before c_proj */
    int xmid;                     /* (N,C) residual after attention (ln_2 input) */
    int ln2, ln2_mean, ln2_rstd;  /* (N,C) (N) (N) */
    int fch, fch_gelu;            /* (N,4C) (N,4C); Llama: gate (N,I) and silu(gate)*up (N,I) */
    int up;                       /* Llama: (N,I) up_proj output; -1 for GPT-2 */
    /* mixture of experts (-1 for a dense MLP): moe[b] is mf_moe_buf b's row
     * (kernels.h) for b < MF_MOE_BUF_DLOGITS; the router's state (probs ..
     * frac) is kept per layer under every recompute policy, so a rebuilt
     * block routes as the forward did */
    int moe[MF_MOE_BUF_COUNT];
    /* expert parallel (moe_ep.c; -1 otherwise): the group's per-expert slot
     * counts (ep x E i32), and the rows this rank's experts received: their
     * grouped input (R_recv, C), each received row's grouped position
     * (R_recv i32) and the group offsets (E/ep + 1 i32) */
    int moe_ep[4];
    /* Qwen2-MoE's shared expert (-1 otherwise; its SwiGLU uses fch, up,
     * fch_gelu at width shared_ffn): the down projection's output (N,C)
     * and sigmoid(gate logit) (N), kept for backward */
    int sh_y, sh_s;
} mf_layer_acts;

/* A block's tensors by what they do (mf_model.lt gives their offsets in
 * the block, -1 when the family has none). GPT-2 fills LN1/LN1B, Q (its
 * c_attn: q|k|v in one matrix) and QB, O/OB (attn.c_proj), LN2/LN2B, GATE
 * (mlp.c_fc) and GATEB, DOWN/DOWNB (mlp.c_proj); a Llama LN1, Q, K, V (and
 * Qwen2's QB, KB, VB), O, LN2, GATE, UP, DOWN. */
enum { MF_LT_LN1, MF_LT_Q, MF_LT_QB, MF_LT_K, MF_LT_KB, MF_LT_V, MF_LT_VB, MF_LT_O, MF_LT_LN2, MF_LT_GATE,
       MF_LT_UP, MF_LT_DOWN, MF_LT_LN1B, MF_LT_OB, MF_LT_LN2B, MF_LT_GATEB, MF_LT_DOWNB,
       /* mixture of experts (in place of GATE, UP, DOWN): the router (E,C) and
        * the experts' stacked w1 (E*F,C), w3 (E*F,C), w2 (E*C,F) */
       MF_LT_ROUTER, MF_LT_W1, MF_LT_W3, MF_LT_W2,
       /* Qwen2-MoE's shared expert: GATE, UP, DOWN (width shared_ffn) are
        * mlp.shared_expert.*_proj, SHGATE its (1,C) mlp.shared_expert_gate */
       MF_LT_SHGATE, MF_LT_COUNT };

typedef struct {
    mf_dims d;
    int B, T;             /* planned micro-batch; forward runs on any B' x T' that mf_model_fits */
    mf_mode mode;
    int nthreads;
    int n_phases;
    int n_tensors;
    mf_tensor *tensors;   /* GPT-2: wte, wpe, h.0.* .. h.{L-1}.*, ln_f.weight, ln_f.bias;
                           * Llama: embed_tokens, layers.0.* .., norm, [lm_head] */
    int t_emb, t_pos;     /* the embedding (0) and GPT-2's wpe (1; -1 for Llama) */
    int t_layer0, nlt;    /* layer l's tensors are [t_layer0 + l*nlt, +nlt) */
    int t_normf, n_normf; /* the final norm's tensors (weight, GPT-2's bias) */
    int t_head;           /* the untied output head, -1 when tied to t_emb */
    int lt[MF_LT_COUNT];  /* offset in a block of each MF_LT_* tensor, -1 if absent */
    int rope;             /* Llama: the cos/sin table (work, the whole run), -1 for GPT-2 */
    int rope_T;           /* positions the table can hold */
    int rope_filled;      /* positions it holds now (0: not filled yet) */
    int inputs, targets;  /* (B,T) int32, category data; a target MF_TARGET_IGNORE (-1) is not in the loss */
    int pos;              /* packing: (B,T) int32 position of each token in its document (0 at its first
                           * token), category data; attention stays within a document; -1 without packing */
    int *res;             /* L+1 residual streams (N,C) as forward writes them; res[0] = embeddings */
    int *rres;            /* L+1: the same as backward reads them (rebuilt ones differ) */
    mf_layer_acts *acts;  /* L: rows the forward pass writes */
    mf_layer_acts *racts; /* L: rows backward reads; fch_gelu -1 = rebuilt into dbig */
    int lnf, lnf_mean, lnf_rstd, logits, losses;
    int chunk_rows;       /* logits rows that exist at once (loss_chunk) */
    mf_recompute recompute;
    int seg;              /* checkpointed segment length in blocks (0 = none) */
    int auto_k;           /* auto: blocks 0..auto_k-1 are recomputed in full */
    int logits_all;       /* last sampling forward computed every row */
    int dres, dln, dbig, dqkv, attn_scratch; /* backward scratch, one layer's worth */
    mf_optim opt;         /* training: the optimizer whose state rows are planned */
    int offload_win[2];   /* offloaded state: the two streaming windows (optimizer phase), else -1 */
    /* update_in_backward and ZeRO 2: called when tensors [first, first+n)
     * have their complete gradient (inside the backward phase that finished
     * them); their gradient rows live only while backward builds them */
    void (*grads_ready)(void *ctx, int first, int n);
    /* update_in_backward on a mixture's expert stacks (mf_tensor.gx): rows
     * [r0, r0+nr) of tensor i (one expert) have their complete gradient g
     * (nr x shape[1] fp32), called inside the layer's backward as each
     * expert finishes; grads_ready then leaves the stacks out */
    void (*grads_rows_ready)(void *ctx, int i, int64_t r0, int64_t nr, const float *g);
    void *grads_ctx;
    mf_dtype cdt;         /* precision: F32, or BF16/F16 for GEMM weights (2-D tensors but wpe) and
                           * the activations GEMMs read (ln1, ln2, fch_gelu, ln_f); docs/precision.md */
    int in16;             /* 16-bit: (N,C) attention output rounded for c_proj, else -1 */
    int dout16;           /* 16-bit: (N,4C) a GEMM's output gradient rounded for its backward, else -1 */
    int dlogits16;        /* 16-bit: (head_dw_rows,Vp) rounded d(loss)/d(logits), else -1 */
    int head_dw_rows;     /* 16-bit training: rows of d(logits) one head weight-gradient GEMM sums
                           * (mf_model_head_dw_rows; chunk_rows for a frozen head) */
    /* update_in_backward with the embedding tied to the head (docs/memory.md):
     * the head's gradient (V x C) lives only in the head's phase; there the
     * rows no input token touches are updated, and the touched rows move
     * to emb_rows (one row per distinct input token) where the embedding's
     * backward adds to them and the update finishes them */
    int emb_split;        /* 1 when the above applies */
    int emb_rows;         /* (N, C) fp32: the touched rows' gradient, head to embedding backward, else -1 */
    int emb_index;        /* (2N) int32: each input position's slot in emb_rows, then the slots' token ids */
    int emb_map;          /* (V) int32: token -> slot or -1, head phase only */
    int emb_nuniq;        /* slots in use this micro-step */
    int emb_stage;        /* grads_ready for the embedding: 1 = untouched rows (head), 2 = touched rows */
    int emb_fold;         /* grad_dtype bf16 without emb_split: the embedding backward widens each distinct
                           * token's bf16 gradient row into a slot of emb_rows (fp32, a work row of its
                           * phase), adds the token's positions there and rounds the slot back once */
    int upd32;            /* bf16 without master weights: fp32 scratch (optimizer phase) the update of one
                           * 16-bit tensor runs in before stochastic rounding back; grad_dtype bf16: also
                           * the slice of the gradient widened for the update (last slot), else -1 */
    int64_t upd_slice;    /* elements per slot of upd32 */
    int gemm_scratch;     /* the GEMM library's scratch (bytes below; fp32: only with the matmul backend), else -1 */
    size_t gemm_scratch_bytes;
    int comm;             /* dist: the ring collectives' scratch row (mf_zero_plan), else -1 */
    int comm_err;         /* ZeRO 3: a parameter gather failed (message in mf_error) */
    int prefetch;         /* ZeRO 3: gather the next layer's parameters while this one runs
                           * (its rows live one phase earlier); MEMFIT_ZERO_PREFETCH=0 turns it off */
    int pf_first;         /* ZeRO 3: first tensor of the gather in flight, else -1 */
    int overlap;          /* ZeRO 0-3: a block's gradients are reduced in the background during the next
                           * phase (ZeRO 2-3: their rows live one phase longer; ZeRO 0-1: in the step's last
                           * micro-batch, grads_final); MEMFIT_ZERO_OVERLAP=0 turns it off */
    int grads_final;      /* trainer: this micro-batch completes the step's gradients */
    /* LoRA (lora.h): adapters on the targeted matmuls of a frozen base */
    mf_lora_cfg lora;     /* lora.r == 0: none */
    int lora_first;       /* tensors[lora_first..]: per layer, per target in order, lora_A then lora_B */
    int lora_u, lora_du;  /* work rows (N,r): dropout(x) @ A^T and its gradient */
    int lora_xf, lora_xb; /* work rows (N, widest input): dropout(x) in forward / backward phases (-1 without dropout);
                           * under 16-bit compute a projection's input widened to fp32 (mf_lora_x32), dropped in place */
    uint64_t lora_seed;   /* dropout seed (the run's seed) */
    uint64_t lora_micro;  /* micro-step counter the trainer sets before each training forward */
    int lora_drop;        /* dropout is on in the last forward (training forward with dropout > 0) */
    int qscr_f, qscr_b;   /* quantised base: GEMM scratch rows in forward / backward layer phases, else -1 */
    size_t qscr_bytes;    /* their size */
    /* mixture of experts: the backward scratch rows (mf_moe_buf
     * MF_MOE_BUF_DLOGITS..; -1 elsewhere), the capacity (slots per expert,
     * 0 dropless) and permuted rows R the plan is sized for; the last
     * forward's router losses (mean over layers), dropped slots, and the
     * aux/z losses' gradient scale for backward */
    int moe_work[MF_MOE_BUF_COUNT];
    int moe_deq_f, moe_deq_b; /* a quantised frozen base (QLoRA): one expert's w1|w3|w2 (3 x F x C)
                               * dequantised to fp32, in forward / backward layer phases, else -1 */
    int moe_lora_u, moe_lora_du; /* adapters on the experts: (R, r) rows, each expert's group its slice, else -1 */
    int moe_x32;              /* precision bf16/fp16: the router's fp32 input, ln2 (16-bit) widened (N,C), else -1 */
    int moe_capacity;
    int64_t moe_rows;
    double moe_aux, moe_z;
    int64_t moe_dropped;
    float moe_gscale;
    int64_t *moe_tokens;  /* (L,E) token-slots the router sent to each expert (before capacity drops) in the
                           * last training forward; NULL for a dense model */
    int moe_count;        /* the forward running now is a training one (it records moe_tokens) */
    /* expert parallel (moe_ep.c; -1 otherwise): the exchange's receive
     * row, the owner's output/input-gradient row (both R_recv x C in source
     * order), the grouped output gradient (R_recv, C), the owner's routing
     * weights (R_recv ones) and its discarded weight gradients (R_recv);
     * the plan's bounds: rows this rank sends and receives at most */
    int moe_ep_work[5];
    int64_t moe_ep_send, moe_ep_recv;
    struct mf_teacher *teacher; /* distillation (distill.h): the frozen teacher, NULL without one */
} mf_model;

/* The plan a config implies, without data or arena (build.c; memfit
 * estimate, the trainer and the planner's search). With recompute "auto",
 * the fewest recomputed blocks whose arena plus `overhead` (the measured
 * runtime) fits cfg->budget. */
int mf_model_build_plan(const mf_config *cfg, mf_mode mode, int nthreads, size_t overhead,
                        mf_dims *d, mf_plan *plan, mf_model *model);

/* Phases of one micro-step (lifetimes are ranges of these). */
int mf_phase_emb_fwd(const mf_model *m);
int mf_phase_layer_fwd(const mf_model *m, int l);
int mf_phase_head_fwd(const mf_model *m);
int mf_phase_head_bwd(const mf_model *m);
int mf_phase_layer_bwd(const mf_model *m, int l);
int mf_phase_emb_bwd(const mf_model *m);
int mf_phase_optim(const mf_model *m);
const char *mf_phase_name(const mf_model *m, int ph, char *buf, size_t n);

/* Declares every row of the model in `plan` (which must have been
 * initialised with mf_model_n_phases). Training plans declare the state
 * rows of `opt` (copied into the model); forward-only plans pass NULL. */
int mf_model_n_phases(const mf_dims *d, mf_mode mode);
int mf_model_plan(mf_model *m, mf_plan *plan, const mf_dims *d, int B, int T,
                  mf_mode mode, int nthreads, int loss_chunk, mf_recompute recompute,
                  const mf_optim *opt);
/* The same with LoRA adapters (lora NULL or lora->r == 0: none). With
 * adapters the base weights are frozen: no gradient and no optimizer rows. */
int mf_model_plan_lora(mf_model *m, mf_plan *plan, const mf_dims *d, int B, int T,
                       mf_mode mode, int nthreads, int loss_chunk, mf_recompute recompute,
                       const mf_optim *opt, const mf_lora_cfg *lora);
void mf_model_free(mf_model *m);

/* LoRA hooks around target k of layer l (src/model/lora_hooks.c); each does
 * nothing when k has no adapter. forward: y += the adapter's output on x.
 * backward_params (before the base matmul's backward): dA, dB, and the
 * low-rank gradient kept for backward_input (after it): dx += its part. */
int mf_lora_tensor(const mf_model *m, int l, int k); /* index of lora_A (lora_B is +1), -1 if none */
void mf_lora_layer_forward(mf_model *m, mf_arena *a, int l, int k, const float *x, float *y, int N);
void mf_lora_layer_backward_params(mf_model *m, mf_arena *a, int l, int k, const float *dy, const float *x, int N);
void mf_lora_layer_backward_input(mf_model *m, mf_arena *a, int l, int k, float *dx, int N);
/* The same with the output (gradient) rows ldy floats apart: q, k and v
 * write column ranges of the Llama block's qkv rows. */
/* 16-bit compute: x (N, in; 16-bit, m->cdt) widened exactly into the fp32
 * row of the phase we are in (work.lora_x32.fwd / .bwd), which it returns;
 * the adapters' GEMMs and a quantised base's read fp32 inputs. */
const float *mf_lora_x32(mf_model *m, mf_arena *a, const void *x, int N, int in);
void mf_lora_layer_forward_ld(mf_model *m, mf_arena *a, int l, int k, const float *x, float *y, int ldy, int N);
void mf_lora_layer_backward_params_ld(mf_model *m, mf_arena *a, int l, int k, const float *dy, int ldy,
                                      const float *x, int N);
/* PEFT's init: every lora_A Kaiming-uniform (seeded per tensor), lora_B zero. */
void mf_lora_init_weights(mf_model *m, mf_arena *a, uint64_t seed);
/* Adapters in PEFT's layout (src/model/adapter.c): DIR/adapter_model.safetensors
 * (base_model.model.transformer.h.{i}.<target>.lora_A.weight (r,in) and
 * .lora_B.weight (out,r), fp32) and DIR/adapter_config.json, each written
 * atomically; base_name goes to base_model_name_or_path. Loading checks
 * every name and shape against the model's adapters (r, targets, layers). */
int mf_lora_save_adapter(const mf_model *m, const mf_arena *a, const char *dir, const char *base_name);
int mf_lora_load_adapter(mf_model *m, mf_arena *a, const char *dir);
/* Set-up only: an arena row (not persistent, so free outside the step) of at
 * least n floats to stage a weight before it is packed, or NULL. */
float *mf_model_stage(const mf_model *m, const mf_arena *a, int64_t n);
/* Trainable parameters (all of them without LoRA, the adapters' with it). */
int64_t mf_model_n_trainable(const mf_model *m);

/* GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1; optimizer state and gradients zero. */
void mf_model_init_weights(mf_model *m, mf_arena *a, uint64_t seed);
/* The row that holds tensor t's fp32 weights: its master row under 16-bit
 * precision with master weights, else its parameter row (which is 16-bit
 * when t is a 16-bit tensor without master weights). */
int mf_tensor_weights_row(const mf_tensor *t);
/* 1 when tensor t's parameter row is 16-bit. */
/* update_in_backward with a tied embedding: updates split by rows (the
 * model's emb_split; plain AdamW, 8-bit AdamW with a block per row, SGD). */
int mf_model_emb_split(const mf_model *m);
/* update_in_backward on a mixture of experts: each expert's gradient in a
 * row of one expert, updated as soon as the expert's backward is done
 * (mf_tensor.gx; plain AdamW, SGD, 8-bit AdamW when its blocks tile an
 * expert; not Adafactor, whose statistics span the stack; docs/moe.md). */
int mf_model_expert_grads(const mf_model *m);
int mf_tensor_is16(const mf_model *m, const mf_tensor *t);
/* 1 for a tensor that stays fp32 whatever the precision although it is a
 * matrix: a mixture of experts' router (top-k decisions are brittle under
 * 16-bit logits; docs/moe.md). */
int mf_tensor_keep32(const char *name);
/* Rounds the master weights of tensors [first, first+n) into their 16-bit
 * compute copies (nearest-even); tensors without a master row are skipped. */
void mf_model_sync_params(const mf_model *m, const mf_arena *a, int first, int n);
/* 16-bit precision: runs every GEMM shape the plan for (B, T, loss_chunk)
 * will run once on zeroed heap operands (freed again), so the GEMM
 * library's code and caches exist before the baseline RSS is read (as
 * mf_blas_warmup does for OpenBLAS). No-op for F32. */
/* 16-bit training: the rows of rounded d(logits) the head's weight
 * gradient sums in one GEMM, a whole number of loss chunks of R rows (or
 * all N): at least MF_HEAD_DW_ROWS. Each such GEMM reads and writes the
 * whole fp32 V x C gradient, so on R = 256 rows it is memory-bound:
 * gpt2-124m's 4 x 256 rows took 168-170 ms, 2 x 512 140-142 ms, 1 x 1024
 * 130-135 ms (docs/performance.md). */
enum { MF_HEAD_DW_ROWS = 512 };
int mf_model_head_dw_rows(int N, int R);
int mf_model_gemm16_warmup(const mf_dims *d, mf_dtype dt, int B, int T, int loss_chunk, int train, int grad16);
/* Pointers to tensor t's optimizer state rows (NULL where unused). */
void mf_model_state_ptrs(const mf_model *m, const mf_arena *a, const mf_tensor *t, void *ptr[MF_OPTIM_STATES]);
/* Sets tensor t's optimizer state to "no steps yet". */
void mf_model_zero_state(const mf_model *m, const mf_arena *a, const mf_tensor *t);

/* The run-time guard: 1 when a forward and backward on B sequences of T
 * tokens fit the planned buffers (B x T <= the planned tokens, T <= the
 * model's block_size, and the attention, GEMM and dequantisation scratch
 * that shape needs within what was planned), else 0. Rows and columns may
 * trade: fewer, longer sequences fit as well as more, shorter ones. */
int mf_model_fits(const mf_model *m, int B, int T);
/* Forward on B x T tokens (B rows of T, that mf_model_fits; inputs/targets
 * (and pos, with packing) already in the arena). Returns the mean loss over
 * the positions whose target is not MF_TARGET_IGNORE (0 if none); the
 * gradient is each counted position's times dscale. If dscale != 0
 * (training), the head also leaves d(loss)/d(logits) * dscale in the
 * logits buffer for mf_model_backward. If targets is 0, no loss is
 * computed (sampling) and 0 is returned. */
double mf_model_forward(mf_model *m, mf_arena *a, int B, int T, int use_targets, float dscale);
/* Backward of the last forward; accumulates into the gradients. */
void mf_model_backward(mf_model *m, mf_arena *a, int B, int T);
/* Logits row of (b, t) after a forward without targets (valid until the next
 * phase change). Every row exists when B*T <= chunk_rows; otherwise only each
 * sequence's last position (t = T-1). */
const float *mf_model_logits(mf_model *m, mf_arena *a, int T, int b, int t);
/* Zeroes every gradient before a step's first micro-batch (with
 * update_in_backward the model zeroes each gradient at its first phase). */
void mf_model_zero_grads(mf_model *m, mf_arena *a);

#ifdef __cplusplus
}
#endif
#endif
