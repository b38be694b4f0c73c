/* The supervised fine-tuning store (data.h): a JSONL file of conversations
 * rendered with a chat template, tokenized once, and laid out in rows.
 *
 * Memory: the store is plain heap, allocated at start-up before the
 * trainer reads its baseline RSS, so the plan's prediction (baseline +
 * arena) includes it; its size is `bytes`, which the trainer prints as the
 * run's data figure. Per id: 4 bytes (id) + 1 (mask); per example 8, per
 * row 4. The file's text and each line's rendering are freed as we go.
 */
#include "memfit/core.h"
#include "memfit/data.h"
#include "memfit/kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *p;
    size_t n, cap, size;
} vec;

static int vec_reserve(vec *v, size_t more) {
    if (v->n + more <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 1024;
    while (cap < v->n + more) cap *= 2;
    void *np = realloc(v->p, cap * v->size);
    if (!np) return -1;
    v->p = np;
    v->cap = cap;
    return 0;
}

/* shrink to what is used: the store's bytes are exactly its contents */
static void *vec_fit(vec *v) {
    void *np = realloc(v->p, (v->n ? v->n : 1) * v->size);
    return np ? np : v->p;
}

void mf_sft_free(mf_sft_data *d) {
    free(d->ids);
    free(d->mask);
    free(d->off);
    free(d->row);
    memset(d, 0, sizeof *d);
}

static int only_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* One line into ids/mask; 1 = bad line (message in mf_error), -1 = out of memory. */
static int add_line(const char *line, size_t len, long lineno, const mf_tokenizer *tok, mf_chat_template tpl,
                    const mf_sft_opts *o, int64_t max_id, vec *ids, vec *mask, vec *off, int *too_long,
                    int64_t *pieces) {
    mf_chat c;
    *too_long = 0;
    if (mf_chat_parse_line(line, len, lineno, &c)) return 1;
    mf_chat_rendered r;
    int rc = mf_chat_render(tpl, &c, &r);
    mf_chat_free(&c);
    if (rc) return 1;
    int32_t *ti = NULL;
    uint8_t *tm = NULL;
    size_t n = 0;
    rc = mf_chat_tokenize(tok, &r, &ti, &tm, &n);
    mf_chat_rendered_free(&r);
    if (rc) {
        mf_fail("line %ld: %s", lineno, mf_error());
        return 1;
    }
    int bad = 0;
    if (n < 2) {
        bad = 1;
        mf_fail("line %ld: the conversation is %zu tokens, fewer than 2", lineno, n);
    } else if ((int64_t)n - 1 > o->T && o->packing) {
        *too_long = 1;
        bad = 1;
        mf_fail("line %ld: the example is %zu tokens, more than seq %d + 1 (raise --seq, or --skip_bad_lines to skip it)",
                lineno, n, o->T);
    }
    for (size_t i = 0; !bad && i < n; i++)
        if (ti[i] < 0 || ti[i] >= max_id)
            bad = 1, mf_fail("line %ld: token id %d is outside the model's vocabulary of %lld", lineno, ti[i],
                             (long long)max_id);
    /* without packing, an example longer than a row is split into pieces
     * of T + 1 ids, each piece's first id the previous piece's last (so
     * every target is predicted exactly once); a piece does not see the
     * pieces before it */
    for (size_t s = 0; !bad && s + 1 < n; s += (size_t)o->T) {
        size_t e = s + (size_t)o->T + 1 < n ? s + (size_t)o->T + 1 : n, k = e - s;
        if (vec_reserve(ids, k) || vec_reserve(mask, k) || vec_reserve(off, 1)) {
            free(ti);
            free(tm);
            return -1;
        }
        uint32_t *di = (uint32_t *)ids->p + ids->n;
        uint8_t *dm = (uint8_t *)mask->p + mask->n;
        for (size_t i = 0; i < k; i++) di[i] = (uint32_t)ti[s + i], dm[i] = o->prompt_too ? 1 : tm[s + i];
        ids->n += k;
        mask->n += k;
        ((uint64_t *)off->p)[off->n++] = ids->n;
        *pieces += 1;
    }
    free(ti);
    free(tm);
    return bad;
}

static int lay_out_rows(mf_sft_data *d) {
    vec row = {.size = sizeof(uint32_t)};
    int64_t fill = 0;
    if (vec_reserve(&row, 1)) return -1;
    ((uint32_t *)row.p)[row.n++] = 0;
    for (int64_t e = 0; e < d->n_ex; e++) {
        int64_t need = (int64_t)(d->off[e + 1] - d->off[e]) - 1;
        /* a new row when this one is not empty and the example does not
         * fit (always, without packing) */
        if (fill > 0 && (!d->o.packing || fill + need > d->o.T)) {
            if (vec_reserve(&row, 1)) { free(row.p); return -1; }
            ((uint32_t *)row.p)[row.n++] = (uint32_t)e;
            d->pad += d->o.T - fill;
            fill = 0;
        }
        fill += need;
        for (uint64_t k = d->off[e] + 1; k < d->off[e + 1]; k++) d->targets += d->mask[k];
    }
    d->pad += d->o.T - fill;
    if (vec_reserve(&row, 1)) { free(row.p); return -1; }
    ((uint32_t *)row.p)[row.n++] = (uint32_t)d->n_ex;
    d->row = vec_fit(&row);
    d->n_rows = (int64_t)row.n - 1;
    d->positions = d->n_rows * d->o.T;
    return 0;
}

int mf_sft_load(mf_sft_data *d, const char *path, const mf_tokenizer *tok, mf_chat_template tpl,
                const mf_sft_opts *o, int64_t max_id) {
    memset(d, 0, sizeof *d);
    d->o = *o;
    d->tpl = tpl;
    if (o->T < 1) return mf_fail("chat data: seq %d", o->T);
    FILE *f = fopen(path, "rb");
    if (!f) return mf_fail("cannot open %s: %s", path, strerror(errno));
    vec ids = {.size = sizeof(uint32_t)}, mask = {.size = 1}, off = {.size = sizeof(uint64_t)};
    if (vec_reserve(&off, 1)) { fclose(f); return mf_fail("out of memory reading %s", path); }
    ((uint64_t *)off.p)[off.n++] = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (lineno % 20000 == 0) fprintf(stderr, "chat data: %s: %ld lines tokenized\n", path, lineno);
        if (only_space(line, (size_t)len)) continue;
        int too_long = 0;
        int64_t pieces = 0;
        int r = add_line(line, (size_t)len, lineno, tok, tpl, o, max_id, &ids, &mask, &off, &too_long, &pieces);
        if (r == 0) d->n_conv++, d->split += pieces > 1 ? pieces - 1 : 0;
        if (r < 0) { rc = mf_fail("out of memory tokenizing %s", path); break; }
        if (r > 0 && !o->skip_bad) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mf_error());
            rc = mf_fail("%s: %s", path, msg);
            break;
        }
        if (r > 0) d->skipped++, d->skipped_long += too_long;
    }
    if (rc == 0 && ferror(f)) rc = mf_fail("cannot read %s", path);
    free(line);
    fclose(f);
    d->lines = lineno;
    d->ids = vec_fit(&ids);
    d->mask = vec_fit(&mask);
    d->off = vec_fit(&off);
    d->n_ids = (int64_t)ids.n;
    d->n_ex = (int64_t)off.n - 1;
    if (rc == 0 && d->n_conv == 0)
        rc = mf_fail("%s: no examples (%ld lines, %lld skipped)", path, lineno, (long long)d->skipped);
    if (rc == 0 && d->n_ex >= UINT32_MAX) rc = mf_fail("%s: more than 2^32 examples", path);
    if (rc == 0 && lay_out_rows(d)) rc = mf_fail("out of memory laying out %s", path);
    if (rc) {
        mf_sft_free(d);
        return -1;
    }
    d->bytes = (size_t)d->n_ids * (sizeof *d->ids + sizeof *d->mask) + (size_t)(d->n_ex + 1) * sizeof *d->off +
               (size_t)(d->n_rows + 1) * sizeof *d->row;
    return 0;
}

