/* The settings search: every combination of the axes below is planned with
 * the real plan builder (mf_model_build_plan), timed with the rates model
 * (rates.c), and the fastest that fits the budget is chosen. */
#include "memfit/planner.h"
#include "memfit/model.h"
#include "dist/dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the axes -----------------------------------------------------------
 * One axis is a config key and its candidate values. "micro_batch" is the
 * one pseudo-key: it sets batch and grad_accum so that their product stays
 * the effective batch (gradients identical to the big batch); "precision"
 * values are fp32, bf16, bf16:nomaster (bf16 with master_weights 0) and
 * bf16:pure (that and pure_bf16: bf16 AdamW moments), each bf16 one also
 * with ":g16" (grad_dtype bf16: bf16 gradients of the 16-bit weights);
 * "lora" values are "" (full fine-tuning) or "BASE_DTYPE|LORA_SPEC". */
#define MAX_VALS 24
#define N_AXES 8
/* the adapters the planner offers: r=8 on all of a block's matrices
 * (GPT-2's four: the README's walk-through and bench/lora.sh; a Llama's
 * seven projections) */
#define MF_PLANNER_LORA "r=8,alpha=16,dropout=0.05,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"
#define MF_PLANNER_LORA_LLAMA "r=8,alpha=16,dropout=0.05,targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
typedef struct {
    const char *key;
    int n;
    char val[MAX_VALS][MF_PATH_MAX + 32];
    int lossy[MAX_VALS];
} axis;

static void axis_add(axis *a, const char *v, int lossy) {
    if (a->n >= MAX_VALS) return;
    snprintf(a->val[a->n], sizeof a->val[0], "%s", v);
    a->lossy[a->n++] = lossy;
}

