/* A trace written span by span reads back as valid trace-event JSON: every
 * event has the fields its phase needs, complete events on the training
 * track end in the order written and nest properly (each one either inside
 * or apart from every other), durations are the times given to the
 * microsecond's thousandth, the "memory" counter's series sum to the
 * ledger's total, and the process/thread names are present. The file only
 * appears at its path on close (events stream to a temp file until then),
 * and a path in a missing directory is refused with a message naming it. */
#include "memfit/monitor.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* in integer nanoseconds: the file prints microseconds with 3 decimals, and
 * adding parsed decimals in floating point could misorder equal ends */
typedef struct { long long t0, t1; } span;

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static const char *str_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int num_field(const cJSON *o, const char *k, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return 0;
    *out = v->valuedouble;
    return 1;
}

/* Sort by start, longer first, so a parent comes before its children. */
static int span_cmp(const void *pa, const void *pb) {
    const span *a = pa, *b = pb;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    if (a->t1 != b->t1) return a->t1 > b->t1 ? -1 : 1;
    return 0;
}

/* Every pair of spans is nested or disjoint: sweep with a stack of open
 * spans; a span must end inside the innermost span still open at its start. */
static int spans_nest(span *s, int n) {
    qsort(s, (size_t)n, sizeof *s, span_cmp);
    span *stack = malloc(sizeof *stack * (size_t)(n + 1));
    int top = 0, ok = 1;
    for (int i = 0; i < n && ok; i++) {
        while (top > 0 && stack[top - 1].t1 <= s[i].t0) top--;
        if (top > 0 && s[i].t1 > stack[top - 1].t1) ok = 0;
        stack[top++] = s[i];
    }
    free(stack);
    return ok;
}

/* Checks the fields each phase requires; returns the phase or 0. */
static char check_event(const cJSON *e, int i) {
    const char *ph = str_field(e, "ph");
    const char *name = str_field(e, "name");
    double ts, pid, tid, dur;
    CHECK(ph && strlen(ph) == 1, "event %d: ph", i);
    CHECK(name != NULL, "event %d: name", i);
    CHECK(num_field(e, "ts", &ts) && ts >= 0, "event %d: ts", i);
    CHECK(num_field(e, "pid", &pid), "event %d: pid", i);
    CHECK(num_field(e, "tid", &tid), "event %d: tid", i);
    if (!ph || !name) return 0;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (ph[0] == 'X') {
        CHECK(num_field(e, "dur", &dur) && dur >= 0, "X event %d (%s): dur", i, name);
        CHECK(str_field(e, "cat") != NULL, "X event %d (%s): cat", i, name);
    } else if (ph[0] == 'C') {
        CHECK(cJSON_IsObject(args) && cJSON_GetArraySize(args) > 0, "C event %d: args", i);
        const cJSON *v;
        cJSON_ArrayForEach(v, args) CHECK(cJSON_IsNumber(v), "C event %d: series %s not a number", i, v->string);
    } else if (ph[0] == 'M') {
        CHECK(!strcmp(name, "process_name") || !strcmp(name, "thread_name"), "M event %d: %s", i, name);
        CHECK(cJSON_IsObject(args) && str_field(args, "name"), "M event %d: args.name", i);
    } else {
        CHECK(0, "event %d: unexpected ph %s", i, ph);
    }
    return ph[0];
}

/* Writes three training steps: step > (fwd > layer x3), bwd, optim, with a
 * ledger counter at each phase change. Returns the number of X events and
 * fills the ledger totals passed, in order. */
