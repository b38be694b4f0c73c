/* The HTML report of a metrics file with known values is well-formed XML
 * (xmllint when installed, and always a small tag/attribute/entity checker
 * here), has one <svg> per chart section, and every plotted series carries
 * exactly the metrics file's numbers (data-steps, data-values) with pixel
 * points that are an affine map of them; a resumed run's lines replace the
 * earlier ones from their step on; the budget and health lines sit at the
 * threshold table's fractions of the plan's budget. Bad input (missing
 * file, a corrupt line, a field that is not a number, a bad plan) fails
 * with a message naming the file and line and leaves the output alone. */
#include "memfit/monitor.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXN 6000

/* What the report should plot: filled while writing the metrics file. */
typedef struct {
    double step[MAXN], loss[MAXN], tok[MAXN], rss[MAXN];
    double mem[4][MAXN];
    int n;
    double vstep[MAXN], val[MAXN];
    int nv;
} expect;

static const char *mem_cats[4] = {"params", "grads", "optim", "acts"};

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

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

/* One metrics line; a resumed run's line drops expected points from its
 * step on, as the report must. */
static void put_line(FILE *f, expect *e, int step, int run) {
    while (e->n > 0 && e->step[e->n - 1] >= step) e->n--;
    while (e->nv > 0 && e->vstep[e->nv - 1] >= step) e->nv--;
    double loss = 5.0 - 0.1 * step - 0.01 * run;        /* 0.1: no exact binary form */
    double tok = 1000.0 + 12.5 * step + (step % 3) / 3.0;
    double rss = 50e6 + 1000.0 * step;
    double mem[4] = {4e6, 4e6, 8e6, 10e6 + 4096.0 * (step % 5)};
    int i = e->n++;
    e->step[i] = step;
    e->loss[i] = loss;
    e->tok[i] = tok;
    e->rss[i] = rss;
    for (int k = 0; k < 4; k++) e->mem[k][i] = mem[k];
    fprintf(f, "{\"step\":%d,\"loss\":%.17g,\"lr\":0.001,\"tok_s\":%.17g,", step, loss, tok);
    if (step % 4 == 0) {
        double val = loss + 0.05;
        e->vstep[e->nv] = step;
        e->val[e->nv++] = val;
        fprintf(f, "\"val_loss\":%.17g,", val);
    } else if (step % 4 == 1) {
        fputs("\"val_loss\":null,", f);  /* null reads as absent */
    }
    fprintf(f, "\"rss_peak_bytes\":%.0f,\"ledger_peak_bytes\":26000000,\"note\":\"ignored\"", rss);
    for (int k = 0; k < 4; k++) fprintf(f, ",\"mem_%s\":%.0f", mem_cats[k], mem[k]);
    fputs("}\n", f);
}

/* ---- a small well-formedness checker --------------------------------- */

static int xml_check(const char *s, char *why, size_t n) {
    char stack[64][32];
    int depth = 0, elements = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '&') {
            const char *ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"};
            int ok = 0;
            for (int i = 0; i < 6; i++) ok |= strncmp(p, ents[i], strlen(ents[i])) == 0;
            if (!ok) { snprintf(why, n, "bare & at offset %ld", (long)(p - s)); return 0; }
            continue;
        }
        if (*p == '>') { snprintf(why, n, "bare > at offset %ld", (long)(p - s)); return 0; }
        if (*p != '<') continue;
        if (!strncmp(p, "<!--", 4)) { p = strstr(p, "-->"); if (!p) return 0; p += 2; continue; }
        if (p[1] == '!' || p[1] == '?') { p = strchr(p, '>'); if (!p) return 0; continue; }
        int closing = p[1] == '/';
        const char *q = p + 1 + closing;
        size_t len = strcspn(q, " \t\n/>");
        if (len == 0 || len >= 32) { snprintf(why, n, "bad tag at offset %ld", (long)(p - s)); return 0; }
        char name[32];
        memcpy(name, q, len);
        name[len] = 0;
        q += len;
        int quote = 0;  /* inside a tag: every value quoted, no < */
        for (; *q && (quote || *q != '>'); q++) {
            if (*q == '"') quote = !quote;
            else if (!quote && *q == '=' && q[1] != '"') { snprintf(why, n, "unquoted attribute in <%s>", name); return 0; }
            else if (*q == '<') { snprintf(why, n, "< inside <%s>", name); return 0; }
        }
        if (!*q) { snprintf(why, n, "unterminated <%s>", name); return 0; }
        if (closing) {
            if (depth == 0 || strcmp(stack[depth - 1], name)) {
                snprintf(why, n, "</%s> closes <%s>", name, depth ? stack[depth - 1] : "nothing");
                return 0;
            }
            depth--;
        } else if (q[-1] != '/') {
            if (depth == 64) { snprintf(why, n, "nesting too deep"); return 0; }
            snprintf(stack[depth++], 32, "%s", name);
            elements++;
        } else {
            elements++;
        }
        p = q;
    }
    if (depth) { snprintf(why, n, "<%s> never closed", stack[depth - 1]); return 0; }
    return elements > 0;
}