static int build_axes(axis *ax, const mf_config *cfg, int eff, int allow_lossy, const char *offload_path) {
    memset(ax, 0, sizeof(axis) * N_AXES);
    char v[64];
    /* recompute: every policy gives identical gradients */
    ax[0].key = "recompute";
    if (mf_config_was_set(cfg, "recompute")) axis_add(&ax[0], cfg->recompute, 0);
    else {
        static const char *pol[] = {"none", "selective", "sqrt", "full", "auto"};
        for (int i = 0; i < 5; i++) axis_add(&ax[0], pol[i], 0);
    }
    /* micro-batch x accumulation with the effective batch fixed */
    ax[1].key = "micro_batch";
    if (mf_config_was_set(cfg, "grad_accum") && cfg->batch * cfg->grad_accum == eff) {
        snprintf(v, sizeof v, "%d", cfg->batch);
        axis_add(&ax[1], v, 0);
    } else {
        for (int b = eff; b >= 1; b--) {
            if (eff % b) continue;
            snprintf(v, sizeof v, "%d", b);
            axis_add(&ax[1], v, 0);
        }
    }
    /* optimizer: the requested one; 8-bit AdamW and Adafactor stand in
     * for AdamW only when lossy settings are allowed; SGD never */
    ax[2].key = "optimizer";
    axis_add(&ax[2], cfg->optimizer, 0);
    if (allow_lossy && strcmp(cfg->optimizer, "adamw") == 0) {
        axis_add(&ax[2], "adamw8bit", 1);
        axis_add(&ax[2], "adafactor", 1);
    }
    /* update_in_backward: exact only without clipping (and accumulation,
     * which mf_optim_init enforces) */
    ax[3].key = "update_in_backward";
    if (mf_config_was_set(cfg, "update_in_backward") || cfg->grad_clip > 0)
        axis_add(&ax[3], cfg->update_in_backward ? "1" : "0", 0);
    else {
        axis_add(&ax[3], "0", 0);
        axis_add(&ax[3], "1", 0);
    }
    /* optimizer state on disk: exact */
    ax[4].key = "offload";
    if (mf_config_was_set(cfg, "offload")) axis_add(&ax[4], cfg->offload, 0);
    else {
        axis_add(&ax[4], "", 0);
        if (offload_path && offload_path[0]) {
            char o[MF_PATH_MAX + 32];
            snprintf(o, sizeof o, "optimizer=disk:%s", offload_path);
            axis_add(&ax[4], o, 0);
        }
    }
    /* precision (docs/precision.md): bf16 changes the maths, so it is a
     * candidate only when lossy settings are allowed; with or without fp32
     * master weights (the smaller); fp16 is never faster or smaller than
     * bf16 here, so it is only kept when asked for */
    ax[5].key = "precision";
    if (mf_config_was_set(cfg, "precision") || mf_config_was_set(cfg, "master_weights") ||
        mf_config_was_set(cfg, "pure_bf16") || mf_config_was_set(cfg, "grad_dtype")) {
        int b16 = strcmp(cfg->precision, "bf16") == 0;
        /* bf16 gradients are offered on a given bf16 setting unless
         * grad_dtype was given too (they change the maths: lossy) */
        int g16 = b16 && strcmp(cfg->grad_dtype, "bf16") == 0, offer = b16 && allow_lossy && !g16 &&
                                                                     !mf_config_was_set(cfg, "grad_dtype");
        const char *mw = b16 && cfg->pure_bf16 ? ":pure" : b16 && !cfg->master_weights ? ":nomaster" : "";
        snprintf(v, sizeof v, "%s%s%s", cfg->precision, mw, g16 ? ":g16" : "");
        axis_add(&ax[5], v, 0);
        if (offer) {
            snprintf(v, sizeof v, "%s%s:g16", cfg->precision, mw);
            axis_add(&ax[5], v, 1);
        }
    } else {
        axis_add(&ax[5], cfg->precision, 0);
        if (allow_lossy && strcmp(cfg->precision, "fp32") == 0) {
            axis_add(&ax[5], "bf16", 1);
            axis_add(&ax[5], "bf16:nomaster", 1);
            axis_add(&ax[5], "bf16:pure", 1);  /* AdamW only: the optimizer refuses the others */
            axis_add(&ax[5], "bf16:g16", 1);   /* the same with bf16 gradients (not adafactor: refused) */
            axis_add(&ax[5], "bf16:nomaster:g16", 1);
            axis_add(&ax[5], "bf16:pure:g16", 1);
        }
    }
    /* LoRA (docs/lora.md) trains adapters on a frozen base instead of the
     * base itself: another run, not the same one leaner. So it is offered
     * only when lossy settings are allowed and the run fine-tunes weights
     * it loads (--init; adapters on a random base learn nothing useful),
     * on an fp32, bf16, int8 or NF4 base; a --lora the user gave is kept */
    ax[6].key = "lora";
    if (cfg->lora[0] || mf_config_was_set(cfg, "lora")) {
        char lv[MF_PATH_MAX + 32];
        snprintf(lv, sizeof lv, "%s|%s", cfg->base_dtype, cfg->lora);
        axis_add(&ax[6], cfg->lora[0] ? lv : "", 0);
    } else {
        axis_add(&ax[6], "", 0);
        mf_dims d;
        if (allow_lossy && cfg->init[0] && mf_model_dims(cfg, &d) == 0) {
            static const char *base[] = {"fp32", "bf16", "int8", "nf4"};
            for (int i = 0; i < 4; i++) {
                char lv[MF_PATH_MAX + 32];
                snprintf(lv, sizeof lv, "%s|%s", base[i], d.arch == MF_ARCH_LLAMA ? MF_PLANNER_LORA_LLAMA : MF_PLANNER_LORA);
                axis_add(&ax[6], lv, 1);
            }
        }
    }
    /* distillation's teacher (docs/distillation.md): stored bf16, int8 or
     * nf4 its logits change, so those are offered only when lossy settings
     * are allowed; a --teacher_dtype the user gave is kept */
    ax[7].key = "teacher_dtype";
    if (!cfg->teacher[0] || mf_config_was_set(cfg, "teacher_dtype")) axis_add(&ax[7], cfg->teacher_dtype, 0);
    else {
        static const char *tdt[] = {"fp32", "bf16", "int8", "nf4"};
        for (int i = 0; i < (allow_lossy ? 4 : 1); i++) axis_add(&ax[7], tdt[i], i > 0);
    }
    return 0;
}

