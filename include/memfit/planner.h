/* memfit planner: searches the memory settings of a run for the fastest one
 * whose plan fits the budget, and predicts each setting's step time.
 *
 * Owns: the list of candidate settings (mf_planner_result.c, heap, freed by
 * mf_planner_free) and the machine's kernel-class rates (a small text file
 * under $MEMFIT_CACHE, written by the calibration). Nothing else.
 *
 * Promises:
 *  - Bytes are exact: each candidate's bytes are the arena of the real plan
 *    (mf_model_build_plan on the config with that setting applied) plus the
 *    measured runtime outside the arena, the same sum the trainer checks.
 *    A setting fits when that sum plus MF_PLANNER_HEADROOM (growth of the
 *    process outside the plan after the baseline is read: the arena's page
 *    tables, thread stacks and BLAS buffers touched in the first step;
 *    measured at up to 1.5 MiB, see docs/planner.md) is within the budget.
 *  - Time is a model: the step's GEMM FLOPs, attention FLOPs, element-wise
 *    bytes and offload I/O bytes (recomputation included), each at a rate
 *    measured on this machine by mf_planner_calibrate (a few seconds, cached
 *    per host name and thread count).
 *  - By default only settings that keep the maths of the requested run are
 *    candidates (recompute, micro-batch x accumulation with the effective
 *    batch fixed, update_in_backward when the run does not clip, optimizer
 *    state offloaded to disk); allow_lossy adds 8-bit AdamW and Adafactor in
 *    place of AdamW, bf16 precision, and, for a run that fine-tunes loaded
 *    weights (--init), LoRA r=8 on an fp32, bf16, int8 or NF4 base. SGD is
 *    never substituted for another optimizer. A key the user set explicitly
 *    (file or flag) is not varied.
 *  - Each axis is one row of a table in planner.c.
 */
#ifndef MEMFIT_PLANNER_H
#define MEMFIT_PLANNER_H

#include <stddef.h>
#include <stdio.h>
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allowance for process growth outside the plan: 4 MiB + arena / 256. */
#define MF_PLANNER_HEADROOM(arena) (((size_t)4 << 20) + (arena) / 256)

/* Kernel-class rates of this machine at the run's thread count. */
#define MF_RATES_GEMM_SIZES 4
#define MF_RATES_GEMM_ROWS 3
#define MF_RATES_ATTN_T 3
#define MF_RATES_ATTN_HS 3
typedef struct {
    int threads;
    int gemm_c[MF_RATES_GEMM_SIZES];          /* model widths C calibrated */
    int gemm_m[MF_RATES_GEMM_ROWS];           /* rows (B x T) calibrated */
    double gemm_gflops[MF_RATES_GEMM_ROWS][MF_RATES_GEMM_SIZES]; /* fp32 GEMM (M rows, K=C, N=4C) */
    double gemm16_gflops[MF_RATES_GEMM_ROWS][MF_RATES_GEMM_SIZES]; /* bf16 GEMM (oneDNN), same shapes */
    int attn_t[MF_RATES_ATTN_T];              /* sequence lengths T calibrated */
    int attn_hs[MF_RATES_ATTN_HS];            /* head sizes calibrated */
    double attn_gflops[MF_RATES_ATTN_T][MF_RATES_ATTN_HS]; /* causal flash attention forward+backward */
    double attn16_ratio;  /* bf16 tiles' rate over fp32's (T 256, hs 64; 1 without AVX512_BF16) */
    double elem_gbs;      /* LayerNorm and GELU kernels, bytes read + written */
    double optim_mps[4];  /* optimizer update, million parameters/s, by mf_optim_kind */
    double optim_tensor_us[4]; /* and microseconds per trainable tensor beyond that (its regions) */
    double disk_gbs;      /* pwrite + pread of a file, as the offload streams */
    double calib_s;       /* seconds the calibration took */
    double busy_cores;    /* CPU other processes used meanwhile, in cores (-1: unknown) */
} mf_rates;

/* 1 when other processes used more of the machine during r's calibration
 * than its threads left free (plus a quarter core): its rates are low. */
int mf_rates_busy(const mf_rates *r);
/* Rates from the cache file, or a fresh calibration (then cached, busy or
 * not). force 0: any cached rates; 1: calibrate even when cached; 2:
 * cached rates only from a calibration that was not busy (mf_rates_busy),
 * else calibrate now (memfit plan: a busy cache is replaced
 * at the next chance). Sets *from_cache. */
int mf_planner_rates(mf_rates *r, int nthreads, int force, int *from_cache);
/* 0 when the cache holds rates for nthreads (read into r), else -1. */
int mf_planner_rates_cached(mf_rates *r, int nthreads);
/* Runs the calibration (no cache). Its buffers (about 70 MiB at most) are
 * freed before it returns, but they raise the process's peak RSS: memfit
 * train runs it in a child process when the cache is empty. */
