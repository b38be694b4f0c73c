/* LoRA against PyTorch (tests/ref/lora_torch.py, which applies a PEFT
 * adapter by PEFT's conventions on the reference GPT-2): memfit writes its
 * base weights and its adapter (--save-adapter layout: PEFT names,
 * adapter_config.json), the script reads those files, and
 *  - logits agree within 1e-5 (relative; 1e-6 absolute), the loss within 1e-5,
 *  - every lora_A / lora_B gradient agrees within 1e-5 relative (1e-7 absolute),
 * with alpha/r = 2, dropout off, all four targets, lora_B non-zero so both
 * halves of the backward matter. Then the adapter is loaded back (--adapter)
 * into a fresh run and gives bit-identical logits. */
#include "io/io.h"
#include "memfit/train.h"
#include "testutil.h"
#include "trainutil.h"

#include <math.h>

#define B_ 2
#define T_ 16

static void config(mf_config *c, const char *data) {
    tu_tiny_config(c, data);
    mf_config_set(c, "n_layer", "2");
    mf_config_set(c, "loss_chunk", "0");
    mf_config_set(c, "val_fraction", "0");
    mf_config_set(c, "lora", "r=4,alpha=8,dropout=0,targets=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj");
}

int main(void) {
    const char *src = getenv("MEMFIT_SRC");
    char data[64], dir[] = "/tmp/memfit-lora-torch-XXXXXX", p[1200], ad[1200], w[1200], cmd[4096];
    CHECK(tu_make_tokens(data, sizeof data, 4000, 5) == 0, "token file: %s", mf_error());
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    mf_config c;
    config(&c, data);
    mf_trainer t;
    if (mf_trainer_init(&t, &c, MF_MODE_TRAIN)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    /* lora_B is zero after PEFT's init: give it values so dA and the
     * forward's low-rank term are tested too */
    mf_rng rng;
    mf_rng_seed(&rng, 99);
    for (int i = t.model.lora_first; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        float *pv = mf_arena_ptr(&t.arena, x->p);
        if (strstr(x->name, "lora_B"))
            for (int64_t k = 0; k < x->numel; k++) pv[k] = 0.05f * mf_rng_normal(&rng);
    }
    snprintf(w, sizeof w, "%s/weights.safetensors", dir);
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    CHECK(mf_trainer_save_weights(&t, w) == 0, "%s", mf_error());
    CHECK(mf_lora_save_adapter(&t.model, &t.arena, ad, "memfit-test") == 0, "%s", mf_error());

    float *lg = tu_logits_of(&t, B_, T_);
    /* the batch as the script reads it */
    int32_t *in = mf_arena_ptr(&t.arena, t.model.inputs), *tg = mf_arena_ptr(&t.arena, t.model.targets);
    mf_st_entry be[2] = {
        {.name = "inputs", .dtype = MF_DTYPE_I32, .ndim = 2, .shape = {B_, T_}, .data = in, .nbytes = B_ * T_ * 4},
        {.name = "targets", .dtype = MF_DTYPE_I32, .ndim = 2, .shape = {B_, T_}, .data = tg, .nbytes = B_ * T_ * 4}};
    snprintf(p, sizeof p, "%s/batch.safetensors", dir);
    CHECK(mf_st_write(p, be, 2, NULL, NULL, 0) == 0, "%s", mf_error());
    /* loss and adapter gradients on the same batch (data_pos rewound) */
    t.data_pos = 0;
    mf_arena_step(&t.arena);
    mf_model_zero_grads(&t.model, &t.arena);
    mf_trainer_load_batch(&t);
    double loss = mf_model_forward(&t.model, &t.arena, B_, T_, 1, 1.0f / (B_ * T_));
    mf_model_backward(&t.model, &t.arena, B_, T_);

    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/ref/lora_torch.py forward --weights %s --adapter %s --batch %s --heads 4 "
             "--out %s/ref.safetensors", src ? src : "..", w, ad, p, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "reference failed: %s\n(needs /usr/bin/python3 with python3-torch)\n", cmd);
        return 1;
    }
    mf_st_file ref;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (mf_st_open(&ref, p)) { fprintf(stderr, "%s\n", mf_error()); return 1; }
    int V = t.d.V;
    const mf_st_tensor *rl = mf_st_find(&ref, "logits");
    CHECK(rl && rl->nbytes == (size_t)B_ * T_ * V * 4, "reference logits");
    if (rl && lg) mf_test_compare("logits", lg, rl->data, (size_t)B_ * T_ * V, 1e-5, 1e-6);
    const char *ls = mf_st_meta(&ref, "loss");
    CHECK(ls && mf_close(loss, atof(ls), 1e-5, 0), "loss memfit %.9g torch %s", loss, ls ? ls : "?");
    int ng = 0;
    for (int i = t.model.lora_first; i < t.model.n_tensors; i++) {
        const mf_tensor *x = &t.model.tensors[i];
        char nm[160];
        snprintf(nm, sizeof nm, "grad.base_model.model.transformer.%s", x->name);
        const mf_st_tensor *g = mf_st_find(&ref, nm);
        CHECK(g && g->nbytes == (size_t)x->numel * 4, "reference gradient %s", nm);
        if (g) ng += mf_test_compare(nm, mf_arena_ptr(&t.arena, x->g), g->data, (size_t)x->numel, 1e-5, 1e-7);
    }
    CHECK(ng == t.model.n_tensors - t.model.lora_first && ng == 16, "%d adapter gradients matched", ng);
    printf("loss %.9g (torch %s); logits and %d adapter gradients within 1e-5\n", loss, ls ? ls : "?", ng);
    mf_trainer_free(&t);

    /* the adapter read back by memfit: the same logits, bit for bit */
    config(&c, data);
    mf_config_set(&c, "init", w);
    mf_config_set(&c, "adapter", ad);
    if (mf_trainer_init(&t, &c, MF_MODE_INFER) == 0) {
        float *lg2 = tu_logits_of(&t, B_, T_);
        CHECK(lg && lg2 && memcmp(lg, lg2, (size_t)B_ * T_ * V * sizeof *lg) == 0, "reloaded adapter: logits differ");
        free(lg2);
        mf_trainer_free(&t);
    } else CHECK(0, "reload: %s", mf_error());
    /* the written config is what PEFT reads */
    snprintf(p, sizeof p, "%s/adapter_config.json", ad);
    FILE *f = fopen(p, "r");
    char js[2048] = "";
    if (f) { size_t n = fread(js, 1, sizeof js - 1, f); js[n] = 0; fclose(f); }
    CHECK(strstr(js, "\"peft_type\": \"LORA\"") && strstr(js, "\"r\": 4") && strstr(js, "\"lora_alpha\": 8") &&
          strstr(js, "\"fan_in_fan_out\": true") && strstr(js, "\"mlp.c_proj\""), "adapter_config.json: %s", js);
    free(lg);
    mf_st_close(&ref);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    unlink(data);
    return mf_test_done("test_lora_matches_torch");
}