static int axis_set(mf_config *c, const axis *a, int i, int eff) {
    if (strcmp(a->key, "micro_batch") == 0) {
        c->batch = atoi(a->val[i]);
        c->grad_accum = eff / c->batch;
        return 0;
    }
    if (strcmp(a->key, "precision") == 0) {
        int pure = strstr(a->val[i], ":pure") != NULL, nomaster = pure || strstr(a->val[i], ":nomaster") != NULL;
        char p[8];
        snprintf(p, sizeof p, "%.*s", (int)strcspn(a->val[i], ":"), a->val[i]);
        c->master_weights = !nomaster;
        c->pure_bf16 = pure;
        snprintf(c->grad_dtype, sizeof c->grad_dtype, "%s", strstr(a->val[i], ":g16") ? "bf16" : "fp32");
        return mf_config_set(c, "precision", p);
    }
    if (strcmp(a->key, "lora") == 0) {
        const char *bar = strchr(a->val[i], '|');
        if (!bar) {
            c->lora[0] = 0;
            return 0;
        }
        char bd[8];
        snprintf(bd, sizeof bd, "%.*s", (int)(bar - a->val[i]), a->val[i]);
        return mf_config_set(c, "base_dtype", bd) || mf_config_set(c, "lora", bar + 1) ? -1 : 0;
    }
    return mf_config_set(c, a->key, a->val[i]);
}

static int push(mf_planner_result *r, const mf_planner_choice *c) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        mf_planner_choice *nc = realloc(r->c, sizeof *nc * (size_t)cap);
        if (!nc) return mf_fail("planner: out of memory");
        r->c = nc;
        r->cap = cap;
    }
    r->c[r->n++] = *c;
    return 0;
}

