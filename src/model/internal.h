/* What the model's files share and nothing outside src/model/ sees: the
 * plan's derived facts the step needs (plan.c), the tensor and activation
 * accessors the blocks use inside a step. */
#ifndef MEMFIT_MODEL_INTERNAL_H
#define MEMFIT_MODEL_INTERNAL_H
#include "memfit/model.h"

/* plan.c: whether gradients live only in the phases that build them
 * (update_in_backward, ZeRO 2); the GEMM library's and the quantised
 * base's scratch bytes for the largest GEMM on N rows. */
int mf_model_grads_transient(const mf_model *m);
/* A quantised model for inference (memfit quantize's files): the block
 * matrices stored as m->lora.base without LoRA adapters. */
static inline int mf_model_quant_infer(const mf_model *m) {
    return m->mode == MF_MODE_INFER && m->lora.r == 0 && m->lora.base != 0;
}
size_t mf_model_gemm_scratch_need(const mf_model *m, int N);
size_t mf_model_quant_scratch_need(const mf_model *m, int N);

/* Tensor i's parameters (under ZeRO 3 the row gathered for this phase) and
 * its gradient (NULL for a frozen weight). */
float *mf_model_tensor_p(mf_model *m, mf_arena *a, int i);
float *mf_model_tensor_g(mf_model *m, mf_arena *a, int i);
/* The MLP activation output backward reads: its row, or work.dmlp when it
 * is rebuilt right before the layer's backward. */
float *mf_model_mlp_out(mf_model *m, mf_arena *a, const mf_layer_acts *A);

/* A family as data (arch.c): the pieces its blocks compose. */
typedef enum { MF_NORM_LAYERNORM, MF_NORM_RMSNORM } mf_norm_kind;
typedef enum { MF_MLP_GELU, MF_MLP_SWIGLU, MF_MLP_MOE } mf_mlp_kind;
typedef struct {
    mf_norm_kind norm;     /* the blocks' and the final norm */
    int learned_pos;       /* the embedding adds learned positions (wpe) */
    int rope;              /* attention rotates q and k (RoPE; theta and scaling in mf_dims) */
    mf_mlp_kind mlp;       /* GELU: fc -> gelu -> proj; SwiGLU: gate, up -> silu(gate)*up -> down;
                            * MoE: router -> top-k SwiGLU experts (moe_block.c) */
    int w_in_out;          /* projection weights stored (in, out) (Conv1D), else (out, in) (nn.Linear) */
    int proj_bias;         /* every projection has a bias (else only q/k/v, when mf_dims.qkv_bias) */
    int fused_fp32;        /* fp32 without LoRA: the fused bias/residual/LayerNorm/GELU epilogues */
    int bf16_frozen_embed; /* under a quantised base the frozen embedding and head are stored bf16 */
    int lora[MF_LT_COUNT]; /* each projection's LoRA target (lora.h), -1 where the slot is no projection */
} mf_block_desc;
const mf_block_desc *mf_model_block_desc(const mf_dims *d);

/* The block (blocks.c): forward on B x T rows of layer l (recompute: into
 * the rows backward reads, inside the current backward phase; write_out 0:
 * leave the block's output unwritten); backward of layer l (dres holds
 * d(output) and receives d(input)); the rotary table for T positions; the
 * token embedding forward and backward. */
void mf_block_forward(mf_model *m, mf_arena *a, int l, int B, int T, int recompute, int write_out);
/* The mixture-of-experts MLP (moe_block.c): out = xmid + experts(ln2)
 * (out NULL: computed into the work.dln row and dropped, for a rebuild whose
 * output is not alive); recompute: reuse the kept routing decision. Its
 * backward: dln = d(ln2) from d(out) in dres (the residual's part stays in
 * dres). Plan: the rows of layer l's acts (acts/racts moe[]) and the
 * backward scratch. */
void mf_moe_block_forward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2,
                          const float *xmid, float *out, int N, int recompute);
