/* memfit's Qwen2-MoE (Mixtral's routed experts plus a shared expert gated
 * by sigmoid(shared_expert_gate . x), q/k/v biases: src/model/moe_shared.c,
 * blocks.c) against PyTorch (tests/ref/qwen2_moe_torch.py, written from HF
 * Qwen2MoeSparseMoeBlock's semantics). For each case the reference writes an
 * HF Qwen2MoeForCausalLM folder and memfit loads it with --init DIR:
 *   - logits within 1e-5 relative (1e-6 absolute); loss, aux and z within
 *     1e-5; every gradient (router, stacked experts, shared expert, shared
 *     gate, biases) within 1e-4 relative (1e-6 absolute);
 *   - 10 AdamW steps with clipping: losses within 1e-5, final weights within
 *     5% of lr; planned peak == ledger peak, per category too.
 * Cases: top-2 without renormalisation (Qwen's default) with the aux loss;
 * top-2 with norm_topk_prob and aux + z-loss; top-1.
 * LoRA on the shared expert (PEFT targets gate_proj, up_proj, down_proj;
 * with q_proj, v_proj too) against the reference's adapters: loss, every
 * adapter gradient, 10 steps, the adapter memfit writes == the reference's.
 * qwen2-moe-tiny: recompute none, selective, full, every:2 bit-identical
 * over 4 steps (also with LoRA on the shared expert over fp32 and NF4
 * bases), planned == ledger. Bad settings and folders fail with one line. */
#include "io/io.h"
#include "memfit/train.h"
#include "model/internal.h"
#include "testutil.h"
#include "trainutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

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

/* the reference's case in dir: batch.tok written, ref.json parsed */
static cJSON *make_case(const char *src, const char *dir, const char *args, char *tok, size_t n) {
    char cmd[2048], p[1200];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/qwen2_moe_torch.py make-case --out %s --vocab %d --seq %d --batch %d %s",
             src, dir, V_, T_, B_, args);
    if (system(cmd) != 0) { CHECK(0, "reference failed: %s (needs /usr/bin/python3 with python3-torch)", cmd); return NULL; }
    mf_st_file batch;
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    if (mf_st_open(&batch, p)) { CHECK(0, "%s", mf_error()); return NULL; }
    const int32_t *iv = mf_st_find(&batch, "inputs")->data, *tv = mf_st_find(&batch, "targets")->data;
    uint16_t ids[B_ * T_ + 1];
    for (int i = 0; i < B_ * T_; i++) ids[i] = (uint16_t)iv[i];
    ids[B_ * T_] = (uint16_t)tv[B_ * T_ - 1];
    mf_st_close(&batch);
    snprintf(tok, n, "%s/batch.tok", dir);
    CHECK(mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, B_ * T_ + 1) == 0, "%s", mf_error());
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *js = mf_test_read_text(p);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    free(js);
    CHECK(j != NULL, "ref.json");
    return j;
}

static void check_plan_ledger(const mf_trainer *t, const char *what) {
    CHECK(t->plan.peak_bytes == t->ledger.peak_total, "%s: planned peak %zu, ledger peak %zu", what, t->plan.peak_bytes,
          t->ledger.peak_total);
    for (int cat = 0; cat < MF_CAT_COUNT; cat++)
        CHECK(t->plan.max_cat[cat] == t->ledger.peak[cat], "%s: category %d planned %zu, ledger %zu", what, cat,
              t->plan.max_cat[cat], t->ledger.peak[cat]);
}

/* 10 steps' losses against the reference's, then the final weights of
 * tensors [first, n_tensors) */
static void steps_match(mf_config *c, cJSON *j, const mf_st_file *ref, int adapters) {
    mf_trainer t;
    cJSON *losses = cJSON_GetObjectItem(j, "losses");
    CHECK(cJSON_GetArraySize(losses) == 10, "ref.json losses");
    if (mf_trainer_init(&t, c, MF_MODE_TRAIN)) { CHECK(0, "%s", mf_error()); return; }
    for (int s = 0; s < 10 && losses; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        double want = cJSON_GetArrayItem(losses, s)->valuedouble;
        CHECK(mf_close(st.loss, want, 1e-5, 0), "step %d loss memfit %.9g torch %.9g", s, st.loss, want);
        if (s == 0 || s == 9) printf("step %d loss %.7f torch %.7f\n", s, st.loss, want);
    }
    check_plan_ledger(&t, "10 steps");
    for (int i = adapters ? t.model.lora_first : 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[160];
        snprintf(nm, sizeof nm, "final.%s", x->name);
        const mf_st_tensor *w = mf_st_find(ref, nm);
        size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
        CHECK(w && w->nbytes == n * 4, "final %s", x->name);
        if (w) mf_test_compare(nm, mf_arena_ptr(&t.arena, x->p), w->data, n, 1e-4, 5e-5);
    }
    mf_trainer_free(&t);
}

