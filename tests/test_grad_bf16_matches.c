/* --grad_dtype bf16: the 16-bit weights' gradient rows are bf16. For
 * AdamW, 8-bit AdamW and SGD, with fp32 master weights and without (and
 * with pure_bf16), the plain step and update_in_backward give the same
 * losses and bitwise the same weights (the tied embedding's rows are
 * rounded the same way on both paths); every plan's ledger matches it to
 * the byte; the grads category is smaller than with fp32 gradients; the
 * losses stay near the fp32-gradient run's; recompute full and grad_accum
 * 2 plan exactly too; and what is not supported is refused in one line. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

#define STEPS 5

typedef struct { unsigned char *w; size_t n; double loss[STEPS]; size_t peak, grads; } run;

typedef struct { const char *opt; int master, pure; } setting;

static int train(const char *data, const setting *s, const char *gdt, const char *mode, run *r) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", "bf16");
    mf_config_set(&c, "grad_dtype", gdt);
    mf_config_set(&c, "master_weights", s->master ? "1" : "0");
    mf_config_set(&c, "pure_bf16", s->pure ? "1" : "0");
    mf_config_set(&c, "optimizer", s->opt);
    mf_config_set(&c, "momentum", strcmp(s->opt, "sgd") == 0 ? "0.9" : "0");
    mf_config_set(&c, "grad_clip", "0");
    if (strcmp(mode, "uib") == 0) mf_config_set(&c, "update_in_backward", "1");
    if (strcmp(mode, "full_accum") == 0) mf_config_set(&c, "recompute", "full"), mf_config_set(&c, "grad_accum", "2");
    memset(r, 0, sizeof *r);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) {
        CHECK(0, "%s %s %s: %s", s->opt, gdt, mode, mf_error());
        return -1;
    }
    tu_steps(&t, 0, STEPS, r->loss);
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "%s master %d %s %s: ledger %zu != plan %zu", s->opt, s->master,
          gdt, mode, t.ledger.peak_total, t.plan.peak_bytes);
    for (int k = 0; k < MF_CAT_COUNT; k++)
        CHECK(t.ledger.at_peak[k] == t.plan.peak_cat[k], "%s %s %s: %s ledger %zu != plan %zu", s->opt, gdt, mode,
              mf_cat_name((mf_cat)k), t.ledger.at_peak[k], t.plan.peak_cat[k]);
    r->peak = t.plan.peak_bytes;
    r->grads = t.plan.max_cat[MF_CAT_GRADS];
    /* the 16-bit weights' gradient rows are bf16 exactly when asked */
    int g16 = strcmp(gdt, "bf16") == 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        if (x->g < 0) continue;
        mf_dtype want = g16 && mf_tensor_is16(&t.model, x) ? MF_DTYPE_BF16 : MF_DTYPE_F32;
        CHECK(t.plan.bufs[x->g].dtype == want, "%s: grad row %s has dtype %d", gdt, t.plan.bufs[x->g].name,
              (int)t.plan.bufs[x->g].dtype);
    }
    /* the weights as stored (compute copies and, with them, the masters) */
    size_t bytes = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        bytes += t.plan.bufs[t.model.tensors[i].p].bytes;
        if (t.model.tensors[i].mw >= 0) bytes += t.plan.bufs[t.model.tensors[i].mw].bytes;
    }
    r->w = malloc(bytes);
    r->n = bytes;
    unsigned char *p = r->w;
    for (int i = 0; i < t.model.n_tensors; i++) {
        int ids[2] = {t.model.tensors[i].p, t.model.tensors[i].mw};
        for (int k = 0; k < 2; k++) {
            if (ids[k] < 0) continue;
            memcpy(p, mf_arena_ptr(&t.arena, ids[k]), t.plan.bufs[ids[k]].bytes);
            p += t.plan.bufs[ids[k]].bytes;
        }
    }
    mf_trainer_free(&t);
    return 0;
}

static void compare(const char *data, const setting *s) {
    run f32, base, uib, acc;
    if (train(data, s, "fp32", "plain", &f32) || train(data, s, "bf16", "plain", &base) ||
        train(data, s, "bf16", "uib", &uib) || train(data, s, "bf16", "full_accum", &acc))
        goto done;
    size_t diff = 0;
    for (size_t i = 0; i < base.n && base.n == uib.n; i++) diff += base.w[i] != uib.w[i];
    CHECK(base.n == uib.n && diff == 0, "%s master %d: %zu of %zu weight bytes differ plain / update_in_backward",
          s->opt, s->master, diff, base.n);
    double gap = 0;
    for (int i = 0; i < STEPS; i++) {
        CHECK(base.loss[i] == uib.loss[i], "%s master %d step %d: loss %.17g vs %.17g", s->opt, s->master, i + 1,
              base.loss[i], uib.loss[i]);
        double g = fabs(base.loss[i] - f32.loss[i]) / f32.loss[i];
        if (g > gap) gap = g;
    }
    CHECK(gap < 0.01, "%s master %d: bf16 gradients' losses %.3g%% away from fp32 gradients'", s->opt, s->master,
          100 * gap);
    CHECK(base.grads < f32.grads, "%s master %d: grads %zu bytes, fp32 gradients %zu", s->opt, s->master, base.grads,
          f32.grads);
    printf("%-9s master_weights %d%s: plain == update_in_backward (%d losses, %zu weight bytes); grads %zu -> %zu "
           "bytes; loss gap to fp32 gradients <= %.4f%%\n",
           s->opt, s->master, s->pure ? " pure_bf16" : "", STEPS, base.n, f32.grads, base.grads, 100 * gap);
done:
    free(f32.w), free(base.w), free(uib.w), free(acc.w);
}

static void refused(const char *data, const char *key, const char *val, const char *key2, const char *val2,
                    const char *needle) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", "bf16");
    mf_config_set(&c, "grad_dtype", "bf16");
    if (key) mf_config_set(&c, key, val);
    if (key2) mf_config_set(&c, key2, val2);
    mf_trainer t;
    int rc = mf_trainer_init(&t, &c, MF_MODE_TRAIN);
    CHECK(rc != 0 && strstr(mf_error(), "grad_dtype") && strstr(mf_error(), needle) && !strchr(mf_error(), '\n'),
          "grad_dtype bf16 with %s %s: %s", key, val, rc ? mf_error() : "accepted");
    if (rc == 0) mf_trainer_free(&t);
}

int main(void) {
    char data[64], path[96];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 5) == 0, "token file: %s", mf_error());
    static const setting set[] = {{"adamw", 1, 0}, {"adamw8bit", 1, 0}, {"sgd", 1, 0},  {"adamw", 0, 0},
                                  {"adamw8bit", 0, 0}, {"sgd", 0, 0},   {"adamw", 0, 1}};
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) compare(data, &set[k]);
    refused(data, "precision", "fp32", NULL, NULL, "precision bf16");
    refused(data, "precision", "fp16", NULL, NULL, "precision bf16");
    refused(data, "optimizer", "adafactor", NULL, NULL, "adafactor");
    snprintf(path, sizeof path, "optimizer=disk:%s.state", data);
    refused(data, "offload", path, NULL, NULL, "offload");
    refused(data, "share_layers", "1", "n_layer", "2", "share_layers");
    mf_config c;
    mf_config_defaults(&c);
    CHECK(mf_config_set(&c, "grad_dtype", "fp16") != 0 && strstr(mf_error(), "grad_dtype"), "grad_dtype fp16: %s",
          mf_error());
    snprintf(path, sizeof path, "%s.state", data);
    unlink(path);
    unlink(data);
    return mf_test_done("test_grad_bf16_matches");
}
