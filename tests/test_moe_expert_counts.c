/* Tokens per expert per layer (the routing's imbalance) as memfit reports
 * them, against the routing's own decisions:
 *  - in process, moe-tiny with a capacity factor 0.75 (so drops happen and
 *    the counts are the routing's, before drops): after each of 3 steps, a
 *    training forward's model.moe_tokens equals the count of every layer's
 *    kept topk_idx row (the router's choices), read while it is alive;
 *    each layer's counts sum to tokens x top-k;
 *    an evaluation forward leaves them alone;
 *  - memfit train --metrics --report: every metrics line's moe_tokens is
 *    L arrays of E counts summing to tokens x top-k, and the report's
 *    tokens-per-expert table holds the last line's numbers and an aux-loss
 *    series with the lines' moe_aux values;
 *  - memfit profile prints the table, each layer's counts summing to
 *    tokens x top-k. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <cjson/cJSON.h>
#include <string.h>

#define B_ 4
#define T_ 32

static void config(mf_config *c, const char *tok) {
    mf_config_defaults(c);
    const char *kv[][2] = {{"model", "moe-tiny"}, {"seq", "32"}, {"batch", "4"}, {"tokenizer", "bytes"},
                           {"capacity_factor", "0.75"}, {"val_fraction", "0"}, {"sample_tokens", "0"},
                           {"steps", "3"}, {"threads", "2"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    mf_config_set(c, "data", tok);
}

static void in_process(const char *tok) {
    mf_config c;
    config(&c, tok);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    const mf_model *m = &t.model;
    int L = m->d.L, E = m->d.n_experts, k = m->d.top_k;
    CHECK(m->moe_tokens != NULL, "no token counts");
    int64_t *want = calloc((size_t)L * E, sizeof *want), dropped = 0;
    for (int s = 0; s < 3 && want && m->moe_tokens; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        dropped += m->moe_dropped;
        /* a training forward on the next batch, read while its routing rows
         * are alive (the arena poisons dead rows in debug builds) */
        mf_arena_step(&t.arena);
        mf_trainer_load_batch(&t);
        mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
        memset(want, 0, (size_t)L * E * sizeof *want);
        for (int l = 0; l < L; l++) {
            const int32_t *idx = mf_arena_get(&t.arena, m->acts[l].moe[MF_MOE_BUF_TOPK_IDX]);
            int64_t sum = 0;
            for (int i = 0; i < B_ * T_ * k; i++)
                if (idx[i] >= 0 && idx[i] < E) want[(size_t)l * E + idx[i]]++;
            for (int e = 0; e < E; e++) {
                CHECK(m->moe_tokens[(size_t)l * E + e] == want[(size_t)l * E + e],
                      "step %d layer %d expert %d: reported %lld, routed %lld", s, l, e,
                      (long long)m->moe_tokens[(size_t)l * E + e], (long long)want[(size_t)l * E + e]);
                sum += m->moe_tokens[(size_t)l * E + e];
            }
            CHECK(sum == (int64_t)B_ * T_ * k, "layer %d: %lld slots, expected %d", l, (long long)sum, B_ * T_ * k);
            if (s == 2) {
                printf("step 3 layer %d:", l);
                for (int e = 0; e < E; e++) printf(" %lld", (long long)m->moe_tokens[(size_t)l * E + e]);
                printf("\n");
            }
        }
    }
    CHECK(dropped > 0, "capacity 0.75 dropped nothing");
    /* an evaluation forward (no gradient) does not replace the step's counts */
    if (want) {
        mf_arena_step(&t.arena);
        mf_trainer_load_batch(&t);
        mf_model_forward(&t.model, &t.arena, B_, T_, 1, 0.0f);
        CHECK(memcmp(want, m->moe_tokens, (size_t)L * E * sizeof *want) == 0, "an evaluation forward changed the counts");
    }
    free(want);
    mf_trainer_free(&t);
}

