/* memfit's mixture-of-experts model (Mixtral: src/model/moe_block.c on
 * src/kernels/moe.c) against PyTorch (tests/ref/mixtral_torch.py, written
 * from HF MixtralSparseMoeBlock's semantics; attention from llama_torch.py).
 * For each case the reference writes an HF Mixtral folder (config.json with
 * num_local_experts / num_experts_per_tok / router_aux_loss_coef, experts one
 * tensor each), memfit loads it with --init DIR, and
 *   - logits agree within 1e-5 relative (1e-6 absolute),
 *   - the loss (cross-entropy + aux/z terms), the aux and z losses, within
 *     1e-5; every gradient (router and stacked experts included) within 1e-4
 *     relative (1e-6 absolute),
 *   - 10 AdamW steps with clipping: losses within 1e-5, final weights within
 *     5% of lr; with a capacity factor the dropped-slot count of every step
 *     equals the reference's, and the step's planned peak equals the ledger's.
 * Cases: top-2 with the aux loss; top-1 without it; top-2 with aux and
 * z-loss; top-2 with a capacity factor 0.5 that drops slots.
 * Then on moe-tiny (capacity 0.75, so the permutation rows are in play):
 * recompute none, selective and full give bit-identical losses over 4
 * steps, each with planned == ledger; QLoRA on the reference's folder (experts
 * packed NF4 / int8 from the files, LoRA on attention): first loss within
 * the quantisation error of PyTorch's, planned == ledger; and bad settings
 * fail with one line. */
#include "io/io.h"
#include "memfit/train.h"
#include "model/internal.h"
#include "quant/quant.h"
#include "testutil.h"
#include "trainutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#define T_ 24
#define B_ 2
#define V_ 256

