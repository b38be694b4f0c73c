/* The plan builder: a run's config -> its shape, optimizer, LoRA setting
 * and ZeRO stage -> the model's plan, laid out. It sits below both the
 * trainer (src/train) and the settings search (src/planner), which call it
 * and neither of which includes the other for it. */
#include "memfit/model.h"
#include "dist/dist.h"
#include "memfit/distill.h"
#include "quant/quant.h"

#include <string.h>

static int plan_once(const mf_config *cfg, mf_mode mode, int nthreads, const mf_dims *d,
                     mf_recompute rc, mf_plan *plan, mf_model *model) {
    int T = cfg->seq ? cfg->seq : d->maxT;
    /* data parallel: each rank plans its share of the batch (dist/) */
    int world = mf_dist_active() ? mf_dist_world() : cfg->world_size;
    if (mf_zero_check(cfg, world) || (mode == MF_MODE_TRAIN && mf_dist_ep_check(cfg, world, 0))) return -1;
    mf_optim opt;
    if (mode == MF_MODE_TRAIN && mf_optim_init(&opt, cfg)) return -1;
    if (mode == MF_MODE_TRAIN) opt.zero = cfg->zero, opt.world = world, opt.rank = mf_dist_rank(), opt.group = cfg->zero_group;
    mf_lora_cfg lora;
    if (mf_lora_parse(cfg->lora, &lora)) return -1;
    /* --adapter without --lora: the adapter's own config says r and targets */
    if (!lora.r && cfg->adapter[0] && mf_lora_read_config(cfg->adapter, &lora, NULL)) return -1;
    if (!lora.r && cfg->save_adapter[0]) return mf_fail("save_adapter needs --lora (the adapter's rank and targets)");
    /* (inference takes a quantised model without LoRA: memfit quantize's
     * files, docs/quantize.md) */
    if (!lora.r && strcmp(cfg->base_dtype, "fp32") != 0 && mode == MF_MODE_TRAIN)
        return mf_fail("base_dtype %s needs --lora (only a frozen base can be stored quantised)", cfg->base_dtype);
    if (mf_quant_parse(cfg->base_dtype, &lora.base)) return mf_fail("base_dtype: %s", mf_error());
    if (mf_plan_init(plan, mf_model_n_phases(d, mode))) return -1;
    if (mf_model_plan_lora(model, plan, d, cfg->batch / world, T, mode, nthreads, cfg->loss_chunk, rc,
                           mode == MF_MODE_TRAIN ? &opt : NULL, &lora) || mf_zero_plan(plan, model)) { mf_plan_free(plan); return -1; }
    if (mf_config_packs(cfg)) {
        /* packed chat data: each token's position in its example (the
         * attention's document mask and positions), beside inputs/targets */
        int64_t shape[4] = {cfg->batch / world, T, 0, 0};
        model->pos = mf_plan_add(plan, "data.pos", MF_CAT_DATA, MF_DTYPE_I32, 2, shape, 0, plan->n_phases - 1, -1);
        if (model->pos < 0) { mf_plan_free(plan); return -1; }
    }
    /* distillation: the teacher's rows (teacher.c) */
    if (mf_teacher_plan(cfg, model, plan, nthreads)) { mf_model_free(model); mf_plan_free(plan); return -1; }
    model->lora_seed = cfg->seed;
    mf_plan_layout(plan);
    return 0;
}

int mf_model_build_plan(const mf_config *cfg, mf_mode mode, int nthreads, size_t overhead,
                  mf_dims *d, mf_plan *plan, mf_model *model) {
    if (mf_model_dims(cfg, d)) return -1;
    mf_recompute rc;
    if (mf_recompute_parse(cfg->recompute, &rc)) return -1;
    if (rc.policy != MF_RECOMPUTE_AUTO || mode != MF_MODE_TRAIN) return plan_once(cfg, mode, nthreads, d, rc, plan, model);
    /* auto: every block costs the same to recompute, so the fewest
     * recomputed blocks that fit the budget cost the fewest FLOPs */
    for (int k = 0; k <= d->L; k++) {
        rc.every = k;
        if (plan_once(cfg, mode, nthreads, d, rc, plan, model)) return -1;
        if (cfg->budget == 0 || plan->arena_bytes + plan->outside_bytes + overhead <= cfg->budget || k == d->L) return 0;
        mf_model_free(model);
        mf_plan_free(plan);
    }
    return mf_fail("no recompute choice");  /* not reached: k == L returns */
}

