/* What the model's files share and nothing outside src/model/ sees: the
 * tensor and activation accessors the family blocks (gpt2.c, llama.c) use
 * inside a step. */
#ifndef MEMFIT_MODEL_INTERNAL_H
#define MEMFIT_MODEL_INTERNAL_H
#include "memfit/model.h"

/* Tensor i's parameters (under ZeRO 3 the row gathered for this phase) and
 * its gradient (NULL for a frozen weight). */
float *mf_model_tensor_p(mf_model *m, mf_arena *a, int i);
float *mf_model_tensor_g(mf_model *m, mf_arena *a, int i);
/* The MLP activation output backward reads: its row, or work.dmlp when it
 * is rebuilt right before the layer's backward. */
float *mf_model_mlp_out(mf_model *m, mf_arena *a, const mf_layer_acts *A);

/* The Llama block (llama.c): forward on B x T rows of layer l (recompute:
 * into the rows backward reads, inside the current backward phase;
 * write_out 0: leave the block's output unwritten); backward of layer l
 * (dres holds d(output) and receives d(input)); the rotary table for T
 * positions; the token embedding forward and backward. */
void mf_llama_block_forward(mf_model *m, mf_arena *a, int l, int B, int T, int recompute, int write_out);
void mf_llama_block_backward(mf_model *m, mf_arena *a, int l, int B, int T);
void mf_llama_rope_fill(mf_model *m, mf_arena *a, int T);
void mf_embed_forward(float *out, const int32_t *inp, const float *wte, int N, int C);
void mf_embed_backward(float *dwte, const float *dout, const int32_t *inp, int N, int C);
/* Packed documents: the (B,T) positions row when the plan has one (packing
 * on), else NULL (the plain causal path, unchanged). */
static inline const int32_t *mf_model_doc_pos(const mf_model *m, mf_arena *a) {
    return m->pos >= 0 ? (const int32_t *)mf_arena_get(a, m->pos) : NULL;
}
#endif