static void set_common(mf_config *c, const char *tok) {
    const char *kv[][2] = {{"seq", "24"}, {"batch", "2"}, {"tokenizer", "bytes"}, {"lr", "1e-3"}, {"warmup", "0"},
                           {"min_lr_frac", "1"}, {"weight_decay", "0.1"}, {"beta1", "0.9"}, {"beta2", "0.95"},
                           {"eps", "1e-8"}, {"grad_clip", "1.0"}, {"val_fraction", "0"}, {"sample_tokens", "0"},
                           {"steps", "10"}, {"threads", "2"}, {"loss_chunk", "0"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    mf_config_set(c, "data", tok);
}

static double jnum(cJSON *j, const char *k) {
    cJSON *x = cJSON_GetObjectItem(j, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static void run_case(const char *src, const char *name, const char *args, const char *cf) {
    char dir[] = "/tmp/memfit-mixtral-parity-XXXXXX", cmd[2048], p[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    printf("== %s: %s\n", name, args);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/mixtral_torch.py make-case --out %s --vocab %d --seq %d --batch %d %s",
             src, dir, V_, T_, B_, args);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s (needs /usr/bin/python3 with python3-torch)", cmd); return; }
    mf_st_file batch, ref;
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    if (mf_st_open(&batch, p)) { CHECK(0, "%s", mf_error()); return; }
    const mf_st_tensor *in = mf_st_find(&batch, "inputs"), *tg = mf_st_find(&batch, "targets");
    CHECK(in && tg && in->dtype == MF_DTYPE_I32, "batch tensors");
    if (!in || !tg) { mf_st_close(&batch); return; }
    const int32_t *iv = in->data, *tv = tg->data;
    uint16_t ids[B_ * T_ + 1];
    for (int i = 0; i < B_ * T_; i++) ids[i] = (uint16_t)iv[i];
    ids[B_ * T_] = (uint16_t)tv[B_ * T_ - 1];
    char tok[1200];
    snprintf(tok, sizeof tok, "%s/batch.tok", dir);
    CHECK(mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, B_ * T_ + 1) == 0, "%s", mf_error());
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *js = mf_test_read_text(p);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    CHECK(j != NULL, "ref.json");

    mf_config c;
    mf_config_defaults(&c);
    set_common(&c, tok);
    snprintf(p, sizeof p, "%s/hf", dir);
    mf_config_set(&c, "init", p);
    if (cf) CHECK(mf_config_set(&c, "capacity_factor", cf) == 0, "%s", mf_error());
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); mf_st_close(&batch); return; }
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (mf_st_open(&ref, p)) { CHECK(0, "%s", mf_error()); mf_trainer_free(&t); mf_st_close(&batch); return; }
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    mf_trainer_load_batch(&t);
    mf_model_forward(&t.model, &t.arena, B_, T_, 0, 0.0f);
    const mf_st_tensor *rl = mf_st_find(&ref, "logits");
    CHECK(rl && rl->nbytes == (size_t)B_ * T_ * V_ * 4, "ref logits");
    for (int r = 0; rl && r < B_ * T_; r++) {
        char what[32];
        snprintf(what, sizeof what, "logits row %d", r);
        if (!mf_test_compare(what, mf_model_logits(&t.model, &t.arena, T_, r / T_, r % T_),
                             (const float *)rl->data + (size_t)r * V_, V_, 1e-5, 1e-6)) break;
    }
    mf_arena_step(&t.arena);
    double loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
    mf_model_backward(&t.model, &t.arena, B_, T_);
    CHECK(j && mf_close(loss, jnum(j, "loss"), 1e-5, 0), "loss memfit %.9g torch %.9g", loss, jnum(j, "loss"));
    CHECK(j && mf_close(t.model.moe_aux, jnum(j, "aux"), 1e-5, 1e-7), "aux memfit %.9g torch %.9g", t.model.moe_aux,
          jnum(j, "aux"));
    CHECK(j && mf_close(t.model.moe_z, jnum(j, "z"), 1e-5, 1e-7), "z memfit %.9g torch %.9g", t.model.moe_z, jnum(j, "z"));
    CHECK(j && t.model.moe_dropped == (int64_t)jnum(j, "dropped"), "dropped memfit %lld torch %g",
          (long long)t.model.moe_dropped, jnum(j, "dropped"));
    int ng = 0;
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[128];
        snprintf(nm, sizeof nm, "grad.%s", x->name);
        const mf_st_tensor *g = mf_st_find(&ref, nm);
        size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
        CHECK(g && g->nbytes == n * 4, "reference gradient %s", nm);
        if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, n, 1e-4, 1e-6);
    }
    printf("loss %.9g (torch %.9g), aux %.6f z %.6f dropped %lld; logits and %d of %d gradients agree\n", loss,
           jnum(j, "loss"), t.model.moe_aux, t.model.moe_z, (long long)t.model.moe_dropped, ng, t.model.n_tensors);
    mf_trainer_free(&t);

    cJSON *losses = j ? cJSON_GetObjectItem(j, "losses") : NULL, *drops = j ? cJSON_GetObjectItem(j, "dropped_steps") : NULL;
    CHECK(cJSON_GetArraySize(losses) == 10 && cJSON_GetArraySize(drops) == 10, "ref.json losses");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        for (int s = 0; s < 10 && losses && drops; s++) {
            mf_step_stats st;
            CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
            double want = cJSON_GetArrayItem(losses, s)->valuedouble;
            CHECK(mf_close(st.loss, want, 1e-5, 0), "step %d loss memfit %.9g torch %.9g", s, st.loss, want);
            int wd = cJSON_GetArrayItem(drops, s)->valueint;
            CHECK(t.model.moe_dropped == wd, "step %d dropped memfit %lld torch %d", s, (long long)t.model.moe_dropped, wd);
            if (s == 0 || s == 9) printf("step %d loss %.7f torch %.7f dropped %lld\n", s, st.loss, want,
                                         (long long)t.model.moe_dropped);
        }
        CHECK(t.plan.peak_bytes == t.ledger.peak_total, "planned peak %zu, ledger peak %zu", t.plan.peak_bytes,
              t.ledger.peak_total);
        for (int i = 0; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            char nm[128];
            snprintf(nm, sizeof nm, "final.%s", x->name);
            const mf_st_tensor *w = mf_st_find(&ref, nm);
            size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
            CHECK(w && w->nbytes == n * 4, "final %s", x->name);
            if (w) mf_test_compare(nm, mf_arena_ptr(&t.arena, x->p), w->data, n, 1e-4, 5e-5);
        }
        mf_trainer_free(&t);
    } else CHECK(0, "%s", mf_error());
    cJSON_Delete(j);
    free(js);
    mf_st_close(&ref);
    mf_st_close(&batch);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* moe-tiny on seeded bytes: the losses of 4 steps under a recompute policy */
