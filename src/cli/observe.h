/* The CLI's view of a running step, through the arena's phase hook: trace
 * spans per phase and per step, the ledger's per-category bytes at each
 * step's peak, per-phase timings and scratch maxima (memfit profile), and
 * the leak check.
 *
 * Owns: an mf_trace (may be NULL: every trace call then does nothing) and
 * per-phase arrays allocated once by mf_observer_init (n_phases entries);
 * nothing is allocated while steps run. Promises: the hook costs one clock
 * read and a few comparisons per phase change (plus one trace event when
 * tracing); the leak check is MF_CAT_COUNT comparisons and one read of
 * /proc/self/status per step. Times are mf_time_now() seconds.
 */
#ifndef MEMFIT_CLI_OBSERVE_H
#define MEMFIT_CLI_OBSERVE_H

#include "memfit/monitor.h"
#include "memfit/train.h"

/* RssAnon growth over the first step's level that fails the run:
 * 16 MiB + 1% (file-backed pages, e.g. the memory-mapped token file as it
 * is read, are not counted: they are not a leak). */
#define MF_LEAK_RSS_SLACK ((size_t)16 << 20)
#define MF_LEAK_RSS_FRAC 0.01

typedef struct {
    mf_trainer *t;
    mf_trace *trace;          /* NULL: not tracing */
    int open_phase;           /* phase whose span is open, -1 none */
    double phase_t0;
    /* the step in progress (between mf_observer_step_begin and _end) */
    int in_step, step_no;
    double step_t0;
    size_t step_peak_total;
    size_t step_at_peak[MF_CAT_COUNT];
    /* per phase, over the steps counted (profile): seconds, visits, the
     * highest ledger bytes of the work category seen at the phase's end */
    int n_phases, count_from;  /* steps numbered >= count_from are timed */
    int n_counted;
    double *phase_s;
    long *phase_n;
    size_t *phase_work;
    size_t *phase_total;
    /* leak check: the ledger and RssAnon at the end of the first step */
    int have_steady, steady_step, last_step;
    size_t steady[MF_CAT_COUNT];
    size_t rss0, rss_last, rss_max_growth;
    int leak_cat;             /* MEMFIT_TEST_LEAK (test builds only), -1 none */
    int leaked;               /* ... done in this step */
} mf_observer;

/* Installs the hook on t's arena. trace may be NULL. */
int mf_observer_init(mf_observer *o, mf_trainer *t, mf_trace *trace);
/* Removes the hook and frees the arrays (not the trace). */
void mf_observer_free(mf_observer *o);

/* A step (the optimizer step that will be numbered `step_no`): begin resets
 * the step's peak; end closes the open phase, records the "step N" span and
 * (ok != 0) runs the leak check: -1 with a one-line message naming the
 * category and the bytes when a category holds more than after the first
 * step, or when RssAnon grew past the tolerance. */
void mf_observer_step_begin(mf_observer *o, int step_no);
int mf_observer_step_end(mf_observer *o, int ok);

/* Any other region (validation, sampling, checkpoint): closes the open
 * phase and records a span [t0, now]. */
void mf_observer_region(mf_observer *o, const char *name, const char *cat, double t0);

/* One line on the leak check's result ("leak check: ...") for the end of
 * the run. */
void mf_observer_print_leak(FILE *f, const mf_observer *o);

/* Anonymous resident memory (RssAnon in /proc/self/status), bytes; 0 if
 * unavailable. */
size_t mf_rss_anon(void);

#endif
