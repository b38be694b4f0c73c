/* --master_weights 0 (bf16 weights, no fp32 copy, stochastic rounding)
 * gives the same losses and bitwise the same bf16 weights whether each
 * tensor is updated at the optimizer step, in backward as its gradient
 * completes (--update_in_backward), or in chunks streamed from disk
 * (--offload, a window small enough that tensors span several chunks):
 * the rounding bits are keyed by (seed, step, tensor, element), so the
 * slicing changes nothing. Each plan has no master rows, the ledger matches
 * the plan, and update_in_backward's plan is smaller. The same with
 * --pure_bf16 (AdamW's moments bf16 as well, half the fp32 state bytes). */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#define STEPS 5

typedef struct { uint16_t *w; size_t n; double loss[STEPS]; size_t peak, master, optim; } run;

static int pure = 0;

static void train(const char *data, const char *opt, const char *mode, run *r) {
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", "bf16");
    mf_config_set(&c, "master_weights", "0");
    mf_config_set(&c, "optimizer", opt);
    mf_config_set(&c, "momentum", strcmp(opt, "sgd") == 0 ? "0.9" : "0");
    mf_config_set(&c, "grad_clip", "0");
    mf_config_set(&c, "pure_bf16", pure ? "1" : "0");
    char off[96];
    snprintf(off, sizeof off, "optimizer=disk:%s.state", data);
    if (strcmp(mode, "uib") == 0) mf_config_set(&c, "update_in_backward", "1");
    if (strcmp(mode, "offload") == 0) mf_config_set(&c, "offload", off), mf_config_set(&c, "offload_window", "16KiB");
    memset(r, 0, sizeof *r);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s %s: %s", opt, mode, mf_error()); return; }
    tu_steps(&t, 0, STEPS, r->loss);
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "%s %s: ledger %zu != plan %zu", opt, mode, t.ledger.peak_total,
          t.plan.peak_bytes);
    r->peak = t.plan.peak_bytes;
    r->master = t.plan.max_cat[MF_CAT_MASTER];
    r->optim = t.plan.max_cat[MF_CAT_OPTIM];
    /* the weights as stored: bf16 for the 2-D tensors, fp32 for the rest */
    size_t bytes = 0;
    for (int i = 0; i < t.model.n_tensors; i++) bytes += t.plan.bufs[t.model.tensors[i].p].bytes;
    r->w = malloc(bytes);
    r->n = bytes / 2;
    unsigned char *p = (unsigned char *)r->w;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_buf *b = &t.plan.bufs[t.model.tensors[i].p];
        memcpy(p, mf_arena_ptr(&t.arena, t.model.tensors[i].p), b->bytes);
        p += b->bytes;
    }
    mf_trainer_free(&t);
}

static void compare(const char *data, const char *opt) {
    run base, uib, off;
    train(data, opt, "plain", &base);
    train(data, opt, "uib", &uib);
    train(data, opt, "offload", &off);
    if (!base.w || !uib.w || !off.w) { CHECK(0, "%s: runs failed", opt); goto done; }
    run *o[2] = {&uib, &off};
    const char *nm[2] = {"update_in_backward", "offload"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < STEPS; i++)
            CHECK(base.loss[i] == o[k]->loss[i], "%s %s step %d: loss %.17g vs %.17g", opt, nm[k], i + 1,
                  base.loss[i], o[k]->loss[i]);
        size_t diff = 0;
        for (size_t i = 0; i < base.n && base.n == o[k]->n; i++) diff += base.w[i] != o[k]->w[i];
        CHECK(base.n == o[k]->n && diff == 0, "%s %s: %zu of %zu weight halves differ", opt, nm[k], diff, base.n);
        CHECK(o[k]->master == 0, "%s %s: %zu master bytes planned", opt, nm[k], o[k]->master);
    }
    CHECK(base.master == 0, "%s: %zu master bytes planned", opt, base.master);
    /* (pure_bf16 on this tiny model: the three-slice update row, alive from
     * the head on, outweighs the gradients update_in_backward drops) */
    CHECK(pure || uib.peak < base.peak, "%s: update_in_backward planned %zu bytes, plain %zu", opt, uib.peak, base.peak);
    printf("%-9s master_weights 0%s: %d losses and %zu weight halves identical plain / update_in_backward / offload; "
           "plan %zu -> %zu bytes in backward\n", opt, pure ? ", pure_bf16" : "", STEPS, base.n, base.peak, uib.peak);
done:
    free(base.w);
    free(uib.w);
    free(off.w);
}

int main(void) {
    char data[64], path[96];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 5) == 0, "token file: %s", mf_error());
    compare(data, "adamw");
    compare(data, "adamw8bit");
    compare(data, "sgd");
    /* pure_bf16: the state of the 16-bit weights halves (biases, norms and
     * wpe keep fp32 moments), and the slicing still changes nothing */
    run fp, pb;
    train(data, "adamw", "plain", &fp);
    pure = 1;
    compare(data, "adamw");
    train(data, "adamw", "plain", &pb);
    pure = 0;
    CHECK(pb.optim < fp.optim && pb.optim > fp.optim / 2, "pure_bf16: optimizer state %zu bytes, fp32 moments %zu",
          pb.optim, fp.optim);
    free(fp.w);
    free(pb.w);
    /* pure_bf16 refuses what it cannot do, naming the setting */
    {
        mf_config c;
        tu_tiny_config(&c, data);
        mf_config_set(&c, "precision", "bf16");
        mf_config_set(&c, "pure_bf16", "1");
        mf_trainer t;
        CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "master_weights 0"),
              "pure_bf16 with master weights accepted: %s", mf_error());
        mf_config_set(&c, "master_weights", "0");
        mf_config_set(&c, "optimizer", "adamw8bit");
        CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "optimizer adamw"),
              "pure_bf16 with adamw8bit accepted: %s", mf_error());
    }
    /* adafactor updates in backward (whole tensors) but cannot offload */
    mf_config c;
    tu_tiny_config(&c, data);
    mf_config_set(&c, "precision", "bf16");
    mf_config_set(&c, "master_weights", "0");
    mf_config_set(&c, "optimizer", "adafactor");
    snprintf(path, sizeof path, "optimizer=disk:%s.state", data);
    mf_config_set(&c, "offload", path);
    mf_trainer t;
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "adafactor"), "adafactor offload: %s",
          mf_error());
    snprintf(path, sizeof path, "%s.state", data);
    unlink(path);
    unlink(data);
    return mf_test_done("test_master_free_matches");
}