/* ---- reading the report back ----------------------------------------- */

/* The text of the element with id="<id>" up to its end ("/>" or ">"). */
static char *element(const char *html, const char *id) {
    char key[96];
    snprintf(key, sizeof key, "id=\"%s\"", id);
    const char *p = strstr(html, key);
    if (!p) return NULL;
    while (p > html && *p != '<') p--;
    const char *end = strchr(p, '>');
    return end ? strndup(p, (size_t)(end - p + 1)) : NULL;
}

/* Numbers of attribute `name` in an element, separated by ',' or ' '. */
static int attr_numbers(const char *el, const char *name, double *out, int max) {
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = el ? strstr(el, key) : NULL;
    if (!p) return -1;
    p += strlen(key);
    int n = 0;
    while (*p && *p != '"' && n < max) {
        char *end;
        out[n++] = strtod(p, &end);
        if (end == p) return -1;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

static double xs[2 * MAXN], vs[2 * MAXN], pts[4 * MAXN];

/* Series `id` plots exactly (steps, values): raw numbers in data-*, pixel
 * x increasing with the step, and (for polylines) pixel y one affine map
 * of the values (to the 0.01 px that the file's rounding allows). */
static void check_series(const char *html, const char *id, const double *steps, const double *values, int n,
                         int polyline) {
    char *el = element(html, id);
    CHECK(el != NULL, "series %s present", id);
    if (!el) return;
    int ns = attr_numbers(el, "data-steps", xs, 2 * MAXN);
    int nv = attr_numbers(el, "data-values", vs, 2 * MAXN);
    int np = attr_numbers(el, "points", pts, 4 * MAXN);
    CHECK(ns == n && nv == n, "%s: %d steps and %d values, want %d", id, ns, nv, n);
    int bad = 0;
    for (int i = 0; i < n && i < ns && i < nv; i++) bad += xs[i] != steps[i] || vs[i] != values[i];
    CHECK(bad == 0, "%s: %d data points differ from the metrics file", id, bad);
    CHECK(np == (polyline ? 2 * n : 4 * n), "%s: %d point coordinates for %d steps", id, np, n);
    for (int i = 1; i < n && np >= 2 * n; i++)
        CHECK(pts[2 * i] > pts[2 * i - 2], "%s: x pixel of step %g not right of the previous", id, steps[i]);
    if (polyline && np == 2 * n && n >= 2) {
        int a = 0, b = 0;
        for (int i = 0; i < n; i++) { if (values[i] < values[a]) a = i; if (values[i] > values[b]) b = i; }
        if (values[b] > values[a]) {
            double slope = (pts[2 * b + 1] - pts[2 * a + 1]) / (values[b] - values[a]);
            CHECK(slope < 0, "%s: larger values are drawn higher", id);
            for (int i = 0; i < n; i++) {
                double want = pts[2 * a + 1] + slope * (values[i] - values[a]);
                CHECK(fabs(pts[2 * i + 1] - want) < 0.011, "%s: y pixel of step %g is %.2f, want %.2f",
                      id, steps[i], pts[2 * i + 1], want);
            }
        }
    }
    free(el);
}

/* The section's text between <section id="..."> and </section>. */
static char *section(const char *html, const char *id) {
    char key[64];
    snprintf(key, sizeof key, "<section id=\"%s\">", id);
    const char *p = strstr(html, key);
    const char *end = p ? strstr(p, "</section>") : NULL;
    return end ? strndup(p, (size_t)(end - p)) : NULL;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void check_well_formed(const char *path, const char *html) {
    char why[160] = "";
    CHECK(xml_check(html, why, sizeof why), "%s is not well-formed: %s", path, why);
    if (system("command -v xmllint >/dev/null 2>&1") == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        CHECK(system(cmd) == 0, "xmllint --noout %s", path);
    } else {
        printf("note: xmllint not installed (apt-get install libxml2-utils); used the built-in checker only\n");
    }
}

static void check_health_table(void) {
    CHECK(mf_health_level(89, 100) == MF_HEALTH_OK, "89%% ok");
    CHECK(mf_health_level(90, 100) == MF_HEALTH_TARGET, "90%% target");
    CHECK(mf_health_level(92, 100) == MF_HEALTH_WARNING, "92%% warning");
    CHECK(mf_health_level(95, 100) == MF_HEALTH_CRITICAL, "95%% critical");
    CHECK(mf_health_level(97, 100) == MF_HEALTH_EMERGENCY, "97%% emergency");
    CHECK(mf_health_level(500, 100) == MF_HEALTH_EMERGENCY, "over budget: emergency");
    CHECK(mf_health_level(500, 0) == MF_HEALTH_OK, "no budget: ok");
    CHECK(!strcmp(mf_health_name(MF_HEALTH_WARNING), "warning"), "names");
    /* configurable thresholds: bad specs refused, good ones move the levels */
    CHECK(mf_health_parse("0.9,0.92,0.95", NULL) < 0, "three levels accepted");
    CHECK(mf_health_parse("0.9,0.8,0.95,0.97", NULL) < 0, "decreasing levels accepted");
    CHECK(mf_health_parse("0.9,0.92,0.95,x", NULL) < 0, "non-number accepted");
    CHECK(mf_health_configure("0.5,0.6,0.7,0.8") == 0, "configure: %s", mf_error());
    CHECK(mf_health_level(55, 100) == MF_HEALTH_TARGET && mf_health_level(79, 100) == MF_HEALTH_CRITICAL &&
          mf_health_level(80, 100) == MF_HEALTH_EMERGENCY, "configured levels");
    CHECK(mf_health_configure("0.90,0.92,0.95,0.97") == 0, "restore defaults");
}

static const char *plan_json =
    "{\"model\":\"gpt2-1m\",\"n_params\":1040768,\"batch\":4,\"seq\":64,\"recompute\":\"none\","
    "\"bytes\":{\"params\":4000000,\"master\":0,\"grads\":4000000,\"optim\":8000000,\"acts\":10000000,"
    "\"work\":0,\"data\":2048},\"total\":26002048,\"arena\":26002048,\"runtime\":6000000,"
    "\"process\":32002048,\"budget\":60000000,"
    "\"layers\":[{\"params\":1,\"acts\":2},{\"params\":3,\"grads\":4}]}";

/* Renders the known metrics and checks every series against them. */
static void check_known_run(const char *dir) {
    char metrics[256], out[256];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(out, sizeof out, "%s/report.html", dir);
    static expect e;
    FILE *f = fopen(metrics, "w");
    for (int s = 1; s <= 12; s++) put_line(f, &e, s, 0);
    fputs("\n   \n", f);  /* blank lines are skipped */
    for (int s = 9; s <= 14; s++) put_line(f, &e, s, 1);  /* resumed from step 8 */
    fclose(f);
    CHECK(e.n == 14 && e.nv == 3, "expected points: %d train, %d val", e.n, e.nv);

    int rc = mf_report_html(out, metrics, plan_json, "run <1> & \"quotes\"");
    CHECK(rc == 0, "render: %s", mf_error());
    char *html = read_all(out);
    CHECK(html != NULL, "read %s", out);
    if (!html) return;
    check_well_formed(out, html);

    const char *charts[] = {"loss", "throughput", "memory"};
    for (int i = 0; i < 3; i++) {
        char *sec = section(html, charts[i]);
        CHECK(sec != NULL, "section %s", charts[i]);
        if (sec) CHECK(count(sec, "<svg") == 1 && count(sec, "<h2>") == 1, "section %s: one <h2> and one <svg>", charts[i]);
        free(sec);
    }
    char *plan = section(html, "plan");
    CHECK(plan && strstr(plan, "<h2>") && strstr(plan, "id=\"plan-categories\"") && strstr(plan, "id=\"plan-layers\""),
          "plan section with category and layer tables");
    /* predicted 4000000 params beside the last mem_params 4000000 */
    CHECK(plan && strstr(plan, "<tr data-row=\"params\"><th>params</th><td class=\"num\">4000000 (3.81 MiB)</td>"
                               "<td class=\"num\">4000000 (3.81 MiB)</td><td class=\"num\">exact</td></tr>"),
          "params row: predicted beside measured, exact");
    free(plan);
    char *summary = section(html, "summary");
    CHECK(summary && strstr(summary, "<h2>"), "summary section");
    free(summary);
    CHECK(strstr(html, "<title>run &lt;1&gt; &amp; &quot;quotes&quot;</title>"), "title escaped");

    check_series(html, "loss-train", e.step, e.loss, e.n, 1);
    check_series(html, "loss-val", e.vstep, e.val, e.nv, 1);
    check_series(html, "tok_s", e.step, e.tok, e.n, 1);
    check_series(html, "mem-rss", e.step, e.rss, e.n, 1);
    for (int k = 0; k < 4; k++) {
        char id[32];
        snprintf(id, sizeof id, "mem-%s", mem_cats[k]);
        check_series(html, id, e.step, e.mem[k], e.n, 0);
    }
    CHECK(!strstr(html, "id=\"mem-work\""), "a category with no bytes is not drawn");

    double v[2];
    char *el = element(html, "budget");
    CHECK(attr_numbers(el, "data-value", v, 1) == 1 && v[0] == 60000000, "budget line at the plan's budget");
    free(el);
    for (int h = 1; h < MF_HEALTH_COUNT; h++) {
        char id[32];
        snprintf(id, sizeof id, "health-%s", mf_health_name((mf_health)h));
        el = element(html, id);
        double want = mf_health_threshold((mf_health)h) * 60000000;
        CHECK(attr_numbers(el, "data-value", v, 1) == 1 && v[0] == want, "%s line at %.0f", id, want);
        free(el);
    }
    free(html);
    unlink(metrics);
    unlink(out);
}

/* A long run is thinned to at most 2000 points per series, keeping the last. */
static void check_long_run(const char *dir) {
    char metrics[256], out[256];
    snprintf(metrics, sizeof metrics, "%s/long.jsonl", dir);
    snprintf(out, sizeof out, "%s/long.html", dir);
    static expect e;
    FILE *f = fopen(metrics, "w");
    for (int s = 1; s <= 4000; s++) put_line(f, &e, s, 0);  /* 4000 = 2 x 2000: a stride of 2 would give 2001 */
    fclose(f);
    CHECK(mf_report_html(out, metrics, NULL, NULL) == 0, "render long: %s", mf_error());
    char *html = read_all(out);
    if (!html) { CHECK(0, "read %s", out); return; }
    check_well_formed(out, html);
    char *el = element(html, "loss-train");
    int n = attr_numbers(el, "data-steps", xs, 2 * MAXN);
    CHECK(n > 1000 && n <= 2000, "long run thinned to %d points", n);
    CHECK(n > 0 && xs[n - 1] == 4000, "the last step is kept");
    CHECK(strstr(html, "No plan given") != NULL, "no plan: said so");
    free(el);
    free(html);
    unlink(metrics);
    unlink(out);
}

/* Bad input: -1, a message naming the file (and line), output untouched. */
static void check_bad(const char *dir, const char *name, const char *text, const char *plan, const char *want) {
    char metrics[256], out[256];
    snprintf(metrics, sizeof metrics, "%s/%s.jsonl", dir, name);
    snprintf(out, sizeof out, "%s/%s.html", dir, name);
    if (text) write_file(metrics, text);
    write_file(out, "old");
    int rc = mf_report_html(out, metrics, plan, NULL);
    CHECK(rc == -1, "%s: rc %d", name, rc);
    CHECK(plan || strstr(mf_error(), metrics), "%s: message names %s: %s", name, metrics, mf_error());
    CHECK(strstr(mf_error(), want), "%s: message says '%s': %s", name, want, mf_error());
    char *old = read_all(out);
    CHECK(old && !strcmp(old, "old"), "%s: output left alone", name);
    free(old);
    CHECK(access(out, F_OK) == 0 && unlink(out) == 0, "cleanup");
    unlink(metrics);
}

int main(void) {
    char dir[] = "/tmp/mf_report_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    check_health_table();
    check_known_run(dir);
    check_long_run(dir);

    const char *good = "{\"step\":1,\"loss\":2}\n";
    check_bad(dir, "missing", NULL, NULL, "No such file");
    check_bad(dir, "corrupt", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.9}\n{\"step\":3,\"loss\":\n", NULL,
              "line 3: not valid JSON");
    check_bad(dir, "array", "{\"step\":1}\n[1,2]\n", NULL, "line 2: not a JSON object");
    check_bad(dir, "trailing", "{\"step\":1} x\n", NULL, "line 1");
    check_bad(dir, "nan", "{\"step\":1,\"loss\":nan}\n", NULL, "line 1: not valid JSON");
    check_bad(dir, "type", "\n{\"step\":1,\"loss\":\"low\"}\n", NULL, "line 2: \"loss\" is not a number");
    check_bad(dir, "nostep", "{\"loss\":1}\n", NULL, "line 1: no \"step\"");
    check_bad(dir, "plan", good, "{\"bytes\":", "plan is not valid JSON");
    check_bad(dir, "planarray", good, "[1]", "plan is not a JSON object");

    char out[300];
    snprintf(out, sizeof out, "%s/nodir/x.html", dir);
    char metrics[300];
    snprintf(metrics, sizeof metrics, "%s/ok.jsonl", dir);
    write_file(metrics, good);
    CHECK(mf_report_html(out, metrics, NULL, NULL) == -1 && strstr(mf_error(), out), "unwritable output named: %s", mf_error());
    unlink(metrics);
    rmdir(dir);
    return mf_test_done("test_monitor_report");
}
