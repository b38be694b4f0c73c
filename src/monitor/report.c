/* HTML run report: metrics JSONL (+ the plan's JSON) -> one self-contained
 * XHTML file with inline SVG charts.
 *
 * Reads everything first (metrics lines, plan), then writes the file through
 * mf_atomic_open, so bad input never touches out_path. The markup is
 * XML-well-formed (every tag closed, attributes quoted, text escaped, no
 * named entities but the five XML ones) so `xmllint --noout` accepts it and
 * a test can read it back. Each plotted series carries its raw numbers in
 * data-steps / data-values (shortest text that reads back to the same
 * double); the pixel coordinates are an affine map of the same numbers.
 * Long runs are thinned to MF_REPORT_MAX_POINTS points per series (every
 * k-th step and the last), and data-steps says which steps were kept. */
#include "memfit/monitor.h"
#include "io/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MF_REPORT_MAX_POINTS 2000

/* ---- metrics rows ---------------------------------------------------- */

/* The metrics fields the report reads, by index; NAN when absent. */
enum {
    F_STEP, F_LOSS, F_VAL_LOSS, F_TOK_S, F_RSS_PEAK, F_LEDGER_PEAK, F_ARENA, F_RSS_BASELINE, F_COMM_MPI,
    F_MOE_AUX, F_MOE_Z,
    F_MEM,                       /* F_MEM + c: "mem_<category c>" */
    F_COUNT = F_MEM + MF_CAT_COUNT
};
static const char *field_keys[F_MEM] = {
    "step", "loss", "val_loss", "tok_s", "rss_peak_bytes", "ledger_peak_bytes", "arena_bytes",
    "rss_baseline_bytes", "comm_mpi_bytes", "moe_aux", "moe_z",
};

typedef struct { double v[F_COUNT]; } mf_row;
/* rows, and the last line's moe_tokens (tokens per expert per layer, a
 * mixture of experts' routing) as parsed JSON, NULL if no line had it */
typedef struct { mf_row *rows; int n, cap; cJSON *moe_tokens; double moe_step; } mf_rows;

static void field_key(int f, char *buf, size_t n) {
    if (f < F_MEM) snprintf(buf, n, "%s", field_keys[f]);
    else snprintf(buf, n, "mem_%s", mf_cat_name((mf_cat)(f - F_MEM)));
}

static int row_parse(const char *text, mf_row *r, mf_rows *rs, const char *path, long line) {
    cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
    if (!o) return mf_fail("metrics file %s line %ld: not valid JSON", path, line);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return mf_fail("metrics file %s line %ld: not a JSON object", path, line);
    }
    int rc = 0;
    for (int f = 0; f < F_COUNT && !rc; f++) {
        char key[32];
        field_key(f, key, sizeof key);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
        r->v[f] = NAN;
        if (cJSON_IsNumber(x) && isfinite(x->valuedouble)) r->v[f] = x->valuedouble;
        else if (x && !cJSON_IsNull(x) && !cJSON_IsNumber(x))
            rc = mf_fail("metrics file %s line %ld: \"%s\" is not a number", path, line, key);
    }
    if (!rc && !(r->v[F_STEP] >= 0))
        rc = mf_fail("metrics file %s line %ld: no \"step\" (a number >= 0)", path, line);
    cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "moe_tokens");
    if (!rc && tok) {
        /* an array per layer of one count per expert */
        int ok = cJSON_IsArray(tok) && cJSON_GetArraySize(tok) > 0, E = -1;
        const cJSON *row, *x;
        cJSON_ArrayForEach(row, tok) {
            ok &= cJSON_IsArray(row) && (E < 0 || cJSON_GetArraySize(row) == E);
            E = cJSON_GetArraySize(row);
            cJSON_ArrayForEach(x, row) ok &= cJSON_IsNumber(x) && x->valuedouble >= 0;
        }
        if (!ok || E < 1) rc = mf_fail("metrics file %s line %ld: \"moe_tokens\" is not an array of equal-length "
                                       "arrays of counts", path, line);
        else {
            cJSON_Delete(rs->moe_tokens);
            rs->moe_tokens = cJSON_DetachItemViaPointer(o, tok);
            rs->moe_step = r->v[F_STEP];
        }
    }
    cJSON_Delete(o);
    return rc;
}

static int blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return 0;
    return 1;
}

static int rows_push(mf_rows *rs, const mf_row *r) {
    /* a resumed run appends from its checkpoint's step: its lines replace
     * the earlier ones from that step on */
    while (rs->n > 0 && rs->rows[rs->n - 1].v[F_STEP] >= r->v[F_STEP]) rs->n--;
    if (rs->n == rs->cap) {
        int cap = rs->cap ? 2 * rs->cap : 256;
        mf_row *p = realloc(rs->rows, sizeof *p * (size_t)cap);
        if (!p) return -1;
        rs->rows = p;
        rs->cap = cap;
    }
    rs->rows[rs->n++] = *r;
    return 0;
}

