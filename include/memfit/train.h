/* memfit train: the training driver that ties config, plan, arena, model,
 * data, optimizer and checkpoints together.
 *
 * Owns: the plan, the arena, the ledger, the open token files (or the
 * chat-data store, src/data/sft.c: heap, before the baseline), the
 * tokenizer and small fixed heap buffers allocated once at start-up
 * (sampling context). Promises: after mf_trainer_init returns, a training
 * step allocates nothing; the process baseline RSS is measured before the
 * arena is mapped; a plan over the budget is refused before any allocation
 * of the arena; checkpoints are written atomically and resuming from one
 * continues bit-identically.
 */
#ifndef MEMFIT_TRAIN_H
#define MEMFIT_TRAIN_H

#include <stdio.h>
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/data.h"
#include "memfit/model.h"
#include "memfit/planner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets OpenMP's and OpenBLAS's thread counts (0 = all cores); returns it. */
int mf_threads_setup(int threads);
/* The classes of fp32 GEMM shapes a run sends through mf_sgemm (oneDNN by
 * default), which mf_blas_warmup runs once before the baseline is read. */
enum {
    MF_WARM_LAYER = 1,   /* block GEMMs, forward and input gradient (fp32 base) */
    MF_WARM_LAYER_DW = 2, /* block weight gradients (trained fp32 base) */
    MF_WARM_HEAD = 4,    /* output head forward and input gradient (fp32 head) */
    MF_WARM_HEAD_DW = 8, /* output head weight gradient (trained fp32 head) */
    MF_WARM_ALL = 15,
    MF_WARM_OPENBLAS = 16 /* large products call OpenBLAS directly (not only the attention tiles) */
};
/* The classes cfg's run warms: none under 16-bit precision (its GEMMs are
 * mf_gemm16's), only the head's forward and input gradient under LoRA on a
 * bf16/int8/nf4 base (quant.h's tile GEMMs call OpenBLAS; the head is
 * frozen), all of them otherwise; MF_WARM_OPENBLAS for fp16, LoRA, or
 * MEMFIT_GEMM=openblas. Warming shapes a run never calls would put their
 * packing buffers in its baseline for nothing (QLoRA-NF4 on gpt2-124m B4
 * T256: 23 MiB). */
unsigned mf_blas_warm_shapes(const mf_config *cfg);
/* Runs GEMMs through OpenBLAS shaped like the model's largest (its output
 * head, or the MLP when that is wider) over `rows` rows with
 * MF_WARM_OPENBLAS, else like the attention tiles; then every shape of the
 * classes in `shapes` through mf_sgemm, so the libraries' buffers and
 * kernels exist before the baseline is read. */
void mf_blas_warmup(const mf_dims *d, int rows, unsigned shapes);

/* The tokenizer named by kind: "gpt2", "bytes", or a tokenizer.json's
 * path; GPT-2 files come from dir, or $MEMFIT_CACHE/gpt2 when dir is
 * empty. NULL on error. */
mf_tokenizer *mf_tokenizer_open(const char *kind, const char *dir);

/* Tokenizes a text file into a token file (atomic write). */
int mf_tokenize_file(const mf_tokenizer *tok, const char *text_path, const char *out_path);



typedef struct {
    mf_config cfg;
    mf_dims d;
    mf_mode mode;         /* MF_MODE_INFER for eval and sampling */
    int B, T, nthreads;   /* B: this rank's share of the configured batch */
    int world, rank;      /* data-parallel ranks (dist/): 1 and 0 without mpirun */
    mf_plan plan;
    mf_model model;
    mf_ledger ledger;
    mf_arena arena;
    mf_tokenizer *tok;    /* loaded when sampling or tokenizing a named corpus */
    uint64_t tok_hash;    /* the run's tokenizer (d.tokenizer) hash: token files must record it */
    mf_tokfile train_file, val_file;
    int own_val_file;
    uint64_t train_lo, train_hi, val_lo, val_hi; /* id ranges [lo, hi) */
    int n_val_batches;
    uint64_t data_pos;    /* next training window, relative to train_lo */
    int chat;             /* chat data (--data FILE.jsonl): rows come from sft, data_pos counts rows */
    mf_sft_data sft;
    int step;             /* optimizer steps done */
    double lr;            /* learning rate of the step in progress */
    double uib_sumsq;     /* update_in_backward: squared gradient norm so far */
    int uib_bad;          /* update_in_backward: a gradient was not finite */
    mf_rng rng;
    mf_scaler scaler;     /* precision fp16: dynamic loss scaling (use_scaler 1) */
    int use_scaler;
    int inject_overflow;  /* tests: the next step's gradient gets an inf (then reset to 0) */
    struct mf_offload *off;            /* offloaded optimizer state (NULL if none) */
    struct mf_offchunk *off_chunks;    /* its chunk map (offload_state.c) */
    int off_n;
    uint64_t off_bytes;
    int32_t *sample_ctx;  /* T ids */
    float *sample_probs;  /* V floats */
    int *sample_idx;      /* top_k ids */
    /* budget planner (budget.c): with --budget and plan auto the settings
     * are the planner's choice, predicted bytes and time kept here */
    mf_rates rates;
    int planned;          /* 1: cfg's settings were chosen by the planner */
    int plan_settings;    /* settings the planner compared */
    mf_planner_choice choice; /* the run's setting and its prediction */
} mf_trainer;