int mf_planner_search(const mf_config *cfg, int eff_batch, int allow_lossy, size_t runtime, int nthreads,
                      const mf_rates *rates, const char *offload_path, mf_planner_result *out) {
    memset(out, 0, sizeof *out);
    out->chosen = out->smallest = out->requested = -1;
    out->budget = cfg->budget;
    out->runtime = runtime;
    int eff = eff_batch > 0 ? eff_batch : cfg->batch * cfg->grad_accum;
    out->eff_batch = eff;
    out->world = cfg->world_size > 1 ? cfg->world_size : 1;
    out->zero = cfg->zero;
    out->group = cfg->zero_group > 0 && cfg->zero_group < out->world ? cfg->zero_group : 0;
    out->net_gbps = cfg->net_gbps;
    snprintf(out->offload_path, sizeof out->offload_path, "%s", offload_path ? offload_path : "");
    /* the requested config must plan: a bad model or seq is the user's
     * error, not a candidate to skip */
    {
        mf_config c0 = *cfg;
        mf_dims d;
        mf_plan p;
        mf_model m;
        if (mf_model_build_plan(&c0, MF_MODE_TRAIN, nthreads, runtime, &d, &p, &m)) return -1;
        out->seq = cfg->seq ? cfg->seq : d.maxT;
        mf_model_free(&m);
        mf_plan_free(&p);
    }
    axis ax[N_AXES];
    build_axes(ax, cfg, eff, allow_lossy, offload_path);
    int idx[N_AXES] = {0};
    for (;;) {
        mf_config c = *cfg;
        int lossy = 0, bad = 0;
        for (int a = 0; a < N_AXES && !bad; a++) {
            bad = axis_set(&c, &ax[a], idx[a], eff) != 0;
            lossy |= ax[a].lossy[idx[a]];
        }
        mf_dims d;
        mf_plan p;
        mf_model m;
        /* combinations the optimizer refuses (update_in_backward with
         * accumulation or offload, offloaded Adafactor) are not settings */
        if (!bad && mf_model_build_plan(&c, MF_MODE_TRAIN, nthreads, runtime, &d, &p, &m) == 0) {
            mf_planner_choice ch;
            memset(&ch, 0, sizeof ch);
            snprintf(ch.recompute, sizeof ch.recompute, "%s", c.recompute);
            ch.batch = c.batch;
            ch.grad_accum = c.grad_accum;
            snprintf(ch.optimizer, sizeof ch.optimizer, "%s", c.optimizer);
            snprintf(ch.precision, sizeof ch.precision, "%s", c.precision);
            ch.master = m.opt.master;
            ch.pure = m.opt.half_state;
            ch.grad16 = m.opt.grad16;
            snprintf(ch.lora, sizeof ch.lora, "%s", c.lora);
            snprintf(ch.base_dtype, sizeof ch.base_dtype, "%s", c.lora[0] ? c.base_dtype : "");
            snprintf(ch.teacher_dtype, sizeof ch.teacher_dtype, "%s", c.teacher[0] ? c.teacher_dtype : "");
            ch.update_in_backward = c.update_in_backward;
            ch.offload = c.offload[0] != 0;
            ch.lossy = lossy;
            ch.auto_k = m.auto_k;
            ch.arena_bytes = p.arena_bytes;
            ch.disk_bytes = p.disk_bytes;
            ch.process = p.arena_bytes + p.outside_bytes + runtime;  /* + MPI's comm.mpi.* rows */
            ch.need = ch.process + MF_PLANNER_HEADROOM(p.arena_bytes);
            memcpy(ch.peak_cat, p.peak_cat, sizeof ch.peak_cat);
            mf_planner_predict(rates, &ch, &m, &p);
            if (m.opt.world > 1) {
                /* each rank's share of the step's collectives (ZeRO paper
                 * section 7: 2 Psi per step for stages 0-2, 3 Psi for stage
                 * 3, with bandwidth-optimal reduce-scatter and all-gather
                 * each moving (W-1)/W of the buffer), in fp32 bytes;
                 * assumed not hidden behind compute (an upper bound) */
                ch.comm_bytes = mf_zero_comm_volume(m.opt.zero, m.opt.world, m.opt.group, (double)ch.optim_params);
                ch.comm_s = cfg->net_gbps > 0 ? ch.comm_bytes * 8 / (cfg->net_gbps * 1e9) : 0;
                ch.pred_s += ch.comm_s;
            }
            ch.fits = cfg->budget == 0 || ch.need <= cfg->budget;
            /* auto that resolved to none or every block repeats those */
            int dup = strcmp(c.recompute, "auto") == 0 && (m.auto_k == 0 || m.auto_k == d.L) &&
                      !mf_config_was_set(cfg, "recompute");
            mf_model_free(&m);
            mf_plan_free(&p);
            if (!dup && push(out, &ch)) return -1;
        }
        int a = 0;
        while (a < N_AXES && ++idx[a] == ax[a].n) idx[a++] = 0;
        if (a == N_AXES) break;
    }
    if (out->n == 0) return mf_fail("planner: no setting of this run could be planned");
    /* the requested setting, the smallest, the frontier, the choice */
    int req_accum = eff % cfg->batch == 0 ? eff / cfg->batch : -1;
    for (int i = 0; i < out->n; i++) {
        mf_planner_choice *x = &out->c[i];
        if (strcmp(x->recompute, cfg->recompute) == 0 && x->batch == cfg->batch && x->grad_accum == req_accum &&
            strcmp(x->optimizer, cfg->optimizer) == 0 && x->update_in_backward == cfg->update_in_backward &&
            strcmp(x->precision, cfg->precision) == 0 && (strcmp(x->precision, "fp32") == 0 || x->master == cfg->master_weights) && x->pure == cfg->pure_bf16 &&
            x->grad16 == (strcmp(cfg->grad_dtype, "bf16") == 0) &&
            x->offload == (cfg->offload[0] != 0) && strcmp(x->lora, cfg->lora) == 0 &&
            (!cfg->lora[0] || strcmp(x->base_dtype, cfg->base_dtype) == 0) &&
            (!cfg->teacher[0] || strcmp(x->teacher_dtype, cfg->teacher_dtype) == 0))
            out->requested = i;
        if (out->smallest < 0 || x->need < out->c[out->smallest].need ||
            (x->need == out->c[out->smallest].need && x->pred_s < out->c[out->smallest].pred_s))
            out->smallest = i;
        int dominated = 0;
        for (int j = 0; j < out->n && !dominated; j++) {
            const mf_planner_choice *y = &out->c[j];
            if (j == i) continue;
            int no_worse = y->need <= x->need && y->pred_s <= x->pred_s;
            int better = y->need < x->need || y->pred_s < x->pred_s;
            dominated = no_worse && (better || j < i);  /* exact ties: the first is kept */
        }
        x->frontier = !dominated;
        if (x->fits && (out->chosen < 0 || x->pred_s < out->c[out->chosen].pred_s)) out->chosen = i;
    }
    /* a lossy setting only when it is needed to fit or clearly faster (3%)
     * than the fastest exact one */
    int ex = -1;
    for (int i = 0; i < out->n; i++)
        if (out->c[i].fits && !out->c[i].lossy && (ex < 0 || out->c[i].pred_s < out->c[ex].pred_s)) ex = i;
    if (ex >= 0 && out->chosen >= 0 && out->c[out->chosen].lossy && out->c[out->chosen].pred_s >= 0.97 * out->c[ex].pred_s) out->chosen = ex;
    /* LoRA trains adapters, not the model: chosen only when no full
     * fine-tuning setting fits, however much faster it is */
    if (out->chosen >= 0 && out->c[out->chosen].lora[0] && !cfg->lora[0]) {
        int full = -1;
        for (int i = 0; i < out->n; i++)
            if (out->c[i].fits && !out->c[i].lora[0] && (full < 0 || out->c[i].pred_s < out->c[full].pred_s)) full = i;
        if (full >= 0) out->chosen = full;
    }
    int q = out->requested;
    if (out->chosen >= 0 && q >= 0 && out->c[q].fits && out->c[q].pred_s <= 1.03 * out->c[out->chosen].pred_s)
        out->chosen = q;
    if (out->chosen >= 0) out->c[out->chosen].chosen = 1;
    return 0;
}

