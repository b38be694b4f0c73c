/* Chat data (--data FILE.jsonl): packing and micro-batching change no maths.
 *   - A packed row (several examples, positions restarting per example,
 *     attention kept inside each: --packing on) gives the same loss and
 *     gradients as its examples run one by one, each as its own plain
 *     causal sequence of its own length (no document mask, positions
 *     0..n-2), normalised by the same count of targets; for GPT-2 (learned
 *     positions) and a Llama (RoPE, GQA). Within fp32 round-off (1e-4
 *     relative, 1e-6 absolute): the sums run in another order.
 *   - A step of 4 rows run as one micro-batch, and the same 4 rows split
 *     by the run-time guard into micro-batches of 2 (batch 2 planned) or 1,
 *     give the same loss and gradients: every micro-batch divides by the
 *     whole step's count of targets, not its own (rows hold different
 *     counts, so a per-micro-batch mean would differ).
 *   - Packing off puts one example per row, and splits an example longer
 *     than a row into pieces without losing or repeating a target;
 *     without --seq the rows are as long as the longest example (rounded
 *     up to 8); prompt_too counts every target. */
#include "memfit/train.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char jsonl[64];

static void write_data(void) {
    snprintf(jsonl, sizeof jsonl, "/tmp/memfit-sft-pack-%d.jsonl", (int)getpid());
    FILE *f = fopen(jsonl, "w");
    if (!f) return;
    const char *q[] = {"x", "ab", "Ohio?", "Maine", "What is the capital of Texas?", "Is it?", "Columbus", "zz top"};
    const char *a[] = {"y", "cd", "Columbus", "Augusta, on the Kennebec", "Austin", "no", "Ohio", "la grange"};
    for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", q[i], a[i]);
    fclose(f);
}

