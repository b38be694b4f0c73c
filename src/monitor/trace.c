/* Trace export: Chrome trace-event JSON, streamed.
 *
 * Format (Trace Event Format, JSON Array Format): a JSON array of event
 * objects, each with name, ph (phase), ts (microseconds), pid, tid, and per
 * phase: "X" complete event + dur (microseconds) + cat; "C" counter + args
 * {series: number, ...} drawn as a stacked chart; "M" metadata named
 * process_name / thread_name + args {name}. The closing "]" may be missing
 * (viewers accept a trace cut short by a crash), which is why the temp file
 * is useful even when close never runs.
 *
 * Times are kept as integer nanoseconds since open and printed as
 * microseconds with three decimals, so a child span computed from the same
 * clock never pokes out of its parent by a rounding step. */
#include "memfit/monitor.h"
#include "io/io.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

struct mf_trace {
    mf_atomic_file af;
    double t_open;    /* mf_time_now() at open: ts 0 */
    long pid;
    long n_events;
};

/* The training thread's track. On Linux the main thread's tid is the pid. */
#define MF_TRACE_TID(t) ((t)->pid)

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);  /* UTF-8 passes through */
    }
    fputc('"', f);
}

static int64_t rel_ns(const mf_trace *t, double t_s) {
    double ns = (t_s - t->t_open) * 1e9;
    if (!(ns > 0)) return 0;  /* before open, or NaN */
    if (ns > 9e18) ns = 9e18;
    return (int64_t)llround(ns);
}

static void put_us(FILE *f, int64_t ns) {
    fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

/* Opens one event object: separator, then the fields every phase shares. */
static FILE *event_begin(mf_trace *t, const char *ph, const char *name, int64_t ts_ns) {
    FILE *f = t->af.fp;
    if (t->n_events++) fputs(",\n", f);
    fprintf(f, "{\"ph\":\"%s\",\"name\":", ph);
    json_str(f, name);
    fputs(",\"ts\":", f);
    put_us(f, ts_ns);
    fprintf(f, ",\"pid\":%ld,\"tid\":%ld", t->pid, MF_TRACE_TID(t));
    return f;
}

static void metadata(mf_trace *t, const char *what, const char *value) {
    FILE *f = event_begin(t, "M", what, 0);
    fputs(",\"args\":{\"name\":", f);
    json_str(f, value);
    fputs("}}", f);
}

mf_trace *mf_trace_open(const char *path) {
    mf_trace *t = calloc(1, sizeof *t);
    if (!t) { mf_fail("cannot write trace %s: out of memory", path ? path : ""); return NULL; }
    if (mf_atomic_open(&t->af, path) != 0) { free(t); return NULL; }
    t->t_open = mf_time_now();
    t->pid = (long)getpid();
    fputs("[\n", t->af.fp);
    metadata(t, "process_name", "memfit");
    metadata(t, "thread_name", "train");
    return t;
}

void mf_trace_span_arg(mf_trace *t, const char *name, const char *cat, double t0_s, double t1_s,
                       const char *key, int64_t value) {
    if (!t) return;
    int64_t a = rel_ns(t, t0_s), b = rel_ns(t, t1_s);
    if (b < a) b = a;
    FILE *f = event_begin(t, "X", name, a);
    fputs(",\"dur\":", f);
    put_us(f, b - a);
    fputs(",\"cat\":", f);
    json_str(f, cat && *cat ? cat : "memfit");
    if (key) {
        fputs(",\"args\":{", f);
        json_str(f, key);
        fprintf(f, ":%lld}", (long long)value);
    }
    fputc('}', f);
}

void mf_trace_span(mf_trace *t, const char *name, const char *cat, double t0_s, double t1_s) {
    mf_trace_span_arg(t, name, cat, t0_s, t1_s, NULL, 0);
}

void mf_trace_counter(mf_trace *t, const char *name, double t_s, int n,
                      const char *const *series, const double *values) {
    if (!t) return;
    FILE *f = event_begin(t, "C", name, rel_ns(t, t_s));
    fputs(",\"args\":{", f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        json_str(f, series[i]);
        /* JSON has no NaN/Inf; a counter that is not a number reads as 0 */
        fprintf(f, ":%.17g", isfinite(values[i]) ? values[i] : 0.0);
    }
    fputs("}}", f);
}

void mf_trace_ledger(mf_trace *t, double t_s, const mf_ledger *l) {
    if (!t || !l) return;
    const char *names[MF_CAT_COUNT];
    double bytes[MF_CAT_COUNT];
    for (int i = 0; i < MF_CAT_COUNT; i++) {
        names[i] = mf_cat_name((mf_cat)i);
        bytes[i] = (double)l->cur[i];  /* exact below 2^53 bytes */
    }
    mf_trace_counter(t, "memory", t_s, MF_CAT_COUNT, names, bytes);
}

int mf_trace_close(mf_trace *t) {
    if (!t) return 0;
    fputs("\n]\n", t->af.fp);
    int rc = mf_atomic_commit(&t->af);
    free(t);
    return rc;
}