static void run_case(const char *src, const char *name, const char *args) {
    char dir[] = "/tmp/memfit-qwen2moe-parity-XXXXXX", p[1200], tok[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    printf("== %s: %s\n", name, args);
    cJSON *j = make_case(src, dir, args, tok, sizeof tok);
    mf_st_file ref;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (!j || mf_st_open(&ref, p)) { CHECK(0, "case files: %s", mf_error()); cJSON_Delete(j); return; }
    mf_config c;
    mf_config_defaults(&c);
    set_common(&c, tok);
    snprintf(p, sizeof p, "%s/hf", dir);
    mf_config_set(&c, "init", p);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        CHECK(t.d.shared_ffn == 48 && t.d.ffn == 32 && t.d.qkv_bias && t.d.n_experts == 4, "shape from config.json");
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
        CHECK(mf_close(loss, jnum(j, "loss"), 1e-5, 0), "loss memfit %.9g torch %.9g", loss, jnum(j, "loss"));
        CHECK(mf_close(t.model.moe_aux, jnum(j, "aux"), 1e-5, 1e-7), "aux memfit %.9g torch %.9g", t.model.moe_aux,
              jnum(j, "aux"));
        CHECK(mf_close(t.model.moe_z, jnum(j, "z"), 1e-5, 1e-7), "z memfit %.9g torch %.9g", t.model.moe_z, jnum(j, "z"));
        int ng = 0, nsh = 0;
        for (int i = 0; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            char nm[160];
            snprintf(nm, sizeof nm, "grad.%s", x->name);
            const mf_st_tensor *g = mf_st_find(&ref, nm);
            size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
            CHECK(g && g->nbytes == n * 4, "reference gradient %s", nm);
            if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, n, 1e-4, 1e-6);
            nsh += strstr(x->name, ".shared_expert") != NULL;
        }
        CHECK(nsh == 8, "%d shared-expert tensors, want 8 (4 per layer)", nsh);
        printf("loss %.9g (torch %.9g), aux %.6f z %.6f; logits and %d of %d gradients agree\n", loss, jnum(j, "loss"),
               t.model.moe_aux, t.model.moe_z, ng, t.model.n_tensors);
        mf_trainer_free(&t);
    } else CHECK(0, "%s", mf_error());
    steps_match(&c, j, &ref, 0);
    cJSON_Delete(j);
    mf_st_close(&ref);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* LoRA on the shared expert (and attention) against the reference's
 * PEFT-style adapters on a frozen fp32 base */
static void lora_case(const char *src, const char *targets) {
    char dir[] = "/tmp/memfit-qwen2moe-lora-XXXXXX", p[1200], tok[1200], args[256], lora[160];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    printf("== LoRA on %s\n", targets);
    snprintf(args, sizeof args, "--seed 5 --lora_r 4 --lora_alpha 8 --lora_targets %s >/dev/null", targets);
    cJSON *j = make_case(src, dir, args, tok, sizeof tok);
    mf_st_file ref;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (!j || mf_st_open(&ref, p)) { CHECK(0, "case files: %s", mf_error()); cJSON_Delete(j); return; }
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
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN) == 0) {
        mf_arena_step(&t.arena);
        mf_model_zero_grads(&t.model, &t.arena);
        mf_trainer_load_batch(&t);
        double loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
        mf_model_backward(&t.model, &t.arena, B_, T_);
        CHECK(mf_close(loss, jnum(j, "loss"), 1e-5, 0), "loss memfit %.9g torch %.9g", loss, jnum(j, "loss"));
        int ng = 0, nl = 0;
        for (int i = t.model.lora_first; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            char nm[160];
            snprintf(nm, sizeof nm, "grad.%s", x->name);
            const mf_st_tensor *g = mf_st_find(&ref, nm);
            CHECK(g && g->nbytes == (size_t)x->numel * 4, "reference gradient %s", nm);
            nl++;
            if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, (size_t)x->numel, 1e-4, 1e-6);
        }
        printf("loss %.9g (torch %.9g); %d of %d adapter gradients agree\n", loss, jnum(j, "loss"), ng, nl);
        char ad[1200], p2[1200];
        snprintf(ad, sizeof ad, "%s/saved", dir);
        CHECK(mf_lora_save_adapter(&t.model, &t.arena, ad, "x") == 0, "%s", mf_error());
        mf_st_file f1, f2;
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
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
    steps_match(&c, j, &ref, 1);
    cJSON_Delete(j);
    mf_st_close(&ref);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* qwen2-moe-tiny on seeded bytes: the losses of 4 steps under a recompute policy */
