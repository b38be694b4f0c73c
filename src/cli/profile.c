/* memfit profile's tables. Bytes come from the plan and the ledger, times
 * from the phase hook (observe.c), FLOPs from the dimensions, savings from
 * real plans of the same config with one setting changed. */
#include "profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sz(size_t b, char *buf) { return mf_size_format(b, buf, 32); }

double mf_profile_block_flops(const mf_dims *d, int B, int T) {
    return 2.0 * B * T * (double)mf_model_block_matmul_params(d) + mf_model_attention_flops(d, B, T);
}

typedef struct {
    int order;              /* layer index: ties keep it */
    char label[24];
    size_t acts, scratch;
    double fwd_ms, bwd_ms;  /* NAN: no such phase */
    double fwd_fl, bwd_fl;  /* NAN: not counted */
} prow;

static double ms(const mf_observer *o, int ph) {
    return o->n_counted ? 1e3 * o->phase_s[ph] / o->n_counted : NAN;
}

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

static int by_memory(const void *pa, const void *pb) {
    const prow *a = pa, *b = pb;
    size_t x = a->acts + a->scratch, y = b->acts + b->scratch;
    if (x != y) return (x < y) - (x > y);
    return (a->order > b->order) - (a->order < b->order);
}

static int recomputed_block(const mf_model *m, int l) { return m->seg > 0 || l < m->auto_k; }

/* extra forward FLOPs per micro-step that recomputation adds (whole blocks;
 * selective rebuilds only element-wise outputs: no matmul FLOPs) */
static double recompute_flops(const mf_model *m) {
    double blk = mf_profile_block_flops(&m->d, m->B, m->T), s = 0;
    for (int l = 0; l < m->d.L; l++) s += recomputed_block(m, l) ? blk : 0;
    return s;
}

/* forward + backward FLOPs of one micro-step without recomputation */
static double step_flops(const mf_model *m) {
    double blk = mf_profile_block_flops(&m->d, m->B, m->T);
    double head = 2.0 * m->B * m->T * m->d.C * m->d.Vp;
    return 3 * (m->d.L * blk + head);
}

static void put_ms(FILE *f, double v) {
    if (isnan(v)) fprintf(f, " %8s", "-");
    else fprintf(f, " %8.2f", v);
}

static void put_gf(FILE *f, double v) {
    if (isnan(v)) fprintf(f, " %9s", "-");
    else fprintf(f, " %9.3f", v / 1e9);
}

