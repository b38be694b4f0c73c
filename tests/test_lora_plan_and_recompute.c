/* LoRA on a frozen base:
 *  - the base has no gradient and no optimizer rows (categories grads and
 *    optim are empty), the adapters' weights, gradients and AdamW state are
 *    category adapter, and after training steps the base is bit-identical to
 *    its initial values while the adapters moved;
 *  - planned == ledger, to the byte in every category, for several shapes,
 *    targets, dropout on/off, accumulation, and for an inference plan;
 *  - every recompute policy (selective, every:N, sqrt, full) gives losses
 *    and adapter weights bit-identical to recompute none over 12 steps,
 *    with dropout on (the mask is a function of seed, micro-step, layer and
 *    target, so the recomputed forward draws the same mask);
 *  - the same under --precision bf16 (docs/lora.md, "16-bit compute"), for
 *    GPT-2 and llama-tiny on fp32 and NF4 bases: planned == ledger per
 *    category, the base has no master row and a bf16 compute row (fp32
 *    base) and stays bit-identical, the adapters are fp32 rows in category
 *    adapter, and recompute selective/every:N/sqrt/full give losses and
 *    weights bit-identical to none over 8 steps, with dropout on. */
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

static void lora_config(mf_config *c, const char *data, const char *lora) {
    tu_tiny_config(c, data);
    mf_config_set(c, "lr", "1e-2");
    CHECK(mf_config_set(c, "lora", lora) == 0, "lora '%s': %s", lora, mf_error());
}

/* one run: losses, a copy of all parameters, and checks on the plan */
static void run(const char *data, const char *lora, const char *policy, const char *L, const char *accum, int steps,
                double *losses, float **w, size_t *nw) {
    mf_config c;
    lora_config(&c, data, lora);
    mf_config_set(&c, "n_layer", L);
    mf_config_set(&c, "recompute", policy);
    mf_config_set(&c, "grad_accum", accum);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s %s: %s", lora, policy, mf_error()); return; }
    CHECK(t.plan.total_cat[MF_CAT_GRADS] == 0 && t.plan.total_cat[MF_CAT_OPTIM] == 0,
          "%s: the frozen base has gradient (%zu) or optimizer (%zu) bytes", lora, t.plan.total_cat[MF_CAT_GRADS],
          t.plan.total_cat[MF_CAT_OPTIM]);
    CHECK(t.plan.total_cat[MF_CAT_ADAPTER] > 0, "no adapter rows");
    int64_t trainable = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        CHECK(x->lora ? x->g >= 0 && x->st[0] >= 0 : x->g < 0 && x->st[0] < 0, "%s: gradient/state rows wrong", x->name);
        if (x->lora) trainable += x->numel;
    }
    CHECK(trainable == mf_model_n_trainable(&t.model), "trainable %lld vs %lld", (long long)trainable,
          (long long)mf_model_n_trainable(&t.model));
    size_t n0;
    float *w0 = tu_copy_tensors(&t, 0, &n0);
    tu_steps(&t, 0, steps, losses);
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "%s %s: ledger peak %zu != planned %zu", lora, policy,
          t.ledger.peak_total, t.plan.peak_bytes);
    for (int i = 0; i < MF_CAT_COUNT; i++)
        CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "%s %s %s: ledger %zu != planned %zu", lora, policy,
              mf_cat_name((mf_cat)i), t.ledger.at_peak[i], t.plan.peak_cat[i]);
    *w = tu_copy_tensors(&t, 0, nw);
    /* frozen base unchanged, adapters moved (lora_B starts at zero) */
    size_t off = 0;
    for (int i = 0; i < t.model.n_tensors && w0 && *w; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        int same = memcmp(w0 + off, *w + off, (size_t)x->numel * sizeof(float)) == 0;
        CHECK(x->lora ? !same : same, "%s %s: %s", lora, x->name, x->lora ? "adapter did not change" : "frozen weight changed");
        off += (size_t)x->numel;
    }
    free(w0);
    mf_trainer_free(&t);
}

/* bf16 LoRA: one run of `model` (gpt2 tiny or llama-tiny) on a `base`
 * (fp32 | nf4) base; losses, and every tensor's weight row as bytes (16-bit
 * and packed rows as they are) */
