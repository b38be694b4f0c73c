/* libmemfit's public API: what a program embedding memfit includes
 * (`#include <memfit/memfit.h>`, flags from `pkg-config --cflags --libs
 * memfit`; docs/library.md). Every function that can fail returns 0 (or a
 * non-NULL pointer) on success and -1 (NULL) on failure with a one-line
 * message in mf_error(); nothing prints or exits. Nothing here allocates
 * inside a training step: the bytes a step uses are planned up front.
 *
 * The path an embedder takes, header by header:
 *   config.h   mf_config_defaults, mf_config_set, mf_config_parse_args,
 *              mf_config_load_yaml: a run's settings from the one key table
 *              (mf_config_key_info lists it).
 *   model.h    mf_model_dims (preset or HF config.json -> shape),
 *              mf_model_build_plan (config -> the plan of one step, nothing
 *              allocated: the estimate), mf_model_free.
 *   core.h     mf_plan: rows, peak bytes per category (peak_cat), arena
 *              bytes; mf_plan_check_budget; mf_cat_name; mf_size_format;
 *              mf_rss_current; mf_error; the arena and the ledger.
 *   planner.h  mf_planner_search: every memory setting's plan and predicted
 *              step time, the fastest that fits a budget; mf_planner_apply.
 *   train.h    mf_trainer_init (plan, arena, weights, data), mf_trainer_step
 *              (one optimizer step, inside the plan), mf_trainer_val_loss,
 *              checkpoints and weights, mf_trainer_free.
 *   monitor.h  memory health levels, the Chrome/Perfetto trace and the HTML
 *              report of a run.
 * model.h and train.h also bring in the types they embed: kernels.h,
 * lora.h, optim.h, data.h. Internal headers (under src/<module>/) are not
 * installed and may change. */
#ifndef MEMFIT_MEMFIT_H
#define MEMFIT_MEMFIT_H
#include "memfit/config.h"
#include "memfit/core.h"
#include "memfit/model.h"
#include "memfit/planner.h"
#include "memfit/train.h"
#include "memfit/monitor.h"
#endif
