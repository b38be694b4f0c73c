#include "report.h"
#include "memfit/kernels.h"
#include "dist/dist.h"
#include "memfit/distill.h"
#include "quant/quant.h"
#include "kernels/half.h"
#include "kernels/isa.h" /* MF_FA512_MAX_HS */
#include "memfit/monitor.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *sz(size_t b, char *buf) { return mf_size_format(b, buf, 32); }

/* "none", "full", "every:3 (segments of 3 blocks)", "auto (5 of 12 blocks)" */
static const char *recompute_desc(const mf_config *cfg, const mf_model *m, char *buf, size_t n) {
    if (m->recompute.policy == MF_RECOMPUTE_AUTO)
        snprintf(buf, n, "auto: %d of %d blocks recomputed", m->auto_k, m->d.L);
    else if (m->seg > 1 || m->recompute.policy == MF_RECOMPUTE_SQRT)
        snprintf(buf, n, "%s: segments of %d blocks", cfg->recompute, m->seg);
    else snprintf(buf, n, "%s", cfg->recompute);
    return buf;
}

/* The model's name in reports: the preset, or the Hugging Face folder its
 * shape came from (--init DIR) */
static const char *model_name(const mf_config *cfg) {
    struct stat st;
    return cfg->init[0] && stat(cfg->init, &st) == 0 && S_ISDIR(st.st_mode) ? cfg->init : cfg->model;
}

/* 1234567 -> "1,234,567" (a static buffer: one call per printf) */
static const char *group_digits(long long v) {
    static char out[32];
    char raw[24];
    int n = snprintf(raw, sizeof raw, "%lld", v), o = 0;
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0 && raw[i - 1] != '-') out[o++] = ',';
        out[o++] = raw[i];
    }
    out[o] = 0;
    return out;
}

void mf_report_presets(FILE *f) {
    int n;
    const mf_preset *p = mf_model_presets(&n);
    fprintf(f, "\nModel presets (parameters as Hugging Face counts them):\n");
    for (int i = 0; i < n; i++) {
        const mf_dims *d = &p[i].d;
        char shape[96];
        if (d->arch == MF_ARCH_LLAMA)
            snprintf(shape, sizeof shape, "L%d C%d H%d/KV%d I%d", d->L, d->C, d->NH, d->NKV, d->ffn);
        else snprintf(shape, sizeof shape, "L%d C%d H%d", d->L, d->C, d->NH);
        fprintf(f, "  %-14s %-26s T%-6d vocab %-6d %-5s %14s params  %s\n", p[i].name, shape, d->maxT, d->V,
                p[i].tokenizer, group_digits((long long)mf_model_n_params(d)), p[i].note);
    }
}

static void print_plan_line(FILE *f, const mf_plan *p, size_t runtime, size_t budget) {
    char a[32], b[32], c[32];
    fprintf(f, "plan: arena %s (", sz(p->arena_bytes, a));
    int first = 1;
    for (int i = 0; i < MF_CAT_COUNT; i++) {
        if (!p->peak_cat[i]) continue;
        fprintf(f, "%s%s %s", first ? "" : ", ", mf_cat_name((mf_cat)i), sz(p->peak_cat[i], a));
        first = 0;
    }
    fprintf(f, ")");
    if (p->outside_bytes) fprintf(f, " + comm outside the arena (MPI) %s", sz(p->outside_bytes, a));
    fprintf(f, " + runtime %s = %s; budget %s\n", sz(runtime, b), sz(p->arena_bytes + p->outside_bytes + runtime, c),
            budget ? sz(budget, a) : "none");
}

/* LoRA: rank, scaling, targets and the trainable share */
static void lora_line(FILE *f, const mf_model *m, const mf_config *cfg, const mf_dims *d) {
    if (m->lora.r <= 0) return;
    char tg[128];
    int64_t n = mf_model_n_trainable(m), all = mf_model_n_params(d);
    fprintf(f, "LoRA r=%d alpha=%g dropout=%g on %s: %lld trainable params (%.3f%% of %lld), base frozen (%s)\n",
            m->lora.r, (double)m->lora.alpha, (double)m->lora.dropout, mf_lora_targets_str(&m->lora, tg, sizeof tg),
            (long long)n, 100.0 * (double)n / (double)all, (long long)all,
            /* under bf16 compute an fp32 base is held as bf16 rows */
            m->cdt == MF_DTYPE_BF16 && strcmp(cfg->base_dtype, "fp32") == 0 ? "bf16" : cfg->base_dtype);
}