int mf_sft_longest(const mf_sft_data *d) {
    int64_t m = 0;
    for (int64_t e = 0; e < d->n_ex; e++)
        if ((int64_t)(d->off[e + 1] - d->off[e]) - 1 > m) m = (int64_t)(d->off[e + 1] - d->off[e]) - 1;
    return (int)m;
}

int mf_sft_relayout(mf_sft_data *d, int T) {
    if (T < mf_sft_longest(d)) return mf_fail("chat data: rows of %d positions are shorter than an example", T);
    free(d->row);
    d->row = NULL;
    d->o.T = T;
    d->pad = d->targets = 0;
    if (lay_out_rows(d)) return mf_fail("out of memory laying out the chat data");
    d->bytes = (size_t)d->n_ids * (sizeof *d->ids + sizeof *d->mask) + (size_t)(d->n_ex + 1) * sizeof *d->off +
               (size_t)(d->n_rows + 1) * sizeof *d->row;
    return 0;
}

int mf_sft_fill_row(const mf_sft_data *d, int64_t r, int32_t *in, int32_t *tg, int32_t *pos) {
    r %= d->n_rows;
    int k = 0, counted = 0, T = d->o.T;
    for (uint32_t e = d->row[r]; e < d->row[r + 1]; e++) {
        const uint32_t *id = d->ids + d->off[e];
        const uint8_t *m = d->mask + d->off[e];
        int n = (int)(d->off[e + 1] - d->off[e]) - 1;
        for (int i = 0; i < n; i++, k++) {
            in[k] = (int32_t)id[i];
            /* the example's last id predicts nothing: the next example's
             * first id is never its target (it is not a target at all) */
            tg[k] = m[i + 1] ? (int32_t)id[i + 1] : MF_TARGET_IGNORE;
            counted += m[i + 1];
            if (pos) pos[k] = i;
        }
    }
    /* padding: id 0, no target, its own positions (a document of its own,
     * so no example attends to it) */
    for (int i = 0; k < T; i++, k++) {
        in[k] = 0;
        tg[k] = MF_TARGET_IGNORE;
        if (pos) pos[k] = i;
    }
    return counted;
}