void mf_planner_free(mf_planner_result *r) {
    free(r->c);
    memset(r, 0, sizeof *r);
}

int mf_planner_apply(const mf_planner_choice *c, const char *offload_path, mf_config *cfg) {
    char v[MF_PATH_MAX + 32];
    cfg->batch = c->batch;
    cfg->grad_accum = c->grad_accum;
    if (mf_config_set(cfg, "recompute", c->recompute) || mf_config_set(cfg, "optimizer", c->optimizer) ||
        mf_config_set(cfg, "update_in_backward", c->update_in_backward ? "1" : "0") ||
        (c->precision[0] && mf_config_set(cfg, "precision", c->precision)))
        return -1;
    if (strcmp(cfg->precision, "fp32") != 0) cfg->master_weights = c->master;
    cfg->pure_bf16 = c->pure;
    snprintf(cfg->grad_dtype, sizeof cfg->grad_dtype, "%s", c->grad16 ? "bf16" : "fp32");
    if (mf_config_set(cfg, "lora", c->lora) || (c->lora[0] && mf_config_set(cfg, "base_dtype", c->base_dtype))) return -1;
    if (c->teacher_dtype[0] && mf_config_set(cfg, "teacher_dtype", c->teacher_dtype)) return -1;
    if (c->offload && !cfg->offload[0]) {
        snprintf(v, sizeof v, "optimizer=disk:%s", offload_path);
        if (mf_config_set(cfg, "offload", v)) return -1;
    } else if (!c->offload) cfg->offload[0] = 0;
    return 0;
}

char *mf_planner_describe(const mf_planner_choice *c, char *buf, size_t n) {
    char rc[32];
    if (strcmp(c->recompute, "auto") == 0) snprintf(rc, sizeof rc, "auto(%d blocks)", c->auto_k);
    else snprintf(rc, sizeof rc, "%s", c->recompute);
    char pr[32] = "";
    if (c->precision[0] && strcmp(c->precision, "fp32") != 0)
        snprintf(pr, sizeof pr, ", %s%s%s", c->precision, c->pure ? " pure" : c->master ? "" : " no master",
                 c->grad16 ? " bf16 grads" : "");
    char lo[48] = "";
    if (c->lora[0]) {
        const char *r = strstr(c->lora, "r=");
        snprintf(lo, sizeof lo, ", LoRA r=%d on a %s base", r ? atoi(r + 2) : 0, c->base_dtype);
    }
    char te[32] = "";
    if (c->teacher_dtype[0]) snprintf(te, sizeof te, ", teacher %s", c->teacher_dtype);
    snprintf(buf, n, "recompute %s, batch %d x accum %d, %s%s%s%s%s%s", rc, c->batch, c->grad_accum, c->optimizer,
             c->update_in_backward ? ", update_in_backward" : "", c->offload ? ", offload disk" : "", pr, lo, te);
    return buf;
}

