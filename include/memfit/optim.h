/* memfit optim: AdamW, the learning-rate schedule and gradient clipping.
 *
 * Owns nothing: state tensors are plan rows passed in by the caller.
 * Promises: the update matches torch.optim.AdamW (decoupled weight decay,
 * bias correction) operation for operation in fp32; clipping matches
 * torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6),
 * clamped to 1) and is folded into the update as a gradient scale.
 */
#ifndef MEMFIT_OPTIM_H
#define MEMFIT_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include "memfit/config.h"
#include "memfit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step on n elements; t is the 1-based step count; g is
 * multiplied by gscale first. wd = 0 for tensors that do not decay. */
void mf_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float wd,
                     int t, float gscale);
/* The same, also writing the new p rounded to bf16 (nearest-even) into p16
 * when it is not NULL: bf16 compute weights from fp32 masters in one pass. */
void mf_adamw_update16(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float wd, int t, float gscale);

/* Linear warm-up over cfg->warmup steps, then cosine decay to
 * lr * min_lr_frac at cfg->steps. step is 0-based. */
double mf_lr_at(const mf_config *cfg, int step);

/* Gradient scale for global-norm clipping (1 when clip <= 0). */
float mf_clip_scale(double grad_norm, double clip);

/* ---- 8-bit AdamW: block-wise quantised state ---------------------------
 * Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization"
 * (arXiv:2110.02861), following bitsandbytes: each state tensor is split
 * into blocks of `block` elements; a block stores one fp32 absmax and one
 * byte per element, the index of the map entry nearest to x / absmax.
 * m uses the signed dynamic map, v the unsigned one. State for n elements:
 * 2*n bytes + 2*4*mf_q8_nblocks(n, block) bytes of absmax. */

#define MF_Q8_MAX_BLOCK 4096 /* largest block the update accepts (stack use) */

/* bitsandbytes.functional.create_dynamic_map(signed=is_signed,
 * max_exponent_bits=7, total_bits=8): 256 distinct values sorted ascending,
 * 0 and 1.0 included. Signed: [-0.99296875, 1] (no -1: -absmax is stored
 * as -0.99296875*absmax); unsigned: [0, 1]. */
void mf_q8_map_dynamic(float map[256], int is_signed);

/* ceil(n / block): the number of absmax values of an n-element state. */
size_t mf_q8_nblocks(size_t n, int block);

/* Bytes of 8-bit AdamW state (m and v) for n elements. */
size_t mf_adamw8bit_state_bytes(size_t n, int block);

/* Block-wise quantisation of x[n]: absmax[b] = max |x| over block b, q[i] =
 * index of the map entry nearest to x[i] / absmax[b] (0 for an all-zero
 * block). q has n bytes, absmax mf_q8_nblocks(n, block) floats. */
void mf_q8_quantize(uint8_t *q, float *absmax, const float *x, size_t n,
                    int block, const float map[256]);
/* x[i] = map[q[i]] * absmax[i / block]. */
void mf_q8_dequantize(float *x, const uint8_t *q, const float *absmax,
                      size_t n, int block, const float map[256]);
/* A state that dequantises to exactly 0: q = index of 0.0 in map, absmax 0. */
void mf_q8_state_zero(uint8_t *q, float *absmax, size_t n, int block,
                      const float map[256]);

/* One AdamW step with 8-bit m (qm, absmax_m; signed map) and v (qv,
 * absmax_v; unsigned map). Per block: dequantise, the same fp32 arithmetic
 * as mf_adamw_update (p is updated from the unquantised new m, v), then
 * requantise with the block's new absmax. 1 <= block <= MF_Q8_MAX_BLOCK
 * (the caller validates it; anything else is a bug and panics). */
void mf_adamw8bit_update(float *p, const float *g, uint8_t *qm, float *absmax_m,
                         uint8_t *qv, float *absmax_v, size_t n, int block,
                         const float map_signed[256], const float map_unsigned[256],
                         float lr, float beta1, float beta2, float eps, float wd,
                         int t, float gscale);

/* ---- Adafactor ----------------------------------------------------------
 * Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear
 * Memory Cost" (arXiv:1804.04235), following transformers.optimization.
 * Adafactor (itself fairseq's): beta2_t = 1 - t^decay_rate; the second
 * moment of g^2 + eps1 is kept as row and column means for a 2-D tensor,
 * in full otherwise; the update g / sqrt(v_hat) is divided by
 * max(1, RMS(update) / clip_threshold) and scaled by the step size
 *   lr_t = (relative_step ? min(warmup_init ? 1e-6 t : 1e-2, 1/sqrt(t)) : lr)
 *          * (scale_parameter ? max(eps2, RMS(p before the step)) : 1);
 * then optionally averaged into m (beta1 > 0), and
 *   p <- p - wd * lr_t * p - update   (decoupled decay, scaled by lr_t). */
