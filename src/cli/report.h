/* Human and JSON output of the CLI: plan tables, the per-step log line and
 * the end-of-run memory report (predicted beside measured). */
#ifndef MEMFIT_CLI_REPORT_H
#define MEMFIT_CLI_REPORT_H

#include <stdio.h>
#include "memfit/train.h"

void mf_report_presets(FILE *f);
void mf_report_header(FILE *f, const mf_trainer *t);
void mf_report_step(FILE *f, const mf_trainer *t, const mf_step_stats *st, double val,
                    int progress, FILE *metrics);
void mf_report_memory(FILE *f, const mf_trainer *t);
void mf_report_estimate(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                        const mf_model *m, size_t runtime);
void mf_report_estimate_json(FILE *f, const mf_config *cfg, const mf_dims *d, const mf_plan *p,
                             const mf_model *m, size_t runtime);
#endif