static size_t cats(char *buf, size_t n, const size_t *cat) {
    size_t len = 0;
    char tmp[32];
    buf[0] = 0;
    for (int i = 0; i < MF_CAT_COUNT && len < n; i++) {
        if (!cat[i]) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s %s", len ? ", " : "", mf_cat_name((mf_cat)i),
                                mf_size_format(cat[i], tmp, sizeof tmp));
    }
    return len;
}

int mf_planner_refuse(const mf_planner_result *r) {
    char a[32], b[32], c[32], d[256], cl[512], rq[768] = "";
    const mf_planner_choice *s = &r->c[r->smallest];
    if (r->requested >= 0) {
        const mf_planner_choice *q = &r->c[r->requested];
        cats(cl, sizeof cl, q->peak_cat);
        snprintf(rq, sizeof rq, "the requested settings need %s (%s; runtime %s; headroom %s), over by %s; ",
                 mf_size_format(q->need, a, sizeof a), cl, mf_size_format(r->runtime, c, sizeof c),
                 mf_size_format(q->need - q->process, d, sizeof d),
                 mf_size_format(q->need - (q->need > r->budget ? r->budget : q->need), b, sizeof b));
    }
    cats(cl, sizeof cl, s->peak_cat);
    return mf_fail("budget %s is below every setting (%d planned): %sthe smallest feasible budget is %s (%zu bytes), "
                   "with %s (%s)", mf_size_format(r->budget, c, sizeof c), r->n, rq, mf_size_format(s->need, a, sizeof a),
                   s->need, mf_planner_describe(s, d, sizeof d), cl);
}

static int by_need(const void *pa, const void *pb) {
    const mf_planner_choice *a = *(const mf_planner_choice *const *)pa, *b = *(const mf_planner_choice *const *)pb;
    if (a->need != b->need) return (a->need > b->need) - (a->need < b->need);
    return (a->pred_s > b->pred_s) - (a->pred_s < b->pred_s);
}

void mf_planner_print(FILE *f, const mf_planner_result *r, int all) {
    char a[32], b[32], d[256];
    const mf_planner_choice **v = malloc(sizeof *v * (size_t)r->n);
    if (!v) return;
    int n = 0;
    for (int i = 0; i < r->n; i++)
        if (all || r->c[i].frontier || r->c[i].chosen) v[n++] = &r->c[i];
    qsort(v, (size_t)n, sizeof *v, by_need);
    double tokens = (double)r->eff_batch * r->seq;
    fprintf(f, "%s (%d of %d settings planned; bytes exact, time predicted)\n",
            all ? "every setting" : "Pareto frontier, memory vs predicted step time", n, r->n);
    fprintf(f, "  %-1s %-66s %12s %12s %12s %9s %9s %s\n", "", "setting", "process", "needs", "disk", "s/step", "tok/s",
            "fits");
    for (int i = 0; i < n; i++) {
        const mf_planner_choice *c = v[i];
        char p[32];
        fprintf(f, "  %-1s %-66s %12s %12s %12s %9.3f %9.0f %s%s\n", c->chosen ? "*" : "",
                mf_planner_describe(c, d, sizeof d), mf_size_format(c->process, p, sizeof p),
                mf_size_format(c->need, a, sizeof a), c->disk_bytes ? mf_size_format(c->disk_bytes, b, sizeof b) : "-",
                c->pred_s, tokens / c->pred_s, r->budget ? (c->fits ? "yes" : "no") : "-", c->lossy ? " (lossy)" : "");
    }
    free(v);
    if (r->chosen >= 0) {
        char p[32];
        const mf_planner_choice *c = &r->c[r->chosen];
        fprintf(f, "chosen (*): %s: process %s (with headroom %s) of the %s budget, predicted %.3f s/step (%.0f tokens/s)\n",
                mf_planner_describe(c, d, sizeof d), mf_size_format(c->process, p, sizeof p), mf_size_format(c->need, a, sizeof a),
                r->budget ? mf_size_format(r->budget, b, sizeof b) : "unlimited", c->pred_s, tokens / c->pred_s);
        if (r->world > 1) {
            /* the volume's formula in units of Psi fp32 values (mf_zero_comm_volume) */
            char fm[256];
            double psi = c->optim_params, coef = psi > 0 ? c->comm_bytes / (4 * psi) : 0;
            int N = r->group, G = N ? r->world / N : 1, k = r->zero >= 3 ? 2 : 1;
            if (N && r->zero >= 1)
                snprintf(fm, sizeof fm, "hybrid shard, %d groups of %d: Psi (%d-1)/%d reduce-scatter + 2 Psi/%d (%d-1)/%d "
                         "shard all-reduce + %d Psi (%d-1)/%d all-gather = %.4g Psi", G, N, N, N, N, G, G, k, N, N, coef);
            else
                snprintf(fm, sizeof fm, "ZeRO's %s Psi x (%d-1)/%d = %.4g Psi", r->zero >= 3 ? "3" : "2", r->world, r->world,
                         coef);
            fprintf(f, "data parallel over %d ranks, ZeRO stage %d: per rank per step %s of collectives (%s fp32 values, "
                       "Psi = %.0f parameters), %.3f s at %g Gbit/s, included in s/step (not overlapped)%s\n",
                    r->world, r->zero, mf_size_format((size_t)c->comm_bytes, p, sizeof p), fm, c->optim_params, c->comm_s,
                    r->net_gbps, r->net_gbps > 0 ? "" : " (--net_gbps B adds the time at B Gbit/s)");
        }
    }
}