typedef struct {
    float lr;             /* external step size; unused when relative_step */
    int relative_step;    /* lr_t from the step count (transformers default 1) */
    int scale_parameter;  /* scale lr_t by max(eps2, RMS(p)) (default 1) */
    int warmup_init;      /* relative_step ramps as 1e-6 t (default 0) */
    float beta1;          /* first-moment decay; 0 = no first moment */
    float decay_rate;     /* -0.8 */
    float eps1;           /* 1e-30, added to g^2 */
    float eps2;           /* 1e-3, floor of RMS(p) in the step size */
    float clip_threshold; /* 1.0; <= 0 disables update clipping */
    float wd;             /* decoupled weight decay (0 for no decay) */
} mf_adafactor_hp;

/* transformers' defaults: relative_step, scale_parameter, no momentum. */
mf_adafactor_hp mf_adafactor_hp_default(void);

/* Bytes of Adafactor state for a rows x cols tensor: factored 4*(rows+cols),
 * else 4*rows*cols; plus 4*rows*cols when beta1 > 0. */
size_t mf_adafactor_state_bytes(int64_t rows, int64_t cols, int factored,
                                int momentum);

/* One Adafactor step on p[rows*cols] (row-major). Factored (a 2-D weight):
 * v == NULL, vr[rows] and vc[cols] hold the row and column statistics.
 * Unfactored (biases, LayerNorm; pass rows = n, cols = 1): v[rows*cols],
 * vr = vc = NULL. m[rows*cols] when hp->beta1 > 0, else may be NULL. State
 * starts at 0; t is the 1-based step; g is multiplied by gscale first.
 * No scratch: one pass updates the statistics and sums the squared update,
 * a second applies it. Sums are in double over a fixed partition, so the
 * result does not depend on the thread count. */
void mf_adafactor_update(float *p, const float *g, float *vr, float *vc,
                         float *v, float *m, int64_t rows, int64_t cols,
                         const mf_adafactor_hp *hp, int t, float gscale);

/* ---- SGD ----------------------------------------------------------------
 * torch.optim.SGD with dampening 0 and nesterov off (Sutskever et al. 2013
 * momentum form): d = g*gscale + wd*p (weight decay coupled, added to the
 * gradient as torch does); with momentum: buf = d at t == 1, else
 * buf = momentum*buf + d, and d = buf; p <- p - lr*d. buf[n] may be NULL
 * when momentum == 0. */
void mf_sgd_update(float *p, const float *g, float *buf, size_t n, float lr,
                   float momentum, float wd, int t, float gscale);

/* ---- the optimizer a run uses --------------------------------------------
 * One tensor's state is up to MF_OPTIM_STATES plan rows, declared by
 * mf_optim_plan (so the estimate, the arena and checkpoints read one table)
 * and passed back to mf_optim_update as pointers in the same order. */

typedef enum { MF_OPTIM_ADAMW, MF_OPTIM_ADAMW8BIT, MF_OPTIM_ADAFACTOR, MF_OPTIM_SGD } mf_optim_kind;

#define MF_OPTIM_STATES 4
#define MF_Q8_MIN_NUMEL 4096 /* smaller tensors keep fp32 AdamW state (as bitsandbytes does) */

typedef struct {
    mf_optim_kind kind;
    float beta1, beta2, eps, momentum;
    int block;                     /* adamw8bit */
    int in_backward;               /* update each tensor as its gradient completes */
    char offload_path[MF_PATH_MAX]; /* "" or the file that holds the state (rows planned on disk) */
    size_t offload_window;         /* bytes of each of the two streaming windows */
    mf_adafactor_hp af;            /* adafactor; lr and wd are set per update */
    float map_signed[256], map_unsigned[256];
    mf_dtype compute;              /* precision: F32, BF16 or F16 for GEMM weights and GEMM-input activations */
    int master;                    /* 16-bit compute: fp32 master weights kept (category master) */
    int half_state;                /* pure_bf16: AdamW's m and v of 16-bit weights are bf16 (mf_optim_half) */
    int grad16;                    /* grad_dtype bf16: the 16-bit weights' gradient rows are bf16; the
                                    * update widens them a slice at a time (docs/precision.md) */
    int zero, world, rank;         /* ZeRO stage and this rank (set by the trainer, dist/): with zero >= 1 on
                                    * world > 1 ranks the state covers this rank's shard of each tensor */
    int group;                     /* ranks one tensor is sharded over (zero_group; world when 0): the shard
                                    * is mf_dist_shard(numel, group, rank % group) */
} mf_optim;

/* Reads optimizer, optim_block, beta1/beta2/eps, momentum, relative_step,
 * update_in_backward, offload, offload_window; refuses combinations that
 * cannot work together. */
int mf_optim_init(mf_optim *o, const mf_config *cfg);
const char *mf_optim_name(mf_optim_kind k);