static int rows_load(mf_rows *rs, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return mf_fail("cannot read metrics file %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long ln = 0;
    int rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        ln++;
        if (blank(line)) continue;
        mf_row r;
        if ((rc = row_parse(line, &r, rs, path, ln))) break;
        if ((rc = rows_push(rs, &r))) { mf_fail("metrics file %s: out of memory", path); break; }
    }
    if (!rc && ferror(f)) rc = mf_fail("cannot read metrics file %s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

/* Last finite value of field f, NAN if none. */
static double rows_last(const mf_rows *rs, int f) {
    for (int i = rs->n - 1; i >= 0; i--)
        if (!isnan(rs->rows[i].v[f])) return rs->rows[i].v[f];
    return NAN;
}

static int rows_have_mem(const mf_rows *rs) {
    for (int i = 0; i < rs->n; i++)
        for (int c = 0; c < MF_CAT_COUNT; c++)
            if (!isnan(rs->rows[i].v[F_MEM + c])) return 1;
    return 0;
}

/* ---- series: (step, value) points of one field ----------------------- */

typedef struct { double *x, *y; int n; } mf_series;

/* Point i of n is drawn: all of them up to MF_REPORT_MAX_POINTS, else every
 * stride-th and the last, at most MF_REPORT_MAX_POINTS in all. */
static int keep_point(int i, int n) {
    int max = MF_REPORT_MAX_POINTS;
    int stride = n <= max ? 1 : (n - 1 + max - 2) / (max - 1);
    return i % stride == 0 || i == n - 1;
}

/* The (step, value) points of the rows where field f is present. */
static int series_make(mf_series *s, const mf_rows *rs, int f) {
    s->x = malloc(sizeof(double) * (size_t)(rs->n + 1));
    s->y = malloc(sizeof(double) * (size_t)(rs->n + 1));
    s->n = 0;
    if (!s->x || !s->y) return mf_fail("report: out of memory");
    int n_have = 0;
    for (int i = 0; i < rs->n; i++) n_have += !isnan(rs->rows[i].v[f]);
    for (int i = 0, k = 0; i < rs->n; i++) {
        double v = rs->rows[i].v[f];
        if (isnan(v)) continue;
        if (keep_point(k++, n_have)) {
            s->x[s->n] = rs->rows[i].v[F_STEP];
            s->y[s->n] = v;
            s->n++;
        }
    }
    return 0;
}

/* One series per category over the rows that carry any mem_ field (missing
 * categories read as 0), all on the same steps so they stack. */
static int series_make_mem(mf_series *s, const mf_rows *rs) {
    int n_have = 0;
    for (int i = 0; i < rs->n; i++) {
        int any = 0;
        for (int c = 0; c < MF_CAT_COUNT; c++) any |= !isnan(rs->rows[i].v[F_MEM + c]);
        n_have += any;
    }
    for (int c = 0; c < MF_CAT_COUNT; c++) {
        s[c].x = malloc(sizeof(double) * (size_t)(n_have + 1));
        s[c].y = malloc(sizeof(double) * (size_t)(n_have + 1));
        s[c].n = 0;
        if (!s[c].x || !s[c].y) return mf_fail("report: out of memory");
    }
    for (int i = 0, k = 0; i < rs->n; i++) {
        const mf_row *r = &rs->rows[i];
        int any = 0;
        for (int c = 0; c < MF_CAT_COUNT; c++) any |= !isnan(r->v[F_MEM + c]);
        if (!any || !keep_point(k++, n_have)) continue;
        for (int c = 0; c < MF_CAT_COUNT; c++) {
            s[c].x[s[c].n] = r->v[F_STEP];
            s[c].y[s[c].n] = isnan(r->v[F_MEM + c]) ? 0 : r->v[F_MEM + c];
            s[c].n++;
        }
    }
    return 0;
}

static void series_free(mf_series *s) {
    free(s->x);
    free(s->y);
    s->x = s->y = NULL;
    s->n = 0;
}

/* ---- text output ----------------------------------------------------- */

/* Text or attribute value, escaped for XML and HTML alike. */
static void put_esc(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default:
            /* control characters other than tab/newline are not allowed in XML */
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n') fputc(' ', f);
            else fputc(*s, f);
        }
    }
}