static int write_steps(mf_trace *tr, double base, size_t *totals, int *n_totals) {
    mf_ledger l;
    mf_ledger_init(&l);
    mf_ledger_add(&l, MF_CAT_PARAMS, 4000);
    mf_ledger_add(&l, MF_CAT_OPTIM, 8000);
    int nx = 0;
    *n_totals = 0;
    for (int s = 0; s < 3; s++) {
        double t = base + 0.1 * s;  /* step s spans [t, t + 0.08] */
        mf_trace_ledger(tr, t, &l);
        totals[(*n_totals)++] = l.cur_total;
        for (int k = 0; k < 3; k++) {
            mf_ledger_add(&l, MF_CAT_ACTS, 1000 + 7 * (size_t)k);
            mf_trace_span_arg(tr, "layer fwd", "fwd", t + 0.001 + 0.01 * k, t + 0.0105 + 0.01 * k, "layer", k);
            nx++;
        }
        mf_trace_span(tr, "forward", "fwd", t + 0.001, t + 0.031);
        mf_ledger_add(&l, MF_CAT_GRADS, 4000);
        mf_ledger_add(&l, MF_CAT_WORK, 333);
        mf_trace_ledger(tr, t + 0.031, &l);
        totals[(*n_totals)++] = l.cur_total;
        mf_trace_span(tr, "backward", "bwd", t + 0.031, t + 0.07);
        mf_ledger_sub(&l, MF_CAT_WORK, 333);
        for (int k = 0; k < 3; k++) mf_ledger_sub(&l, MF_CAT_ACTS, 1000 + 7 * (size_t)k);
        mf_trace_span(tr, "optimizer", "optim", t + 0.07, t + 0.08);
        mf_ledger_sub(&l, MF_CAT_GRADS, 4000);
        mf_trace_ledger(tr, t + 0.08, &l);
        totals[(*n_totals)++] = l.cur_total;
        mf_trace_span_arg(tr, "step", "step", t, t + 0.08, "step", s + 1);
        nx += 4;
    }
    const char *series[] = {"tok_s"};
    const double v[] = {1234.5};
    mf_trace_counter(tr, "throughput", base + 0.3, 1, series, v);
    mf_trace_span(tr, "name with \"quotes\"\n\\ and \xc3\xa9", "misc", base + 0.31, base + 0.32);
    return nx + 1;
}

static void check_trace(const char *path, int want_x, const size_t *totals, int n_totals) {
    char *text = read_all(path);
    CHECK(text != NULL, "read %s", path);
    if (!text) return;
    cJSON *root = cJSON_Parse(text);
    CHECK(cJSON_IsArray(root), "trace is a JSON array");
    int n = cJSON_GetArraySize(root);
    span *spans = malloc(sizeof *spans * (size_t)(n + 1));
    int nx = 0, nm = 0, n_mem = 0, saw_process = 0, saw_thread = 0, saw_quotes = 0, saw_tok = 0;
    long long last_end = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(root, i);
        char ph = check_event(e, i);
        const char *name = str_field(e, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        double ts = 0, dur = 0;
        num_field(e, "ts", &ts);
        if (ph == 'X') {
            num_field(e, "dur", &dur);
            /* spans are written as they end: ends never go back (one track) */
            long long end = llround(ts * 1000) + llround(dur * 1000);
            CHECK(end >= last_end, "X event %d (%s) ends at %lld ns, before the previous end %lld ns",
                  i, name, end, last_end);
            last_end = end;
            spans[nx].t0 = llround(ts * 1000);
            spans[nx].t1 = spans[nx].t0 + llround(dur * 1000);
            nx++;
            double want = -1;
            if (!strcmp(name, "step")) want = 80000;
            else if (!strcmp(name, "forward")) want = 30000;
            else if (!strcmp(name, "backward")) want = 39000;
            else if (!strcmp(name, "layer fwd")) want = 9500;
            if (want >= 0) CHECK(fabs(dur - want) < 0.002, "%s dur %.3f us, want %.0f", name, dur, want);
            if (!strcmp(name, "name with \"quotes\"\n\\ and \xc3\xa9")) saw_quotes = 1;
        } else if (ph == 'C' && !strcmp(name, "memory")) {
            double sum = 0;
            int k = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, args) {
                CHECK(k < MF_CAT_COUNT && !strcmp(v->string, mf_cat_name((mf_cat)k)),
                      "memory series %d is %s, want %s", k, v->string, mf_cat_name((mf_cat)k));
                sum += v->valuedouble;
                k++;
            }
            CHECK(n_mem < n_totals && sum == (double)totals[n_mem], "memory counter %d sums to %.0f, want %zu",
                  n_mem, sum, n_mem < n_totals ? totals[n_mem] : 0);
            n_mem++;
        } else if (ph == 'C' && !strcmp(name, "throughput")) {
            double v = 0;
            CHECK(num_field(args, "tok_s", &v) && v == 1234.5, "throughput counter value %g", v);
            saw_tok = 1;
        } else if (ph == 'M') {
            nm++;
            const char *value = str_field(args, "name");
            if (!strcmp(name, "process_name")) saw_process = value && !strcmp(value, "memfit");
            if (!strcmp(name, "thread_name")) saw_thread = value && !strcmp(value, "train");
        }
    }
    CHECK(nx == want_x, "%d X events, want %d", nx, want_x);
    CHECK(n_mem == n_totals, "%d memory counters, want %d", n_mem, n_totals);
    CHECK(nm == 2 && saw_process && saw_thread, "process_name and thread_name metadata (%d M events)", nm);
    if (totals) {  /* the structured trace, not the long one */
        CHECK(saw_quotes, "a span name with quotes, backslash, newline and UTF-8 reads back unchanged");
        CHECK(saw_tok, "a one-series counter");
    }
    CHECK(spans_nest(spans, nx), "complete events nest properly");
    free(spans);
    cJSON_Delete(root);
    free(text);
}