static int run_policy(const char *tok, const char *policy, double *losses, const char *lora, const char *base) {
    mf_config c;
    mf_config_defaults(&c);
    set_common(&c, tok);
    const char *kv[][2] = {{"model", "moe-tiny"}, {"seq", "32"}, {"batch", "4"}, {"steps", "4"},
                           {"capacity_factor", "0.75"}, {"router_z_loss_coef", "0.001"}, {"recompute", policy}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(&c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    if (lora) {
        CHECK(mf_config_set(&c, "lora", lora) == 0 && mf_config_set(&c, "base_dtype", base) == 0, "%s", mf_error());
        mf_config_set(&c, "lr", "1e-2");  /* lora_B leaves zero in step 1, so steps 2-4 see the adapters */
    }
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", policy, mf_error()); return -1; }
    int64_t dropped = 0;
    for (int s = 0; s < 4; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        losses[s] = st.loss;
        dropped += t.model.moe_dropped;
    }
    CHECK(t.plan.peak_bytes == t.ledger.peak_total, "%s: planned peak %zu, ledger peak %zu", policy, t.plan.peak_bytes,
          t.ledger.peak_total);
    printf("recompute %-9s %s%s losses %.9g .. %.9g, %lld slots dropped, plan %zu == ledger %zu\n", policy,
           lora ? "LoRA on experts, base " : "", lora ? base : "", losses[0], losses[3], (long long)dropped,
           t.plan.peak_bytes, t.ledger.peak_total);
    CHECK(dropped > 0, "capacity 0.75 drops slots");
    mf_trainer_free(&t);
    return 0;
}

static void recompute_policies(void) {
    char dir[] = "/tmp/memfit-mixtral-rc-XXXXXX", tok[256];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    uint16_t ids[4096];
    uint64_t s = 12345;
    for (int i = 0; i < 4096; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (uint16_t)(s >> 56);
    }
    snprintf(tok, sizeof tok, "%s/c.tok", dir);
    CHECK(mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, 4096) == 0, "%s", mf_error());
    double base[4], l[4];
    if (run_policy(tok, "none", base, NULL, NULL) == 0) {
        const char *pol[] = {"selective", "full"};
        for (int k = 0; k < 2; k++)
            if (run_policy(tok, pol[k], l, NULL, NULL) == 0)
                for (int i = 0; i < 4; i++)
                    CHECK(l[i] == base[i], "recompute %s step %d loss %.17g, none %.17g", pol[k], i, l[i], base[i]);
    }
    /* adapters on the experts (and q, v), fp32 and NF4 expert bases */
    const char *lora = "r=4,alpha=8,targets=q_proj,v_proj,w1,w2,w3", *bases[] = {"fp32", "nf4"};
    for (int q = 0; q < 2; q++)
        if (run_policy(tok, "none", base, lora, bases[q]) == 0) {
            const char *pol[] = {"selective", "full", "every:2"};
            CHECK(base[3] != base[1], "LoRA losses do not move");
            for (int k = 0; k < 3; k++)
                if (run_policy(tok, pol[k], l, lora, bases[q]) == 0)
                    for (int i = 0; i < 4; i++)
                        CHECK(l[i] == base[i], "LoRA %s: recompute %s step %d loss %.17g, none %.17g", bases[q], pol[k],
                              i, l[i], base[i]);
        }
    remove(tok);
    rmdir(dir);
}

/* QLoRA on a Mixtral folder: the experts (and attention) packed NF4 / int8
 * straight from the reference's F32 folder, LoRA on q_proj, v_proj (lora_B
 * starts at 0, so the first loss is the quantised base's): the expert stacks
 * are quantised rows, the first loss within the quantisation's error of
 * PyTorch's fp32 loss, int8 closer than NF4, planned == ledger */
static void qlora_case(const char *src) {
    char dir[] = "/tmp/memfit-mixtral-qlora-XXXXXX", cmd[2048], p[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/ref/mixtral_torch.py make-case --out %s --vocab %d --seq %d "
             "--batch %d --steps 1 --seed 4 >/dev/null", src, dir, V_, T_, B_);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s", cmd); return; }
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *js = mf_test_read_text(p);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    double want = j ? jnum(j, "loss") : NAN, err[2] = {NAN, NAN};
    const char *kinds[2] = {"nf4", "int8"};
    for (int q = 0; q < 2; q++) {
        uint16_t ids[B_ * T_ + 1];
        mf_st_file batch;
        snprintf(p, sizeof p, "%s/batch.safetensors", dir);
        if (mf_st_open(&batch, p)) { CHECK(0, "%s", mf_error()); break; }
        const int32_t *iv = mf_st_find(&batch, "inputs")->data, *tv = mf_st_find(&batch, "targets")->data;
        for (int i = 0; i < B_ * T_; i++) ids[i] = (uint16_t)iv[i];
        ids[B_ * T_] = (uint16_t)tv[B_ * T_ - 1];
        mf_st_close(&batch);
        char tok[1200];
        snprintf(tok, sizeof tok, "%s/batch.tok", dir);
        CHECK(mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, B_ * T_ + 1) == 0, "%s", mf_error());
        mf_config c;
        mf_config_defaults(&c);
        set_common(&c, tok);
        snprintf(p, sizeof p, "%s/hf", dir);
        mf_config_set(&c, "init", p);
        mf_config_set(&c, "lora", "r=4,alpha=8,targets=q_proj,v_proj,w1,w2,w3");
        mf_config_set(&c, "base_dtype", kinds[q]);
        mf_config_set(&c, "recompute", "full");
        mf_trainer t;
        if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", kinds[q], mf_error()); continue; }
        const mf_tensor *w1 = &t.model.tensors[t.model.t_layer0 + t.model.lt[MF_LT_W1]];
        CHECK(w1->qkind && t.plan.bufs[w1->p].dtype == MF_DTYPE_U8 && w1->g < 0, "%s: %s is not a quantised frozen row",
              kinds[q], w1->name);
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        err[q] = fabs(st.loss - want);
        CHECK(t.plan.peak_bytes == t.ledger.peak_total, "%s: planned %zu, ledger %zu", kinds[q], t.plan.peak_bytes,
              t.ledger.peak_total);
        printf("QLoRA %s base: first loss %.7f, PyTorch fp32 %.7f (|diff| %.2e), plan == ledger %zu\n", kinds[q],
               st.loss, want, err[q], t.ledger.peak_total);
        /* per-expert dequantisation: the row holds one expert (3 x F x C
         * floats), and the hook's tile for expert e is, bit for bit, the
         * e-th slice of the whole stacks dequantised at once (what the
         * kernels were given before, one layer's stacks in one row) */
        mf_model *m = &t.model;
        const int64_t fc = (int64_t)m->d.ffn * m->d.C, E = m->d.n_experts;
        CHECK(m->moe_deq_f >= 0 && t.plan.bufs[m->moe_deq_f].bytes == (size_t)(3 * fc) * 4, "%s: dequant row %zu bytes",
              kinds[q], m->moe_deq_f >= 0 ? t.plan.bufs[m->moe_deq_f].bytes : 0);
        float *whole = malloc((size_t)(E * fc) * 4);
        int same = 1;
        mf_arena_step(&t.arena);
        for (int l = 0; l < m->d.L && whole; l++) {
            mf_arena_phase(&t.arena, mf_phase_layer_fwd(m, l));
            mf_moe_expert_ctx ec;
            mf_moe_expert_ops eo;
            const float *w[3];
            const mf_moe_expert_ops *ops = mf_moe_expert_setup(m, &t.arena, l, &ec, &eo, &w[0], &w[1], &w[2]);
            CHECK(ops && ops->weights && !w[0], "%s: no per-expert weights hook", kinds[q]);
            for (int k = 0; k < 3 && ops && ops->weights; k++) {
                const mf_tensor *x = &m->tensors[ec.ids[k]];
                mf_quant_unpack((mf_quant_kind)x->qkind, whole, mf_arena_ptr(&t.arena, x->p), 0, E * fc);
                for (int e = 0; e < E; e++) {
                    ops->weights(ops->ctx, e, &w[0], &w[1], &w[2]);
                    same &= memcmp(w[k], whole + e * fc, (size_t)fc * 4) == 0;
                }
            }
        }
        CHECK(same, "%s: a per-expert tile differs from the whole stack's dequantised slice", kinds[q]);
        free(whole);
        mf_trainer_free(&t);
    }
    CHECK(err[0] < 2e-2 && err[1] < err[0], "quantised-base losses off by %g (nf4), %g (int8)", err[0], err[1]);
    cJSON_Delete(j);
    free(js);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* the batch of a reference case directory as a token file (dir/batch.tok) */
static int case_tokens(const char *dir, char *tok, size_t n) {
    char p[1200];
    mf_st_file batch;
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    if (mf_st_open(&batch, p)) return -1;
    const int32_t *iv = mf_st_find(&batch, "inputs")->data, *tv = mf_st_find(&batch, "targets")->data;
    uint16_t ids[B_ * T_ + 1];
    for (int i = 0; i < B_ * T_; i++) ids[i] = (uint16_t)iv[i];
    ids[B_ * T_] = (uint16_t)tv[B_ * T_ - 1];
    mf_st_close(&batch);
    snprintf(tok, n, "%s/batch.tok", dir);
    return mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, B_ * T_ + 1);
}