/* Shortest decimal that reads back as the same double. */
static char *fmt_num(double v, char *buf, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

/* Bytes as "28426752 (27.11 MiB)". */
static void put_bytes(FILE *f, double bytes) {
    char a[64];
    if (isnan(bytes)) { fputs("&#8212;", f); return; }
    fprintf(f, "%.0f (%s)", bytes, mf_size_format((size_t)bytes, a, sizeof a));
}

/* ---- SVG charts ------------------------------------------------------ */

/* Pixel layout of every chart: plot area inside margins, legend at right. */
#define SVG_W 780
#define SVG_H 300
#define SVG_L 80
#define SVG_R 170
#define SVG_T 16
#define SVG_B 44
#define PLOT_W (SVG_W - SVG_L - SVG_R)
#define PLOT_H (SVG_H - SVG_T - SVG_B)

typedef struct {
    double x0, x1, xstep;    /* steps shown and x tick spacing */
    double y0, y1, ystep;    /* values shown and y tick spacing */
    double yunit;            /* tick labels are value / yunit ... */
    const char *yunit_name;  /* ... followed by this ("" or "MiB") */
    int n_legend;
} mf_chart;

static double nice_step(double range, int n_ticks) {
    if (!(range > 0)) return 1;
    double raw = range / n_ticks;
    double mag = pow(10, floor(log10(raw)));
    double r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static void chart_x(mf_chart *c, const mf_rows *rs) {
    c->x0 = rs->n ? rs->rows[0].v[F_STEP] : 0;
    c->x1 = rs->n ? rs->rows[rs->n - 1].v[F_STEP] : 1;
    c->xstep = nice_step(c->x1 - c->x0, 8);
    if (c->xstep < 1) c->xstep = 1;
    c->n_legend = 0;
}

/* y range from lo..hi rounded out to whole ticks; bytes get a binary unit. */
static void chart_y(mf_chart *c, double lo, double hi, int bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (!(lo <= hi)) { lo = 0; hi = 1; }
    if (hi == lo) { double d = fabs(lo) > 0 ? 0.1 * fabs(lo) : 1; lo -= d; hi += d; }
    c->yunit = 1;
    c->yunit_name = "";
    if (bytes) {
        int u = 0;
        while (u < 4 && hi / c->yunit >= 1024) { c->yunit *= 1024; u++; }
        c->yunit_name = units[u];
    }
    c->ystep = nice_step((hi - lo) / c->yunit, 5) * c->yunit;
    c->y0 = floor(lo / c->ystep) * c->ystep;
    c->y1 = ceil(hi / c->ystep) * c->ystep;
    if (c->y1 <= c->y0) c->y1 = c->y0 + c->ystep;
}

static double px(const mf_chart *c, double x) {
    if (c->x1 <= c->x0) return SVG_L + PLOT_W / 2.0;
    return SVG_L + (x - c->x0) / (c->x1 - c->x0) * PLOT_W;
}

static double py(const mf_chart *c, double y) {
    return SVG_T + PLOT_H - (y - c->y0) / (c->y1 - c->y0) * PLOT_H;
}

static void svg_open(FILE *f, const char *label) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"", SVG_W, SVG_H, SVG_W, SVG_H);
    put_esc(f, label);
    fprintf(f, "\">\n<rect class=\"plot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n",
            SVG_L, SVG_T, PLOT_W, PLOT_H);
}

static void svg_axes(FILE *f, const mf_chart *c, const char *ylabel) {
    char buf[64];
    for (int i = 0; ; i++) {
        double y = c->y0 + i * c->ystep;
        if (y > c->y1 + 1e-9 * c->ystep) break;
        double yy = py(c, y);
        double shown = y / c->yunit;
        if (fabs(shown) < 1e-12 * c->ystep / c->yunit) shown = 0;
        fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>", SVG_L, yy, SVG_L + PLOT_W, yy);
        snprintf(buf, sizeof buf, "%g%s%s", shown, *c->yunit_name ? " " : "", c->yunit_name);
        fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", SVG_L - 6, yy + 4, buf);
    }
    double first = ceil(c->x0 / c->xstep) * c->xstep;
    for (double x = first; x <= c->x1 + 1e-9; x += c->xstep) {
        double xx = px(c, x);
        fprintf(f, "<line class=\"grid\" x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>", xx, SVG_T, xx, SVG_T + PLOT_H);
        fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                xx, SVG_T + PLOT_H + 16, fmt_num(x, buf, sizeof buf));
        if (c->x1 <= c->x0) break;
    }
    fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
            SVG_L + PLOT_W / 2, SVG_H - 6);
    fprintf(f, "<text class=\"axis\" x=\"14\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 14 %d)\">",
            SVG_T + PLOT_H / 2, SVG_T + PLOT_H / 2);
    put_esc(f, ylabel);
    fputs("</text>\n", f);
}

/* A legend entry: a swatch (dash NULL) or a line with that dash pattern
 * ("" = solid). */
static void svg_legend(FILE *f, mf_chart *c, const char *color, const char *label, const char *dash) {
    int x = SVG_L + PLOT_W + 14, y = SVG_T + 8 + 18 * c->n_legend++;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"%d\"",
            x, y, x + 18, y, color, dash ? 2 : 6);
    if (dash && *dash) fprintf(f, " stroke-dasharray=\"%s\"", dash);
    fputs("/>", f);
    fprintf(f, "<text class=\"legend\" x=\"%d\" y=\"%d\">", x + 24, y + 4);
    put_esc(f, label);
    fputs("</text>\n", f);
}

