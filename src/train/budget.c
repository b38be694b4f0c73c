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
