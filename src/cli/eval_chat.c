/* memfit eval-chat --init WEIGHTS --data FILE.jsonl [train's keys]: for
 * every conversation, the text up to its first assistant turn (rendered
 * with the run's chat template) is continued greedily (temperature 0) for
 * sample_tokens tokens; the answer is what precedes the template's
 * end-of-turn marker, stripped of ASCII white space. Prints each miss, then
 * the exact-match rate against the first assistant turn, and the unit error
 * rate: the edit distance (Levenshtein) between the answer's and the
 * reference's space-separated units, summed, over the reference's units
 * (for cmudict pronunciations that is the phoneme error rate). */
#include "eval_chat.h"

#include "memfit/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *end_marker(mf_chat_template t) {
    switch (t) {
    case MF_CHAT_LLAMA3: return "<|eot_id|>";
    case MF_CHAT_LLAMA2: return "</s>";
    default: return "<|im_end|>";
    }
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void strip(const char **s, size_t *n) {
    while (*n && is_space(**s)) (*s)++, (*n)--;
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

/* space-separated units of s[0..n): starts and lengths (at most cap) */
static int units(const char *s, size_t n, const char **u, int *ul, int cap) {
    int k = 0;
    for (size_t i = 0; i < n && k < cap;) {
        while (i < n && is_space(s[i])) i++;
        if (i >= n) break;
        size_t j = i;
        while (j < n && !is_space(s[j])) j++;
        u[k] = s + i, ul[k] = (int)(j - i), k++;
        i = j;
    }
    return k;
}

/* Levenshtein distance between two unit sequences */
static int edits(const char *a, size_t na, const char *b, size_t nb, int *nref) {
    enum { CAP = 256 };
    const char *ua[CAP], *ub[CAP];
    int la[CAP], lb[CAP];
    int m = units(a, na, ua, la, CAP), n = units(b, nb, ub, lb, CAP);
    *nref = n;
    int prev[CAP + 1], cur[CAP + 1];
    for (int j = 0; j <= n; j++) prev[j] = j;
    for (int i = 1; i <= m; i++) {
        cur[0] = i;
        for (int j = 1; j <= n; j++) {
            int same = la[i - 1] == lb[j - 1] && memcmp(ua[i - 1], ub[j - 1], (size_t)la[i - 1]) == 0;
            int v = prev[j - 1] + !same;
            if (prev[j] + 1 < v) v = prev[j] + 1;
            if (cur[j - 1] + 1 < v) v = cur[j - 1] + 1;
            cur[j] = v;
        }
        memcpy(prev, cur, sizeof(int) * (size_t)(n + 1));
    }
    return prev[n];
}

int mf_cli_eval_chat(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: memfit eval-chat --init MODEL.safetensors|HF_DIR --data FILE.jsonl [--chat_template NAME]\n"
                   "       [--model PRESET ...] [--sample_tokens N]\n"
                   "  Answers every conversation's first user turn greedily and prints the exact-match rate and the\n"
                   "  error rate of space-separated units (phonemes, for a pronunciation dictionary).\n\n");
            mf_config_print_help(stdout);
            return 0;
        }
    mf_config cfg;
    mf_config_defaults(&cfg);
    char *pos[4];
    int npos = mf_config_parse_args(&cfg, argc, argv, pos, 4);
    if (npos < 0) { fprintf(stderr, "memfit: error: %s\n", mf_error()); return 1; }
    if (npos) { fprintf(stderr, "memfit: error: unexpected argument '%s'\n", pos[0]); return 1; }
    if (!cfg.init[0]) { fprintf(stderr, "memfit: error: give the weights with --init\n"); return 1; }
    if (!mf_config_is_chat(&cfg)) { fprintf(stderr, "memfit: error: --data must be a .jsonl chat file\n"); return 1; }
    if (!mf_config_was_set(&cfg, "batch")) cfg.batch = 1;
    if (!mf_config_was_set(&cfg, "sample_tokens")) cfg.sample_tokens = 32;
    cfg.temperature = 0;
    mf_trainer t;
    if (mf_trainer_init(&t, &cfg, MF_MODE_INFER)) { fprintf(stderr, "memfit: error: %s\n", mf_error()); return 1; }
    FILE *f = fopen(cfg.data, "rb");
    if (!f) { fprintf(stderr, "memfit: error: cannot open %s\n", cfg.data); mf_trainer_free(&t); return 1; }
    const char *marker = end_marker(t.sft.tpl);
    char *line = NULL, *gen = NULL;
    size_t cap = 0, glen = 0;
    ssize_t len;
    long lineno = 0, n = 0, exact = 0, errs = 0, refs = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        mf_chat c;
        if (mf_chat_parse_line(line, (size_t)len, lineno, &c)) continue; /* training skipped or refused it */
        char *prompt = NULL;
        const char *ans;
        size_t alen;
        if (mf_chat_prompt(t.sft.tpl, &c, &prompt, &ans, &alen)) { mf_chat_free(&c); continue; }
        FILE *ms = open_memstream(&gen, &glen);
        if (!ms || mf_trainer_sample(&t, prompt, cfg.sample_tokens, ms)) {
            rc = 1;
            fprintf(stderr, "memfit: error: %s\n", ms ? mf_error() : "out of memory");
            if (ms) fclose(ms);
            free(prompt);
            mf_chat_free(&c);
            break;
        }
        fclose(ms);
        size_t pl = strlen(prompt);
        const char *got = glen >= pl ? gen + pl : gen;
        size_t gl = glen >= pl ? glen - pl : 0;
        const char *end = memmem(got, gl, marker, strlen(marker));
        if (end) gl = (size_t)(end - got);
        strip(&got, &gl);
        strip(&ans, &alen);
        int ok = gl == alen && memcmp(got, ans, gl) == 0, nr = 0;
        errs += edits(got, gl, ans, alen, &nr);
        refs += nr;
        exact += ok;
        n++;
        if (!ok) printf("line %ld: want \"%.*s\", got \"%.*s\"%s\n", lineno, (int)alen, ans, (int)gl, got,
                        end ? "" : " (no end-of-turn)");
        free(prompt);
        free(gen);
        gen = NULL;
        mf_chat_free(&c);
    }
    free(line);
    fclose(f);
    if (rc == 0)
        printf("eval-chat: %s: exact match %ld/%ld (%.1f%%); unit error rate %ld/%ld (%.2f%%)\n", cfg.data, exact, n,
               n ? 100.0 * exact / n : 0.0, errs, refs, refs ? 100.0 * errs / refs : 0.0);
    mf_trainer_free(&t);
    return rc;
}