static int run_policy(const char *tok, const char *policy, double *losses, const char *lora, const char *base) {
    mf_config c;
    mf_config_defaults(&c);
    set_common(&c, tok);
    const char *kv[][2] = {{"model", "qwen2-moe-tiny"}, {"seq", "32"}, {"batch", "4"}, {"steps", "4"},
                           {"router_z_loss_coef", "0.001"}, {"recompute", policy}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(&c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    if (lora) {
        CHECK(mf_config_set(&c, "lora", lora) == 0 && mf_config_set(&c, "base_dtype", base) == 0, "%s", mf_error());
        mf_config_set(&c, "lr", "1e-2");  /* lora_B leaves zero in step 1, so steps 2-4 see the adapters */
    }
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { CHECK(0, "%s: %s", policy, mf_error()); return -1; }
    for (int s = 0; s < 4; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        losses[s] = st.loss;
    }
    check_plan_ledger(&t, policy);
    printf("recompute %-9s %s%s losses %.9g .. %.9g, plan %zu == ledger %zu\n", policy,
           lora ? "LoRA on the shared expert, base " : "", lora ? base : "", losses[0], losses[3], t.plan.peak_bytes,
           t.ledger.peak_total);
    mf_trainer_free(&t);
    return 0;
}

static void recompute_policies(void) {
    char dir[] = "/tmp/memfit-qwen2moe-rc-XXXXXX", tok[256];
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
    const char *pol[] = {"selective", "full", "every:2"};
    if (run_policy(tok, "none", base, NULL, NULL) == 0)
        for (int k = 0; k < 3; k++)
            if (run_policy(tok, pol[k], l, NULL, NULL) == 0)
                for (int i = 0; i < 4; i++)
                    CHECK(l[i] == base[i], "recompute %s step %d loss %.17g, none %.17g", pol[k], i, l[i], base[i]);
    const char *lora = "r=4,alpha=8,targets=q_proj,v_proj,gate_proj,up_proj,down_proj", *bases[] = {"fp32", "nf4"};
    for (int q = 0; q < 2; q++)
        if (run_policy(tok, "none", base, lora, bases[q]) == 0) {
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

/* the dims string carries the shared expert's width and round-trips it */
static void dims_roundtrip(void) {
    int n;
    const mf_preset *ps = mf_model_presets(&n);
    int found = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(ps[i].name, "qwen2-moe-tiny")) continue;
        found = 1;
        mf_dims d = ps[i].d, back;
        char s[512];
        mf_model_dims_str(&d, s, sizeof s);
        CHECK(mf_model_dims_parse(s, &back) == 0, "%s: %s", s, mf_error());
        CHECK(back.shared_ffn == 64 && back.ffn == 32 && back.norm_topk_prob == 0 && back.qkv_bias == 1 &&
                  back.n_experts == 4 && strcmp(back.hf_arch, "Qwen2MoeForCausalLM") == 0,
              "dims string does not round-trip: %s", s);
        printf("dims %s\n", s);
    }
    CHECK(found, "no qwen2-moe-tiny preset");
}

/* one config.json change to the reference's folder: --init fails with one line */
static void bad_folder(const char *src) {
    char dir[] = "/tmp/memfit-qwen2moe-bad-XXXXXX", tok[1200], cmd[2048], p[1200];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    cJSON *j = make_case(src, dir, "--steps 1 >/dev/null", tok, sizeof tok);
    cJSON_Delete(j);
    const char *edits[][2] = {{"c['decoder_sparse_step'] = 2", "only models whose every layer is sparse"},
                              {"c['mlp_only_layers'] = [0]", "only models whose every layer is sparse"},
                              {"del c['shared_expert_intermediate_size']", "shared_expert_intermediate_size' is missing"},
                              {"c['norm_topk_prob'] = 1", "'norm_topk_prob' must be true or false"}};
    snprintf(p, sizeof p, "%s/hf/config.json", dir);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        snprintf(cmd, sizeof cmd, "cp %s %s.orig && /usr/bin/python3 -c \"import json; p='%s'; c=json.load(open(p)); "
                 "%s; json.dump(c, open(p, 'w'))\"", p, p, p, edits[i][0]);
        CHECK(system(cmd) == 0, "%s", cmd);
        mf_dims d;
        snprintf(cmd, sizeof cmd, "%s/hf", dir);
        int rc = mf_hf_read_config(cmd, &d);
        CHECK(rc != 0 && strstr(mf_error(), edits[i][1]) && !strchr(mf_error(), '\n'), "%s: rc %d '%s'", edits[i][0],
              rc, mf_error());
        if (rc) printf("%s: %s\n", edits[i][0], mf_error());
        snprintf(cmd, sizeof cmd, "mv %s.orig %s", p, p);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

static void bad_settings(void) {
    const char *cases[][3] = {
        {"lora", "r=4,targets=q_proj,w1", "not modules of a Qwen2-MoE model"},
        {"precision", "bf16", "fp32 only"},
        {"lora", "r=4,targets=q_proj,mlp.c_fc", "not modules of a mixture-of-experts model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mf_config c;
        mf_config_defaults(&c);
        mf_config_set(&c, "model", "qwen2-moe-tiny");
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
    run_case(src, "top-2, no renormalisation, aux loss", "--top_k 2 --aux_coef 0.02");
    run_case(src, "top-2, norm_topk_prob, aux and z-loss", "--top_k 2 --norm_topk_prob 1 --aux_coef 0.05 --z_coef 0.01 --seed 2");
    run_case(src, "top-1, no aux loss", "--top_k 1 --aux_coef 0 --seed 3");
    lora_case(src, "gate_proj,up_proj,down_proj");
    lora_case(src, "q_proj,v_proj,gate_proj,up_proj,down_proj");
    recompute_policies();
    dims_roundtrip();
    bad_folder(src);
    bad_settings();
    return mf_test_done("test_qwen2_moe_matches_torch");
}
