/* memfit monitor: memory health thresholds, trace export and the HTML run
 * report.
 *
 * Owns: an open trace (mf_trace: one heap struct and one FILE*, freed by
 * mf_trace_close). Nothing else keeps state between calls.
 *
 * Promises:
 *  - Health: the thresholds are fractions of the memory budget, kept in one
 *    process-wide table here (defaults, or health_levels through
 *    mf_health_configure at start-up); the report's threshold lines and the
 *    per-step level come from the same table.
 *  - Trace: Chrome trace-event JSON (JSON Array Format: "[ {...}, ... ]"),
 *    which chrome://tracing and ui.perfetto.dev open. Events are streamed to
 *    "<path>.tmp.<pid>" as they are recorded, so memory use is fixed however
 *    long the run; mf_trace_close ends the array, fsyncs and renames it to
 *    <path>. <path> therefore never holds half a trace (a crash leaves the
 *    temp file, which the viewers still open: the format lets the closing
 *    "]" be missing). Times given to the trace are seconds of mf_time_now();
 *    the file holds microseconds since mf_trace_open, to the nanosecond.
 *    Every mf_trace_* call on a NULL trace does nothing, so callers need no
 *    "is tracing on" branches. Record from one thread.
 *  - Report: one self-contained file (inline CSS and SVG; no scripts, fonts
 *    or network) that is also well-formed XML, written atomically. Every
 *    plotted series carries its raw numbers (data-steps, data-values).
 */
#ifndef MEMFIT_MONITOR_H
#define MEMFIT_MONITOR_H

#include <stddef.h>
#include <stdint.h>
#include "memfit/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- health ---------------------------------------------------------- */

/* Levels of process memory against the budget, each starting at a fraction
 * of it (the seed guides' names): target 0.90, warning 0.92, critical 0.95,
 * emergency 0.97 by default; config key health_levels changes them. */
typedef enum {
    MF_HEALTH_OK,
    MF_HEALTH_TARGET,
    MF_HEALTH_WARNING,
    MF_HEALTH_CRITICAL,
    MF_HEALTH_EMERGENCY,
    MF_HEALTH_COUNT
} mf_health;

/* Fraction of the budget where level h starts (0 for MF_HEALTH_OK). */
double mf_health_threshold(mf_health h);
/* "ok", "target", "warning", "critical", "emergency". */
const char *mf_health_name(mf_health h);
/* Level of `bytes` against `budget`; budget 0 (none) is always OK. */
mf_health mf_health_level(size_t bytes, size_t budget);
/* Parses "0.90,0.92,0.95,0.97" (four increasing fractions in (0, 2]);
 * -1 with a message otherwise. out may be NULL (validation only). */
int mf_health_parse(const char *spec, double out[MF_HEALTH_COUNT - 1]);
/* Sets the process's thresholds from a spec (once, at start-up, before
 * any thread reads them: the table is process-wide). */
int mf_health_configure(const char *spec);

/* ---- trace (Chrome trace-event JSON) --------------------------------- */

typedef struct mf_trace mf_trace;

/* Starts a trace that will be written to `path` (the directory must exist).
 * Writes the process/thread name metadata. NULL with a message (mf_error)
 * naming the path on failure. */
mf_trace *mf_trace_open(const char *path);
/* A complete ("X") event from t0_s to t1_s on the training thread's track.
 * Record a span when it ends: nested spans come child first, and a child
 * must lie inside its parent (Perfetto draws nesting from containment). */
void mf_trace_span(mf_trace *t, const char *name, const char *cat, double t0_s, double t1_s);
/* The same with one integer argument shown in the viewer, e.g. "step", 12. */
void mf_trace_span_arg(mf_trace *t, const char *name, const char *cat, double t0_s, double t1_s,
                       const char *key, int64_t value);
/* A counter ("C") event: n series drawn stacked under one counter `name`. */
void mf_trace_counter(mf_trace *t, const char *name, double t_s, int n,
                      const char *const *series, const double *values);
/* Counter "memory": one series per category (mf_cat_name), the ledger's
 * current bytes; the series sum to l->cur_total. */
void mf_trace_ledger(mf_trace *t, double t_s, const mf_ledger *l);
/* Ends the array, fsyncs and renames into place, frees t. 0, or -1 with a
 * message (then <path> is untouched and the temp file removed). NULL: 0. */
int mf_trace_close(mf_trace *t);

/* ---- HTML report ----------------------------------------------------- */

/* Renders the run report from memfit's metrics JSONL (one object per line;
 * see the fields below) and, optionally, the JSON of `memfit estimate
 * --json` (plan_json may be NULL). Sections, each with <section id> and
 * <h2>: "summary", "loss" (train and validation loss vs step), "throughput"
 * (tokens/s vs step), "memory" (bytes per category stacked, measured peak
 * RSS, budget and health threshold lines), "plan" (predicted beside
 * measured, per category and per layer). One <svg> per chart section.
 *
 * Metrics fields used (all optional but "step"; null reads as absent):
 * step, loss, val_loss, tok_s, rss_peak_bytes, ledger_peak_bytes,
 * arena_bytes, rss_baseline_bytes, mem_<category> (bytes per category at
 * the step's peak, e.g. mem_params, mem_acts). Plan fields
 * used: model, n_params, batch, seq, recompute, bytes{category}, total,
 * arena, runtime, process, budget, layers[{category}].
 * A line whose step is not above the previous line's (a resumed run
 * appending to the file) replaces the earlier lines from that step on.
 *
 * 0, or -1 with a message naming the file and line of bad input; out_path
 * is then untouched. */
int mf_report_html(const char *out_path, const char *metrics_jsonl_path, const char *plan_json,
                   const char *title);

#ifdef __cplusplus
}
#endif
#endif