/* LoRA on the experts (PEFT targets w1, w2, w3; with attention targets
 * too) against the reference's PEFT-style adapters on a frozen fp32 base:
 * memfit loads the reference's adapter (one tensor per expert) into its
 * stacked rows, then the loss within 1e-5, every adapter gradient within
 * 1e-4 relative (1e-6 absolute), 10 AdamW steps' losses within 1e-5 and
 * the final adapters; planned == ledger; the adapter memfit writes back is
 * the reference's byte for byte; memfit merge folds it into the HF folder's
 * per-expert weights and a plain fp32 run of the merged folder gives the
 * adapted model's loss (1e-5). */
static void lora_case(const char *src, const char *targets) {
    char dir[] = "/tmp/memfit-mixtral-lora-XXXXXX", cmd[2048], p[1200], tok[1200], lora[128];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    printf("== LoRA on %s\n", targets);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/ref/mixtral_torch.py make-case --out %s --vocab %d --seq %d "
             "--batch %d --seed 5 --lora_r 4 --lora_alpha 8 --lora_targets %s >/dev/null", src, dir, V_, T_, B_, targets);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s", cmd); return; }
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *js = mf_test_read_text(p);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    mf_st_file ref;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (!j || case_tokens(dir, tok, sizeof tok) || mf_st_open(&ref, p)) { CHECK(0, "case files: %s", mf_error()); return; }
    mf_config c;
    mf_config_defaults(&c);
    set_common(&c, tok);
    snprintf(p, sizeof p, "%s/hf", dir);
    mf_config_set(&c, "init", p);
    snprintf(lora, sizeof lora, "r=4,alpha=8,targets=%s", targets);
    CHECK(mf_config_set(&c, "lora", lora) == 0, "%s", mf_error());
    snprintf(p, sizeof p, "%s/adapter", dir);
    mf_config_set(&c, "adapter", p);
    mf_trainer t;
    double loss = NAN;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        mf_arena_step(&t.arena);
        mf_model_zero_grads(&t.model, &t.arena);
        mf_trainer_load_batch(&t);
        loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
        mf_model_backward(&t.model, &t.arena, B_, T_);
        CHECK(mf_close(loss, jnum(j, "loss"), 1e-5, 0), "loss memfit %.9g torch %.9g", loss, jnum(j, "loss"));
        int ng = 0, nl = 0;
        for (int i = 0; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            CHECK((i >= t.model.lora_first) == !x->frozen, "%s: frozen %d", x->name, x->frozen);
            if (i < t.model.lora_first) continue;
            char nm[160];
            snprintf(nm, sizeof nm, "grad.%s", x->name);
            const mf_st_tensor *g = mf_st_find(&ref, nm);
            CHECK(g && g->nbytes == (size_t)x->numel * 4, "reference gradient %s", nm);
            nl++;
            if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, (size_t)x->numel, 1e-4, 1e-6);
        }
        printf("loss %.9g (torch %.9g); %d of %d adapter gradients agree\n", loss, jnum(j, "loss"), ng, nl);
        /* the adapter as memfit writes it: the reference's file, tensor for tensor */
        char ad[1200];
        snprintf(ad, sizeof ad, "%s/saved", dir);
        CHECK(mf_lora_save_adapter(&t.model, &t.arena, ad, "x") == 0, "%s", mf_error());
        mf_st_file f1, f2;
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
        char p2[1200];
        snprintf(p2, sizeof p2, "%s/adapter/adapter_model.safetensors", dir);
        if (mf_st_open(&f1, p) == 0) {
            if (mf_st_open(&f2, p2) == 0) {
                CHECK(f1.n == f2.n, "saved adapter has %d tensors, the reference's %d", f1.n, f2.n);
                for (int i = 0; i < f1.n; i++) {
                    const mf_st_tensor *o = mf_st_find(&f2, f1.tensors[i].name);
                    CHECK(o && o->nbytes == f1.tensors[i].nbytes && !memcmp(o->data, f1.tensors[i].data, o->nbytes),
                          "saved %s differs from the reference's", f1.tensors[i].name);
                }
                mf_st_close(&f2);
            }
            mf_st_close(&f1);
        } else CHECK(0, "%s", mf_error());
        mf_trainer_free(&t);
    } else CHECK(0, "%s: %s", targets, mf_error());

    cJSON *losses = cJSON_GetObjectItem(j, "losses");
    CHECK(cJSON_GetArraySize(losses) == 10, "ref.json losses");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        for (int s = 0; s < 10 && losses; s++) {
            mf_step_stats st;
            CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
            double want = cJSON_GetArrayItem(losses, s)->valuedouble;
            CHECK(mf_close(st.loss, want, 1e-5, 0), "step %d loss memfit %.9g torch %.9g", s, st.loss, want);
            if (s == 0 || s == 9) printf("step %d loss %.7f torch %.7f\n", s, st.loss, want);
        }
        CHECK(t.plan.peak_bytes == t.ledger.peak_total, "planned peak %zu, ledger peak %zu", t.plan.peak_bytes,
              t.ledger.peak_total);
        for (int cat = 0; cat < MF_CAT_COUNT; cat++)
            CHECK(t.plan.max_cat[cat] == t.ledger.peak[cat], "category %d: planned %zu, ledger %zu", cat,
                  t.plan.max_cat[cat], t.ledger.peak[cat]);
        for (int i = t.model.lora_first; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            char nm[160];
            snprintf(nm, sizeof nm, "final.%s", x->name);
            const mf_st_tensor *w = mf_st_find(&ref, nm);
            CHECK(w && w->nbytes == (size_t)x->numel * 4, "final %s", x->name);
            if (w) mf_test_compare(nm, mf_arena_ptr(&t.arena, x->p), w->data, (size_t)x->numel, 1e-4, 5e-5);
        }
        mf_trainer_free(&t);
    } else CHECK(0, "%s", mf_error());

    /* memfit merge into the folder's per-expert weights, then a plain run */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/merged && cp %s/hf/config.json %s/merged/", dir, dir, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    char mp[1200], ap[1200], op[1200];
    snprintf(mp, sizeof mp, "%s/hf/model.safetensors", dir);
    snprintf(ap, sizeof ap, "%s/adapter", dir);
    snprintf(op, sizeof op, "%s/merged/model.safetensors", dir);
    CHECK(mf_lora_merge_file(mp, ap, op, 0) == 0, "merge: %s", mf_error());
    mf_config_defaults(&c);
    set_common(&c, tok);
    snprintf(p, sizeof p, "%s/merged", dir);
    mf_config_set(&c, "init", p);
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        mf_arena_step(&t.arena);
        mf_model_zero_grads(&t.model, &t.arena);
        mf_trainer_load_batch(&t);
        double ml = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
        CHECK(mf_close(ml, loss, 1e-5, 0), "merged model's loss %.9g, the adapted model's %.9g", ml, loss);
        printf("merged (memfit merge) loss %.9g, adapter %.9g\n", ml, loss);
        mf_trainer_free(&t);
    } else CHECK(0, "merged: %s", mf_error());
    cJSON_Delete(j);
    free(js);
    mf_st_close(&ref);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* checkpoint metadata: the dims string carries the experts and round-trips
 * them; a dense Llama's string is what it was before experts existed */