static void run16(const char *data, const char *model, const char *base, const char *lora, const char *policy,
                  int steps, double *losses, unsigned char **w, size_t *nw, size_t *nbase) {
    mf_config c;
    lora_config(&c, data, lora);
    if (strcmp(model, "llama-tiny") == 0) {
        mf_config_set(&c, "model", "llama-tiny");
        mf_config_set(&c, "n_layer", "2");
        mf_config_set(&c, "n_embd", "64");
        mf_config_set(&c, "n_head", "8");
    } else mf_config_set(&c, "n_layer", "3");
    CHECK(mf_config_set(&c, "lora", lora) == 0, "%s", mf_error());
    mf_config_set(&c, "recompute", policy);
    CHECK(mf_config_set(&c, "precision", "bf16") == 0, "%s", mf_error());
    CHECK(mf_config_set(&c, "base_dtype", base) == 0, "%s", mf_error());
    mf_trainer t;
    *w = NULL;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "bf16 %s %s %s: %s", model, base, policy, mf_error()); return; }
    CHECK(t.model.cdt == MF_DTYPE_BF16, "not a bf16 plan");
    CHECK(t.plan.total_cat[MF_CAT_GRADS] == 0 && t.plan.total_cat[MF_CAT_OPTIM] == 0 &&
              t.plan.total_cat[MF_CAT_MASTER] == 0,
          "bf16 %s %s: the frozen base has gradient (%zu), optimizer (%zu) or master (%zu) bytes", model, base,
          t.plan.total_cat[MF_CAT_GRADS], t.plan.total_cat[MF_CAT_OPTIM], t.plan.total_cat[MF_CAT_MASTER]);
    size_t total = 0;
    int n16 = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        const mf_buf *b = &t.plan.bufs[mf_tensor_weights_row(x)];
        CHECK(x->mw < 0, "%s: a master row under LoRA", x->name);
        if (x->lora)
            CHECK(b->dtype == MF_DTYPE_F32 && b->cat == MF_CAT_ADAPTER && x->g >= 0 &&
                      t.plan.bufs[x->g].dtype == MF_DTYPE_F32 && x->st[0] >= 0,
                  "%s: an adapter is not fp32 in category adapter with an fp32 gradient and state", x->name);
        if (!x->lora && x->ndim == 2 && x->role != MF_ROLE_POS)
            CHECK(b->dtype == MF_DTYPE_BF16 || b->dtype == MF_DTYPE_U8, "%s: an fp32 base matrix under bf16", x->name);
        n16 += !x->lora && b->dtype == MF_DTYPE_BF16;
        if (i == t.model.lora_first) *nbase = total;  /* the adapters follow the base */
        total += b->bytes;
    }
    /* an fp32 base: every matrix a bf16 compute row; NF4: the blocks
     * packed (GPT-2's wte a bf16 compute row; a Llama's embedding and
     * head packed bf16, U8 rows) */
    CHECK(n16 > 0 || (strcmp(base, "nf4") == 0 && strcmp(model, "llama-tiny") == 0), "bf16 %s %s: no bf16 weight rows",
          model, base);
    tu_steps(&t, 0, steps, losses);
    CHECK(!steps || t.ledger.peak_total == t.plan.peak_bytes, "bf16 %s %s %s: ledger peak %zu != planned %zu", model,
          base, policy, t.ledger.peak_total, t.plan.peak_bytes);
    for (int i = 0; steps && i < MF_CAT_COUNT; i++)
        CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "bf16 %s %s %s %s: ledger %zu != planned %zu", model, base,
              policy, mf_cat_name((mf_cat)i), t.ledger.at_peak[i], t.plan.peak_cat[i]);
    unsigned char *o = malloc(total ? total : 1), *q = o;
    for (int i = 0; o && i < t.model.n_tensors; i++) {
        int r = mf_tensor_weights_row(&t.model.tensors[i]);
        memcpy(q, mf_arena_ptr(&t.arena, r), t.plan.bufs[r].bytes);
        q += t.plan.bufs[r].bytes;
    }
    *w = o, *nw = total;
    mf_trainer_free(&t);
}