static void svg_no_data(FILE *f, const char *what) {
    fprintf(f, "<text class=\"nodata\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", SVG_L + PLOT_W / 2, SVG_T + PLOT_H / 2);
    put_esc(f, what);
    fputs("</text>\n", f);
}

/* data-steps="..." data-values="..." of a series. */
static void put_data_attrs(FILE *f, const mf_series *s) {
    char buf[40];
    fputs(" data-steps=\"", f);
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%s", i ? "," : "", fmt_num(s->x[i], buf, sizeof buf));
    fputs("\" data-values=\"", f);
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%s", i ? "," : "", fmt_num(s->y[i], buf, sizeof buf));
    fputc('"', f);
}

static void svg_polyline(FILE *f, const mf_chart *c, const char *id, const char *color,
                         const mf_series *s, int dashed) {
    fprintf(f, "<polyline id=\"%s\" class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"",
            id, color, dashed ? " stroke-dasharray=\"5 3\"" : "");
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(c, s->x[i]), py(c, s->y[i]));
    fputc('"', f);
    put_data_attrs(f, s);
    fputs("/>\n", f);
    if (s->n > 60) return;  /* markers only where points are few enough to see */
    fprintf(f, "<g fill=\"%s\">", color);
    for (int i = 0; i < s->n; i++) fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\"/>", px(c, s->x[i]), py(c, s->y[i]));
    fputs("</g>\n", f);
}

/* A horizontal line across the plot at value y with a hover title; `label`
 * (may be NULL) is also written just above its left end. */
static void svg_hline(FILE *f, const mf_chart *c, const char *id, const char *color, double y,
                      const char *title, const char *label, int dashed) {
    char buf[40];
    double yy = py(c, y);
    fprintf(f, "<line id=\"%s\" x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"1.2\"%s data-value=\"%s\"><title>",
            id, SVG_L, yy, SVG_L + PLOT_W, yy, color, dashed ? " stroke-dasharray=\"2 3\"" : "", fmt_num(y, buf, sizeof buf));
    put_esc(f, title);
    fputs("</title></line>\n", f);
    if (!label) return;
    fprintf(f, "<text class=\"hline\" x=\"%d\" y=\"%.2f\" fill=\"%s\">", SVG_L + 4, yy - 4, color);
    put_esc(f, label);
    fputs("</text>\n", f);
}

static double series_min(const mf_series *s, double lo) {
    for (int i = 0; i < s->n; i++) if (s->y[i] < lo) lo = s->y[i];
    return lo;
}

static double series_max(const mf_series *s, double hi) {
    for (int i = 0; i < s->n; i++) if (s->y[i] > hi) hi = s->y[i];
    return hi;
}

/* ---- sections -------------------------------------------------------- */

/* one per category; categories beyond the table reuse it from the start */
static const char *const cat_palette[] = {
    "#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f",
    "#8cd17d", "#b6992d", "#499894", "#e15759", "#79706e", "#b07aa1",
};
#define CAT_COLOR(k) cat_palette[(k) % (int)(sizeof cat_palette / sizeof cat_palette[0])]
static const char *health_colors[MF_HEALTH_COUNT] = {"#000000", "#c7a600", "#e08000", "#d04000", "#b00000"};

static void section_open(FILE *f, const char *id, const char *title) {
    fprintf(f, "<section id=\"%s\">\n<h2>", id);
    put_esc(f, title);
    fputs("</h2>\n", f);
}

static int section_loss(FILE *f, const mf_rows *rs) {
    mf_series tr = {0}, va = {0};
    int rc = series_make(&tr, rs, F_LOSS);
    if (!rc) rc = series_make(&va, rs, F_VAL_LOSS);
    if (!rc) {
        mf_chart c;
        chart_x(&c, rs);
        double lo = series_min(&va, series_min(&tr, INFINITY)), hi = series_max(&va, series_max(&tr, -INFINITY));
        chart_y(&c, lo, hi, 0);
        section_open(f, "loss", "Loss");
        svg_open(f, "train and validation loss by step");
        svg_axes(f, &c, "loss");
        if (tr.n + va.n == 0) svg_no_data(f, "no loss in the metrics file");
        if (tr.n) { svg_polyline(f, &c, "loss-train", CAT_COLOR(0), &tr, 0); svg_legend(f, &c, CAT_COLOR(0), "train loss", NULL); }
        if (va.n) { svg_polyline(f, &c, "loss-val", CAT_COLOR(8), &va, 0); svg_legend(f, &c, CAT_COLOR(8), "validation loss", NULL); }
        fputs("</svg>\n</section>\n", f);
    }
    series_free(&tr);
    series_free(&va);
    return rc;
}