static void command_line(const char *tok) {
    const char *bin = getenv("MEMFIT_BIN");
    char dir[] = "/tmp/memfit-moe-counts-XXXXXX", cmd[2048], p[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    const char *args = "--model moe-tiny --seq 32 --batch 4 --tokenizer bytes --capacity_factor 0.75 --val_fraction 0 "
                       "--sample_tokens 0 --threads 2 --progress 0";
    snprintf(cmd, sizeof cmd, "%s train %s --data %s --steps 4 --metrics %s/m.jsonl --report %s/rep >%s/train.log 2>&1",
             bin ? bin : "./memfit", args, tok, dir, dir, dir);
    CHECK(system(cmd) == 0, "failed: %s", cmd);
    snprintf(p, sizeof p, "%s/m.jsonl", dir);
    FILE *f = fopen(p, "r");
    char line[8192];
    cJSON *last = NULL;
    int n = 0;
    double aux[8];
    while (f && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line), *tk = j ? cJSON_GetObjectItem(j, "moe_tokens") : NULL, *row, *x;
        CHECK(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == 2, "metrics line %d: moe_tokens missing or not 2 layers", n);
        cJSON_ArrayForEach(row, tk) {
            double sum = 0;
            CHECK(cJSON_GetArraySize(row) == 4, "metrics line %d: not 4 experts", n);
            cJSON_ArrayForEach(x, row) sum += x->valuedouble;
            CHECK(sum == B_ * T_ * 2, "metrics line %d: a layer's counts sum to %g, expected %d", n, sum, B_ * T_ * 2);
        }
        if (n < 8) aux[n] = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "moe_aux"));
        n++;
        cJSON_Delete(last);
        last = j;
    }
    if (f) fclose(f);
    CHECK(n == 4 && last, "%d metrics lines", n);
    snprintf(p, sizeof p, "%s/rep/report.html", dir);
    char *html = mf_test_read_text(p);
    CHECK(html != NULL, "no report at %s", p);
    cJSON *tk = last ? cJSON_GetObjectItem(last, "moe_tokens") : NULL;
    for (int l = 0; html && tk && l < 2; l++)
        for (int e = 0; e < 4; e++) {
            char id[64], want[96];
            snprintf(id, sizeof id, "id=\"moe-tok-%d-%d\">", l, e);
            snprintf(want, sizeof want, "%s%.0f<", id, cJSON_GetArrayItem(cJSON_GetArrayItem(tk, l), e)->valuedouble);
            CHECK(strstr(html, want) != NULL, "report: no cell %s", want);
        }
    /* the aux loss over training: the series' raw values are the lines' */
    const char *s = html ? strstr(html, "id=\"moe-aux\"") : NULL;
    const char *dv = s ? strstr(s, "data-values=\"") : NULL;
    CHECK(dv != NULL, "report: no aux-loss series");
    for (int i = 0; dv && i < n && i < 8; i++) {
        char *end;
        double v = strtod(dv + (i ? 0 : 13), &end);
        CHECK(v == aux[i], "report aux point %d: %.17g, metrics %.17g", i, v, aux[i]);
        dv = end + 1;
    }
    if (html && tk) printf("report: tokens-per-expert table and aux series equal the metrics lines' (%d steps)\n", n);
    free(html);
    cJSON_Delete(last);
    /* memfit profile's table */
    snprintf(cmd, sizeof cmd, "%s profile %s --data %s --steps 2 >%s/prof.txt 2>&1", bin ? bin : "./memfit", args, tok, dir);
    CHECK(system(cmd) == 0, "failed: %s", cmd);
    snprintf(p, sizeof p, "%s/prof.txt", dir);
    char *prof = mf_test_read_text(p);
    const char *t = prof ? strstr(prof, "tokens per expert per layer") : NULL;
    CHECK(t != NULL, "memfit profile: no tokens-per-expert table");
    for (int l = 0; t && l < 2; l++) {
        char lb[32];
        snprintf(lb, sizeof lb, "\n  layers.%d ", l);
        const char *r = strstr(t, lb);
        long long c[4] = {0};
        CHECK(r && sscanf(r + strlen(lb), "%lld %lld %lld %lld", &c[0], &c[1], &c[2], &c[3]) == 4,
              "memfit profile: no row for layer %d", l);
        CHECK(c[0] + c[1] + c[2] + c[3] == B_ * T_ * 2, "memfit profile layer %d: counts sum to %lld", l,
              c[0] + c[1] + c[2] + c[3]);
    }
    free(prof);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

int main(void) {
    char tok[64];
    CHECK(tu_make_tokens(tok, sizeof tok, 8000, 7) == 0, "token file: %s", mf_error());
    in_process(tok);
    command_line(tok);
    remove(tok);
    return mf_test_done("test_moe_expert_counts");
}