static void dims_roundtrip(void) {
    int n;
    const mf_preset *ps = mf_model_presets(&n);
    for (int i = 0; i < n; i++) {
        mf_dims d = ps[i].d, back;
        if (d.arch != MF_ARCH_LLAMA) continue;
        d.z_coef = d.n_experts ? 0.125f : 0.0f;
        char s[512];
        mf_model_dims_str(&d, s, sizeof s);
        CHECK(mf_model_dims_parse(s, &back) == 0, "%s: %s", s, mf_error());
        CHECK(back.n_experts == d.n_experts && back.top_k == d.top_k && back.norm_topk_prob == d.norm_topk_prob &&
              back.aux_coef == d.aux_coef && back.z_coef == d.z_coef && back.L == d.L && back.ffn == d.ffn,
              "%s: dims string does not round-trip: %s", ps[i].name, s);
        CHECK(!strstr(s, "moe:") == !d.n_experts, "%s: %s", ps[i].name, s);
        if (strcmp(ps[i].name, "mixtral-8x7b") == 0) printf("dims %s\n", s);
    }
    mf_dims bad;
    CHECK(mf_model_dims_parse("llama:2,64,8,2,8,64,256,256,0,0,0,1e-05,1000000,0,0,0,0,0,MixtralForCausalLM,moe:4,5,1,0.02,0",
                              &bad) != 0, "top_k 5 of 4 experts accepted from a dims string");
}