void mf_moe_block_backward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, int N);
/* Qwen2-MoE's shared-expert gate (moe_shared.c), on N rows of C: forward
 * s = sigmoid(x wg^T) (wg (1,C)) and out += s * y (out NULL: s only);
 * backward, from d(out) in dout: dx += dg wg, dwg += dg^T x with
 * dg = s (1 - s) (dout . y), and y's row overwritten by d(y) = s * dout
 * (s's row by dg: both rows' last reader). */
void mf_moe_shared_gate_forward(float *out, float *s, const float *y, const float *x, const float *wg, int N, int C);
void mf_moe_shared_gate_backward(float *dx, float *dwg, float *y, float *s, const float *dout, const float *x,
                                 const float *wg, int N, int C);
/* Layer l's experts for the kernels (moe_lora.c): fp32 stacks into w1, w3,
 * w2, or (quantised base) NULLs and a hook that dequantises one expert at a
 * time into the phase's work.moe.dequant row; LoRA hooks when the experts
 * have adapters. Returns ops, or NULL when no hook is needed. c holds the
 * hooks' state (alive while the kernels run). */
typedef struct {
    mf_model *m;
    mf_arena *a;
    int l;
    float *tile;  /* (3,F,C) one expert's w1|w3|w2 dequantised, or NULL */
    int ids[3];   /* tensor indices of w1, w3, w2 */
    int lora[3];  /* lora_A tensor index of w1, w3, w2's adapters, or -1 */
    int e0;       /* the model's index of the kernels' expert 0 (expert parallel: g*E/N, else 0) */
} mf_moe_expert_ctx;
/* moe_tokens' row l = the slots route r sends to each expert (moe_lora.c) */
void mf_moe_count_tokens(mf_model *m, int l, const mf_moe_route *r, int N);
const mf_moe_expert_ops *mf_moe_expert_setup(mf_model *m, mf_arena *a, int l, mf_moe_expert_ctx *c,
                                             mf_moe_expert_ops *ops, const float **w1, const float **w3,
                                             const float **w2);
/* Expert parallel (moe_ep.c, docs/moe.md; bounds in model.h): the
 * block when the experts are split over an expert group of d->ep ranks. */
void mf_moe_ep_forward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, const float *xmid,
                       float *out, int N, int recompute);
void mf_moe_ep_backward(mf_model *m, mf_arena *a, int l, const mf_layer_acts *A, const float *ln2, int N);
void mf_block_backward(mf_model *m, mf_arena *a, int l, int B, int T);
void mf_model_rope_fill(mf_model *m, mf_arena *a, int T);
/* The embedding block (res[0] from the inputs; rope table) and its
 * backward (gradients from dres); the norm piece (the description's
 * LayerNorm or RMSNorm; dt: the output's dtype) the blocks and the final
 * norm share. */
void mf_embed_block_forward(mf_model *m, mf_arena *a, int B, int T);
void mf_embed_block_backward(mf_model *m, mf_arena *a, int B, int T);
void mf_norm_forward(const mf_model *m, mf_dtype dt, void *out, float *mean, float *rstd, const float *x,
                     const float *w, const float *b, int N);
void mf_norm_backward(const mf_model *m, float *dx, float *dw, float *db, const float *dout, const float *x,
                      const float *w, const float *mean, const float *rstd, int N);
void mf_embed_forward(float *out, const int32_t *inp, const float *wte, int N, int C);
void mf_embed_backward(float *dwte, const float *dout, const int32_t *inp, int N, int C);
/* Packed documents: the (B,T) positions row when the plan has one (packing
 * on), else NULL (the plain causal path, unchanged). */
static inline const int32_t *mf_model_doc_pos(const mf_model *m, mf_arena *a) {
    return m->pos >= 0 ? (const int32_t *)mf_arena_get(a, m->pos) : NULL;
}
#endif