static void layer_table(FILE *f, const mf_trainer *t, const mf_observer *o) {
    const mf_model *m = &t->model;
    const mf_plan *p = &t->plan;
    int L = t->d.L, accum = t->cfg.grad_accum;
    prow *rows = calloc((size_t)L + 4, sizeof *rows);
    if (!rows) return;
    double blk = mf_profile_block_flops(&t->d, t->B, t->T) * accum;
    for (int l = 0; l < L; l++) {
        prow *r = &rows[l];
        r->order = l;
        snprintf(r->label, sizeof r->label, m->d.arch == MF_ARCH_LLAMA ? "layers.%d" : "h.%d", l);
        int pf = mf_phase_layer_fwd(m, l), pb = mf_phase_layer_bwd(m, l);
        r->scratch = maxz(o->phase_work[pf], o->phase_work[pb]);
        r->fwd_ms = ms(o, pf);
        r->bwd_ms = ms(o, pb);
        r->fwd_fl = blk;
        r->bwd_fl = 2 * blk + (recomputed_block(m, l) ? blk : 0);
    }
    /* rows without a layer: the embedding's, the head's (final LayerNorm,
     * logits and loss) and the recompute slots every block shares; the
     * optimizer last */
    int ef = mf_phase_emb_fwd(m), hf = mf_phase_head_fwd(m), hb = mf_phase_head_bwd(m), eb = mf_phase_emb_bwd(m);
    prow *em = &rows[L], *hd = &rows[L + 1], *sl = &rows[L + 2], *op = &rows[L + 3];
    snprintf(em->label, sizeof em->label, "embed");
    em->order = L;
    em->scratch = maxz(o->phase_work[ef], o->phase_work[eb]);
    em->fwd_ms = ms(o, ef);
    em->bwd_ms = ms(o, eb);
    em->fwd_fl = em->bwd_fl = NAN;
    snprintf(hd->label, sizeof hd->label, "head");
    hd->order = L + 1;
    hd->scratch = maxz(o->phase_work[hf], o->phase_work[hb]);
    hd->fwd_ms = ms(o, hf);
    hd->bwd_ms = ms(o, hb);
    double head = 2.0 * t->B * t->T * t->d.C * t->d.Vp * accum;
    hd->fwd_fl = head;
    hd->bwd_fl = 2 * head;
    snprintf(sl->label, sizeof sl->label, "slots");
    sl->order = L + 2;
    sl->fwd_ms = sl->bwd_ms = sl->fwd_fl = sl->bwd_fl = NAN;
    snprintf(op->label, sizeof op->label, "optimizer");
    int po = mf_phase_optim(m);
    op->scratch = o->phase_work[po];
    op->fwd_ms = NAN;
    op->bwd_ms = ms(o, po);
    op->fwd_fl = op->bwd_fl = NAN;
    for (int i = 0; i < p->n; i++) {
        const mf_buf *b = &p->bufs[i];
        if (b->cat != MF_CAT_ACTS || b->disk) continue;
        if (b->layer >= 0 && b->layer < L) rows[b->layer].acts += b->bytes;
        else if (b->first == ef) em->acts += b->bytes;
        else if (b->first == hf) hd->acts += b->bytes;
        else sl->acts += b->bytes;
    }
    int nrows = L + 2;
    if (sl->acts) nrows++;
    else *sl = *op;
    qsort(rows, (size_t)nrows, sizeof *rows, by_memory);  /* the optimizer row stays last */

    char rc[32];
    snprintf(rc, sizeof rc, "%s", t->cfg.recompute);
    fprintf(f, "\nper layer, sorted by memory (times: ms per step, mean of %d step%s%s)\n", o->n_counted,
            o->n_counted == 1 ? "" : "s", o->count_from > o->steady_step && o->n_counted ? "; the first step is warm-up, not counted" : "");
    if (strcmp(rc, "none") == 0)
        fprintf(f, "  bwd ms: the layer's backward (recompute none: nothing is recomputed)\n");
    else
        fprintf(f, "  bwd ms and bwd GFLOP include the recomputation of --recompute %s, which runs inside the backward phase\n", rc);
    fprintf(f, "  %-10s %12s %12s %8s %8s %9s %9s %8s\n", "layer", "acts kept", "scratch peak", "fwd ms", "bwd ms",
            "fwd GFLOP", "bwd GFLOP", "GFLOP/s");
    char a[32], b[32];
    for (int i = 0; i < nrows + 1; i++) {
        const prow *r = &rows[i];
        fprintf(f, "  %-10s %12s %12s", r->label, r->acts ? sz(r->acts, a) : "-", sz(r->scratch, b));
        put_ms(f, r->fwd_ms);
        put_ms(f, r->bwd_ms);
        put_gf(f, r->fwd_fl);
        put_gf(f, r->bwd_fl);
        double tms = (isnan(r->fwd_ms) ? 0 : r->fwd_ms) + (isnan(r->bwd_ms) ? 0 : r->bwd_ms);
        if (!isnan(r->fwd_fl) && tms > 0) fprintf(f, " %8.1f", (r->fwd_fl + r->bwd_fl) / (tms * 1e-3) / 1e9);
        else fprintf(f, " %8s", "-");
        fputc('\n', f);
    }
    fprintf(f, "  embed: its phase also loads the batch and zeroes the gradients. head: final LayerNorm, logits\n"
               "  and loss; the classifier's backward runs with the loss, inside 'head fwd'.\n");
    if (sl->acts) fprintf(f, "  slots: activations rebuilt by recomputation, one set shared by every block.\n");
    fprintf(f, "  scratch peak: the work category's live bytes, highest over the row's phases.\n");
    free(rows);
}

static void category_table(FILE *f, const mf_trainer *t, const mf_observer *o) {
    char a[32];
    const mf_ledger *l = &t->ledger;
    size_t tot = 0;
    for (int c = 0; c < MF_CAT_COUNT; c++) tot += o->step_at_peak[c];
    fprintf(f, "\nper category at the step's peak (the ledger's bytes, read by the phase hook in step %d)\n", o->last_step);
    fprintf(f, "  %-10s %14s %12s %7s\n", "category", "bytes", "", "share");
    for (int c = 0; c < MF_CAT_COUNT; c++) {
        if (!o->step_at_peak[c]) continue;
        fprintf(f, "  %-10s %14zu %12s %6.1f%%\n", mf_cat_name((mf_cat)c), o->step_at_peak[c],
                sz(o->step_at_peak[c], a), 100.0 * (double)o->step_at_peak[c] / (double)(tot ? tot : 1));
    }
    int same = tot == l->peak_total && memcmp(o->step_at_peak, l->at_peak, sizeof l->at_peak) == 0;
    fprintf(f, "  %-10s %14zu %12s   %s the ledger's peak (%zu bytes) and its breakdown\n", "total", tot, sz(tot, a),
            same ? "equal to" : "DIFFERENT from", l->peak_total);
}