int mf_sft_row_targets(const mf_sft_data *d, int64_t r) {
    r %= d->n_rows;
    int counted = 0;
    for (uint32_t e = d->row[r]; e < d->row[r + 1]; e++)
        for (uint64_t k = d->off[e] + 1; k < d->off[e + 1]; k++) counted += d->mask[k];
    return counted;
}

int mf_chat_prompt(mf_chat_template t, const mf_chat *c, char **prompt, const char **answer, size_t *answer_len) {
    int first = -1;
    for (int i = 0; i < c->n && first < 0; i++)
        if (c->msgs[i].role == MF_CHAT_ASSISTANT) first = i;
    if (first < 0) return mf_fail("line %ld: no assistant turn", c->line);
    mf_chat_rendered r;
    if (mf_chat_render(t, c, &r)) return -1;
    if (r.n_spans < 1) {
        mf_chat_rendered_free(&r);
        return mf_fail("line %ld: no loss span", c->line);
    }
    size_t n = r.spans[0].begin;
    *prompt = malloc(n + 1);
    if (!*prompt) {
        mf_chat_rendered_free(&r);
        return mf_fail("out of memory");
    }
    memcpy(*prompt, r.text, n);
    (*prompt)[n] = 0;
    mf_chat_rendered_free(&r);
    *answer = c->msgs[first].content;
    *answer_len = c->msgs[first].len;
    return 0;
}
