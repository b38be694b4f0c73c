/* The trainer's side of the budget planner: the effective batch and, under
 * a budget, the planner's choice of settings for the measured baseline. */
#include "memfit/train.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *mf_planner_offload_path(const mf_config *cfg, char *buf, size_t n) {
    const char *tmp = getenv("TMPDIR");
    if (cfg->out_dir[0]) snprintf(buf, n, "%s/optimizer_state.bin", cfg->out_dir);
    else snprintf(buf, n, "%s/memfit-optimizer-state.%d.bin", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    return buf;
}

int mf_trainer_choose(mf_trainer *t, int search) {
    mf_config *c = &t->cfg;
    int eff = c->effective_batch ? c->effective_batch : c->batch * c->grad_accum;
    if (!search) {
        if (c->effective_batch) {
            if (eff % c->batch)
                return mf_fail("effective_batch %d is not a multiple of batch %d", eff, c->batch);
            c->grad_accum = eff / c->batch;
        }
        return 0;
    }
    char path[MF_PATH_MAX];
    mf_planner_offload_path(c, path, sizeof path);
    mf_planner_result r;
    if (mf_planner_search(c, eff, strcmp(c->allow, "lossy") == 0, t->ledger.rss_baseline, t->nthreads, &t->rates,
                          path, &r))
        return -1;
    if (r.chosen < 0) {
        mf_planner_refuse(&r);
        mf_planner_free(&r);
        return -1;
    }
    t->choice = r.c[r.chosen];
    t->plan_settings = r.n;
    t->planned = 1;
    int rc = mf_planner_apply(&t->choice, path, c);
    mf_planner_free(&r);
    if (rc) return -1;
    t->B = c->batch;
    return 0;
}

/* The current error extended with the run's plan by category and, from
 * the planner (every key free): under a budget the fastest setting that fits
 * it (or the smallest feasible budget), without one the smallest setting. */
int mf_trainer_hint(mf_trainer *t, size_t budget) {
    char msg[1024], cl[512] = "", a[32], d[256];
    snprintf(msg, sizeof msg, "%s", mf_error());
    if (t->world > 1) return -1;  /* the planner's settings are single-process ones */
    size_t len = 0;
    for (int i = 0; !budget && i < MF_CAT_COUNT; i++) {
        if (!t->plan.peak_cat[i]) continue;
        len += (size_t)snprintf(cl + len, sizeof cl - len, "%s%s %s", len ? ", " : "", mf_cat_name((mf_cat)i),
                                mf_size_format(t->plan.peak_cat[i], a, sizeof a));
        if (len >= sizeof cl) break;
    }
    /* out of memory: no calibration (it allocates); placeholder rates serve
     * when only bytes are used */
    mf_rates r;
    int have = budget ? mf_planner_rates(&r, t->nthreads, 0, NULL) == 0 : mf_planner_rates_cached(&r, t->nthreads) == 0;
    if (!have) {
        if (budget) return mf_fail("%s", msg);
        memset(&r, 0, sizeof r);
        for (int j = 0; j < MF_RATES_GEMM_ROWS; j++)
            for (int i = 0; i < MF_RATES_GEMM_SIZES; i++)
                r.gemm_c[i] = 1 << (i + 7), r.gemm_m[j] = 1 << (2 * j + 6), r.gemm_gflops[j][i] = 1,
                r.gemm16_gflops[j][i] = 1;
        for (int t = 0; t < MF_RATES_ATTN_T; t++)
            for (int h = 0; h < MF_RATES_ATTN_HS; h++)
                r.attn_t[t] = 128 << t, r.attn_hs[h] = 32 << h, r.attn_gflops[t][h] = 1;
        r.elem_gbs = r.disk_gbs = 1;
        for (int k = 0; k < 4; k++) r.optim_mps[k] = 1;
    }
    mf_config c = t->cfg;
    memset(c.set_by_user, 0, sizeof c.set_by_user);
    c.budget = budget;
    char path[MF_PATH_MAX];
    mf_planner_offload_path(&c, path, sizeof path);
    mf_planner_result res;
    if (mf_planner_search(&c, c.batch * c.grad_accum, 0, t->ledger.rss_baseline, t->nthreads, &r, path, &res))
        return budget ? mf_fail("%s", msg) : mf_fail("%s (plan: %s)", msg, cl);
    if (budget && res.chosen >= 0)
        mf_fail("%s; the fastest setting that fits: %s (%s, predicted %.3f s/step; memfit plan shows the others)", msg,
                mf_planner_describe(&res.c[res.chosen], d, sizeof d), mf_size_format(res.c[res.chosen].need, a, sizeof a),
                res.c[res.chosen].pred_s);
    else if (budget)
        mf_fail("%s; no setting fits: the smallest feasible budget is %s (%zu bytes), with %s", msg,
                mf_size_format(res.c[res.smallest].need, a, sizeof a), res.c[res.smallest].need,
                mf_planner_describe(&res.c[res.smallest], d, sizeof d));
    else
        mf_fail("%s (plan: %s); the smallest setting needs %s: %s (memfit plan --budget SIZE finds the fastest that fits)",
                msg, cl, mf_size_format(res.c[res.smallest].need, a, sizeof a),
                mf_planner_describe(&res.c[res.smallest], d, sizeof d));
    mf_planner_free(&res);
    return -1;
}