/* distillation: the teacher, its storage and its rows' bytes */
static void teacher_line(FILE *f, const mf_model *m, const mf_plan *p) {
    const mf_teacher *t = m->teacher;
    if (!t) return;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "teacher %s: %.2fM params (%s L%d C%d H%d), stored %s, weights %s, forward %s, hidden %s + logits chunk %s; "
               "distill alpha=%g temperature=%g\n",
            t->path, (double)mf_model_n_params(&t->d) / 1e6, t->d.arch == MF_ARCH_LLAMA ? "llama" : "gpt2", t->d.L, t->d.C,
            t->d.NH, mf_quant_name((mf_quant_kind)t->kind), sz(t->weight_bytes, a), sz(p->bufs[t->row_fwd].bytes, b),
            sz(p->bufs[t->row_hidden].bytes, c), sz(p->bufs[t->row_logits].bytes, d), t->cfg.alpha, t->cfg.temperature);
}

void mf_report_header(FILE *f, const mf_trainer *t) {
    const mf_dims *d = &t->d;
    fprintf(f, "model %s: %.2fM params (L%d C%d H%d, block %d, vocab %d padded to %d, %s tokenizer)\n",
            model_name(&t->cfg), (double)mf_model_n_params(d) / 1e6, d->L, d->C, d->NH, d->maxT, d->V, d->Vp, d->tokenizer);
    char rc[64];
    fprintf(f, "batch %d x seq %d x accum %d = %d tokens/step, %d threads; train %llu tokens, val %d batches; recompute %s\n",
            t->B, t->T, t->cfg.grad_accum, t->B * t->T * t->cfg.grad_accum, t->nthreads,
            /* chat data: the positions of its rows (padding included) */
            (unsigned long long)(t->chat ? (uint64_t)t->sft.positions : t->train_hi - t->train_lo), t->n_val_batches,
            recompute_desc(&t->cfg, &t->model, rc, sizeof rc));
    lora_line(f, &t->model, &t->cfg, d);
    teacher_line(f, &t->model, &t->plan);
    if (t->model.cdt != MF_DTYPE_F32)
        fprintf(f, "precision %s: 16-bit GEMM weights and GEMM inputs, fp32 %s, %sreductions; GEMM %s%s; "
                "attention tiles %s\n",
                t->cfg.precision, t->model.opt.master ? "master weights, optimizer state" : "optimizer state (bf16 weights, "
                "stochastic rounding)", t->model.opt.grad16 ? "bf16 gradients of the 16-bit weights, fp32 " : "gradients and ",
                t->model.cdt == MF_DTYPE_BF16 ? "oneDNN " : "fp32 sgemm on widened fp16 blocks",
                t->model.cdt == MF_DTYPE_BF16 ? mf_gemm_bf16_impl() : "",
                t->model.cdt == MF_DTYPE_BF16 && mf_flash_attention_bf16_tiles() && d->hd <= MF_FA512_MAX_HS
                    ? "bf16 (vdpbf16ps)" : "fp32");
    if (t->world > 1)
        fprintf(f, "data parallel: %d ranks of batch %d (global batch %d), ZeRO stage %d; memory below is per rank\n",
                t->world, t->B, t->B * t->world, t->model.opt.zero);
    if (t->world > 1) {
        char s0[32], s1[32], s2[32], s3[32];
        fprintf(f, "collectives: Open MPI's (messages of at most %s); memory the MPI library kept for its first "
                   "all-reduce %s, reduce-scatter %s, all-gather %s (measured at start, after the baseline: the plan's "
                   "comm.mpi.* rows, outside the arena)\n",
                sz((size_t)mf_dist_bucket() * sizeof(float), s0), sz(mf_dist_mpi_scratch(MF_DIST_ALLREDUCE), s1),
                sz(mf_dist_mpi_scratch(MF_DIST_REDUCE_SCATTER), s2), sz(mf_dist_mpi_scratch(MF_DIST_ALLGATHER), s3));
    }
    const char *ct = getenv("OPENBLAS_CORETYPE");
    fprintf(f, "BLAS: OpenBLAS %s kernels (OPENBLAS_CORETYPE %s); fp32 GEMM %s (MEMFIT_GEMM %s); memfit kernels %s (MEMFIT_ISA %s); OMP_WAIT_POLICY %s\n",
            openblas_get_corename(), ct ? ct : "unset", mf_sgemm_name(),
            getenv("MEMFIT_GEMM") ? getenv("MEMFIT_GEMM") : "unset", mf_kernels_isa_name(),
            getenv("MEMFIT_ISA") ? getenv("MEMFIT_ISA") : "unset",
            getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "unset");
    print_plan_line(f, &t->plan, t->ledger.rss_baseline, t->cfg.budget);
    if (t->planned) {
        char a[256], b[32], c[32], d[32];
        fprintf(f, "planner: %s, the fastest of %d settings that fits %s (process %s, with headroom %s; predicted %.3f s/step)\n",
                mf_planner_describe(&t->choice, a, sizeof a), t->plan_settings, sz(t->cfg.budget, b),
                sz(t->choice.process, c), sz(t->choice.need, d), t->choice.pred_s);
        if (t->choice.offload) fprintf(f, "planner: optimizer state offloaded to %s (removed at the end)\n",
                                       t->cfg.offload + strlen("optimizer=disk:"));
    }
    fflush(f);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void mf_report_planner(FILE *f, const mf_trainer *t, const double *step_s, int n) {
    if (!t->planned) return;
    char a[32], b[32], c[32];
    size_t pred = t->ledger.rss_baseline + t->plan.arena_bytes + t->plan.outside_bytes, rss = mf_rss_peak();
    fprintf(f, "planner: predicted process %s, measured peak RSS %s (%+.2f%%), budget %s: %s\n", sz(pred, a),
            sz(rss, b), 100.0 * ((double)rss - (double)pred) / (double)pred, sz(t->cfg.budget, c),
            rss <= t->cfg.budget ? "within" : "EXCEEDED");
    if (n < 1) {
        fprintf(f, "planner: predicted %.3f s/step; too few steps to measure (the first is warm-up)\n", t->choice.pred_s);
        return;
    }
    double *v = malloc(sizeof *v * (size_t)n);
    if (!v) return;
    memcpy(v, step_s, sizeof *v * (size_t)n);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    fprintf(f, "planner: predicted %.3f s/step, measured median %.3f s over %d steps (%+.1f%%)\n", t->choice.pred_s, med,
            n, 100.0 * (med - t->choice.pred_s) / t->choice.pred_s);
}

static void put_num(FILE *f, const char *key, double v, const char *fmt) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

void mf_report_step(FILE *f, const mf_trainer *t, const mf_step_stats *st, double val,
                    int progress, FILE *metrics, const size_t *mem) {
    char a[32], b[32];
    size_t rss = mf_rss_peak();
    int every = t->cfg.log_every;
    if (progress) {
        int w = 30, done = (int)((double)t->step / t->cfg.steps * w);
        fprintf(f, "\r[");
        for (int i = 0; i < w; i++) fputc(i < done ? '#' : '.', f);
        fprintf(f, "] %d/%d loss %.4f %.0f tok/s ", t->step, t->cfg.steps, st->loss, st->tok_s);
        if (!isnan(val)) fprintf(f, "\nstep %5d | val loss %.4f\n", t->step, val);
    } else if (t->step % every == 0 || t->step == t->cfg.steps || !isnan(val)) {
        fprintf(f, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %6.0f tok/s | ledger %s | rss %s",
                t->step, t->cfg.steps, st->loss, st->lr, st->grad_norm, st->tok_s,
                sz(t->ledger.peak_total, a), sz(rss, b));
        if (!isnan(val)) fprintf(f, " | val %.4f", val);
        if (t->model.d.n_experts > 0) {
            /* the routers' losses (and drops) of the step's last micro-batch */
            fprintf(f, " | aux %.4f z %.3f", t->model.moe_aux, t->model.moe_z);
            if (t->model.moe_capacity > 0) fprintf(f, " | dropped %lld", (long long)t->model.moe_dropped);
        }
        if (st->seq && st->seq != t->T)
            fprintf(f, " | batch %d x %d in %d micro-batch%s", st->rows, st->seq, st->micro, st->micro == 1 ? "" : "es");
        if (t->use_scaler) fprintf(f, " | scale %g%s (%lld skipped)", st->loss_scale, st->skipped ? " SKIPPED" : "",
                                   (long long)t->scaler.skipped);
        if (t->cfg.budget)
            fprintf(f, " | mem %.1f%% %s", 100.0 * (double)rss / (double)t->cfg.budget,
                    mf_health_name(mf_health_level(rss, t->cfg.budget)));
        fputc('\n', f);
    }
    fflush(f);
    if (metrics) {
        /* JSON has no NaN or infinity: a number that is not finite is null,
         * so a diverging run still writes valid lines */
        fprintf(metrics, "{\"step\":%d", t->step);
        put_num(metrics, "loss", st->loss, "%.9g");
        put_num(metrics, "lr", st->lr, "%.9g");
        put_num(metrics, "grad_norm", st->grad_norm, "%.9g");
        put_num(metrics, "tok_s", st->tok_s, "%.6g");
        put_num(metrics, "step_s", st->seconds, "%.6g");
        if (t->model.d.n_experts > 0) {
            put_num(metrics, "moe_aux", t->model.moe_aux, "%.9g");
            put_num(metrics, "moe_z", t->model.moe_z, "%.9g");
            if (t->model.moe_capacity > 0) fprintf(metrics, ",\"moe_dropped\":%lld", (long long)t->model.moe_dropped);
            /* token-slots per expert per layer (the step's last micro-batch) */
            fprintf(metrics, ",\"moe_tokens\":[");
            for (int l = 0; l < t->model.d.L; l++)
                for (int e = 0; e < t->model.d.n_experts; e++)
                    fprintf(metrics, "%s%lld%s", e ? "," : l ? ",[" : "[",
                            (long long)t->model.moe_tokens[(size_t)l * t->model.d.n_experts + e],
                            e == t->model.d.n_experts - 1 ? "]" : "");
            fputc(']', metrics);
        }
        if (!isnan(val)) put_num(metrics, "val_loss", val, "%.9g");
        if (st->seq) fprintf(metrics, ",\"rows\":%d,\"seq\":%d,\"micro\":%d", st->rows, st->seq, st->micro);
        if (t->use_scaler)
            fprintf(metrics, ",\"loss_scale\":%.9g,\"skipped\":%d,\"skipped_total\":%lld", st->loss_scale, st->skipped,
                    (long long)t->scaler.skipped);
        fprintf(metrics, ",\"planned_peak_bytes\":%zu,\"arena_bytes\":%zu,\"ledger_peak_bytes\":%zu,"
                         "\"rss_baseline_bytes\":%zu,\"rss_peak_bytes\":%zu",
                t->plan.peak_bytes, t->plan.arena_bytes, t->ledger.peak_total, t->ledger.rss_baseline, rss);
        for (int c = 0; mem && c < MF_CAT_COUNT; c++) fprintf(metrics, ",\"mem_%s\":%zu", mf_cat_name((mf_cat)c), mem[c]);
        if (t->world > 1)
            fprintf(metrics, ",\"mpi_scratch_allreduce_bytes\":%zu,\"mpi_scratch_reduce_scatter_bytes\":%zu,"
                             "\"mpi_scratch_allgather_bytes\":%zu,\"comm_mpi_bytes\":%zu", mf_dist_mpi_scratch(MF_DIST_ALLREDUCE),
                    mf_dist_mpi_scratch(MF_DIST_REDUCE_SCATTER), mf_dist_mpi_scratch(MF_DIST_ALLGATHER),
                    t->plan.outside_bytes);
        if (t->world > 1) {
            /* cumulative: collectives run in the step (sync), in the background, and waited for */
            double cs, cb, cw;
            mf_dist_comm_times(&cs, &cb, &cw);
            fprintf(metrics, ",\"comm_sync_s\":%.6g,\"comm_bg_s\":%.6g,\"comm_wait_s\":%.6g,\"comm_bytes\":%.0f", cs, cb, cw,
                    mf_dist_comm_bytes());
        }
        /* health of the peak RSS so far against the budget */
        if (t->cfg.budget)
            fprintf(metrics, ",\"budget_bytes\":%zu,\"budget_frac\":%.6f,\"health\":\"%s\"", t->cfg.budget,
                    (double)rss / (double)t->cfg.budget, mf_health_name(mf_health_level(rss, t->cfg.budget)));
        fputs("}\n", metrics);
        fflush(metrics);
    }
}

void mf_report_memory(FILE *f, const mf_trainer *t) {
    char a[32], b[32], c[32];
    const mf_plan *p = &t->plan;
    const mf_ledger *l = &t->ledger;
    fprintf(f, "\nmemory report (bytes at the step's peak, phase '%s')\n",
            mf_phase_name(&t->model, p->peak_phase, a, sizeof a));
    fprintf(f, "  %-10s %16s %16s %8s\n", "category", "predicted", "ledger", "match");
    for (int i = 0; i < MF_CAT_COUNT; i++) {
        if (!p->peak_cat[i] && !l->at_peak[i]) continue;
        fprintf(f, "  %-10s %16zu %16zu %8s\n", mf_cat_name((mf_cat)i), p->peak_cat[i], l->at_peak[i],
                p->peak_cat[i] == l->at_peak[i] ? "exact" : "DIFF");
    }
    fprintf(f, "  %-10s %16zu %16zu %8s\n", "total", p->peak_bytes, l->peak_total,
            p->peak_bytes == l->peak_total ? "exact" : "DIFF");
    if (p->outside_bytes)
        fprintf(f, "  %-10s %16zu %16s %8s   (outside the arena: the MPI library's, measured at start)\n", "comm (MPI)",
                p->outside_bytes, "-", "-");
    size_t rss = mf_rss_peak(), pred = l->rss_baseline + p->arena_bytes + p->outside_bytes;
    double diff = 100.0 * ((double)rss - (double)pred) / (double)pred;
    fprintf(f, "  arena (with reuse) %s; process baseline %s", sz(p->arena_bytes, a), sz(l->rss_baseline, b));
    if (p->outside_bytes) fprintf(f, "; comm outside the arena (MPI) %s", sz(p->outside_bytes, c));
    fputc('\n', f);
    fprintf(f, "  predicted peak RSS %s, measured peak RSS (VmHWM) %s: %+.2f%%\n", sz(pred, a), sz(rss, c), diff);
}

static void per_layer(const mf_plan *p, int L, size_t (*out)[MF_CAT_COUNT]) {
    memset(out, 0, (size_t)(L + 1) * sizeof *out);
    for (int i = 0; i < p->n; i++) {
        int l = p->bufs[i].layer;
        out[l >= 0 && l < L ? l : L][p->bufs[i].cat] += p->bufs[i].bytes;
    }
}

/* always shown, in this order; the other categories when they hold bytes */
static const mf_cat shown[] = {MF_CAT_PARAMS, MF_CAT_GRADS, MF_CAT_OPTIM, MF_CAT_ACTS, MF_CAT_WORK, MF_CAT_DATA,
                               MF_CAT_MASTER, MF_CAT_ADAPTER, MF_CAT_QUANT, MF_CAT_COMM, MF_CAT_OFFLOAD,
                               MF_CAT_TEACHER};
static const char *shown_label[] = {"params", "grads", "optimizer", "activations", "scratch", "data",
                                    "master", "adapter", "quant", "comm", "offload", "teacher"};
/* The same labels as JSON keys: "optimizer" there is the optimizer's name,
 * so its bytes are "optimizer_state" (one key, one meaning). */
static const char *json_label(int k) { return shown[k] == MF_CAT_OPTIM ? "optimizer_state" : shown_label[k]; }
#define NALWAYS 6
#define NSHOWN 12

/* "fp32 AdamW", "fp32 adamw8bit (blocks of 2048)", "fp32 adafactor" */
static const char *optim_desc(const mf_model *m, char *buf, size_t n) {
    const mf_optim *o = &m->opt;
    if (m->mode != MF_MODE_TRAIN) snprintf(buf, n, "forward only");
    else if (o->kind == MF_OPTIM_ADAMW8BIT) snprintf(buf, n, "adamw8bit (blocks of %d)", o->block);
    else if (o->kind == MF_OPTIM_ADAFACTOR || o->kind == MF_OPTIM_SGD)
        snprintf(buf, n, "%s%s", mf_optim_name(o->kind), o->momentum > 0 ? " with momentum" : "");
    else snprintf(buf, n, "adamw");
    return buf;
}

/* A mixture of experts: layer l's expert weights (the params rows of its
 * block_sparse_moe.experts tensors, Qwen2-MoE's mlp.experts: the routed
 * experts; the shared expert is mlp.shared_expert) */
static size_t expert_bytes(const mf_plan *p, int l) {
    size_t b = 0;
    for (int i = 0; i < p->n; i++)
        if (p->bufs[i].layer == l && p->bufs[i].cat == MF_CAT_PARAMS && 
            (strstr(p->bufs[i].name, ".block_sparse_moe.experts.") || strstr(p->bufs[i].name, ".mlp.experts.")))
            b += p->bufs[i].bytes;
    return b;
}

void mf_report_estimate(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                        const mf_model *m, size_t runtime) {
    char a[32], b[32];
    char rc[64], od[64];
    /* LoRA under bf16 keeps no master rows: the base is frozen bf16, the
     * adapters (weights, gradients, state) fp32 */
    const char *prec = m->cdt == MF_DTYPE_BF16 && m->lora.r > 0 ? "bf16 (frozen base bf16, adapters fp32)"
                     : m->cdt == MF_DTYPE_BF16 && m->opt.grad16
                           ? (m->opt.master ? "bf16 (fp32 master weights, bf16 gradients)" : "bf16 (no master weights, bf16 gradients)")
                     : m->cdt == MF_DTYPE_BF16 ? (m->opt.master ? "bf16 (fp32 master weights)" : "bf16 (no master weights)")
                     : m->cdt == MF_DTYPE_F16 ? "fp16 (fp32 master weights, loss scaling)" : "fp32";
    fprintf(f, "model %s: %lld params (L%d C%d H%d, block %d, vocab %d), batch %d x seq %d, %s, optimizer %s, recompute %s\n",
            model_name(cfg), (long long)mf_model_n_params(d), d->L, d->C, d->NH, d->maxT, d->V, m->B, m->T, prec,
            optim_desc(m, od, sizeof od), recompute_desc(cfg, m, rc, sizeof rc));
    lora_line(f, m, cfg, d);
    if (d->share)
        fprintf(f, "share_layers %d: the %d blocks use %d weight sets (block i uses set i %% %d); params, grads and "
                   "optimizer state hold %d sets, activations are not shared (all %d blocks keep theirs)\n",
                d->share, d->L, d->share, d->share, d->share, d->L);
    if (d->n_experts > 0) {
        /* which worst case the moe.* rows are sized for (docs/moe.md) */
        int64_t R = 0, G = 0, N = (int64_t)m->B * m->T;
        mf_moe_buffer_sizes(NULL, &R, &G, (int)N, d->top_k, d->n_experts, d->C, d->ffn, d->capacity_factor);
        if (m->d.ep > 1) mf_moe_ep_bounds(&m->d, (int)N, &R, NULL, &G, NULL);  /* the expert group's */
        fprintf(f, "mixture of experts: %d experts, top-%d, %lld active params per token; expert weights %s per layer; ",
                d->n_experts, d->top_k, (long long)mf_model_n_active(d), sz(expert_bytes(p, 0), a));
        if (m->moe_capacity > 0)
            fprintf(f, "capacity factor %g: %d slots per expert, routing rows sized for %lld permuted rows (%lld per "
                       "expert at most)\n", d->capacity_factor, m->moe_capacity, (long long)R, (long long)G);
        else
            fprintf(f, "dropless: routing rows sized for the worst case, %lld permuted rows (tokens x top-k), "
                       "%lld on one expert at most\n", (long long)R, (long long)G);
        if (d->ep > 1 && m->d.ep > 1) {
            /* expert parallel (moe_ep.c): rank 0's experts and its exchange rows */
            int El = d->n_experts / m->d.ep, g = m->opt.rank % m->d.ep;
            fprintf(f, "expert parallel over groups of %d ranks: this rank holds experts %d-%d of each layer (%s of "
                       "expert weights), sends at most %lld rows and receives at most %lld (%s)\n",
                    m->d.ep, g * El, g * El + El - 1, sz(expert_bytes(p, 0), a), (long long)m->moe_ep_send,
                    (long long)m->moe_ep_recv,
                    m->moe_capacity > 0 ? "capacity bound: at most capacity rows per expert, the capacity of the "
                                          "group's tokens"
                                        : "dropless bound: every token of every rank in the group could pick this "
                                          "rank's experts");
        }
    }
    teacher_line(f, m, p);
    if (m->opt.world > 1) {
        /* ZeRO paper section 5.1: the model states each rank keeps */
        size_t ms[MF_CAT_COUNT];
        char c3[32];
        mf_zero_model_states(p, ms);
        fprintf(f, "data parallel over %d ranks, ZeRO stage %d: bytes are per rank (its batch %d of %d); model states "
                   "per rank %s (params %s, grads %s, optimizer %s)\n", m->opt.world, m->opt.zero, m->B, cfg->batch,
                sz(ms[MF_CAT_PARAMS] + ms[MF_CAT_GRADS] + ms[MF_CAT_OPTIM], a), sz(ms[MF_CAT_PARAMS], b),
                sz(ms[MF_CAT_GRADS], rc), sz(ms[MF_CAT_OPTIM], c3));
    }
    fprintf(f, "\n  %-12s %14s %12s   %s\n", "category", "bytes", "", "at the peak (category's own max)");
    size_t tot = 0;
    for (int k = 0; k < NSHOWN; k++) {
        mf_cat c = shown[k];
        if (k >= NALWAYS && !p->max_cat[c]) continue;
        fprintf(f, "  %-12s %14zu %12s   (%s)\n", shown_label[k], p->peak_cat[c], sz(p->peak_cat[c], a),
                sz(p->max_cat[c], b));
        tot += p->peak_cat[c];
    }
    fprintf(f, "  %-12s %14zu %12s\n", "total", p->peak_bytes, sz(p->peak_bytes, a));
    if (p->disk_bytes)
        fprintf(f, "  %-12s %14zu %12s   (optimizer state in %s, streamed through the offload windows)\n", "on disk",
                p->disk_bytes, sz(p->disk_bytes, a), m->opt.world > 1 ? "PATH.rank<r> per rank" : m->opt.offload_path);
    fprintf(f, "  %-12s %14zu %12s   (lifetimes let buffers share bytes)\n", "arena", p->arena_bytes, sz(p->arena_bytes, a));
    if (m->opt.world > 1) {
        /* the comm.mpi.* rows: MPI's own scratch for the collectives */
        size_t mpi[MF_DIST_COLL_COUNT] = {0};
        for (int c = 0; c < MF_DIST_COLL_COUNT; c++) {
            static const char *nm[MF_DIST_COLL_COUNT] = {"comm.mpi.allreduce", "comm.mpi.reduce_scatter", "comm.mpi.allgather"};
            int id = mf_plan_find(p, nm[c]);
            mpi[c] = id >= 0 ? p->bufs[id].bytes : 0;
        }
        char c0[32], c1[32], c2[32];
        fprintf(f, "  %-12s %14zu %12s   (outside the arena: MPI's scratch per rank for all-reduce %s, reduce-scatter %s, "
                   "all-gather %s at %s messages; %s)\n", "comm (MPI)", p->outside_bytes, sz(p->outside_bytes, a),
                sz(mpi[0], c0), sz(mpi[1], c1), sz(mpi[2], c2), sz((size_t)mf_dist_bucket() * sizeof(float), b),
                mf_dist_scratch_source_name(mf_dist_scratch_source()));
    }
    fprintf(f, "  %-12s %14zu %12s   (measured: this process before the arena)\n", "runtime", runtime, sz(runtime, a));
    size_t proc = p->arena_bytes + p->outside_bytes + runtime;
    fprintf(f, "  %-12s %14zu %12s\n", "process", proc, sz(proc, a));
    (void)tot;
    size_t(*rows)[MF_CAT_COUNT] = calloc((size_t)d->L + 1, sizeof *rows);
    if (!rows) return;
    per_layer(p, d->L, rows);
    int show_master = p->max_cat[MF_CAT_MASTER] != 0;
    fprintf(f, "\n  per layer      params      grads  optimizer activations    scratch%s\n", show_master ? "     master" : "");
    for (int l = 0; l <= d->L; l++) {
        char lab[16];
        if (l < d->L) snprintf(lab, sizeof lab, d->arch == MF_ARCH_LLAMA ? "layers.%d" : "h.%d", l);
        else snprintf(lab, sizeof lab, "other");
        fprintf(f, "  %-10s", lab);
        for (int k = 0; k < 5; k++) fprintf(f, " %10s", sz(rows[l][shown[k]], a));
        if (show_master) fprintf(f, " %10s", sz(rows[l][MF_CAT_MASTER], a));
        fputc('\n', f);
    }
    free(rows);
    fprintf(f, "  (peak at phase '%s')\n", mf_phase_name(m, p->peak_phase, a, sizeof a));
}

cJSON *mf_report_plan_json(const mf_config *cfg, const mf_dims *d, const mf_plan *p, const mf_model *m,
                           size_t runtime) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "model", model_name(cfg));
    cJSON_AddNumberToObject(o, "n_params", (double)mf_model_n_params(d));
    cJSON_AddNumberToObject(o, "n_active", (double)mf_model_n_active(d));
    cJSON_AddNumberToObject(o, "n_trainable", (double)mf_model_n_trainable(m));
    if (d->n_experts > 0) {
        int64_t R = 0, G = 0;
        mf_moe_buffer_sizes(NULL, &R, &G, m->B * m->T, d->top_k, d->n_experts, d->C, d->ffn, d->capacity_factor);
        if (m->d.ep > 1) mf_moe_ep_bounds(&m->d, m->B * m->T, &R, NULL, &G, NULL);  /* the expert group's */
        cJSON *mo = cJSON_AddObjectToObject(o, "moe");
        cJSON_AddNumberToObject(mo, "n_experts", d->n_experts);
        cJSON_AddNumberToObject(mo, "top_k", d->top_k);
        cJSON_AddNumberToObject(mo, "capacity_factor", d->capacity_factor > 0 ? d->capacity_factor : 0);
        cJSON_AddNumberToObject(mo, "capacity", m->moe_capacity);
        cJSON_AddStringToObject(mo, "bound", m->moe_capacity > 0 ? "capacity" : "dropless");
        cJSON_AddNumberToObject(mo, "permuted_rows", (double)R);
        cJSON_AddNumberToObject(mo, "group_rows", (double)G);
        if (m->d.ep > 1) {
            cJSON *ep = cJSON_AddObjectToObject(mo, "expert_parallel");
            cJSON_AddNumberToObject(ep, "group_ranks", m->d.ep);
            cJSON_AddNumberToObject(ep, "experts_per_rank", d->n_experts / m->d.ep);
            cJSON_AddNumberToObject(ep, "send_rows", (double)m->moe_ep_send);
            cJSON_AddNumberToObject(ep, "recv_rows", (double)m->moe_ep_recv);
        }
    }
    if (m->lora.r > 0) {
        char tg[128];
        cJSON *lo = cJSON_AddObjectToObject(o, "lora");
        cJSON_AddNumberToObject(lo, "r", m->lora.r);
        cJSON_AddNumberToObject(lo, "alpha", m->lora.alpha);
        cJSON_AddNumberToObject(lo, "dropout", m->lora.dropout);
        cJSON_AddStringToObject(lo, "targets", mf_lora_targets_str(&m->lora, tg, sizeof tg));
        cJSON_AddStringToObject(lo, "base_dtype", cfg->base_dtype);
    }
    cJSON_AddNumberToObject(o, "batch", m->B);
    cJSON_AddNumberToObject(o, "seq", m->T);
    cJSON_AddStringToObject(o, "recompute", cfg->recompute);
    cJSON_AddStringToObject(o, "precision", m->mode == MF_MODE_TRAIN ? cfg->precision : "fp32");
    cJSON_AddBoolToObject(o, "master_weights", m->opt.master);
    cJSON_AddStringToObject(o, "grad_dtype", m->mode == MF_MODE_TRAIN && m->opt.grad16 ? "bf16" : "fp32");
    cJSON_AddNumberToObject(o, "world_size", m->opt.world > 1 ? m->opt.world : 1);
    cJSON_AddNumberToObject(o, "zero", cfg->zero);
    {
        size_t ms[MF_CAT_COUNT];
        mf_zero_model_states(p, ms);
        cJSON *st = cJSON_AddObjectToObject(o, "model_states");
        cJSON_AddNumberToObject(st, "params", (double)ms[MF_CAT_PARAMS]);
        cJSON_AddNumberToObject(st, "grads", (double)ms[MF_CAT_GRADS]);
        cJSON_AddNumberToObject(st, "optim", (double)ms[MF_CAT_OPTIM]);
    }
    if (m->recompute.policy == MF_RECOMPUTE_AUTO) cJSON_AddNumberToObject(o, "recompute_blocks", m->auto_k);
    cJSON *bytes = cJSON_AddObjectToObject(o, "bytes");
    for (int i = 0; i < MF_CAT_COUNT; i++) cJSON_AddNumberToObject(bytes, mf_cat_name((mf_cat)i), (double)p->peak_cat[i]);
    cJSON_AddStringToObject(o, "optimizer", m->mode == MF_MODE_TRAIN ? mf_optim_name(m->opt.kind) : "");
    for (int k = 0; k < NSHOWN; k++) cJSON_AddNumberToObject(o, json_label(k), (double)p->peak_cat[shown[k]]);
    cJSON *mx = cJSON_AddObjectToObject(o, "max");
    for (int i = 0; i < MF_CAT_COUNT; i++) cJSON_AddNumberToObject(mx, mf_cat_name((mf_cat)i), (double)p->max_cat[i]);
    cJSON_AddNumberToObject(o, "total", (double)p->peak_bytes);
    cJSON_AddNumberToObject(o, "disk", (double)p->disk_bytes);
    cJSON_AddNumberToObject(o, "arena", (double)p->arena_bytes);
    cJSON_AddNumberToObject(o, "runtime", (double)runtime);
    {
        /* the comm.mpi.* rows: MPI's own scratch, outside the arena */
        cJSON *cm = cJSON_AddObjectToObject(o, "comm_mpi");
        static const char *nm[MF_DIST_COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather"};
        for (int c = 0; c < MF_DIST_COLL_COUNT; c++) {
            char row[64];
            snprintf(row, sizeof row, "comm.mpi.%s", nm[c]);
            int id = mf_plan_find(p, row);
            cJSON_AddNumberToObject(cm, nm[c], id >= 0 ? (double)p->bufs[id].bytes : 0);
        }
        cJSON_AddNumberToObject(cm, "total", (double)p->outside_bytes);
        mf_dist_scratch_src src = m->opt.world > 1 ? mf_dist_scratch_source() : MF_DIST_SCRATCH_NONE;
        cJSON_AddStringToObject(cm, "source", src == MF_DIST_SCRATCH_MEASURED ? "measured"
                                              : src == MF_DIST_SCRATCH_CACHED ? "cached"
                                              : src == MF_DIST_SCRATCH_DEFAULT ? "default" : "none");
        cJSON_AddNumberToObject(cm, "bucket_bytes", (double)mf_dist_bucket() * sizeof(float));
    }
    cJSON_AddNumberToObject(o, "process", (double)(p->arena_bytes + p->outside_bytes + runtime));
    /* bytes; 0 = no budget (as in the config) */
    cJSON_AddNumberToObject(o, "budget", (double)cfg->budget);
    size_t(*rows)[MF_CAT_COUNT] = calloc((size_t)d->L + 1, sizeof *rows);
    if (rows) {
        per_layer(p, d->L, rows);
        cJSON *layers = cJSON_AddArrayToObject(o, "layers");
        for (int l = 0; l < d->L; l++) {
            cJSON *x = cJSON_CreateObject();
            for (int i = 0; i < MF_CAT_COUNT; i++)
                if (rows[l][i]) cJSON_AddNumberToObject(x, mf_cat_name((mf_cat)i), (double)rows[l][i]);
            if (d->n_experts > 0) cJSON_AddNumberToObject(x, "experts", (double)expert_bytes(p, l));
            cJSON_AddItemToArray(layers, x);
        }
        free(rows);
    }
    return o;
}

char *mf_report_plan_json_string(const mf_config *cfg, const mf_dims *d, const mf_plan *p, const mf_model *m,
                                 size_t runtime) {
    cJSON *o = mf_report_plan_json(cfg, d, p, m, runtime);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

void mf_report_estimate_json(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                             const mf_model *m, size_t runtime) {
    char *s = mf_report_plan_json_string(cfg, d, p, m, runtime);
    if (s) fprintf(f, "%s\n", s);
    free(s);
}
