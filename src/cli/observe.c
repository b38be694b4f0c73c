/* The arena's phase hook as the CLI uses it: trace spans, per-step peak,
 * per-phase timing, leak check. See observe.h. */
#include "observe.h"

#include <stdlib.h>
#include <string.h>

size_t mf_rss_anon(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "RssAnon:", 8) == 0) { kb = strtoull(line + 8, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

/* "fwd" for the forward phases (and every phase of a forward-only plan),
 * "bwd" from the head's backward to the embedding's, "optim" after. */
static const char *phase_cat(const mf_model *m, int ph) {
    if (m->mode != MF_MODE_TRAIN || ph <= mf_phase_head_fwd(m)) return "fwd";
    if (ph < mf_phase_optim(m)) return "bwd";
    return "optim";
}

/* Ends the open phase at `now`. The hook runs before the arena releases
 * the phase's buffers and a phase only adds to the ledger, so the ledger
 * now holds the phase's high-water mark: the trace draws that from the
 * phase's start, and the step's peak is the largest of these. */
static void close_phase(mf_observer *o, double now) {
    int ph = o->open_phase;
    if (ph < 0) return;
    const mf_ledger *l = &o->t->ledger;
    if (o->trace) {
        char name[48];
        mf_phase_name(&o->t->model, ph, name, sizeof name);
        mf_trace_span(o->trace, name, phase_cat(&o->t->model, ph), o->phase_t0, now);
        mf_trace_ledger(o->trace, o->phase_t0, l);
    }
    if (o->in_step) {
        if (l->cur_total > o->step_peak_total) {
            o->step_peak_total = l->cur_total;
            memcpy(o->step_at_peak, l->cur, sizeof o->step_at_peak);
        }
        if (o->step_no >= o->count_from && ph < o->n_phases) {
            o->phase_s[ph] += now - o->phase_t0;
            o->phase_n[ph]++;
            if (l->cur[MF_CAT_WORK] > o->phase_work[ph]) o->phase_work[ph] = l->cur[MF_CAT_WORK];
            if (l->cur_total > o->phase_total[ph]) o->phase_total[ph] = l->cur_total;
        }
    }
    o->open_phase = -1;
}

#define LEAK_BYTES 4096

static void on_phase(void *ctx, int from, int to) {
    mf_observer *o = ctx;
    (void)from;
    double now = mf_time_now();
    close_phase(o, now);
#ifdef MEMFIT_POISON
    /* test hook: count bytes that are never given back, as a buffer asked
     * for and never released would, once per step from the second on */
    if (o->leak_cat >= 0 && o->in_step && o->have_steady && !o->leaked) {
        mf_ledger_add(&o->t->ledger, (mf_cat)o->leak_cat, LEAK_BYTES);
        o->leaked = 1;
    }
#endif
    o->open_phase = to;
    o->phase_t0 = now;
}

int mf_observer_init(mf_observer *o, mf_trainer *t, mf_trace *trace) {
    memset(o, 0, sizeof *o);
    o->t = t;
    o->trace = trace;
    o->open_phase = -1;
    o->leak_cat = -1;
    o->n_phases = t->plan.n_phases;
    size_t n = (size_t)o->n_phases;
    o->phase_s = calloc(n, sizeof *o->phase_s);
    o->phase_n = calloc(n, sizeof *o->phase_n);
    o->phase_work = calloc(n, sizeof *o->phase_work);
    o->phase_total = calloc(n, sizeof *o->phase_total);
    if (!o->phase_s || !o->phase_n || !o->phase_work || !o->phase_total) {
        mf_observer_free(o);
        return mf_fail("out of memory for the phase table");
    }
    const char *leak = getenv("MEMFIT_TEST_LEAK");
    if (leak && *leak) {
#ifdef MEMFIT_POISON
        for (int c = 0; c < MF_CAT_COUNT; c++)
            if (strcmp(leak, mf_cat_name((mf_cat)c)) == 0) o->leak_cat = c;
        if (o->leak_cat < 0) {
            mf_observer_free(o);
            return mf_fail("MEMFIT_TEST_LEAK=%s is not a memory category (params, grads, optim, acts, work, ...)", leak);
        }
        fprintf(stderr, "memfit: test hook: the ledger counts %d extra bytes of %s in every step after the first\n",
                LEAK_BYTES, leak);
#else
        fprintf(stderr, "memfit: note: MEMFIT_TEST_LEAK ignored: test hooks exist only in builds with MEMFIT_POISON "
                        "(cmake -DMEMFIT_SANITIZE=ON)\n");
#endif
    }
    mf_trace_ledger(trace, mf_time_now(), &t->ledger);
    mf_arena_set_phase_hook(&t->arena, on_phase, o);
    return 0;
}

void mf_observer_free(mf_observer *o) {
    if (o->t) mf_arena_set_phase_hook(&o->t->arena, NULL, NULL);
    free(o->phase_s);
    free(o->phase_n);
    free(o->phase_work);
    free(o->phase_total);
    o->phase_s = NULL;
    o->phase_n = NULL;
    o->phase_work = NULL;
    o->phase_total = NULL;
    o->t = NULL;
}

void mf_observer_step_begin(mf_observer *o, int step_no) {
    close_phase(o, mf_time_now());
    o->in_step = 1;
    o->step_no = step_no;
    o->step_peak_total = 0;
    memset(o->step_at_peak, 0, sizeof o->step_at_peak);
    o->leaked = 0;
    o->step_t0 = mf_time_now();
}

int mf_observer_step_end(mf_observer *o, int ok) {
    double now = mf_time_now();
    close_phase(o, now);
    o->in_step = 0;
    if (o->trace) {
        char name[48];
        snprintf(name, sizeof name, ok ? "step %d" : "step %d (failed)", o->step_no);
        mf_trace_span_arg(o->trace, name, "step", o->step_t0, now, "step", o->step_no);
    }
    if (!ok) return 0;
    if (o->step_no >= o->count_from) o->n_counted++;
    const mf_ledger *l = &o->t->ledger;
    if (o->step_peak_total == 0) memcpy(o->step_at_peak, l->at_peak, sizeof o->step_at_peak);
    /* leak check: the end of a step (optimizer phase done) is the same
     * point of the same plan every time, so each category must come back
     * to where the first step left it */
    size_t rss = mf_rss_anon();
    o->last_step = o->step_no;
    if (!o->have_steady) {
        memcpy(o->steady, l->cur, sizeof o->steady);
        o->rss0 = o->rss_last = rss;
        o->steady_step = o->step_no;
        o->have_steady = 1;
        return 0;
    }
    for (int c = 0; c < MF_CAT_COUNT; c++)
        if (l->cur[c] > o->steady[c])
            return mf_fail("leak check: category %s holds %zu bytes at the end of step %d, %zu more than the %zu "
                           "it held at the end of step %d (every step must return the ledger to that level)",
                           mf_cat_name((mf_cat)c), l->cur[c], o->step_no, l->cur[c] - o->steady[c], o->steady[c],
                           o->steady_step);
    o->rss_last = rss;
    size_t growth = rss > o->rss0 ? rss - o->rss0 : 0;
    if (growth > o->rss_max_growth) o->rss_max_growth = growth;
    size_t tol = MF_LEAK_RSS_SLACK + (size_t)(MF_LEAK_RSS_FRAC * (double)o->rss0);
    if (rss && o->rss0 && growth > tol)
        return mf_fail("leak check: anonymous resident memory (RssAnon) grew by %zu bytes from the end of step %d "
                       "to the end of step %d, over the tolerance of %zu bytes (16 MiB + 1%%): something outside "
                       "the arena allocates every step", growth, o->steady_step, o->step_no, tol);
    return 0;
}

void mf_observer_region(mf_observer *o, const char *name, const char *cat, double t0) {
    double now = mf_time_now();
    close_phase(o, now);
    mf_trace_span(o->trace, name, cat, t0, now);
}

void mf_observer_print_leak(FILE *f, const mf_observer *o) {
    char a[32], b[32];
    if (!o->have_steady || o->last_step == o->steady_step) {
        fprintf(f, "  leak check: needs two steps in one run (the first sets the level)\n");
        return;
    }
    size_t tol = MF_LEAK_RSS_SLACK + (size_t)(MF_LEAK_RSS_FRAC * (double)o->rss0);
    fprintf(f, "  leak check: every category back to step %d's level at the end of steps %d-%d; "
               "RssAnon grew at most %s (tolerance %s)\n",
            o->steady_step, o->steady_step + 1, o->last_step, mf_size_format(o->rss_max_growth, a, sizeof a),
            mf_size_format(tol, b, sizeof b));
}