int main(void) {
    char data[64];
    CHECK(tu_make_tokens(data, sizeof data, 20000, 21) == 0, "token file: %s", mf_error());
    const char *all = "r=4,alpha=8,dropout=0.1,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj";
    double l0[12], l1[12];
    float *w0 = NULL, *w1 = NULL;
    size_t n0 = 0, n1 = 0;
    run(data, all, "none", "4", "1", 12, l0, &w0, &n0);
    CHECK(l0[11] < l0[0], "loss did not fall: %.4f -> %.4f", l0[0], l0[11]);
    const char *policies[] = {"selective", "every:3", "sqrt", "full"};
    for (int k = 0; k < 4; k++) {
        run(data, all, policies[k], "4", "1", 12, l1, &w1, &n1);
        for (int i = 0; i < 12; i++)
            CHECK(l0[i] == l1[i], "%s step %d: loss %.17g vs none %.17g", policies[k], i + 1, l1[i], l0[i]);
        CHECK(n0 == n1 && w0 && w1 && memcmp(w0, w1, n0 * sizeof *w0) == 0, "%s: weights after 12 steps differ",
              policies[k]);
        printf("lora + recompute %-9s: 12 losses and all weights identical to none\n", policies[k]);
        free(w1);
        w1 = NULL;
    }
    free(w0);
    /* other settings: planned == ledger (checked inside run) */
    const char *other[][3] = {
        {"r=2,targets=attn.c_attn", "2", "1"},
        {"r=8,alpha=16,targets=mlp.c_proj,attn.c_proj", "3", "2"},
        {"r=1,alpha=1,dropout=0.5,targets=mlp.c_fc", "1", "3"},
    };
    for (int k = 0; k < 3; k++) {
        double l[3];
        float *w = NULL;
        size_t n;
        run(data, other[k][0], "none", other[k][1], other[k][2], 3, l, &w, &n);
        free(w);
    }
    /* inference plan with adapters */
    mf_config c;
    lora_config(&c, data, all);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_INFER) == 0) {
        mf_trainer_val_loss(&t);
        CHECK(t.ledger.peak_total == t.plan.peak_bytes, "infer: ledger %zu != plan %zu", t.ledger.peak_total, t.plan.peak_bytes);
        for (int i = 0; i < MF_CAT_COUNT; i++)
            CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "infer %s: ledger %zu != planned %zu",
                  mf_cat_name((mf_cat)i), t.ledger.at_peak[i], t.plan.peak_cat[i]);
        mf_trainer_free(&t);
    } else CHECK(0, "infer: %s", mf_error());
    /* bf16 compute: recompute policies bit-identical to none, plan ==
     * ledger (inside run16), the frozen base unchanged */
    {
        const char *models[2][2] = {{"gpt2", "r=4,alpha=8,dropout=0.1,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"},
                                    {"llama-tiny", "r=4,alpha=8,dropout=0.1,targets=q_proj,k_proj,v_proj,o_proj,"
                                                   "gate_proj,up_proj,down_proj"}};
        const char *bases[2] = {"fp32", "nf4"};
        const char *pol16[] = {"selective", "every:2", "sqrt", "full"};
        for (int mi = 0; mi < 2; mi++)
            for (int bi = 0; bi < 2; bi++) {
                double a[8], b[8];
                unsigned char *wa = NULL, *wb = NULL, *w0 = NULL;
                size_t na = 0, nb = 0, n0 = 0, nbase = 0;
                run16(data, models[mi][0], bases[bi], models[mi][1], "none", 0, a, &w0, &n0, &nbase);
                run16(data, models[mi][0], bases[bi], models[mi][1], "none", 8, a, &wa, &na, &nbase);
                CHECK(a[7] < a[0], "bf16 %s %s: loss did not fall: %.4f -> %.4f", models[mi][0], bases[bi], a[0], a[7]);
                /* the adapters are the last rows: the base before them is unchanged, they moved */
                CHECK(w0 && wa && n0 == na && nbase < na && memcmp(w0, wa, nbase) == 0 &&
                          memcmp(w0 + nbase, wa + nbase, na - nbase) != 0,
                      "bf16 %s %s: the base changed or the adapters did not", models[mi][0], bases[bi]);
                for (int k = 0; k < 4; k++) {
                    if (bi == 1 && k != 3 && k != 0) continue;  /* NF4: selective and full */
                    run16(data, models[mi][0], bases[bi], models[mi][1], pol16[k], 8, b, &wb, &nb, &nbase);
                    for (int i = 0; i < 8; i++)
                        CHECK(a[i] == b[i], "bf16 %s %s %s step %d: loss %.17g vs none %.17g", models[mi][0], bases[bi],
                              pol16[k], i + 1, b[i], a[i]);
                    CHECK(wa && wb && na == nb && memcmp(wa, wb, na) == 0, "bf16 %s %s %s: weights differ from none",
                          models[mi][0], bases[bi], pol16[k]);
                    printf("bf16 lora %-10s %s base, recompute %-9s: 8 losses and all weights identical to none "
                           "(loss %.4f -> %.4f)\n", models[mi][0], bases[bi], pol16[k], a[0], a[7]);
                    free(wb);
                    wb = NULL;
                }
                free(w0);
                free(wa);
            }
    }
    /* refused combinations */
    lora_config(&c, data, all);
    mf_config_set(&c, "update_in_backward", "1");
    mf_config_set(&c, "grad_clip", "0");
    CHECK(mf_trainer_init(&t, &c, MF_MODE_TRAIN) != 0 && strstr(mf_error(), "update_in_backward"),
          "update_in_backward with lora accepted");
    unlink(data);
    return mf_test_done("test_lora_plan_and_recompute");
}