typedef struct {
    double loss, lr, grad_norm, seconds, tok_s;
    double loss_scale;    /* fp16: the scale this step's backward used (0 otherwise) */
    int skipped;          /* fp16: the update was skipped (inf/NaN gradients) */
    int rows, seq, micro; /* the step's batch (rows x seq tokens on this rank) and the micro-batches it ran in */
} mf_step_stats;

int mf_trainer_init(mf_trainer *t, const mf_config *cfg, mf_mode mode);
/* budget.c: resolves effective_batch into grad_accum and, with a budget and
 * plan auto, replaces the settings in t->cfg by the planner's choice for
 * the measured baseline (or refuses: no setting fits). */
int mf_trainer_choose(mf_trainer *t, int search);
/* Extends the current error with what the planner finds (every key free):
 * budget != 0 (the plan was over it): the fastest setting that fits, or the
 * smallest feasible budget; budget 0 (the arena could not be mapped): the
 * plan by category and the run's smallest setting. Returns -1. */
int mf_trainer_hint(mf_trainer *t, size_t budget);
/* The offload file the planner proposes: out_dir/optimizer_state.bin, else
 * $TMPDIR (or /tmp)/memfit-optimizer-state.<pid>.bin. */
const char *mf_planner_offload_path(const mf_config *cfg, char *buf, size_t n);
void mf_trainer_free(mf_trainer *t);
/* One optimizer step on the step's batch (mf_trainer_step_shape):
 * grad_accum micro-batches of the plan's B x T, or under seq_warmup the
 * same tokens as shorter sequences. */
int mf_trainer_step(mf_trainer *t, mf_step_stats *st);
/* The batch of optimizer step `step` on this rank: B x grad_accum rows of
 * T; under seq_warmup (steps < seq_warmup) shorter sequences, from
 * seq_warmup_start up to T in multiples of 8, and as many rows as keep the
 * step's tokens (rounded down). */
void mf_trainer_step_shape(const mf_trainer *t, int step, int *rows, int *T);
/* One optimizer step on `rows` sequences of T tokens from the training
 * stream, whatever their shape: the run-time guard runs them in the fewest
 * micro-batches that each fit the plan (mf_model_fits; longer sequences in
 * fewer rows), with gradients of the mean loss over all rows x T tokens,
 * identical (to float round-off) to one pass over the whole batch. Fails
 * with a message when one sequence of T tokens cannot fit the plan. */
int mf_trainer_step_rows(mf_trainer *t, int rows, int T, mf_step_stats *st);
/* After a step whose loss or gradient norm is not finite: sets the error to
 * one line naming the first NaN or infinity in forward order (weights, the
 * step's activations still in the arena, gradients) by plan row, element and
 * value, and when the weights are finite their largest element; returns -1.
 * Reads every such row, so it runs only once the step went bad
 * (src/train/nonfinite.c). */
int mf_trainer_fail_nonfinite(mf_trainer *t, double loss, double norm);
/* The forward/backward part of mf_trainer_step_rows: zeroes the gradients,
 * accumulates those of the batch (loss times lscale), sets *loss to its mean
 * loss; returns the number of micro-batches, or -1 with mf_error set. */
int mf_trainer_accumulate(mf_trainer *t, int rows, int T, float lscale, double *loss);
/* Mean loss over the validation batches (forward only). */
double mf_trainer_val_loss(mf_trainer *t);
/* Loads the next training window into the arena's loader buffers. */
void mf_trainer_load_batch(mf_trainer *t);
/* Generates n tokens after `prompt` and writes the text to out. */
int mf_trainer_sample(mf_trainer *t, const char *prompt, int n, FILE *out);

/* Offloaded optimizer state (offload_state.c): the chunk map and the file,
 * its "no steps yet" contents, one streamed update, and byte access to a
 * state row by its logical offset (for checkpoints). */
/* master_weights 0: updates elements [e0, e0+n) of 16-bit tensor i (e0 on
 * a quantisation block) a slice at a time through work.update_f32, st[]
 * and g pointing at element e0's state and gradient, rounding back
 * stochastically. g16 (grad_dtype bf16): g is bf16, each slice of it is
 * widened into work.update_f32 too. */
void mf_trainer_update16(mf_trainer *t, int i, void *const st[MF_OPTIM_STATES], int64_t e0, int64_t n, const void *g,
                         int g16, float gscale);
int mf_offstate_open(mf_trainer *t);
void mf_offstate_close(mf_trainer *t);
int mf_offstate_zero(mf_trainer *t);
int mf_offstate_step(mf_trainer *t, float gscale);
int mf_offstate_row_io(mf_trainer *t, int tensor, int id, uint64_t off, void *buf, size_t len, int write);

/* Data parallel with ZeRO >= 1: rank r of N writes and resumes from PATH
 * with ".rank<r>-of-<N>" before ".safetensors" (into out, n bytes). */
void mf_trainer_shard_path(const char *path, int rank, int world, char *out, size_t n);
/* Joins the N shard files of a ZeRO checkpoint PATH (as named above) into
 * one single-process checkpoint at out_path. */
int mf_checkpoint_consolidate(const char *path, const char *out_path);
int mf_trainer_save_checkpoint(const mf_trainer *t, const char *path);
int mf_trainer_load_checkpoint(mf_trainer *t, const char *path);
/* Weights only, Hugging Face GPT-2 names (unpadded vocabulary). */
int mf_trainer_save_weights(const mf_trainer *t, const char *path);
int mf_trainer_load_weights(mf_trainer *t, const char *path);
/* Distillation (distill.c): the teacher's weights into its rows (no-op without --teacher). */
int mf_trainer_load_teacher(mf_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
