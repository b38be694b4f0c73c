/* Cross-layer parameter sharing (--share_layers N, docs/sharing.md): a
 * 6-block GPT-2 with 2 weight sets (blocks use sets 0 1 0 1 0 1) equals
 * tests/ref/share_torch.py, a PyTorch model that calls 2 block modules 3
 * times (written for this test, not from our C code): same loss and every
 * gradient at the initial weights (each set's gradient summed over its
 * three uses), the same losses over 10 AdamW steps with clipping (1e-5)
 * and the same final weights. Also: the plan holds 2 sets of parameter,
 * gradient and AdamW rows where the unshared plan holds 6, and the same
 * activations; the ledger's peak equals the plan's; a share that does not
 * divide n_layer, and the paths that cannot accumulate a shared gradient,
 * are refused with a message; a shared weights file refuses to load into
 * an unshared model. */
#include "io/io.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <cjson/cJSON.h>
#include <math.h>

#define L_ 6
#define N_ 2
#define C_ 32
#define T_ 16
#define B_ 3

static void base_config(mf_config *c, const char *tok, const char *init) {
    mf_config_defaults(c);
    const char *kv[][2] = {{"model", "gpt2-1m"}, {"n_layer", "6"}, {"share_layers", "2"}, {"n_embd", "32"},
                           {"n_head", "4"}, {"block_size", "16"}, {"seq", "16"}, {"batch", "3"},
                           {"vocab_size", "256"}, {"tokenizer", "bytes"}, {"lr", "1e-3"}, {"warmup", "0"},
                           {"min_lr_frac", "1"}, {"weight_decay", "0.1"}, {"beta1", "0.9"}, {"beta2", "0.95"},
                           {"eps", "1e-8"}, {"grad_clip", "1.0"}, {"val_fraction", "0"}, {"sample_tokens", "0"},
                           {"val_every", "0"}, {"steps", "10"}, {"threads", "2"}, {"loss_chunk", "7"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) CHECK(mf_config_set(c, kv[i][0], kv[i][1]) == 0, "%s", mf_error());
    mf_config_set(c, "data", tok);
    if (init) mf_config_set(c, "init", init);
}

/* bytes of the plan's rows in category cat */
static size_t cat_bytes(const mf_plan *p, mf_cat cat) {
    size_t s = 0;
    for (int i = 0; i < p->n; i++) if (p->bufs[i].cat == cat) s += p->bufs[i].bytes;
    return s;
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    char dir[] = "/tmp/memfit-share-XXXXXX", cmd[2048], p[1200];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/share_torch.py make-case --out %s --layers %d --share %d --embd %d"
             " --heads 4 --vocab 256 --seq %d --batch %d --seed 1 --steps 10 --lr 1e-3 --beta1 0.9 --beta2 0.95"
             " --eps 1e-8 --wd 0.1 --clip 1.0",
             src ? src : "..", dir, L_, N_, C_, T_, B_);
    if (system(cmd) != 0) {
        fprintf(stderr, "reference failed: %s\n(needs /usr/bin/python3 with python3-torch)\n", cmd);
        return 1;
    }
    mf_st_file batch, ref, fin;
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    if (mf_st_open(&batch, p)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    const mf_st_tensor *in = mf_st_find(&batch, "inputs"), *tg = mf_st_find(&batch, "targets");
    CHECK(in && tg && in->dtype == MF_DTYPE_I32, "batch tensors");
    if (!in || !tg) return mf_test_done("test_share_layers_matches_torch");
    const int32_t *iv = in->data, *tv = tg->data;
    uint16_t ids[B_ * T_ + 1];
    for (int i = 0; i < B_ * T_; i++) ids[i] = (uint16_t)iv[i];
    ids[B_ * T_] = (uint16_t)tv[B_ * T_ - 1];
    char tok[1200], w[1200];
    snprintf(tok, sizeof tok, "%s/batch.tok", dir);
    CHECK(mf_tokfile_write(tok, MF_TOK_BYTES, 256, ids, B_ * T_ + 1) == 0, "%s", mf_error());
    snprintf(w, sizeof w, "%s/weights.safetensors", dir);

    /* loss and gradients at the initial weights */
    mf_config c;
    base_config(&c, tok, w);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (mf_st_open(&ref, p)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    CHECK(t.model.n_tensors == 2 + N_ * 12 + 2, "%d tensors, want %d (only the %d sets exist)", t.model.n_tensors,
          2 + N_ * 12 + 2, N_);
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    mf_trainer_load_batch(&t);
    double loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
    mf_model_backward(&t.model, &t.arena, B_, T_);
    const char *ls = mf_st_meta(&ref, "loss");
    CHECK(ls && mf_close(loss, atof(ls), 1e-5, 0), "loss memfit %.9g torch %s", loss, ls ? ls : "?");
    for (int i = 0; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[80];
        snprintf(nm, sizeof nm, "grad.%s", x->name);
        const mf_st_tensor *g = mf_st_find(&ref, nm);
        size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
        CHECK(g && g->nbytes == n * 4, "reference gradient %s", nm);
        if (g) mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, n, 1e-4, 1e-6);
    }
    printf("loss %.9g (torch %s); %d gradients compared\n", loss, ls ? ls : "?", t.model.n_tensors);
    mf_trainer_free(&t);

    /* 10 AdamW steps with clipping; the ledger's peak is the plan's */
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *js = mf_test_read_text(p);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    cJSON *losses = j ? cJSON_GetObjectItem(j, "losses") : NULL;
    CHECK(cJSON_GetArraySize(losses) == 10, "ref.json losses");
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    for (int s = 0; s < 10 && losses; s++) {
        mf_step_stats st;
        CHECK(mf_trainer_step(&t, &st) == 0, "%s", mf_error());
        double want = cJSON_GetArrayItem(losses, s)->valuedouble;
        CHECK(mf_close(st.loss, want, 1e-5, 0), "step %d loss memfit %.9g torch %.9g", s, st.loss, want);
        printf("step %2d loss %.7f torch %.7f\n", s, st.loss, want);
    }
    snprintf(p, sizeof p, "%s/final.safetensors", dir);
    if (mf_st_open(&fin, p) == 0) {
        for (int i = 0; i < t.model.n_tensors; i++) {
            const mf_tensor *x = &t.model.tensors[i];
            const mf_st_tensor *fw = mf_st_find(&fin, x->name);
            size_t n = (size_t)(x->rows_file * (x->ndim > 1 ? x->shape[1] : 1));
            CHECK(fw && fw->nbytes == n * 4, "final %s", x->name);
            /* the bound test_parity_torch gives final weights (5% of lr) */
            if (fw) mf_test_compare(x->name, mf_arena_ptr(&t.arena, x->p), fw->data, n, 1e-4, 5e-5);
        }
        mf_st_close(&fin);
    } else CHECK(0, "%s", mf_error());
    CHECK(t.ledger.peak_total == t.plan.peak_bytes, "ledger peak %zu != planned %zu", t.ledger.peak_total,
          t.plan.peak_bytes);
    for (int i = 0; i < MF_CAT_COUNT; i++)
        CHECK(t.ledger.at_peak[i] == t.plan.peak_cat[i], "%s: ledger %zu != planned %zu", mf_cat_name((mf_cat)i),
              t.ledger.at_peak[i], t.plan.peak_cat[i]);
    /* the saved weights record the sharing and load back only as shared */
    snprintf(p, sizeof p, "%s/saved.safetensors", dir);
    CHECK(mf_trainer_save_weights(&t, p) == 0, "save: %s", mf_error());
    mf_trainer_free(&t);
    mf_st_file sv;
    if (mf_st_open(&sv, p) == 0) {
        const char *d = mf_st_meta(&sv, "dims");
        CHECK(d && strstr(d, ";share=2"), "saved dims '%s' do not record the sharing", d ? d : "(none)");
        CHECK(!mf_st_find(&sv, "h.2.ln_1.weight") && mf_st_find(&sv, "h.1.ln_1.weight"), "saved file holds 2 sets");
        mf_st_close(&sv);
    } else CHECK(0, "%s", mf_error());
    mf_config u;
    base_config(&u, tok, p);
    mf_config_set(&u, "share_layers", "0");
    CHECK(mf_trainer_init(&t, &u, MF_MODE_INFER) != 0 && strstr(mf_error(), "--share_layers 2"),
          "a shared file loaded into an unshared model: %s", mf_error());

    /* the plan: params, grads and AdamW state of 2 sets, not 6; activations unchanged.
     * One block's parameters: 12C^2 + 13C (GPT-2: c_attn 3C^2+3C, c_proj C^2+C,
     * c_fc 4C^2+4C, mlp c_proj 4C^2+C, two LayerNorms 4C) */
    base_config(&c, tok, NULL);
    mf_config_set(&u, "init", "");
    mf_trainer ts, tu;
    int ok = mf_trainer_init(&ts, &c, MF_MODE_TRAIN) == 0;
    CHECK(ok, "%s", mf_error());
    int ok2 = ok && mf_trainer_init(&tu, &u, MF_MODE_TRAIN) == 0;
    CHECK(!ok || ok2, "%s", mf_error());
    if (ok && ok2) {
        size_t blk = (size_t)(12 * C_ * C_ + 13 * C_) * 4;
        mf_cat cats[3] = {MF_CAT_PARAMS, MF_CAT_GRADS, MF_CAT_OPTIM};
        size_t per[3] = {blk, blk, 2 * blk};  /* AdamW: m and v */
        for (int k = 0; k < 3; k++) {
            size_t a = cat_bytes(&tu.plan, cats[k]), b = cat_bytes(&ts.plan, cats[k]);
            CHECK(a - b == (size_t)(L_ - N_) * per[k], "%s: unshared %zu - shared %zu != %d blocks' %zu",
                  mf_cat_name(cats[k]), a, b, L_ - N_, per[k]);
            printf("%-6s unshared %zu shared %zu bytes\n", mf_cat_name(cats[k]), a, b);
        }
        CHECK(cat_bytes(&tu.plan, MF_CAT_ACTS) == cat_bytes(&ts.plan, MF_CAT_ACTS), "activations differ");
    }
    if (ok) mf_trainer_free(&ts);
    if (ok2) mf_trainer_free(&tu);

    /* refusals: a share that does not divide n_layer; update in backward */
    const char *bad[][2] = {{"share_layers", "4"}, {"share_layers", "7"}, {"update_in_backward", "1"}};
    for (int k = 0; k < 3; k++) {
        base_config(&c, tok, NULL);
        mf_config_set(&c, bad[k][0], bad[k][1]);
        mf_config_set(&c, "grad_clip", "0");  /* (update_in_backward's own requirement) */
        int rc = mf_trainer_init(&t, &c, MF_MODE_TRAIN);
        CHECK(rc != 0 && strstr(mf_error(), "share_layers"), "%s %s: not refused (%s)", bad[k][0], bad[k][1],
              rc ? mf_error() : "accepted");
        if (!rc) mf_trainer_free(&t);
    }
    cJSON_Delete(j);
    free(js);
    mf_st_close(&ref);
    mf_st_close(&batch);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return mf_test_done("test_share_layers_matches_torch");
}