static int section_throughput(FILE *f, const mf_rows *rs) {
    mf_series s = {0};
    int rc = series_make(&s, rs, F_TOK_S);
    if (!rc) {
        mf_chart c;
        chart_x(&c, rs);
        chart_y(&c, 0, series_max(&s, 0), 0);
        section_open(f, "throughput", "Throughput");
        svg_open(f, "tokens per second by step");
        svg_axes(f, &c, "tokens/s");
        if (s.n) { svg_polyline(f, &c, "tok_s", CAT_COLOR(4), &s, 0); svg_legend(f, &c, CAT_COLOR(4), "tokens/s", NULL); }
        else svg_no_data(f, "no tok_s in the metrics file");
        fputs("</svg>\n</section>\n", f);
    }
    series_free(&s);
    return rc;
}

/* Stacked areas: category c fills between the sum of the categories below
 * it and that sum plus its own bytes. */
static void svg_stack(FILE *f, mf_chart *c, const mf_series *mem) {
    int n = mem[0].n;
    double *base = calloc((size_t)n + 1, sizeof *base);
    if (!base) return;
    for (int k = 0; k < MF_CAT_COUNT; k++) {
        if (series_max(&mem[k], 0) <= 0) continue;
        const char *name = mf_cat_name((mf_cat)k);
        fprintf(f, "<polygon id=\"mem-%s\" class=\"area\" fill=\"%s\" points=\"", name, CAT_COLOR(k));
        for (int i = 0; i < n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", px(c, mem[k].x[i]), py(c, base[i] + mem[k].y[i]));
        for (int i = n - 1; i >= 0; i--) fprintf(f, " %.2f,%.2f", px(c, mem[k].x[i]), py(c, base[i]));
        fputc('"', f);
        put_data_attrs(f, &mem[k]);
        fputs("/>\n", f);
        for (int i = 0; i < n; i++) base[i] += mem[k].y[i];
        svg_legend(f, c, CAT_COLOR(k), name, NULL);
    }
    free(base);
}

static int section_memory(FILE *f, const mf_rows *rs, double budget) {
    mf_series mem[MF_CAT_COUNT] = {{0}}, rss = {0}, ledger = {0};
    int rc = series_make_mem(mem, rs);
    if (!rc) rc = series_make(&rss, rs, F_RSS_PEAK);
    if (!rc) rc = series_make(&ledger, rs, F_LEDGER_PEAK);
    if (!rc) {
        int have_mem = rows_have_mem(rs);
        double hi = series_max(&rss, 0);
        for (int i = 0; i < mem[0].n; i++) {
            double sum = 0;
            for (int k = 0; k < MF_CAT_COUNT; k++) sum += mem[k].y[i];
            if (sum > hi) hi = sum;
        }
        if (!have_mem) hi = series_max(&ledger, hi);
        if (budget > hi) hi = budget;
        mf_chart c;
        chart_x(&c, rs);
        chart_y(&c, 0, hi * 1.02, 1);
        section_open(f, "memory", "Memory");
        svg_open(f, "memory by category at each step's peak, measured peak RSS and the budget");
        svg_axes(f, &c, "bytes");
        if (have_mem) svg_stack(f, &c, mem);
        else if (ledger.n) {
            svg_polyline(f, &c, "mem-ledger", CAT_COLOR(0), &ledger, 0);
            svg_legend(f, &c, CAT_COLOR(0), "ledger peak", NULL);
        }
        if (rss.n) {
            svg_polyline(f, &c, "mem-rss", "#333333", &rss, 1);
            svg_legend(f, &c, "#333333", "peak RSS", "5 3");
        }
        if (!have_mem && !ledger.n && !rss.n) svg_no_data(f, "no memory fields in the metrics file");
        if (budget > 0) {
            char title[96], size[32];
            mf_size_format((size_t)budget, size, sizeof size);
            snprintf(title, sizeof title, "budget %s", size);
            /* the health lines are 2-3% of the budget apart: too close to
             * label one by one, so they share a legend entry and hover titles */
            for (int h = 1; h < MF_HEALTH_COUNT; h++) {
                double frac = mf_health_threshold((mf_health)h);
                char id[32], t[96];
                snprintf(id, sizeof id, "health-%s", mf_health_name((mf_health)h));
                snprintf(t, sizeof t, "%.0f%% of the budget: %s", 100 * frac, mf_health_name((mf_health)h));
                svg_hline(f, &c, id, health_colors[h], frac * budget, t, NULL, 1);
            }
            svg_hline(f, &c, "budget", health_colors[MF_HEALTH_EMERGENCY], budget, title, title, 0);
            svg_legend(f, &c, health_colors[MF_HEALTH_EMERGENCY], "budget", "");
            svg_legend(f, &c, health_colors[MF_HEALTH_WARNING], "health levels", "2 3");
            fputs("</svg>\n", f);
            fprintf(f, "<p>Budget %s; the dotted lines mark the health levels at", size);
            for (int h = 1; h < MF_HEALTH_COUNT; h++)
                fprintf(f, "%s %.0f%% (%s)", h > 1 ? "," : "", 100 * mf_health_threshold((mf_health)h), mf_health_name((mf_health)h));
            fputs(" of it.</p>\n", f);
        } else {
            fputs("</svg>\n<p>No budget in the plan: no budget or health lines.</p>\n", f);
        }
        if (!have_mem)
            fputs("<p>The metrics have no per-category bytes (mem_&lt;category&gt; fields).</p>\n", f);
        fputs("</section>\n", f);
    }
    for (int k = 0; k < MF_CAT_COUNT; k++) series_free(&mem[k]);
    series_free(&rss);
    series_free(&ledger);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double rows_median(const mf_rows *rs, int f) {
    double *v = malloc(sizeof *v * (size_t)(rs->n + 1));
    int n = 0;
    if (!v) return NAN;
    for (int i = 0; i < rs->n; i++) if (!isnan(rs->rows[i].v[f])) v[n++] = rs->rows[i].v[f];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double m = n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}

static void summary_row(FILE *f, const char *key, const char *fmt, double v) {
    fputs("<tr><th>", f);
    put_esc(f, key);
    fputs("</th><td class=\"num\">", f);
    if (isnan(v)) fputs("&#8212;", f);
    else fprintf(f, fmt, v);
    fputs("</td></tr>\n", f);
}

static void section_summary(FILE *f, const mf_rows *rs, double budget) {
    double best = NAN, best_step = NAN, peak = NAN;
    for (int i = 0; i < rs->n; i++) {
        const mf_row *r = &rs->rows[i];
        if (!isnan(r->v[F_VAL_LOSS]) && !(r->v[F_VAL_LOSS] >= best)) { best = r->v[F_VAL_LOSS]; best_step = r->v[F_STEP]; }
        if (!isnan(r->v[F_RSS_PEAK]) && !(r->v[F_RSS_PEAK] <= peak)) peak = r->v[F_RSS_PEAK];
    }
    section_open(f, "summary", "Summary");
    fputs("<table id=\"summary-table\">\n", f);
    summary_row(f, "steps", "%.0f", rows_last(rs, F_STEP));
    summary_row(f, "final train loss", "%.4f", rows_last(rs, F_LOSS));
    summary_row(f, "final validation loss", "%.4f", rows_last(rs, F_VAL_LOSS));
    summary_row(f, "best validation loss", "%.4f", best);
    summary_row(f, "at step", "%.0f", best_step);
    summary_row(f, "median tokens/s", "%.0f", rows_median(rs, F_TOK_S));
    fputs("<tr><th>peak RSS</th><td class=\"num\">", f);
    put_bytes(f, peak);
    fputs("</td></tr>\n<tr><th>budget</th><td class=\"num\">", f);
    if (budget > 0) put_bytes(f, budget);
    else fputs("none", f);
    fputs("</td></tr>\n", f);
    if (budget > 0 && !isnan(peak)) {
        mf_health h = mf_health_level((size_t)peak, (size_t)budget);
        fprintf(f, "<tr><th>health</th><td class=\"health-%s\">%s: peak RSS is %.1f%% of the budget</td></tr>\n",
                mf_health_name(h), mf_health_name(h), 100 * peak / budget);
    }
    fputs("</table>\n</section>\n", f);
}

/* ---- plan ------------------------------------------------------------ */

static double plan_num(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static void plan_compare_row(FILE *f, const char *id, const char *label, double predicted, double measured) {
    fprintf(f, "<tr data-row=\"%s\"><th>", id);
    put_esc(f, label);
    fputs("</th><td class=\"num\">", f);
    put_bytes(f, predicted);
    fputs("</td><td class=\"num\">", f);
    put_bytes(f, measured);
    fputs("</td><td class=\"num\">", f);
    if (isnan(predicted) || isnan(measured)) fputs("&#8212;", f);
    else if (predicted == measured) fputs("exact", f);
    else if (predicted > 0) fprintf(f, "%+.2f%%", 100 * (measured - predicted) / predicted);
    else fputs("&#8212;", f);
    fputs("</td></tr>\n", f);
}

static void plan_settings(FILE *f, const cJSON *plan) {
    static const char *keys[] = {"model", "n_params", "batch", "seq", "recompute", "recompute_blocks"};
    char buf[40];
    fputs("<table id=\"plan-settings\">\n", f);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(plan, keys[i]);
        if (!cJSON_IsString(x) && !cJSON_IsNumber(x)) continue;
        fprintf(f, "<tr><th>%s</th><td>", keys[i]);
        if (cJSON_IsString(x)) put_esc(f, x->valuestring);
        else fputs(fmt_num(x->valuedouble, buf, sizeof buf), f);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* Predicted (plan) beside measured (the last metrics line). */
static void plan_compare(FILE *f, const cJSON *plan, const mf_rows *rs) {
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(plan, "bytes");
    fputs("<table id=\"plan-categories\">\n<tr><th>category</th><th>predicted</th>"
          "<th>measured</th><th>difference</th></tr>\n", f);
    for (int c = 0; c < MF_CAT_COUNT; c++) {
        double p = plan_num(bytes, mf_cat_name((mf_cat)c));
        double m = rows_last(rs, F_MEM + c);
        if (!(p > 0) && !(m > 0)) continue;
        plan_compare_row(f, mf_cat_name((mf_cat)c), mf_cat_name((mf_cat)c), p, m);
    }
    plan_compare_row(f, "total", "total at the step's peak (ledger)", plan_num(plan, "total"), rows_last(rs, F_LEDGER_PEAK));
    plan_compare_row(f, "arena", "arena (with reuse)", plan_num(plan, "arena"), NAN);
    /* category comm's part outside the arena: the MPI library's scratch
     * (the comm.mpi.* rows), not in the ledger; under train the plan's rows
     * are the measurement of the run's start */
    double mpi = plan_num(cJSON_GetObjectItemCaseSensitive(plan, "comm_mpi"), "total");
    if (mpi > 0) plan_compare_row(f, "comm-mpi", "comm outside the arena (MPI's scratch)", mpi, rows_last(rs, F_COMM_MPI));
    plan_compare_row(f, "runtime", "runtime outside the arena", plan_num(plan, "runtime"), NAN);
    plan_compare_row(f, "process", "process peak RSS", plan_num(plan, "process"), rows_last(rs, F_RSS_PEAK));
    /* what `memfit train` predicts once the process exists: the arena (and
     * MPI's scratch) over the RSS measured before it was mapped */
    double arena = rows_last(rs, F_ARENA), baseline = rows_last(rs, F_RSS_BASELINE), cm = rows_last(rs, F_COMM_MPI);
    if (!isnan(arena) && !isnan(baseline))
        plan_compare_row(f, "process-run", isnan(cm) ? "process peak RSS (arena + measured baseline)"
                                                     : "process peak RSS (arena + MPI's scratch + measured baseline)",
                         arena + baseline + (isnan(cm) ? 0 : cm), rows_last(rs, F_RSS_PEAK));
    fputs("</table>\n", f);
}

static void plan_layers(FILE *f, const cJSON *plan) {
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(plan, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0) return;
    int used[MF_CAT_COUNT] = {0};
    const cJSON *row;
    cJSON_ArrayForEach(row, layers)
        for (int c = 0; c < MF_CAT_COUNT; c++) used[c] |= plan_num(row, mf_cat_name((mf_cat)c)) > 0;
    fputs("<h3>Per layer (bytes)</h3>\n<table id=\"plan-layers\">\n<tr><th>layer</th>", f);
    for (int c = 0; c < MF_CAT_COUNT; c++) if (used[c]) fprintf(f, "<th>%s</th>", mf_cat_name((mf_cat)c));
    fputs("</tr>\n", f);
    int l = 0;
    cJSON_ArrayForEach(row, layers) {
        fprintf(f, "<tr><th>%d</th>", l++);
        for (int c = 0; c < MF_CAT_COUNT; c++) {
            if (!used[c]) continue;
            double v = plan_num(row, mf_cat_name((mf_cat)c));
            fprintf(f, "<td class=\"num\">%.0f</td>", isnan(v) ? 0 : v);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* A mixture of experts: the routers' aux (load-balancing) and z losses by
 * step, and the last metrics line's tokens per expert per layer with each
 * layer's imbalance (largest count over the mean). Nothing for a dense run. */
static int section_moe(FILE *f, const mf_rows *rs) {
    mf_series au = {0}, zz = {0};
    int rc = series_make(&au, rs, F_MOE_AUX);
    if (!rc) rc = series_make(&zz, rs, F_MOE_Z);
    if (!rc && (au.n || rs->moe_tokens)) {
        section_open(f, "moe", "Mixture of experts");
        mf_chart c;
        chart_x(&c, rs);
        chart_y(&c, 0, series_max(&zz, series_max(&au, 0)), 0);
        svg_open(f, "router losses by step");
        svg_axes(f, &c, "router loss");
        if (au.n) { svg_polyline(f, &c, "moe-aux", CAT_COLOR(0), &au, 0); svg_legend(f, &c, CAT_COLOR(0), "aux (load balancing)", NULL); }
        if (zz.n) { svg_polyline(f, &c, "moe-z", CAT_COLOR(4), &zz, 0); svg_legend(f, &c, CAT_COLOR(4), "z-loss", NULL); }
        if (!au.n && !zz.n) svg_no_data(f, "no moe_aux in the metrics file");
        fputs("</svg>\n", f);
        if (rs->moe_tokens) {
            int E = cJSON_GetArraySize(cJSON_GetArrayItem(rs->moe_tokens, 0)), l = 0;
            fprintf(f, "<h3>Tokens per expert per layer (step %.0f)</h3>\n"
                       "<p>Token-slots the router sent to each expert in the step's last micro-batch, before any "
                       "capacity drop; imbalance: the largest over the mean.</p>\n<table id=\"moe-tokens\">\n"
                       "<tr><th>layer</th>", rs->moe_step);
            for (int e = 0; e < E; e++) fprintf(f, "<th>expert %d</th>", e);
            fputs("<th>imbalance</th></tr>\n", f);
            const cJSON *row, *x;
            cJSON_ArrayForEach(row, rs->moe_tokens) {
                double sum = 0, mx = 0;
                fprintf(f, "<tr><th>%d</th>", l);
                int e = 0;
                cJSON_ArrayForEach(x, row) {
                    fprintf(f, "<td class=\"num\" id=\"moe-tok-%d-%d\">%.0f</td>", l, e++, x->valuedouble);
                    sum += x->valuedouble;
                    mx = x->valuedouble > mx ? x->valuedouble : mx;
                }
                fprintf(f, "<td class=\"num\" id=\"moe-imb-%d\">%.3f</td></tr>\n", l++, sum > 0 ? mx / (sum / E) : 0.0);
            }
            fputs("</table>\n", f);
        }
        fputs("</section>\n", f);
    }
    series_free(&au);
    series_free(&zz);
    return rc;
}

static void section_plan(FILE *f, const cJSON *plan, const mf_rows *rs) {
    section_open(f, "plan", "Plan: predicted beside measured");
    if (!plan) {
        fputs("<p>No plan given (memfit estimate --json).</p>\n</section>\n", f);
        return;
    }
    plan_settings(f, plan);
    fputs("<h3>Bytes at the step's peak</h3>\n", f);
    plan_compare(f, plan, rs);
    plan_layers(f, plan);
    fputs("</section>\n", f);
}

/* ---- the document ---------------------------------------------------- */

static const char *css =
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:820px;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;margin:.5em 0}th,td{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "svg{display:block;font-size:11px}rect.plot{fill:#fafafa;stroke:#999}"
    "line.grid{stroke:#e4e4e4}text.tick{fill:#555}text.axis{fill:#222}text.nodata{fill:#999;font-size:14px}"
    "polygon.area{stroke:#fff;stroke-width:.5;fill-opacity:.85}"
    ".health-ok{color:#070}.health-target,.health-warning{color:#a60}.health-critical,.health-emergency{color:#b00}";

static int document(FILE *f, const char *title, const char *metrics_path, const mf_rows *rs,
                    const cJSON *plan, double budget) {
    fputs("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n"
          "<meta charset=\"utf-8\"/>\n<title>", f);
    put_esc(f, title);
    fprintf(f, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>", css);
    put_esc(f, title);
    fputs("</h1>\n<p>From ", f);
    put_esc(f, metrics_path);
    fprintf(f, " (%d steps).</p>\n", rs->n);
    section_summary(f, rs, budget);
    int rc = section_loss(f, rs);
    if (!rc) rc = section_throughput(f, rs);
    if (!rc) rc = section_memory(f, rs, budget);
    if (!rc) rc = section_moe(f, rs);
    if (!rc) section_plan(f, plan, rs);
    fputs("</body>\n</html>\n", f);
    return rc;
}

int mf_report_html(const char *out_path, const char *metrics_jsonl_path, const char *plan_json,
                   const char *title) {
    if (!out_path || !metrics_jsonl_path) return mf_fail("report: no output or metrics path");
    mf_rows rs = {0};
    cJSON *plan = NULL;
    int rc = rows_load(&rs, metrics_jsonl_path);
    if (!rc && plan_json) {
        plan = cJSON_Parse(plan_json);
        if (!plan) {
            const char *at = cJSON_GetErrorPtr();
            rc = mf_fail("report: the plan is not valid JSON (near: %.40s)", at ? at : "?");
        } else if (!cJSON_IsObject(plan)) {
            rc = mf_fail("report: the plan is not a JSON object");
        }
    }
    double budget = plan_num(plan, "budget");
    if (!(budget > 0)) budget = 0;
    mf_atomic_file af;
    if (!rc) rc = mf_atomic_open(&af, out_path);
    if (!rc) {
        rc = document(af.fp, title && *title ? title : "memfit run", metrics_jsonl_path, &rs, plan, budget);
        if (rc) mf_atomic_abort(&af);
        else rc = mf_atomic_commit(&af);
    }
    cJSON_Delete(plan);
    cJSON_Delete(rs.moe_tokens);
    free(rs.rows);
    return rc;
}
