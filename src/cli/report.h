/* Human and JSON output of the CLI: plan tables, the per-step log line and
 * the end-of-run memory report (predicted beside measured). */
#ifndef MEMFIT_CLI_REPORT_H
#define MEMFIT_CLI_REPORT_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include "memfit/train.h"

void mf_report_presets(FILE *f);
void mf_report_header(FILE *f, const mf_trainer *t);
/* The per-step log line and, when metrics is not NULL, one JSON object
 * line (non-finite numbers as null). mem: the ledger's bytes per category
 * at the step's peak (MF_CAT_COUNT entries, written as mem_<category>), or
 * NULL. */
void mf_report_step(FILE *f, const mf_trainer *t, const mf_step_stats *st, double val,
                    int progress, FILE *metrics, const size_t *mem);
void mf_report_memory(FILE *f, const mf_trainer *t);
/* When the planner chose the settings: its predicted process bytes and step
 * time beside the measured peak RSS and the median of step_s[0..n) (the
 * steps after the first; n 0 = none measured). */
void mf_report_planner(FILE *f, const mf_trainer *t, const double *step_s, int n);
void mf_report_estimate(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                        const mf_model *m, size_t runtime);
/* The plan as one JSON object: what `memfit estimate --json` prints and what
 * the HTML report reads (model, n_params, batch, seq, recompute, bytes{cat},
 * max{cat}, total, disk, arena, runtime, process, budget (0 = none),
 * layers[{cat}], and the category labels params/grads/optimizer/...).
 * runtime: measured bytes outside the arena. NULL when out of memory;
 * the _string form is cJSON_PrintUnformatted's (free it). */
cJSON *mf_report_plan_json(const mf_config *cfg, const mf_dims *d, const mf_plan *p, const mf_model *m,
                           size_t runtime);
char *mf_report_plan_json_string(const mf_config *cfg, const mf_dims *d, const mf_plan *p, const mf_model *m,
                                 size_t runtime);
void mf_report_estimate_json(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                             const mf_model *m, size_t runtime);
#endif