int mf_planner_calibrate(mf_rates *r, int nthreads);
/* The GEMM rate at model width C and rows M (log-linear between the
 * calibrated points, clamped at the ends). */
double mf_rates_gemm(const mf_rates *r, int C, int M);
/* The same for bf16 GEMMs (precision bf16). */
double mf_rates_gemm16(const mf_rates *r, int C, int M);
/* Flash attention's rate at sequence length T and head size hs (log-linear
 * between the calibrated points, clamped at the ends): short sequences and
 * narrow heads run it far below its peak (T 128 hs 32 at about 40% of
 * T 1024 hs 64 here). */
double mf_rates_attn(const mf_rates *r, int T, int hs);

/* One candidate setting and what it costs. */
typedef struct {
    char recompute[16];
    int batch, grad_accum;
    char optimizer[16];
    char precision[8];    /* fp32 | bf16 | fp16 */
    int master;           /* 16-bit precision with fp32 master weights */
    int pure;             /* pure_bf16: bf16 weights and AdamW moments */
    int grad16;           /* grad_dtype bf16: bf16 gradients of the 16-bit weights */
    char lora[256];       /* "" (full fine-tuning) or the --lora spec */
    char base_dtype[8];   /* with lora: the frozen base's storage */
    char teacher_dtype[8]; /* with a teacher (distillation): its storage, else "" */
    int update_in_backward;
    int offload;          /* optimizer state in a file */
    int lossy;            /* changes the maths of the requested run */
    int auto_k;           /* recompute auto: blocks recomputed */
    size_t arena_bytes, disk_bytes;
    size_t process;       /* arena + runtime: the predicted peak RSS */
    size_t need;          /* process + headroom: the smallest budget it fits */
    size_t peak_cat[MF_CAT_COUNT];
    double gemm_flops, attn_flops, elem_bytes, io_bytes; /* per optimizer step */
    double optim_params;  /* parameters the optimizer updates per step */
    double pred_s;        /* predicted seconds per optimizer step (compute, plus comm_s over ranks) */
    double comm_bytes;    /* world_size > 1: bytes each rank sends per step (ZeRO paper: 2 Psi for stages
                           * 0-2, 3 Psi for stage 3, in fp32, times (W-1)/W for bandwidth-optimal collectives) */
    double comm_s;        /* comm_bytes at net_gbps (0 when net_gbps is 0), not overlapped with compute */
    int fits, frontier, chosen;
} mf_planner_choice;

typedef struct {
    mf_planner_choice *c;
    int n, cap;
    int chosen;           /* index of the choice, -1 if nothing fits */
    int smallest;         /* index of the setting needing the fewest bytes */
    int requested;        /* index of the requested setting, -1 if not enumerated */
    size_t budget, runtime;
    int eff_batch, seq;
    int world, zero;      /* ranks planned for (world_size) and the ZeRO stage */
    int group;            /* zero_group: ranks per shard group under hybrid sharding (0 = all of world) */
    double net_gbps;      /* bandwidth per rank the communication time assumes (0: none) */
    char offload_path[MF_PATH_MAX];
} mf_planner_result;

/* Enumerates the settings of cfg (effective batch eff_batch, 0 = batch x
 * grad_accum), plans each, predicts its time, marks the Pareto frontier
 * (no other setting is both smaller and faster) and the choice: the fastest
 * that fits cfg->budget, but an exact setting over a lossy one less than 3%
 * faster, a full fine-tuning setting over LoRA whenever one fits, and the
 * requested setting when it fits and is within 3% of that.
 * offload_path: the file offloaded candidates use.
 * -1 only when the requested config itself cannot be planned. */
int mf_planner_search(const mf_config *cfg, int eff_batch, int allow_lossy, size_t runtime, int nthreads,
                      const mf_rates *rates, const char *offload_path, mf_planner_result *out);
void mf_planner_free(mf_planner_result *r);
/* Writes a choice's settings into cfg (batch, grad_accum, recompute,
 * optimizer, update_in_backward, offload, precision, lora, base_dtype). */
int mf_planner_apply(const mf_planner_choice *c, const char *offload_path, mf_config *cfg);
/* "recompute full, batch 2 x accum 8, adamw, update_in_backward, offload disk" */
char *mf_planner_describe(const mf_planner_choice *c, char *buf, size_t n);
/* Sets mf_error to the one-line refusal: the budget, the smallest feasible
 * budget and its setting, its plan by category; returns -1. */
int mf_planner_refuse(const mf_planner_result *r);
/* The frontier table (and, with all, every setting) and the choice. */
void mf_planner_print(FILE *f, const mf_planner_result *r, int all);
void mf_planner_print_json(FILE *f, const mf_planner_result *r);

/* Fills c's work counts and pred_s from a planned model (per optimizer
 * step: grad_accum micro-steps and one update); returns pred_s. */
double mf_planner_predict(const mf_rates *r, mf_planner_choice *c, const mf_model *m, const mf_plan *p);

#ifdef __cplusplus
}
#endif
#endif