static void bad_settings(void) {
    const char *cases[][3] = {
        {"num_experts_per_tok", "5", "num_experts_per_tok 5 must be between 1 and num_local_experts 4"},
        {"capacity_factor", "0", "capacity_factor 0 must be > 0"},
        {"capacity_factor", "-1", "capacity_factor"},
        {"lora", "r=4,targets=q_proj,gate_proj", "not modules of a mixture-of-experts model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mf_config c;
        mf_config_defaults(&c);
        mf_config_set(&c, "model", "moe-tiny");
        mf_config_set(&c, "seq", "32");
        mf_dims d;
        mf_plan plan;
        mf_model m;
        int rc = mf_config_set(&c, cases[i][0], cases[i][1]);
        if (rc == 0) rc = mf_model_build_plan(&c, MF_MODE_TRAIN, 1, 0, &d, &plan, &m);
        CHECK(rc != 0 && strstr(mf_error(), cases[i][2]) && !strchr(mf_error(), '\n'),
              "--%s %s: want one line with '%s', got rc %d '%s'", cases[i][0], cases[i][1], cases[i][2], rc, mf_error());
        if (rc == 0) { mf_model_free(&m); mf_plan_free(&plan); }
        else printf("--%s %s: %s\n", cases[i][0], cases[i][1], mf_error());
    }
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    src = src ? src : "..";
    run_case(src, "top-2, aux loss", "--top_k 2 --aux_coef 0.02", NULL);
    run_case(src, "top-1, no aux loss", "--top_k 1 --aux_coef 0", NULL);
    run_case(src, "top-2, aux and z-loss", "--top_k 2 --aux_coef 0.05 --z_coef 0.01 --seed 2", NULL);
    run_case(src, "top-2, capacity factor 0.5 drops slots", "--top_k 2 --capacity_factor 0.5 --seed 3", "0.5");
    lora_case(src, "w1,w2,w3");
    lora_case(src, "q_proj,v_proj,w1,w2,w3");
    recompute_policies();
    qlora_case(src);
    dims_roundtrip();
    bad_settings();
    return mf_test_done("test_mixtral_matches_torch");
}