int main(void) {
    char dir[] = "/tmp/mf_trace_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char path[256], tmp[300];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());

    /* the structured trace */
    mf_trace *tr = mf_trace_open(path);
    CHECK(tr != NULL, "open: %s", mf_error());
    if (!tr) return mf_test_done("test_monitor_trace");
    double base = mf_time_now();
    size_t totals[16];
    int n_totals = 0;
    int want_x = write_steps(tr, base, totals, &n_totals);
    CHECK(access(path, F_OK) != 0, "before close, %s does not exist yet", path);
    CHECK(access(tmp, F_OK) == 0, "before close, events go to %s", tmp);
    CHECK(mf_trace_close(tr) == 0, "close: %s", mf_error());
    CHECK(access(tmp, F_OK) != 0, "after close the temp file is gone");
    check_trace(path, want_x, totals, n_totals);

    /* streaming: many spans reach the temp file before close */
    char path2[256], tmp2[300];
    snprintf(path2, sizeof path2, "%s/long.json", dir);
    snprintf(tmp2, sizeof tmp2, "%s.tmp.%ld", path2, (long)getpid());
    tr = mf_trace_open(path2);
    CHECK(tr != NULL, "open: %s", mf_error());
    const int n_long = 20000;
    for (int i = 0; i < n_long; i++) mf_trace_span(tr, "tick", "loop", base + 1e-4 * i, base + 1e-4 * i + 5e-5);
    long mid = file_size(tmp2);
    CHECK(mid > 100L * n_long / 2, "events are written as recorded (temp file %ld bytes before close)", mid);
    CHECK(access(path2, F_OK) != 0, "no file at the destination before close");
    CHECK(mf_trace_close(tr) == 0, "close: %s", mf_error());
    check_trace(path2, n_long, NULL, 0);

    /* NULL is a no-op; a missing directory is refused with its path */
    mf_trace_span(NULL, "x", "y", 0, 1);
    mf_trace_ledger(NULL, 0, NULL);
    CHECK(mf_trace_close(NULL) == 0, "close(NULL)");
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/trace.json", dir);
    CHECK(mf_trace_open(bad) == NULL, "open in a missing directory fails");
    CHECK(strstr(mf_error(), bad) != NULL, "message names the path: %s", mf_error());

    unlink(path);
    unlink(path2);
    rmdir(dir);
    return mf_test_done("test_monitor_trace");
}