void mf_planner_print_json(FILE *f, const mf_planner_result *r) {
    fprintf(f, "{\"budget\":%zu,\"runtime\":%zu,\"effective_batch\":%d,\"seq\":%d,\"chosen\":%d,\"smallest\":%d,"
               "\"smallest_feasible_budget\":%zu,\"world_size\":%d,\"zero\":%d,\"net_gbps\":%g,\"settings\":[",
            r->budget, r->runtime, r->eff_batch, r->seq, r->chosen, r->smallest, r->c[r->smallest].need, r->world, r->zero,
            r->net_gbps);
    for (int i = 0; i < r->n; i++) {
        const mf_planner_choice *c = &r->c[i];
        fprintf(f, "%s\n{\"index\":%d,\"recompute\":\"%s\",\"auto_blocks\":%d,\"batch\":%d,\"grad_accum\":%d,"
                   "\"optimizer\":\"%s\",\"precision\":\"%s\",\"master_weights\":%d,\"pure_bf16\":%d,\"grad_dtype\":\"%s\",\"update_in_backward\":%d,\"offload\":%d,\"lossy\":%d,"
                   "\"lora\":\"%s\",\"base_dtype\":\"%s\",\"trainable_params\":%.0f,"
                   "\"arena_bytes\":%zu,\"disk_bytes\":%zu,\"process_bytes\":%zu,\"need_bytes\":%zu,\"gemm_flops\":%.0f,"
                   "\"attn_flops\":%.0f,\"elem_bytes\":%.0f,\"io_bytes\":%.0f,\"pred_step_s\":%.6f,\"comm_bytes\":%.0f,\"comm_s\":%.6f,"
                   "\"fits\":%s,\"frontier\":%s,\"chosen\":%s}",
                i ? "," : "", i, c->recompute, c->auto_k, c->batch, c->grad_accum, c->optimizer, c->precision, c->master,
                c->pure, c->grad16 ? "bf16" : "fp32", c->update_in_backward,
                c->offload, c->lossy, c->lora, c->base_dtype, c->optim_params, c->arena_bytes, c->disk_bytes, c->process, c->need, c->gemm_flops, c->attn_flops,
                c->elem_bytes, c->io_bytes, c->pred_s, c->comm_bytes, c->comm_s, c->fits ? "true" : "false", c->frontier ? "true" : "false",
                c->chosen ? "true" : "false");
    }
    fprintf(f, "\n]}\n");
}