/* A parameter as the optimizer sees it. */
typedef struct {
    int ndim;           /* 1 or 2 */
    int64_t rows, cols; /* cols = 1 for a vector */
    int embedding;      /* rows are token embeddings (8-bit state: one block per row) */
    int half;           /* a 16-bit weight: under pure_bf16 its AdamW moments are bf16 rows */
} mf_optim_shape;

/* Elements per quantisation block of tensor s under adamw8bit: a token
 * embedding's row (its gradient scale follows the token's frequency, so
 * rows of rare and common tokens must not share an absmax), else
 * optim_block. */
int mf_optim_block(const mf_optim *o, const mf_optim_shape *s);

/* Declares the state rows of parameter `name` alive over [first, last];
 * st[] gets the row ids, -1 where unused. Returns 0, or -1 with a message. */
int mf_optim_plan(const mf_optim *o, mf_plan *plan, const char *name, const mf_optim_shape *s,
                  int first, int last, int layer, int st[MF_OPTIM_STATES]);
/* Sets a tensor's state to "no steps yet". st_ptr[i] points at row st[i]. */
void mf_optim_zero(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], const int st[MF_OPTIM_STATES],
                   const mf_optim_shape *s);
/* The same on elements [e0, e0+n) of the tensor (e0 a multiple of its
 * quantisation block), with p, g and st_ptr pointing at that range's
 * first element (first block for absmax rows). Not for adafactor, whose
 * row and column statistics span the tensor. The offload stream uses it. */
void mf_optim_zero_range(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], const int st[MF_OPTIM_STATES],
                         const mf_optim_shape *s, int64_t e0, int64_t n);
void mf_optim_update_range(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, const float *g,
                           const mf_optim_shape *s, int64_t n, float lr, float wd, int t, float gscale);
/* One update of p[rows*cols] from g times gscale, at 1-based step t, with
 * learning rate lr and weight decay wd. */
void mf_optim_update(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, const float *g,
                     const mf_optim_shape *s, float lr, float wd, int t, float gscale);
/* The same for a whole tensor with a bf16 compute copy p16: returns 1 when
 * the optimizer also wrote p rounded to bf16 into p16 (fp32-state AdamW),
 * 0 when the caller still has to (the other optimizers). */
int mf_optim_update_bf16(const mf_optim *o, void *const st_ptr[MF_OPTIM_STATES], float *p, uint16_t *p16,
                         const float *g, const mf_optim_shape *s, float lr, float wd, int t, float gscale);

/* master_weights 0 (bf16 weights, no fp32 copy): a tensor is updated a
 * slice at a time, widened into a planned fp32 scratch of this many
 * elements and rounded back stochastically, so the scratch is small and
 * the result does not depend on the slicing (element-wise rounding seeds,
 * slices of whole quantisation blocks). Adafactor's row and column
 * statistics span the tensor: it takes the whole tensor at once. */
#define MF_OPTIM_SLICE (1 << 18)
int64_t mf_optim_slice(const mf_optim *o, const mf_optim_shape *s);
/* 1 when tensor s keeps bf16 AdamW moments (pure_bf16): the update then
 * widens a slice of m and v beside the weights and rounds all three back
 * stochastically. */
int mf_optim_half(const mf_optim *o, const mf_optim_shape *s);
/* out[k] = st[k] advanced to element e0 of the tensor (e0 a multiple of
 * its quantisation block): per-element rows by e0 elements, 8-bit AdamW's
 * absmax rows by e0 / block. Not for adafactor. */
void mf_optim_state_at(const mf_optim *o, const mf_optim_shape *s, void *const st[MF_OPTIM_STATES], int64_t e0,
                       void *out[MF_OPTIM_STATES]);

/* Dynamic loss scaling for fp16 training, with the semantics of PyTorch's
 * torch.cuda.amp.GradScaler: the loss is multiplied by scale before
 * backward; mf_scaler_unscale multiplies the gradients by 1/scale and
 * reports any non-finite value; mf_scaler_update then either skips the step
 * (non-finite: scale *= backoff, the clean-step count restarts) or counts
 * a clean step (after growth_interval clean steps in a row: scale *= growth,
 * unless that would be infinite). */
typedef struct {
    float scale;           /* initial 65536 */
    float growth, backoff; /* 2, 0.5 */
    int interval;          /* 2000 */
    int clean;             /* clean steps since the last change */
    int64_t skipped;       /* steps skipped so far */
} mf_scaler;

void mf_scaler_init(mf_scaler *s, float init_scale, int growth_interval);
/* g[i] *= 1/scale for n elements; returns 1 if any result is inf or NaN. */
int mf_scaler_unscale(const mf_scaler *s, float *g, size_t n);
/* After a step's gradients were unscaled: returns 1 if the update must be
 * skipped (found_inf), and moves the scale as above. */
int mf_scaler_update(mf_scaler *s, int found_inf);

#ifdef __cplusplus
}
#endif
#endif