static void set_common(mf_config *c, const char *model, const char *batch, const char *packing) {
    mf_config_defaults(c);
    const char *kv[][2] = {{"model", model}, {"tokenizer", "bytes"}, {"chat_template", "chatml"}, {"seq", "128"},
                           {"batch", batch}, {"sample_tokens", "0"}, {"threads", "2"}, {"loss_chunk", "50"},
                           {"packing", packing}, {"n_layer", "2"}, {"block_size", "128"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    mf_config_set(c, "data", jsonl);
}

static float *grads_copy(mf_trainer *t, size_t *n) {
    size_t total = 0;
    for (int i = 0; i < t->model.n_tensors; i++) total += (size_t)t->model.tensors[i].numel;
    float *out = malloc(total * sizeof *out), *p = out;
    for (int i = 0; out && i < t->model.n_tensors; i++) {
        memcpy(p, mf_arena_ptr(&t->arena, t->model.tensors[i].g), (size_t)t->model.tensors[i].numel * sizeof *p);
        p += t->model.tensors[i].numel;
    }
    *n = total;
    return out;
}

static void packed_vs_one_by_one(const char *model) {
    printf("== packed row vs its examples one by one: %s\n", model);
    mf_config c;
    set_common(&c, model, "1", "on");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    const mf_sft_data *d = &t.sft;
    int T = t.T, e0 = (int)d->row[0], e1 = (int)d->row[1];
    CHECK(e1 - e0 >= 2, "row 0 packs %d examples (want >= 2)", e1 - e0);
    /* packed: row 0 as the trainer loads it */
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    int32_t *in = mf_arena_get(&t.arena, t.model.inputs), *tg = mf_arena_get(&t.arena, t.model.targets);
    int32_t *pos = mf_arena_get(&t.arena, t.model.pos);
    int counted = mf_sft_fill_row(d, 0, in, tg, pos);
    CHECK(counted == mf_sft_row_targets(d, 0), "fill_row and row_targets agree");
    double lp = mf_model_forward(&t.model, &t.arena, 1, T, 1, 1.0f / (float)counted);
    mf_model_backward(&t.model, &t.arena, 1, T);
    size_t n;
    float *gp = grads_copy(&t, &n);
    /* one by one: example e alone, a plain sequence of n-1 positions */
    double lsum = 0;
    int c1 = 0;
    for (int e = e0; e < e1; e++) {
        int ne = (int)(d->off[e + 1] - d->off[e]) - 1, ce = 0;
        mf_arena_step(&t.arena);
        if (e == e0) mf_model_zero_grads(&t.model, &t.arena);
        in = mf_arena_get(&t.arena, t.model.inputs), tg = mf_arena_get(&t.arena, t.model.targets);
        pos = mf_arena_get(&t.arena, t.model.pos);
        const uint32_t *id = d->ids + d->off[e];
        const uint8_t *m = d->mask + d->off[e];
        for (int i = 0; i < ne; i++) {
            in[i] = (int32_t)id[i];
            tg[i] = m[i + 1] ? (int32_t)id[i + 1] : MF_TARGET_IGNORE;
            pos[i] = i; /* one document: the plain causal mask */
            ce += m[i + 1];
        }
        double le = mf_model_forward(&t.model, &t.arena, 1, ne, 1, 1.0f / (float)counted);
        mf_model_backward(&t.model, &t.arena, 1, ne);
        lsum += le * ce;
        c1 += ce;
    }
    CHECK(c1 == counted, "targets one by one %d, packed %d", c1, counted);
    float *g1 = grads_copy(&t, &n);
    CHECK(mf_close(lp, lsum / c1, 1e-5, 0), "loss packed %.9g one by one %.9g", lp, lsum / c1);
    if (gp && g1) mf_test_compare("gradients packed vs one by one", gp, g1, n, 1e-4, 1e-6);
    printf("%d examples in a row of %d: loss packed %.7f, one by one %.7f\n", e1 - e0, T, lp, lsum / c1);
    free(gp);
    free(g1);
    mf_trainer_free(&t);
}

/* rows 0..3 of the store through mf_trainer_accumulate, planned for
 * `batch` rows at a time */
static float *step_grads(const char *model, const char *batch, double *loss, int *micro, size_t *n) {
    mf_config c;
    set_common(&c, model, batch, "on");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return NULL; }
    CHECK(t.sft.n_rows >= 4, "4 rows of data (%lld)", (long long)t.sft.n_rows);
    *micro = mf_trainer_accumulate(&t, 4, t.T, 1.0f, loss);
    CHECK(*micro > 0, "%s", mf_error());
    float *g = grads_copy(&t, n);
    mf_trainer_free(&t);
    return g;
}

static void micro_batches_match(const char *model) {
    printf("== 4 rows in 1, 2 and 4 micro-batches: %s\n", model);
    double l4, l2, l1;
    int m4, m2, m1;
    size_t n4 = 0, n2 = 0, n1 = 0;
    float *g4 = step_grads(model, "4", &l4, &m4, &n4), *g2 = step_grads(model, "2", &l2, &m2, &n2),
          *g1 = step_grads(model, "1", &l1, &m1, &n1);
    CHECK(m4 == 1 && m2 == 2 && m1 == 4, "micro-batches %d %d %d", m4, m2, m1);
    CHECK(mf_close(l2, l4, 1e-6, 0) && mf_close(l1, l4, 1e-6, 0), "loss %.9g %.9g %.9g", l4, l2, l1);
    if (g4 && g2 && n2 == n4) mf_test_compare("gradients 2 micro-batches vs 1", g2, g4, n4, 1e-5, 1e-7);
    if (g4 && g1 && n1 == n4) mf_test_compare("gradients 4 micro-batches vs 1", g1, g4, n4, 1e-5, 1e-7);
    printf("loss %.7f (1 micro-batch) %.7f (2) %.7f (4)\n", l4, l2, l1);
    free(g4);
    free(g2);
    free(g1);
}

static void layouts(void) {
    printf("== packing off, prompt_too\n");
    mf_config c;
    set_common(&c, "gpt2-1m", "1", "off");
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    CHECK(t.sft.n_rows == t.sft.n_ex && t.model.pos < 0, "packing off: %lld rows for %lld examples, pos row %d",
          (long long)t.sft.n_rows, (long long)t.sft.n_ex, t.model.pos);
    /* padding: every position not an example's input */
    CHECK(t.sft.pad == t.sft.positions - (t.sft.n_ids - t.sft.n_ex), "padding %lld", (long long)t.sft.pad);
    int64_t whole = t.sft.targets;
    mf_trainer_free(&t);
    /* packing off, rows shorter than the examples: each is split into
     * pieces that overlap by one id, so every target counts exactly once */
    set_common(&c, "gpt2-1m", "1", "off");
    mf_config_set(&c, "seq", "32");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    CHECK(t.sft.split > 0 && t.sft.targets == whole && t.sft.n_conv == 8,
          "split: %lld extra pieces, %lld targets (unsplit %lld), %lld conversations", (long long)t.sft.split,
          (long long)t.sft.targets, (long long)whole, (long long)t.sft.n_conv);
    mf_trainer_free(&t);
    /* packing off and no --seq: the plan is for the longest example (a
     * multiple of 8), not for block_size */
    mf_config_defaults(&c);
    const char *kv[][2] = {{"model", "gpt2-1m"}, {"tokenizer", "bytes"}, {"chat_template", "chatml"},
                           {"batch", "1"}, {"sample_tokens", "0"}, {"threads", "2"}, {"packing", "off"},
                           {"n_layer", "2"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) mf_config_set(&c, kv[i][0], kv[i][1]);
    mf_config_set(&c, "data", jsonl);
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    int longest = mf_sft_longest(&t.sft);
    CHECK(t.T == (longest + 7) / 8 * 8 && t.T < t.d.maxT && t.model.T == t.T && t.sft.o.T == t.T,
          "seq unset: rows of %d (model %d, store %d) for a longest example of %d (block %d)", t.T, t.model.T,
          t.sft.o.T, longest, t.d.maxT);
    mf_trainer_free(&t);
    set_common(&c, "gpt2-1m", "1", "on");
    mf_config_set(&c, "train_on", "prompt_too");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    /* every example's ids but its first are targets that count */
    CHECK(t.sft.targets == t.sft.n_ids - t.sft.n_ex, "prompt_too: %lld targets of %lld ids, %lld examples",
          (long long)t.sft.targets, (long long)t.sft.n_ids, (long long)t.sft.n_ex);
    mf_trainer_free(&t);
}

int main(void) {
    write_data();
    packed_vs_one_by_one("gpt2-1m");
    packed_vs_one_by_one("llama-tiny");
    micro_batches_match("llama-tiny");
    layouts();
    unlink(jsonl);
    return mf_test_done("test_sft_packing_matches");
}