static int by_bytes(const void *pa, const void *pb) {
    const mf_buf *a = *(const mf_buf *const *)pa, *b = *(const mf_buf *const *)pb;
    return (a->bytes < b->bytes) - (a->bytes > b->bytes);
}

static void top_consumers(FILE *f, const mf_trainer *t, int k) {
    const mf_plan *p = &t->plan;
    const mf_buf **v = malloc(sizeof *v * (size_t)(p->n ? p->n : 1));
    if (!v) return;
    int n = 0;
    for (int i = 0; i < p->n; i++)
        if (!p->bufs[i].disk) v[n++] = &p->bufs[i];
    qsort(v, (size_t)n, sizeof *v, by_bytes);
    fprintf(f, "\ntop %d consumers (plan rows by bytes)\n", k < n ? k : n);
    char a[32], p0[48], p1[48];
    for (int i = 0; i < k && i < n; i++) {
        const mf_buf *b = v[i];
        int persistent = b->first == 0 && b->last == p->n_phases - 1;
        if (persistent) snprintf(p0, sizeof p0, "whole step");
        else {
            mf_phase_name(&t->model, b->first, p0, sizeof p0);
            mf_phase_name(&t->model, b->last, p1, sizeof p1);
            if (b->first != b->last) snprintf(p0 + strlen(p0), sizeof p0 - strlen(p0), " .. %s", p1);
        }
        fprintf(f, "  %-32s %-7s %12s  %s\n", b->name, mf_cat_name(b->cat), sz(b->bytes, a), p0);
    }
    free(v);
}

/* The plan of t's config with one key changed: its arena bytes, and the
 * model's recomputation FLOPs (through *rflops). 0 on failure. */
static size_t replan(const mf_trainer *t, const char *key, const char *value, double *rflops) {
    mf_config c = t->cfg;
    if (mf_config_set(&c, key, value)) return 0;
    mf_dims d;
    mf_plan p;
    mf_model m;
    if (mf_model_build_plan(&c, MF_MODE_TRAIN, t->nthreads, t->ledger.rss_baseline, &d, &p, &m)) return 0;
    size_t arena = p.arena_bytes;
    if (rflops) *rflops = recompute_flops(&m);
    mf_model_free(&m);
    mf_plan_free(&p);
    return arena;
}

static void suggestions(FILE *f, const mf_trainer *t, const mf_observer *o) {
    char a[32], b[32];
    const size_t *cat = o->step_at_peak;
    size_t peak = 0, big = 0;
    int bigc = 0;
    for (int c = 0; c < MF_CAT_COUNT; c++) {
        peak += cat[c];
        if (cat[c] > big) { big = cat[c]; bigc = c; }
    }
    if (!peak) return;
    size_t arena = t->plan.arena_bytes;
    double base_fl = step_flops(&t->model), base_rc = recompute_flops(&t->model);
    int n = 0;
    fprintf(f, "\nsuggestions (from plans of this config with one setting changed; savings in arena bytes, now %s)\n",
            sz(arena, a));
    double acts = (double)cat[MF_CAT_ACTS] / (double)peak;
    if (acts > 0.30) {
        static const char *pol[] = {"selective", "full"};
        for (int i = 0; i < 2; i++) {
            if (strcmp(t->cfg.recompute, pol[i]) == 0) continue;
            double rf = 0;
            size_t other = replan(t, "recompute", pol[i], &rf);
            if (!other || other >= arena) continue;
            fprintf(f, "  acts are %.0f%% of peak: --recompute %s saves %s", 100 * acts, pol[i], sz(arena - other, b));
            if (i == 0) fprintf(f, " (rebuilds LayerNorm and GELU outputs: element-wise, no extra matmul FLOPs)\n");
            else fprintf(f, " (recomputes every block: ~%+.0f%% step FLOPs)\n", 100 * (rf - base_rc) / (base_fl + base_rc));
            n++;
        }
    }
    if (bigc == MF_CAT_OPTIM) {
        static const char *opt[] = {"adamw8bit", "adafactor"};
        for (int i = 0; i < 2; i++) {
            if (strcmp(t->cfg.optimizer, opt[i]) == 0) continue;
            size_t other = replan(t, "optimizer", opt[i], NULL);
            if (!other || other >= arena) continue;
            fprintf(f, "  optimizer state is the largest category (%.0f%% of peak): --optimizer %s saves %s "
                       "(changes the maths: see its measured loss gap)\n",
                    100.0 * (double)big / (double)peak, opt[i], sz(arena - other, b));
            n++;
        }
    }
    double work = (double)cat[MF_CAT_WORK] / (double)peak;
    if (work > 0.30 && (t->cfg.loss_chunk == 0 || t->cfg.loss_chunk > 256)) {
        size_t other = replan(t, "loss_chunk", "256", NULL);
        if (other && other < arena) {
            fprintf(f, "  scratch is %.0f%% of peak: --loss_chunk 256 saves %s (logits for 256 rows at a time, same loss)\n",
                    100 * work, sz(arena - other, b));
            n++;
        }
    }
    if (bigc == MF_CAT_OFFLOAD && t->cfg.offload_window >= ((size_t)4 << 20)) {
        char v[32];
        size_t w = t->cfg.offload_window / 4;
        if (w % ((size_t)1 << 20) == 0) snprintf(v, sizeof v, "%zuMiB", w >> 20);
        else snprintf(v, sizeof v, "%zu", w);
        size_t other = replan(t, "offload_window", v, NULL);
        if (other && other < arena) {
            fprintf(f, "  the offload windows are the largest category (%.0f%% of peak): --offload_window %s saves %s "
                       "(more, smaller reads and writes per step)\n",
                    100.0 * (double)big / (double)peak, v, sz(arena - other, b));
            n++;
        }
    }
    if (t->cfg.budget) {
        size_t proc = arena + t->ledger.rss_baseline;
        fprintf(f, "  the process needs %s of the %s budget (%.1f%%, health level %s)\n", sz(proc, a),
                sz(t->cfg.budget, b), 100.0 * (double)proc / (double)t->cfg.budget,
                mf_health_name(mf_health_level(proc, t->cfg.budget)));
        n++;
    }
    if (!n) fprintf(f, "  none (checked: acts over 30%% of peak, optimizer state or offload windows largest, scratch over 30%%)\n");
}

/* a mixture of experts: token-slots per expert per layer in the last
 * training forward (the routing's counts, before capacity drops) */
static void expert_table(FILE *f, const mf_trainer *t) {
    const mf_model *m = &t->model;
    int E = m->d.n_experts;
    if (E <= 0 || !m->moe_tokens) return;
    fprintf(f, "\ntokens per expert per layer (token-slots routed in the last step's last micro-batch, top-%d; "
               "imbalance = largest / mean)\n  %-10s", m->d.top_k, "layer");
    for (int e = 0; e < E; e++) fprintf(f, " %7s%-2d", "e", e);
    fprintf(f, " %9s\n", "imbalance");
    for (int l = 0; l < m->d.L; l++) {
        const int64_t *c = m->moe_tokens + (size_t)l * E;
        int64_t sum = 0, mx = 0;
        char lb[24];
        snprintf(lb, sizeof lb, "layers.%d", l);
        fprintf(f, "  %-10s", lb);
        for (int e = 0; e < E; e++) {
            fprintf(f, " %9lld", (long long)c[e]);
            sum += c[e];
            mx = c[e] > mx ? c[e] : mx;
        }
        fprintf(f, " %9.3f\n", sum ? (double)mx * E / (double)sum : 0.0);
    }
    fprintf(f, "  router losses of that micro-batch (means over layers): aux %.6f, z %.6f\n", m->moe_aux, m->moe_z);
}

void mf_profile_print(FILE *f, const mf_trainer *t, const mf_observer *o) {
    fprintf(f, "\n==== profile: %s, batch %d x seq %d x accum %d, recompute %s, optimizer %s ====\n", t->cfg.model, t->B,
            t->T, t->cfg.grad_accum, t->cfg.recompute, t->cfg.optimizer);
    if (o->n_counted == 0) {
        fprintf(f, "no steps were profiled\n");
        return;
    }
    layer_table(f, t, o);
    category_table(f, t, o);
    expert_table(f, t);
    top_consumers(f, t, 5);
    suggestions(f, t, o);
}
